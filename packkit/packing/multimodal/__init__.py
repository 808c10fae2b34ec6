"""Vision-language packing: Qwen-VL mRoPE positions and vision inputs in packed order.

Imported lazily by the packing paths; nothing here needs transformers (configs are read by attribute).
"""
from .mrope import FAMILIES, MRopeSpec, mrope_spec
from .positions import mrope_position_ids
from .vision import pack_multimodal

__all__ = ["FAMILIES", "MRopeSpec", "mrope_spec", "mrope_position_ids", "pack_multimodal"]
