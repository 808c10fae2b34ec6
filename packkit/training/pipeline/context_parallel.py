"""Context parallelism inside each pipeline stage: every CP rank of a stage gets its shard of every micro-batch.

Each micro-batch of ``plan_pipeline`` is packed **on its own** into one pre-shard row of ``row_len`` CP-padded
tokens (the same ``row_len`` for every micro-batch), then split with :func:`packkit.shard_context_parallel`, so
its CP metadata (local ``cu_seq_lens``, ``cu_seqlens_padded``, global positions, segment ids) is built for that
micro-batch alone, never sliced from a batch-wide ``cu_seqlens`` (the torchtitan PR 4098 failure class). Every
shard has ``row_len / cp_size`` tokens and ``max_sequences + 1`` offsets, so the micro-batches stack into ``(m, L)``
and ``(m, N + 1)`` tensors whose dim-0 chunks (what ``schedule.step`` hands each stage) are each micro-batch's own.

Zigzag: the row is the micro-batch's documents followed by a padding tail of ``row_len - sum(cp_padded_lengths)``
tokens (a multiple of ``2 * cp_size``), so the shard's CP padding brings every micro-batch to exactly ``row_len``.
Contiguous: the row is packed to ``row_len`` tokens (a multiple of ``cp_size``). docs/pipeline.md, "Context
parallelism inside each stage", has the recipe."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch

from ...context_parallel.shard import CPShardInfo, _check_cp, cp_padded_lengths, shard_context_parallel
from ...packing.sequences import pack_sequences
from ...planning.arg_rules import Int, check_args
from .guard import HINT, check_microbatch
from .microbatches import IGNORE, microbatch_rows


@dataclass
class PipelineCPBatch:
    """CP rank ``cp_rank``'s shards of one step's micro-batches, stacked along dim 0 (micro-batch ``i`` is row ``i``
    of every tensor). ``L = row_len / cp_size`` tokens per shard, ``N + 1`` offsets per micro-batch."""
    cp_size: int
    cp_rank: int
    mode: str
    row_len: int  # tokens of each micro-batch's CP-padded pre-shard row (= cp_size * L)
    input_ids: torch.Tensor  # (m, L) int64
    shift_labels: torch.Tensor  # (m, L) int64: next label of the same document, shifted before the split
    position_ids: torch.Tensor  # (m, L) int64: global positions inside each document
    seq_idx: torch.Tensor  # (m, L): each token's segment in its micro-batch's pre-shard row
    cu_seq_lens: torch.Tensor  # (m, N + 1) int32: local boundaries, each row 0 .. L; unused slots repeat L
    cu_seqlens_padded: Optional[torch.Tensor]  # (m, N + 1) int32, zigzag only: the global padded cu_seqlens (TE THD)
    kv_position_ids: torch.Tensor  # (m, cp_size * L): every CP rank's position_ids, rank order (all_gather's order)
    kv_seq_idx: torch.Tensor  # (m, cp_size * L): every CP rank's seq_idx, rank order
    src_index: torch.Tensor  # (m, L) int64: each local token's index in its micro-batch's pre-shard row, -1 padding
    num_label_tokens: int  # label tokens of the whole step, all CP ranks together: the loss divides by it
    infos: List[CPShardInfo] = field(default_factory=list)  # per micro-batch, for unshard_context_parallel

    @property
    def num_microbatches(self) -> int:
        return int(self.input_ids.shape[0])

    def model_kwargs(self) -> dict:
        """The keyword arguments every stage's ``schedule.step`` passes (chunked along dim 0 alike on every rank):
        the shard's global ``position_ids``, ``seq_idx``, local ``cu_seq_lens`` and the key side of the CP group's
        attention (``kv_position_ids`` / ``kv_seq_idx``, every rank's, in all_gather order)."""
        return {"position_ids": self.position_ids, "seq_idx": self.seq_idx, "cu_seq_lens": self.cu_seq_lens,
                "kv_position_ids": self.kv_position_ids, "kv_seq_idx": self.kv_seq_idx}

    def loss_fn(self, num_label_tokens=None):
        """``loss_fn(logits, shift_labels)`` for the schedule (``target=batch.shift_labels``): a shard's summed
        cross-entropy against the labels shifted **before** the split, over the whole step's label-token count (all
        CP ranks, all micro-batches; with DP pass the step's count summed over DP ranks). With ``scale_grads=False``
        the CP ranks' losses add up to the per-token mean of the step, and their gradients, summed over each
        stage's CP group, to its gradient."""
        if num_label_tokens is None:
            return ShiftedPackedLoss(self.num_label_tokens)
        (count,) = check_args(Int("num_label_tokens", max(1, self.num_label_tokens)), values=(num_label_tokens,))
        return ShiftedPackedLoss(count)


class ShiftedPackedLoss:
    """Summed cross-entropy of logits against already-shifted labels (a CP shard's ``shift_labels``: no shift on the
    rank, whose neighbour token may live on another rank) divided by a fixed count. In the logits' dtype."""

    def __init__(self, num_label_tokens: int):
        (self.count,) = check_args(Int("num_label_tokens", 1), values=(num_label_tokens,))

    def __call__(self, logits: torch.Tensor, shift_labels: torch.Tensor) -> torch.Tensor:
        flat = logits.reshape(-1, logits.shape[-1])
        return torch.nn.functional.cross_entropy(flat, shift_labels.reshape(-1).to(torch.int64), ignore_index=IGNORE,
                                                 reduction="sum") / self.count


def _row_multiple(cp_size: int, mode: str) -> int:
    return 2 * cp_size if mode == "zigzag" else cp_size


def pipeline_cp_microbatches(microbatches, sequences, cp_size: int, cp_rank: int, mode: str = "zigzag", *,
                             labels=None, row_len: Optional[int] = None, max_sequences: Optional[int] = None,
                             pad_token_id: int = 0) -> PipelineCPBatch:
    """CP rank ``cp_rank`` of ``cp_size``'s shards of ``microbatches`` (lists of indices into ``sequences``, in
    schedule order: one DP rank's ``plan_pipeline(...).microbatches[rank]``), as a :class:`PipelineCPBatch`.

    Every CP rank of every stage calls it with the same arguments but its own ``cp_rank``. ``mode``: ``"zigzag"``
    or ``"contiguous"`` (:func:`packkit.shard_context_parallel`). ``row_len``: tokens of each micro-batch's
    CP-padded pre-shard row, a multiple of ``2 * cp_size`` (zigzag) or ``cp_size`` (contiguous); default the
    longest micro-batch's (zigzag: its documents' ``cp_padded_lengths``) rounded up to that multiple; a micro-batch
    over it is a ValueError. ``max_sequences``: offsets per shard minus one (default: the most segments, documents
    plus a padding tail, of one micro-batch). Plan with ``plan_pipeline(cp_padded_lengths(lengths, cp_size, mode),
    row_len, ...)`` so every micro-batch fits."""
    _check_cp(cp_size, cp_rank, mode)
    rows = microbatch_rows(microbatches, sequences, labels)
    multiple = _row_multiple(cp_size, mode)
    real = [[len(sequences[i]) for i in row] for row in rows]
    padded = [int(cp_padded_lengths(n, cp_size, mode).sum()) for n in real]
    longest = max(padded)
    (given,) = check_args(Int("row_len", longest, optional=True), values=(row_len,))
    total = -(-longest // multiple) * multiple if given is None else given
    if total % multiple:
        raise ValueError(f"row_len={total} must be a multiple of {multiple} ({'2 * ' if mode == 'zigzag' else ''}"
                         f"cp_size, mode={mode!r}): every CP rank gets row_len / cp_size tokens")
    # the pre-shard row of each micro-batch: its documents, then a padding tail that the shard's CP padding brings
    # to exactly `total` tokens (zigzag pads each segment, the tail included, to a multiple of 2 * cp_size)
    pre_len = [sum(n) + total - p for n, p in zip(real, padded)]
    need = max(len(row) + (p < total) for row, p in zip(rows, padded))
    (slots,) = check_args(Int("max_sequences", need, optional=True), values=(max_sequences,))
    slots = need if slots is None else slots
    shards, infos = [], []
    for row, length in zip(rows, pre_len):
        packed = pack_sequences([sequences[i] for i in row], labels=None if labels is None else [labels[i] for i in row],
                                layout="flat", row_len=length, pad_token_id=pad_token_id, ignore_index=IGNORE)
        every = [shard_context_parallel(packed, cp_size, r, mode, pad_token_id=pad_token_id, ignore_index=IGNORE,
                                        return_info=True, max_sequences=slots) for r in range(cp_size)]
        shards.append([s for s, _ in every])
        infos.append(every[cp_rank][1])
    local = total // cp_size
    assert all(s["input_ids"].shape[1] == local for ranks in shards for s in ranks)  # the static shape

    def stack(key, dtype, rank=cp_rank):
        return torch.cat([torch.as_tensor(ranks[rank][key]).reshape(1, -1).to(dtype) for ranks in shards])

    def every_rank(key, dtype):
        return torch.cat([stack(key, dtype, r) for r in range(cp_size)], dim=1)

    count = sum(int((ranks[r]["shift_labels"] != IGNORE).sum()) for ranks in shards for r in range(cp_size))
    return PipelineCPBatch(
        cp_size, cp_rank, mode, total, stack("input_ids", torch.int64), stack("shift_labels", torch.int64),
        stack("position_ids", torch.int64), stack("seq_idx", torch.int64), stack("cu_seq_lens_q", torch.int32),
        stack("cu_seqlens_padded", torch.int32) if mode == "zigzag" else None,
        every_rank("position_ids", torch.int64), every_rank("seq_idx", torch.int64),
        torch.stack([info.src_index.to(torch.int64) for info in infos]), count, infos)


def check_cp_microbatch(cu_seq_lens: torch.Tensor, tokens: int, position_ids=None, *, cp_size: int = 1,
                        cp_rank: int = 0, mode: str = "zigzag", name: str = "cu_seq_lens"):
    """:func:`check_microbatch` for one CP shard of a micro-batch: ``cu_seq_lens`` (local, one micro-batch's: from 0
    to its ``tokens``) as a 1-D int64 host array. With ``position_ids`` in zigzag mode, also that they are the
    shard's **global** positions: every local segment of ``2c`` tokens holds positions ``cp_rank * c ..`` then
    ``(2 * cp_size - 1 - cp_rank) * c ..`` (positions restarting per local segment are a ValueError naming
    ``position_ids``)."""
    _check_cp(cp_size, cp_rank, mode)
    host = check_microbatch(cu_seq_lens, tokens, name=name)
    if position_ids is None or mode != "zigzag":
        return host
    pos = position_ids.detach().reshape(-1).to("cpu", torch.int64).numpy()
    if pos.size != tokens:
        raise ValueError(f"position_ids has {pos.size} tokens, the shard {tokens}; {HINT}")
    for a, b in zip(host[:-1], host[1:]):
        c, odd = divmod(int(b - a), 2)
        if c == 0 and not odd:
            continue
        want = np.concatenate((cp_rank * c + np.arange(c), (2 * cp_size - 1 - cp_rank) * c + np.arange(c)))
        if odd or not np.array_equal(pos[a:b], want):
            raise ValueError(f"position_ids of local segment [{a}, {b}) are {pos[a:b].tolist()[:8]}, not zigzag "
                             f"rank {cp_rank} of {cp_size}'s global positions (chunks {cp_rank} and "
                             f"{2 * cp_size - 1 - cp_rank} of the document); shard with "
                             f"packkit.training.pipeline.pipeline_cp_microbatches")
    return host
