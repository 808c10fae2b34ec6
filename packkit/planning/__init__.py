"""Stage 1, plan (host, C++ core): which sequences share a row, balanced across data-parallel ranks under a cost
model, with a certified bound on that balance and a checker for plans made elsewhere."""
from .cost_model import transformer_cost
from .plan_check import PLAN_ERRORS, check_plan
from .planner import ALGORITHMS, OVERLONG_POLICIES, CostSpec, Plan, Segments, as_lengths, plan

__all__ = ["plan", "Plan", "Segments", "ALGORITHMS", "OVERLONG_POLICIES", "CostSpec", "as_lengths",
           "transformer_cost", "check_plan", "PLAN_ERRORS"]
