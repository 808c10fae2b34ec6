"""Stage 1, plan (host, C++ core): which sequences share a row, balanced across data-parallel ranks under a cost
model, with a certified bound on that balance and a checker for plans made elsewhere."""
from .context_parallel import ContextParallelPlan, plan_context_parallel
from .cost_model import transformer_cost
from .plan_check import PLAN_ERRORS, check_plan
from .planner import ALGORITHMS, OVERLONG_POLICIES, CostSpec, Plan, Segments, as_lengths, plan
from .vision_cost import VisionCost, vision_cost
from ..pipeline.simulate import pp_simulate  # issue 61: torch pipeline schedules, simulated

__all__ = ["plan", "Plan", "Segments", "ALGORITHMS", "OVERLONG_POLICIES", "CostSpec", "as_lengths",
           "transformer_cost", "vision_cost", "VisionCost", "check_plan", "PLAN_ERRORS",
           "plan_context_parallel", "ContextParallelPlan"]
