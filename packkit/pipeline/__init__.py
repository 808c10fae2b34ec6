"""Pipeline parallelism (issue 61): packed micro-batches planned for every pipeline stage (:func:`plan_pipeline`)
and a simulator of torch.distributed.pipelining's schedules (:func:`pp_simulate`)."""
from .simulate import SCHEDULES, PipelineSim, pp_simulate
from .plan import PipelinePlan, plan_pipeline

__all__ = ["pp_simulate", "PipelineSim", "SCHEDULES", "plan_pipeline", "PipelinePlan"]
