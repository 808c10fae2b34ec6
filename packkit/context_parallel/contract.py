"""The static-shape contract on a context-parallel shard (docs/packing.md "Static shapes"): N sequence slots per
rank shard, ``cu_seq_lens_q/k`` (and zigzag's ``cu_seqlens_padded``) always ``N + 1`` long with unused slots
repeating the last offset, and ``max_length_q/k`` rounded up to a bucket. Shared by ``pack_context_parallel`` and
``shard_context_parallel`` so both shards of the same row carry the same contract."""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..packing.static_shapes import bucket, check_buckets, check_max_sequences, pad_cu_seqlens


def check_contract(max_sequences, max_length_buckets) -> tuple:
    return check_max_sequences(max_sequences), check_buckets(max_length_buckets)


def check_shard_slots(cu: np.ndarray, documents: int, cp_size: int, mode: str, max_sequences: int) -> None:
    """ValueError naming ``max_sequences`` when a rank's shard could need more slots. Decided from the packed row,
    the same on every rank (no rank refuses while the others enter a collective): its segments, plus, in contiguous
    mode, the end CP padding (its own local segment on the last ranks) when the row is not a multiple of cp_size."""
    segments = len(cu) - 1
    tail = int(mode == "contiguous" and int(cu[-1]) % cp_size != 0)
    if segments + tail > max_sequences:
        raise ValueError(f"the CP shard needs {segments + tail} slots ({documents} documents, "
                         f"{segments - documents} padding tails{', the end CP padding' if tail else ''}) but "
                         f"max_sequences={max_sequences} slots per shard: pass fewer documents per batch (a "
                         "PackedBatchSampler with max_sequences plans them), or a larger max_sequences")


def apply_contract(out: dict, max_sequences: Optional[int], max_length_buckets, local_len: int) -> dict:
    """``out`` (a shard's outputs) under the contract: cu_seqlens padded to N + 1, max lengths bucketed (a bucket
    never above the shard's own length, which bounds every local sequence)."""
    if max_sequences is not None:
        for key in ("cu_seq_lens_q", "cu_seqlens_padded"):
            if key in out:
                out[key] = pad_cu_seqlens(out[key], max_sequences + 1)
        out["cu_seq_lens_k"] = out["cu_seq_lens_q"]
    if max_length_buckets is not None:
        for key in ("max_length_q", "max_length_k"):
            if key in out:
                out[key] = bucket(int(out[key]), max_length_buckets, local_len)
    return out
