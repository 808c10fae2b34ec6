"""packkit's Triton kernels, installed as ``packkit.triton_kernels`` (never a top-level module).

``packkit.triton_kernels.pack``: the pack op family (layout, pack, pack_batch, unpack, unpack_padded)
as ``torch.library.triton_op``s, ``torch.ops.packkit.triton_<name>``. Import it explicitly; it needs
triton. This package itself imports nothing, so it stays importable without triton.
"""
