"""A host-read-free exact Mamba-2 mixer for packed batches: ``prepare_model(model, mixer="masked")``
(``Mamba2Mixer``, and Bamba's ``BambaMixer``: the same layer).

The per-document mixer (``mixers.py``) splits each row at boundaries read on the host (``.tolist()``), which a
``torch.compile(fullgraph=True)`` step or a captured CUDA graph cannot hold. This one keeps the documents on the
device as ``seq_idx`` ([rows, length], one document index per token) and masks instead of splitting:

- the causal depthwise conv1d is a sum of its K shifted copies, each tap zeroed where it would reach into an
  earlier document (``seq_idx[t - j] != seq_idx[t]``): each document's conv starts from zeros, as when run alone;
- the SSD scan runs in its exact quadratic ("attention") form ``y = (L o C B^T) (dt x) + D x`` with
  ``L[i, j] = exp(sum of dt * A over (j, i])`` for ``j <= i`` in the same document and 0 elsewhere: the state
  restarts at every document start, with no chunk carrying it across.

Cost: O(length^2) per row and head (memory and time), fine for the short rows of compile / graph tests and tiny
models, not a replacement for the chunked kernels on long rows. It computes in float32, or float64 for float64
inputs (transformers' torch reference casts to float32 always). The boundaries are trusted as the collator built
them: checking them (offsets rising, documents inside rows) would be the host read this path exists to avoid.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from .documents import BOUNDARY_KEYS

# Mixer classes with a masked forward here (model type -> class names): prepare_model(mixer="masked") refuses others.
MASKED_MIXERS = {"mamba2": ("Mamba2Mixer",), "bamba": ("BambaMixer",)}


_ALLOWED = frozenset()  # filled by the first install (import packkit must not import transformers)


def _allowed_kwargs() -> frozenset:
    """The batch's boundaries and the keywords transformers routes through every layer (TransformersKwargs): they
    reach the mixer unasked."""
    try:
        from transformers.utils.generic import TransformersKwargs
        routed = frozenset(getattr(TransformersKwargs, "__annotations__", {}))
    except Exception:  # noqa: BLE001 (an older transformers: no routed keywords to allow)
        routed = frozenset()
    return frozenset(BOUNDARY_KEYS) | routed


def seq_idx_of(bounds: dict, rows: int, length: int, device, where: str) -> torch.Tensor:
    """``[rows, length]`` document indices on ``device`` from a call's ``seq_idx``, ``cu_seq_lens_q`` or restarting
    ``position_ids`` (in that order; zeros when none: one document a row). Torch ops only, no host read."""
    seq_idx = bounds.get("seq_idx")
    if isinstance(seq_idx, torch.Tensor):
        if tuple(seq_idx.shape) != (rows, length):
            raise ValueError(f"{where}: seq_idx must be [{rows}, {length}], got {tuple(seq_idx.shape)}")
        return seq_idx
    cu = next((bounds[k] for k in ("cu_seqlens", "cu_seq_lens_q") if isinstance(bounds.get(k), torch.Tensor)), None)
    if cu is not None:
        if cu.dim() != 1 or cu.is_floating_point():
            raise ValueError(f"{where}: cu_seqlens must be a 1-D integer tensor, got {cu.dtype} {tuple(cu.shape)}")
        # token t belongs to the last offset <= t; zero-length slots (repeated offsets) are skipped by right=True
        tokens = torch.arange(rows * length, device=cu.device, dtype=cu.dtype)
        return (torch.searchsorted(cu, tokens, right=True) - 1).view(rows, length)
    pos = bounds.get("position_ids")
    if isinstance(pos, torch.Tensor):
        pos = pos[0] if pos.dim() == 3 else pos  # mRoPE [3 or 4, B, L]: the text row
        pos = pos.expand(rows, length) if pos.dim() == 2 and pos.shape[0] == 1 else pos
        if tuple(pos.shape) != (rows, length):
            raise ValueError(f"{where}: position_ids of shape {tuple(pos.shape)} do not match the batch's "
                             f"{rows} x {length} tokens")
        starts = torch.ones_like(pos, dtype=torch.int32)
        starts = torch.cat([starts[:, :1] * 0, (pos[:, 1:] != pos[:, :-1] + 1).to(torch.int32)], dim=1)
        return starts.cumsum(1)
    return torch.zeros(rows, length, dtype=torch.int32, device=device)


def masked_causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias, seq_idx: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv1d of ``x`` [B, C, L] (``weight`` [C, 1, K]) restarting at each document of
    ``seq_idx``: ``out[t] = bias + sum_j w[K-1-j] x[t-j]`` over the lags j whose token is in t's document."""
    length, taps = x.shape[-1], weight.shape[-1]
    out = x * weight[:, 0, taps - 1, None]
    for lag in range(1, min(taps, length)):
        shifted = F.pad(x[..., :length - lag], (lag, 0))
        same = torch.cat([torch.zeros_like(seq_idx[:, :lag], dtype=torch.bool),
                          seq_idx[:, lag:] == seq_idx[:, :length - lag]], dim=1)
        out = out + shifted * weight[:, 0, taps - 1 - lag, None] * same[:, None, :].to(x.dtype)
    return out if bias is None else out + bias[:, None]


def _segment_sum(a: torch.Tensor) -> torch.Tensor:
    """``s[..., i, j] = sum of a[..., k] for j < k <= i`` (0 on the diagonal, -inf above), as a masked cumsum of
    the repeated input (transformers' segment_sum): no difference of two large prefix sums, so no cancellation."""
    length = a.shape[-1]
    x = a[..., None].expand(*a.shape, length)
    strict = torch.tril(torch.ones(length, length, dtype=torch.bool, device=a.device), diagonal=-1)
    s = torch.cumsum(x.masked_fill(~strict, 0), dim=-2)
    lower = torch.tril(torch.ones(length, length, dtype=torch.bool, device=a.device))
    return s.masked_fill(~lower, -torch.inf)


def masked_ssd(x, dt, A, B, C, D, seq_idx: torch.Tensor) -> torch.Tensor:
    """The Mamba-2 SSD scan of ``x`` [b, L, h, p] (``dt`` [b, L, h] already softplus'd and clamped, ``A`` / ``D``
    [h], ``B`` / ``C`` [b, L, g, n]) from a zero state at every document of ``seq_idx`` [b, L]: the quadratic form
    with the decay matrix zero between tokens of different documents. Returns [b, L, h, p]."""
    heads, groups = x.shape[2], B.shape[2]
    B = B.repeat_interleave(heads // groups, dim=2)
    C = C.repeat_interleave(heads // groups, dim=2)
    same = (seq_idx[:, :, None] == seq_idx[:, None, :])[:, None]  # [b, 1, L(i), L(j)]
    decay = torch.exp(_segment_sum((A * dt).transpose(1, 2)).masked_fill(~same, -torch.inf))  # [b, h, i, j]
    scores = torch.einsum("bihn,bjhn->bhij", C, B) * decay
    y = torch.einsum("bhij,bjhp->bihp", scores, x * dt[..., None])
    return y + D[:, None] * x


def _forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
    where = f"{type(self).__name__} (packkit masked)"
    unknown = sorted(k for k in kwargs if k not in _ALLOWED)
    if unknown:
        raise ValueError(f"{where}: keyword(s) {', '.join(unknown)} are not honoured by the masked mixer")
    if cache is not None or kwargs.get("cache_params") is not None:
        raise ValueError(f"{where}: a call with a cache is refused: each document starts from a zero state "
                         "(call the model with use_cache=False)")
    rows, length, _ = hidden_states.shape
    if attention_mask is not None and tuple(attention_mask.shape) != (rows, length):
        raise ValueError(f"{where}: an attention_mask of shape {tuple(attention_mask.shape)} is refused "
                         f"(a packkit batch has none; a padding mask is [{rows}, {length}])")
    has_bounds = any(isinstance(kwargs.get(k), torch.Tensor) for k in BOUNDARY_KEYS)
    bounds = kwargs if has_bounds else self._packkit_state.boundaries
    seq_idx = seq_idx_of(bounds, rows, length, hidden_states.device, where)
    return masked_forward(self, hidden_states, attention_mask, seq_idx)


def check_masked_mixer(module: torch.nn.Module):
    """Why the masked forward cannot run ``module``, or None (prepare_model asks before it patches anything)."""
    if module.num_heads % module.n_groups:
        return (f"its {type(module).__name__} has {module.num_heads} heads in {module.n_groups} groups (B and C are "
                "shared by num_heads // n_groups heads each)")
    return None


def install_masked_mixer(module: torch.nn.Module, state) -> None:
    """Replace ``module.forward`` (a transformers ``Mamba2Mixer``) by the masked forward; boundaries come from the
    call's keywords (transformers >= 5.25 routes the batch's to every mixer) or else the model's pre-hook. A method
    bound to the module and the state an attribute of it (no closure): a deepcopy runs its own weights."""
    global _ALLOWED
    _ALLOWED = _ALLOWED or _allowed_kwargs()
    module._packkit_state = state
    module.forward = types.MethodType(_forward, module)


def masked_forward(m, hidden_states, attention_mask, seq_idx):
    """Mamba2Mixer.forward's torch path (in_proj, conv1d, SSD scan, gated norm, out_proj) with the conv and the
    scan masked per document."""
    dtype = hidden_states.dtype
    compute = torch.promote_types(dtype, torch.float32)
    mask = None if attention_mask is None else attention_mask[:, :, None].to(dtype)
    if mask is not None:
        hidden_states = hidden_states * mask
    gate, xbc, dt = m.in_proj(hidden_states).split([m.intermediate_size, m.conv_dim, m.num_heads], dim=-1)
    xbc = masked_causal_conv1d(xbc.transpose(1, 2), m.conv1d.weight, m.conv1d.bias, seq_idx)
    xbc = m.act(xbc).transpose(1, 2)
    if mask is not None:
        xbc = xbc * mask
    state = m.n_groups * m.ssm_state_size
    x, B, C = torch.split(xbc, [m.intermediate_size, state, state], dim=-1)
    rows, length = x.shape[:2]
    dt = F.softplus(dt.to(compute) + m.dt_bias.to(compute))
    dt = torch.clamp(dt, min=m.time_step_limit[0], max=m.time_step_limit[1])
    y = masked_ssd(x.reshape(rows, length, m.num_heads, m.head_dim).to(compute), dt,
                   -torch.exp(m.A_log.to(compute)),
                   B.reshape(rows, length, m.n_groups, m.ssm_state_size).to(compute),
                   C.reshape(rows, length, m.n_groups, m.ssm_state_size).to(compute), m.D.to(compute), seq_idx)
    y = m.norm(y.reshape(rows, length, m.intermediate_size), gate)
    return m.out_proj(y.to(dtype))
