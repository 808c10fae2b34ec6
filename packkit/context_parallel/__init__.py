"""Context parallelism: one CP rank's shard of a flat packed batch (``packkit.shard_context_parallel``), or
straight from the unpacked sequences in one launch (``packkit.pack_context_parallel``); one rank's batch for one
pass of a dynamic CP plan (``packkit.pack_context_parallel_pass``, ``packkit.iter_context_parallel``).

See ``docs/context_parallel.md``. Stage: packing (imports planning and packing only).
"""
from .pack import pack_context_parallel
from .pass_batch import iter_context_parallel, pack_context_parallel_pass
from .shard import (CP_MODES, CPShardInfo, cp_padded_lengths, cp_plan_multiple, parse_context_parallel,
                    shard_context_parallel, unshard_context_parallel)

__all__ = ["CP_MODES", "CPShardInfo", "cp_padded_lengths", "cp_plan_multiple", "iter_context_parallel", "pack_context_parallel",
           "pack_context_parallel_pass", "parse_context_parallel",
           "shard_context_parallel", "unshard_context_parallel"]
