"""packkit: sequence packing for LLM training.

``packkit.plan`` decides which sequences share a row (C++ bin packing); ``torch.ops.packkit.*`` are
the same planner (and, later, the device pack kernels) as torch ops.
"""
from . import ops  # registers torch.ops.packkit.*
from .planning import ALGORITHMS, OVERLONG_POLICIES, Plan, Segments, plan

__all__ = ["plan", "Plan", "Segments", "ALGORITHMS", "OVERLONG_POLICIES"]
__version__ = "0.1.0"
