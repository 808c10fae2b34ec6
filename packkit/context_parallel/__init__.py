"""Context parallelism: one CP rank's shard of a flat packed batch (``packkit.shard_context_parallel``).

See ``docs/context_parallel.md``. Stage: packing (imports planning and packing only).
"""
from .shard import (CP_MODES, CPShardInfo, cp_padded_lengths, cp_plan_multiple, parse_context_parallel,
                    shard_context_parallel, unshard_context_parallel)

__all__ = ["CP_MODES", "CPShardInfo", "cp_padded_lengths", "cp_plan_multiple", "parse_context_parallel",
           "shard_context_parallel", "unshard_context_parallel"]
