"""Per-completion log-probs, losses and per-token outputs from a shared-prefix forward.

Token ``j`` of a sequence is predicted by the logits at token ``j - 1``'s packed position. For a completion's
first token that is the prompt's last position, which every branch of the group shares: each branch reads it
(one logits row, gathered once per branch), so no branch loses or duplicates a log-prob and no extra token is
packed. Only the rows that predict something are normalised (a log-sum-exp over the vocabulary per row), so
memory stays linear in the scored tokens, not ``[T, V]`` in fp32.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .checks import as_values, check_float_tensor, check_real, check_shape, check_temperature
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


def _check_info(info, name: str = "info") -> None:
    if not isinstance(info, SharedPrefixInfo):
        raise TypeError(f"{name} must be the SharedPrefixInfo that pack_groups / pack_tree returned, got "
                        f"{type(info).__name__}")


def _check_attended(info: SharedPrefixInfo) -> None:
    """Outputs of a forward that never called the shared-prefix attention are plain-sequence outputs: wrong."""
    attn = info.attention
    if attn is not None and attn.calls == 0 and info.tokens_forwarded:
        raise ValueError("the shared-prefix attention was never called with this batch: either the model has not "
                         "run on it yet, or it does not route attention through transformers' AttentionInterface "
                         "(recurrent / state-space layers, a model's own attention code), so its outputs saw every "
                         "row as one plain sequence; pack these sequences without sharing")


def _flat(values: torch.Tensor, info: SharedPrefixInfo, name: str = "values") -> torch.Tensor:
    rows, row_len = info.layout.num_rows, info.layout.row_len
    if not isinstance(values, torch.Tensor):
        hint = " (use torch.from_numpy)" if hasattr(values, "__array__") else ""
        raise TypeError(f"{name} must be a torch.Tensor [{rows}, {row_len}, ...] (the packed batch), got "
                        f"{type(values).__name__}{hint}")
    if values.dim() == 0:
        raise ValueError(f"{name} must be [{rows}, {row_len}, ...] (the packed batch) or [{rows * row_len}, ...], "
                         "got a 0-d tensor")
    if values.device != info.device:
        raise ValueError(f"{name} are on {values.device} but the packed batch (info) is on {info.device}")
    if values.dim() >= 2 and tuple(values.shape[:2]) == (rows, row_len):
        return values.reshape(rows * row_len, *values.shape[2:])
    if values.shape[0] == rows * row_len:
        return values
    raise ValueError(f"{name} must be [{rows}, {row_len}, ...] (the packed batch) or [{rows * row_len}, ...], got "
                     f"{tuple(values.shape)}")


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
        logits: the model's ``[R, S, V]`` output on the packed batch (a floating tensor: fp16 / bf16 computed in
            fp32, fp32 / fp64 in their own dtype; int, bool and complex logits are refused, never cast).
        info: from :func:`pack_groups` / :func:`pack_tree`.
        temperature: logits are divided by it first (GRPO's sampling temperature): a finite real >= 1e-6.
        input_ids: the targets' source (default: the packed ``input_ids`` the batch holds).

    Every target must be a token of the vocabulary (``V`` > token id): checked on the host when the ids are
    known there (ValueError naming both); for ids only on a GPU the check would sync, so the log-prob of an
    out-of-vocabulary target is NaN instead (never a value read from another token, never a device assert).
    """
    temperature = check_temperature(temperature)
    _check_info(info)
    check_float_tensor(logits, "logits", "[R, S, V]")
    flat = _flat(logits, info, "logits")
    _check_attended(info)
    if flat.dim() != 2:
        raise ValueError(f"logits must be [R, S, V], got {tuple(logits.shape)}")
    vocab = flat.shape[1]
    work = flat if flat.dtype in (torch.float32, torch.float64) else flat.float()
    targets = _targets(info, input_ids, flat.device)
    outside = _check_vocab(targets, vocab, info if input_ids is None else None)
    if outside is not None:
        targets = targets.clamp(max=max(vocab - 1, 0))
    rows, inverse = torch.unique(info.pred, return_inverse=True) if info.pred.numel() else (info.pred, info.pred)
    picked = work.index_select(0, rows)
    if temperature != 1.0:
        picked = picked / temperature
    lse = torch.logsumexp(picked, dim=-1)
    logp = picked[inverse, targets] - lse[inverse]
    if outside is not None:
        logp = logp.masked_fill(outside, float("nan"))
    padded, mask = _to_padded(logp, info, 0.0)
    padded = padded.masked_fill(~mask, 0.0)
    return CompletionLogprobs(padded, mask, _split(padded, info))


def _targets(info: SharedPrefixInfo, input_ids, device) -> torch.Tensor:
    ids = info.input_ids if input_ids is None else input_ids
    if input_ids is not None and isinstance(ids, torch.Tensor) and (ids.is_floating_point() or ids.is_complex()
                                                                    or ids.dtype == torch.bool):
        raise TypeError(f"input_ids must hold integer token ids, got dtype {ids.dtype}")
    flat = _flat(ids, info, "input_ids")
    if flat.dim() != 1:
        raise ValueError(f"input_ids must be [R, S] like the packed batch, got {tuple(ids.shape)}")
    if flat.device != device:
        raise ValueError(f"input_ids are on {flat.device} but the logits are on {device}")
    return flat.index_select(0, info.target).long()


def _check_vocab(targets: torch.Tensor, vocab: int, info) -> torch.Tensor | None:
    """Refuse a target id >= ``vocab`` (or < 0) where the ids are known on the host; on a GPU, return the mask
    of such targets (their log-prob becomes NaN) instead of syncing."""
    known = info.max_token_id if info is not None else None
    if known is None and targets.device.type == "cpu":
        known = int(targets.max()) if targets.numel() else None
        if targets.numel() and int(targets.min()) < 0:
            raise ValueError(f"input_ids hold token id {int(targets.min())}: token ids must be >= 0")
    if known is not None:
        if known >= vocab:
            raise ValueError(f"the logits have a vocabulary of {vocab}, but the batch holds token id {known}: these "
                             "logits are not the model's output on this batch (or the tokenizer and model differ)")
        return None
    return (targets >= vocab) | (targets < 0)


def completion_values(values: torch.Tensor, info: SharedPrefixInfo, *, shift: bool = True, fill=0.0) -> tuple:
    """Any per-token output ``[R, S, *]`` (values, entropy, ...) -> ``([N, W, *], mask [N, W])`` in the layout of
    :func:`completion_logprobs`. ``shift=True`` reads the predicting position (as log-probs do: a critic's value
    or an entropy "at" token ``j`` is computed from the logits before it); ``shift=False`` the token's own.
    ``fill`` (the value past each sequence's end) must be representable in ``values``' dtype."""
    _check_info(info)
    if not isinstance(shift, (bool, np.bool_)):
        raise TypeError(f"shift must be True or False, got {type(shift).__name__} {shift!r}")
    flat = _flat(values, info)
    _check_fill(fill, flat.dtype)
    _check_attended(info)
    picked = flat.index_select(0, info.pred if shift else info.target)
    padded, mask = _to_padded(picked, info, fill)
    if not shift:
        mask = torch.zeros_like(mask).index_put((info.seq, info.col), torch.ones_like(info.valid))
    return padded, mask


def dpo_logps(result: CompletionLogprobs, info: SharedPrefixInfo) -> tuple:
    """``(chosen [P], rejected [P])`` summed log-probs for DPO pairs packed as groups of two completions
    (``completions[g] = [chosen, rejected]``): the two sequences of a pair must be adjacent, chosen first."""
    if not isinstance(result, CompletionLogprobs):
        raise TypeError(f"result must be the CompletionLogprobs of completion_logprobs, got {type(result).__name__}")
    _check_info(info)
    if result.padded.dim() < 1 or result.padded.shape[0] != info.num_sequences:
        raise ValueError(f"result holds {result.padded.shape[0] if result.padded.dim() else 0} sequences but info "
                         f"{info.num_sequences}: they are not from the same batch")
    group = np.asarray(info.forest.seq_group, np.int64)
    _, counts = np.unique(group, return_counts=True)
    if len(group) % 2 or (counts != 2).any():
        raise ValueError("DPO needs every group to hold exactly two completions [chosen, rejected]; got group sizes "
                         f"{sorted(set(counts.tolist()))}")
    apart = np.flatnonzero(group[0::2] != group[1::2])
    if len(apart):
        p = int(apart[0])
        raise ValueError(f"sequences {2 * p} and {2 * p + 1} are in groups {int(group[2 * p])} and "
                         f"{int(group[2 * p + 1])}: DPO pairs must be adjacent (chosen, then rejected of the same "
                         "group), as pack_groups lays them out")
    sums = result.sums()
    return sums[0::2], sums[1::2]


def grpo_token_mean_loss(logprobs: CompletionLogprobs, advantages: torch.Tensor, old_logprobs=None, *,
                         clip_eps: float = 0.2) -> torch.Tensor:
    """GRPO's clipped surrogate, averaged over all completion tokens (the "token-mean" loss aggregation).

    ``advantages``: ``[N]`` per sequence or ``[N, W]`` per token; ``old_logprobs``: ``[N, W]`` (default: detached
    current ones); both exactly (a ``[1, W]`` or ``[W]`` tensor is refused, not broadcast), real-valued (tensor,
    numpy or list; moved to the log-probs' device and dtype). ``clip_eps``: a finite real in ``[0, 1)``."""
    if not isinstance(logprobs, CompletionLogprobs):
        raise TypeError("logprobs must be the CompletionLogprobs of completion_logprobs, got "
                        f"{type(logprobs).__name__}")
    clip_eps = check_real(clip_eps, "clip_eps", low=0.0)
    if clip_eps >= 1:
        raise ValueError(f"clip_eps must be in [0, 1) (the ratio is clipped to [1 - clip_eps, 1 + clip_eps]), got "
                         f"{clip_eps}")
    n, width = logprobs.padded.shape
    adv = as_values(advantages, "advantages", logprobs.padded)
    check_shape(adv, "advantages", [[n], [n, width]])
    if old_logprobs is None:
        old = logprobs.padded.detach()
    else:
        old = as_values(old_logprobs, "old_logprobs", logprobs.padded)
        check_shape(old, "old_logprobs", [[n, width]])
    _check_finite(adv, "advantages", logprobs.mask if adv.dim() == 2 else None)
    if old_logprobs is not None:
        _check_finite(old, "old_logprobs", logprobs.mask)
    ratio = torch.exp(logprobs.padded - old)
    adv = adv if adv.dim() == 2 else adv.unsqueeze(1)
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    mask = logprobs.mask
    return per_token.masked_fill(~mask, 0).sum() / mask.sum().clamp(min=1)


def ppo_token_mean_loss(logprobs: CompletionLogprobs, advantages, old_logprobs, *, values=None, returns=None,
                        old_values=None, clip_eps: float = 0.2, value_clip_eps=None,
                        value_coef: float = 0.5) -> torch.Tensor:
    """PPO's per-token loss, averaged over the scored tokens (``logprobs.mask``: with ``labels``, exactly the labelled
    tokens): the clipped policy surrogate of :func:`grpo_token_mean_loss` with ``old_logprobs`` ``[N, W]``, plus, with
    a value head, ``value_coef * 0.5 * (values - returns)**2`` (the larger of that and the clipped one around
    ``old_values`` when ``value_clip_eps`` is given, as verl's ``compute_value_loss``). ``values``: ``[N, W]`` from
    :func:`completion_values` on the value head's ``[R, S]`` output (``shift=True``: the value of the state before
    each token); ``returns`` / ``old_values``: ``[N, W]``."""
    policy = grpo_token_mean_loss(logprobs, advantages, old_logprobs, clip_eps=clip_eps)
    given = [name for name, v in (("values", values), ("returns", returns)) if v is not None]
    if len(given) == 1:
        other = "returns" if given[0] == "values" else "values"
        raise ValueError(f"ppo_token_mean_loss got {given[0]} without {other}: the value loss needs both")
    if values is None:
        if old_values is not None or value_clip_eps is not None:
            raise ValueError("old_values / value_clip_eps need values and returns")
        return policy
    value_coef = check_real(value_coef, "value_coef", low=0.0)
    n, width = logprobs.padded.shape
    if not isinstance(values, torch.Tensor) or not (values.is_floating_point()):
        raise TypeError("values must be a floating tensor [N, W] (completion_values of the value head's output)")
    check_shape(values, "values", [[n, width]])
    ret = as_values(returns, "returns", values)
    check_shape(ret, "returns", [[n, width]])
    mask = logprobs.mask
    _check_finite(ret, "returns", mask)
    loss = (values - ret) ** 2
    if value_clip_eps is not None:
        eps = check_real(value_clip_eps, "value_clip_eps", low=0.0)
        if old_values is None:
            raise ValueError("value_clip_eps needs old_values (the critic's values at rollout time)")
        old = as_values(old_values, "old_values", values)
        check_shape(old, "old_values", [[n, width]])
        _check_finite(old, "old_values", mask)
        clipped = old + (values - old).clamp(-eps, eps)
        loss = torch.maximum(loss, (clipped - ret) ** 2)
    elif old_values is not None:
        raise ValueError("old_values is only read with value_clip_eps")
    value = 0.5 * loss.masked_fill(~mask, 0).sum() / mask.sum().clamp(min=1)
    return policy + value_coef * value


def _check_fill(fill, dtype: torch.dtype) -> None:
    if isinstance(fill, bool) and dtype != torch.bool or not isinstance(fill, (int, float, np.integer, np.floating)):
        raise TypeError(f"fill must be a number, got {type(fill).__name__} {fill!r}")
    if not (dtype.is_floating_point or dtype.is_complex) and (isinstance(fill, (float, np.floating))
                                                             and not float(fill).is_integer()):
        raise ValueError(f"fill={fill!r} cannot be stored in {dtype} values")


def _check_finite(values: torch.Tensor, name: str, mask) -> None:
    """Refuse NaN / inf where they count (under ``mask``) when the values are on the host (free); device values
    are not read back (a NaN there gives a NaN loss, visible at the next natural sync)."""
    if values.device.type != "cpu":
        return
    counted = values if mask is None else values[mask]
    if counted.numel() and not bool(torch.isfinite(counted).all()):
        raise ValueError(f"{name} holds a non-finite value (NaN or inf) where the loss reads it")
