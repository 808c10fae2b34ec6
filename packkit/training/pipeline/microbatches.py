"""Self-contained packed micro-batches for ``torch.distributed.pipelining`` and the loss that makes their sum the
per-sample mean.

The schedule chunks every tensor passed to ``schedule.step`` along dim 0 into ``n_microbatches`` pieces. So each
micro-batch is packed on its own (positions reset per document, ``cu_seq_lens`` from 0 to its own token count,
``seq_idx``) to one static shape (``row_len`` tokens, ``max_sequences`` slots: the static-shape contract of
docs/packing.md), and the micro-batches are stacked: ``(m, T)`` tokens, ``(m, N + 1)`` ``cu_seq_lens``. Chunk ``i``
of every tensor is then micro-batch ``i`` exactly, on every stage, and all micro-batches share one shape (the
schedule chunks one whole-batch tensor; stages exchange activations of that shape)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...packing.sequences import pack_sequences
from ...planning.arg_rules import Int, check_args

IGNORE = -100


@dataclass
class PipelineBatch:
    """One step's micro-batches, stacked along dim 0 (micro-batch ``i`` is row ``i`` of every tensor)."""
    input_ids: torch.Tensor  # (m, T) int64
    labels: torch.Tensor  # (m, T) int64, unshifted, IGNORE at each document's first token and on padding
    position_ids: torch.Tensor  # (m, T) int64, restarting at 0 per document
    seq_idx: torch.Tensor  # (m, T) int32, each token's slot in its micro-batch's cu_seq_lens
    cu_seq_lens: torch.Tensor  # (m, N + 1) int32, each row 0 .. T; unused slots repeat T
    num_label_tokens: int  # label tokens of these micro-batches (the whole step without DP): the loss divides by it

    @property
    def num_microbatches(self) -> int:
        return int(self.input_ids.shape[0])

    def model_kwargs(self) -> dict:
        """The keyword arguments every stage's ``schedule.step`` passes (chunked alike on every rank)."""
        return {"position_ids": self.position_ids, "cu_seq_lens": self.cu_seq_lens}

    def loss_fn(self, num_label_tokens=None):
        """``loss_fn(logits, labels)`` for the schedule: one micro-batch's summed next-token cross-entropy over the
        step's label-token count, so the losses' sum (and the gradient the schedule accumulates, with
        ``scale_grads=False``) is the per-token mean over the whole step, as one forward of all the documents.

        ``num_label_tokens`` (default: this batch's own, ``self.num_label_tokens``) is the count to divide by. With
        data parallelism pass the **whole step's** count, summed over the DP ranks (e.g. an all-reduce of every DP
        rank's ``num_label_tokens``), then sum the gradients over each stage's DP group: the result is the
        per-token mean over all the step's documents. Dividing by each DP rank's own count instead weights a
        rank's tokens by how few it has. It must be at least this batch's own count (ValueError naming it)."""
        if num_label_tokens is None:
            return PackedLoss(self.num_label_tokens)
        (count,) = check_args(Int("num_label_tokens", max(1, self.num_label_tokens)), values=(num_label_tokens,))
        return PackedLoss(count)


class PackedLoss:
    """Summed next-token cross-entropy of a micro-batch divided by a fixed count (the step's label tokens).
    Computed in the logits' dtype (fp64 stays fp64; HF's own loss casts to fp32)."""

    def __init__(self, num_label_tokens: int):
        (self.count,) = check_args(Int("num_label_tokens", 1), values=(num_label_tokens,))

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # labels are unshifted (HF's convention): token t predicts label t + 1; a document's first label is IGNORE,
        # so no token predicts across a boundary.
        flat = logits[:, :-1].reshape(-1, logits.shape[-1])
        target = labels[:, 1:].reshape(-1).to(torch.int64)
        return torch.nn.functional.cross_entropy(flat, target, ignore_index=IGNORE, reduction="sum") / self.count


def microbatch_rows(microbatches, sequences, labels=None) -> list:
    """``microbatches`` as lists of ints, each naming documents of ``sequences``; ValueError naming what is wrong."""
    rows = [list(map(int, row)) for row in microbatches]
    if not rows or any(not row for row in rows):
        raise ValueError("microbatches must be a non-empty list of non-empty lists of document indices")
    n = len(sequences)
    bad = [i for row in rows for i in row if not 0 <= i < n]
    if bad:
        raise ValueError(f"microbatches names document {bad[0]}; sequences has {n} (indices 0 .. {n - 1})")
    if labels is not None and len(labels) != n:
        raise ValueError(f"labels has {len(labels)} entries, sequences {n}: one label sequence per document")
    return rows


def pipeline_microbatches(microbatches, sequences, labels=None, *, row_len=None, max_sequences=None,
                          pad_token_id: int = 0) -> PipelineBatch:
    """Pack ``microbatches`` (lists of indices into ``sequences``, in schedule order: one DP rank's
    ``plan_pipeline(...).microbatches[rank]``) into a :class:`PipelineBatch`.

    ``row_len`` (default: the longest micro-batch) and ``max_sequences`` (default: the most documents in one
    micro-batch, plus the padding slot) fix the shape; a micro-batch over either is a ValueError."""
    rows = microbatch_rows(microbatches, sequences, labels)
    sizes = [sum(len(sequences[i]) for i in row) for row in rows]
    longest = max(sizes)
    (row_len,) = check_args(Int("row_len", longest, optional=True), values=(row_len,))
    row_len = longest if row_len is None else row_len
    # A row shorter than row_len gets one padding segment: it takes a slot.
    need = max(len(row) + (size < row_len) for row, size in zip(rows, sizes))
    (slots,) = check_args(Int("max_sequences", need, optional=True), values=(max_sequences,))
    slots = need if slots is None else slots
    packed = [pack_sequences([sequences[i] for i in row], labels=None if labels is None else [labels[i] for i in row],
                             layout="flat", row_len=row_len, max_sequences=slots, pad_token_id=pad_token_id,
                             ignore_index=IGNORE) for row in rows]

    def stack(key, dtype):
        return torch.cat([torch.as_tensor(b[key]).reshape(1, -1).to(dtype) for b in packed])

    out = PipelineBatch(stack("input_ids", torch.int64), stack("labels", torch.int64),
                        stack("position_ids", torch.int64), stack("seq_idx", torch.int32),
                        stack("cu_seq_lens_q", torch.int32), 0)
    out.num_label_tokens = int((out.labels[:, 1:] != IGNORE).sum())
    return out
