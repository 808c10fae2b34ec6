"""packkit's Triton kernels, installed as ``packkit.triton_kernels`` (never a top-level module).

``torch.library.triton_op``s, ``torch.ops.packkit.triton_<name>``, one module per op family, as in
``csrc/ops/``: ``layout``, ``pack``, ``pack_batch``, ``unpack`` (with ``unpack_padded``), sharing
``common`` (tile sizes, device helpers, value/word conversion) and ``checks`` (argument checks).
Semantics (bit for bit) are those of ``tests/pack_reference.py`` and ``csrc/ops/pack_op.cpp``. Nothing
reads a device value back to the host: every size comes from an int argument or a tensor shape, and
every kernel masks its loads and stores, so inconsistent plans give wrong values, never out-of-bounds
accesses.

Import ``packkit.triton_kernels.pack`` explicitly: it registers the whole family and needs triton.
This package itself imports nothing, so it stays importable without triton.
"""
