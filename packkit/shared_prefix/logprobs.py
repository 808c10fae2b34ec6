"""Per-completion log-probs, losses and per-token outputs from a shared-prefix forward.

Token ``j`` of a sequence is predicted by the logits at token ``j - 1``'s packed position. For a completion's
first token that is the prompt's last position, which every branch of the group shares: each branch reads it
(one logits row, gathered once per branch), so no branch loses or duplicates a log-prob and no extra token is
packed. Only the rows that predict something are normalised (a log-sum-exp over the vocabulary per row), so
memory stays linear in the scored tokens, not ``[T, V]`` in fp32.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .pack import SharedPrefixInfo


class CompletionLogprobs(NamedTuple):
    """``padded[s, j]``: log-prob of completion token ``j`` of sequence ``s`` (``mask`` False past its end and for a
    first token with nothing before it); ``per_sequence``: the same as a list (group order) of 1-D tensors."""

    padded: torch.Tensor
    mask: torch.Tensor
    per_sequence: list

    def sums(self) -> torch.Tensor:
        """Summed log-prob of each sequence's completion ``[N]`` (DPO's policy / reference log-prob)."""
        return self.padded.masked_fill(~self.mask, 0).sum(-1)


def _flat(values: torch.Tensor, info: SharedPrefixInfo) -> torch.Tensor:
    rows, row_len = info.layout.num_rows, info.layout.row_len
    if values.dim() >= 2 and tuple(values.shape[:2]) == (rows, row_len):
        return values.reshape(rows * row_len, *values.shape[2:])
    if values.shape[0] == rows * row_len:
        return values
    raise ValueError(f"expected per-token values of shape [{rows}, {row_len}, ...] (the packed batch) or "
                     f"[{rows * row_len}, ...], got {tuple(values.shape)}")


def _to_padded(flat_scored: torch.Tensor, info: SharedPrefixInfo, fill) -> tuple:
    n, width = info.num_sequences, info.score.width
    out = flat_scored.new_full((n, width, *flat_scored.shape[1:]), fill)
    out = out.index_put((info.seq, info.col), flat_scored)
    mask = torch.zeros((n, width), dtype=torch.bool, device=flat_scored.device)
    mask = mask.index_put((info.seq, info.col), info.valid)
    return out, mask


def _split(padded: torch.Tensor, info: SharedPrefixInfo) -> list:
    return [padded[s, :int(c)] for s, c in enumerate(info.score.counts)]


def completion_logprobs(logits: torch.Tensor, info: SharedPrefixInfo, *, temperature: float = 1.0,
                        input_ids: torch.Tensor | None = None) -> CompletionLogprobs:
    """Per-token log-probs of every completion (differentiable w.r.t. ``logits``).

    Args:
        logits: the model's ``[R, S, V]`` output on the packed batch (any float dtype; computed in fp32 for
            half precision, in the logits' dtype otherwise).
        info: from :func:`pack_groups` / :func:`pack_tree`.
        temperature: logits are divided by it first (GRPO's sampling temperature).
        input_ids: the targets' source (default: the packed ``input_ids`` the batch holds).
    """
    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    flat = _flat(logits, info)
    if flat.dim() != 2:
        raise ValueError(f"logits must be [R, S, V], got {tuple(logits.shape)}")
    work = flat if flat.dtype in (torch.float32, torch.float64) else flat.float()
    targets = _targets(info, input_ids, flat.device)
    rows, inverse = torch.unique(info.pred, return_inverse=True) if info.pred.numel() else (info.pred, info.pred)
    picked = work.index_select(0, rows)
    if temperature != 1.0:
        picked = picked / temperature
    lse = torch.logsumexp(picked, dim=-1)
    logp = picked[inverse, targets] - lse[inverse]
    padded, mask = _to_padded(logp, info, 0.0)
    padded = padded.masked_fill(~mask, 0.0)
    return CompletionLogprobs(padded, mask, _split(padded, info))


def _targets(info: SharedPrefixInfo, input_ids, device) -> torch.Tensor:
    ids = info.input_ids if input_ids is None else input_ids
    return _flat(ids, info).index_select(0, info.target).long()


def completion_values(values: torch.Tensor, info: SharedPrefixInfo, *, shift: bool = True, fill=0.0) -> tuple:
    """Any per-token output ``[R, S, *]`` (values, entropy, ...) -> ``([N, W, *], mask [N, W])`` in the layout of
    :func:`completion_logprobs`. ``shift=True`` reads the predicting position (as log-probs do: a critic's value
    or an entropy "at" token ``j`` is computed from the logits before it); ``shift=False`` the token's own."""
    flat = _flat(values, info)
    picked = flat.index_select(0, info.pred if shift else info.target)
    padded, mask = _to_padded(picked, info, fill)
    if not shift:
        mask = torch.zeros_like(mask).index_put((info.seq, info.col), torch.ones_like(info.valid))
    return padded, mask


def dpo_logps(result: CompletionLogprobs, info: SharedPrefixInfo) -> tuple:
    """``(chosen [P], rejected [P])`` summed log-probs for DPO pairs packed as groups of two completions
    (``completions[g] = [chosen, rejected]``)."""
    group = info.forest.seq_group
    counts = torch.bincount(torch.from_numpy(group)) if len(group) else torch.zeros(0, dtype=torch.long)
    if len(group) % 2 or (counts != 2).any():
        raise ValueError("DPO needs every group to hold exactly two completions [chosen, rejected]; got group sizes "
                         f"{sorted(set(counts.tolist()))}")
    sums = result.sums()
    return sums[0::2], sums[1::2]


def grpo_token_mean_loss(logprobs: CompletionLogprobs, advantages: torch.Tensor, old_logprobs=None, *,
                         clip_eps: float = 0.2) -> torch.Tensor:
    """GRPO's clipped surrogate, averaged over all completion tokens (the "token-mean" loss aggregation).
    ``advantages``: ``[N]`` per sequence; ``old_logprobs``: ``[N, W]`` (default: detached current ones)."""
    old = logprobs.padded.detach() if old_logprobs is None else old_logprobs
    ratio = torch.exp(logprobs.padded - old)
    adv = advantages.reshape(-1, 1).to(ratio.dtype)
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    mask = logprobs.mask
    return per_token.masked_fill(~mask, 0).sum() / mask.sum().clamp(min=1)
