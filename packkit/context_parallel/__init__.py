"""Context parallelism: one CP rank's shard of a flat packed batch (``packkit.shard_context_parallel``).

See ``docs/context_parallel.md``. Stage: packing (imports planning and packing only).
"""
from .shard import CP_MODES, CPShardInfo, cp_padded_lengths, shard_context_parallel, unshard_context_parallel

__all__ = ["CP_MODES", "CPShardInfo", "cp_padded_lengths", "shard_context_parallel", "unshard_context_parallel"]
