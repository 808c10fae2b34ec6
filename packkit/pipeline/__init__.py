"""Pipeline parallelism (issue 61): packed micro-batches planned for every pipeline stage (:func:`plan_pipeline`),
a simulator of torch.distributed.pipelining's schedules (:func:`pp_simulate`), and consecutive steps with a bounded
outlier delay (:class:`PipelineStepPlanner`)."""
from .simulate import SCHEDULES, PipelineSim, pp_simulate
from .plan import PipelinePlan, plan_pipeline
from .steps import PipelineStep, PipelineStepPlanner

__all__ = ["pp_simulate", "PipelineSim", "SCHEDULES", "plan_pipeline", "PipelinePlan", "PipelineStepPlanner",
           "PipelineStep"]
