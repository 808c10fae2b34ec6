"""Stage 3: packed micro-batches run through ``torch.distributed.pipelining`` (issue 61 part 3).

``packkit.pipeline.plan_pipeline`` (planning) says which documents share each micro-batch; this subpackage turns
that plan into inputs the schedule's dim-0 chunking splits correctly (:func:`pipeline_microbatches`), refuses the
torchtitan PR 4098 form, a batch-wide ``cu_seqlens`` chunked into micro-batches (:func:`check_microbatch`), and
splits a tiny HF Llama into stage modules (:class:`LlamaStage`). docs/pipeline.md has the recipe."""
from .guard import check_microbatch
from .microbatches import PipelineBatch, pipeline_microbatches
from .llama_stages import LlamaStage, split_layers
from .context_parallel import PipelineCPBatch, check_cp_microbatch, pipeline_cp_microbatches

__all__ = ["pipeline_microbatches", "PipelineBatch", "check_microbatch", "LlamaStage", "split_layers"]
