"""Stage 2, pack (device): the op library, packing sequences and their per-token fields into rows from a plan,
reusable output buffers, and multimodal (mRoPE, vision) fields."""
from . import ops  # registers torch.ops.packkit.*
from .buffers import PackBuffers
from .multimodal import mrope_position_ids
from .sequences import (LAYOUTS, PackInfo, PackLayout, flatten_sequences, pack_layout, pack_on_device, pack_sequences,
                        unpack_sequences)

__all__ = ["ops", "PackBuffers", "mrope_position_ids", "LAYOUTS", "PackInfo", "PackLayout", "flatten_sequences",
           "pack_layout", "pack_on_device", "pack_sequences", "unpack_sequences"]
