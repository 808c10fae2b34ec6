"""verl GRPO with shared prefixes: the actor's and the reference's log-prob passes forward each prompt once.

verl's ``DataParallelPPOActor._forward_micro_batch(micro_batch, temperature)`` returns ``(entropy, log_probs)``
in the response layout ``[b, response_length]``. :func:`shared_prefix_log_probs` returns the same from a
shared-prefix forward: rows with the same ``uid`` (one prompt, G responses) are packed as one tree by
:func:`packkit.shared_prefix.pack_rollout_groups`, the model runs with packkit's shared-prefix attention, and the
per-token results come back in verl's layout (zeros past each response), differentiable for the actor loss::

    from packkit.integrations.verl_shared_prefix import shared_prefix_log_probs
    entropy, log_probs = shared_prefix_log_probs(actor_module, micro_batch, uids, temperature=temperature,
                                                 calculate_entropy=True)

``uids`` is ``data.non_tensor_batch["uid"]`` for the micro-batch's rows. Qwen-VL rollouts (a micro-batch with
``multi_modal_inputs`` and verl's ``[b, 3|4, S]`` ``position_ids``) encode each uid's images once; the vision tower
keeps SDPA (``packkit.shared_prefix.hf``). Only torch and transformers are used
here, so it also runs where verl is not installed.

Multi-turn agent rollouts (verl's agent loop: assistant turns and tool output in one response, ``response_mask``):
:func:`multi_turn_tree_batch` packs each uid as one prefix tree scored where ``response_mask`` is 1, and its
``to_verl`` maps per-token results back to ``[B, response_length]``.
"""
from __future__ import annotations

import numpy as np
import torch

from ..shared_prefix import check_rollout_groups, pack_rollout_groups, register_attention, rollout_logprobs
from ..shared_prefix.checks import check_temperature
from ..shared_prefix.logprobs import completion_values


def _entropy_rows(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    work = (logits if logits.dtype in (torch.float32, torch.float64) else logits.float()) / temperature
    logp = torch.log_softmax(work, -1)
    return -(logp.exp() * logp).sum(-1)


def shared_prefix_log_probs(model, micro_batch, uids, *, temperature: float = 1.0, calculate_entropy: bool = False,
                            layout=None, attention: str = "auto", check: bool = False):
    """``(entropy or None, log_probs)``, each ``[b, response_length]``, for verl's micro-batch dict / TensorDict
    with ``input_ids``, ``attention_mask`` and ``responses`` (prompt columns = S - response_length), and, for Qwen-VL,
    ``multi_modal_inputs`` and ``position_ids``. Rows of one uid whose prompt tokens or pixels differ are flagged on
    the device with no sync; ``check=True`` reads the flags after the forward (one sync) and raises ValueError."""
    temperature = check_temperature(temperature)
    if not isinstance(calculate_entropy, (bool, np.bool_)):
        raise TypeError(f"calculate_entropy must be True or False, got {type(calculate_entropy).__name__}")
    if not hasattr(micro_batch, "keys"):
        raise TypeError("micro_batch must be verl's micro-batch (a dict or TensorDict), got "
                        f"{type(micro_batch).__name__}")
    keys = set(micro_batch.keys())  # TensorDict refuses `key in td`
    missing = [k for k in ("input_ids", "attention_mask", "responses") if k not in keys]
    if missing:
        raise ValueError(f"micro_batch lacks {missing}: verl's micro-batch holds input_ids, attention_mask and "
                         "responses")
    input_ids, attention_mask, responses = (micro_batch[k] for k in ("input_ids", "attention_mask", "responses"))
    for name, value in (("input_ids", input_ids), ("responses", responses)):
        if not isinstance(value, torch.Tensor) or value.dim() != 2:
            what = f"a {value.dim()}-d tensor" if isinstance(value, torch.Tensor) else type(value).__name__
            raise TypeError(f"micro_batch[{name!r}] must be a [batch, length] tensor, got {what}")
    width = int(responses.shape[-1])
    if responses.shape[0] != input_ids.shape[0] or width > input_ids.shape[1]:
        raise ValueError(f"micro_batch['responses'] {tuple(responses.shape)} must have input_ids' rows and at most "
                         f"its {input_ids.shape[1]} columns (input_ids {tuple(input_ids.shape)}): the response "
                         "columns are input_ids' last ones")
    uids = np.asarray(uids, dtype=object)
    if uids.shape != (input_ids.shape[0],):
        raise ValueError(f"uids must hold one id per row of the micro-batch ({input_ids.shape[0]}), got shape "
                         f"{uids.shape}")
    vision = {}
    if "multi_modal_inputs" in keys:  # Qwen-VL rollouts: verl's [b, 3|4, S] positions and per-row processor outputs
        if "position_ids" not in keys:
            raise ValueError("micro_batch has multi_modal_inputs but no position_ids: verl builds [b, 3, S] or "
                             "[b, 4, S] mRoPE positions for Qwen-VL rollouts; pass them")
        vision = dict(position_ids=micro_batch["position_ids"], multi_modal_inputs=micro_batch["multi_modal_inputs"],
                      mrope=model.config)
    batch, info = pack_rollout_groups(input_ids, attention_mask, uids, np.arange(input_ids.shape[0]), layout,
                                      prompt_length=int(input_ids.shape[1]) - width, attention=attention, **vision)
    if not isinstance(check, (bool, np.bool_)):
        raise TypeError(f"check must be True or False, got {type(check).__name__}")
    name = register_attention()
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        logits = model(**batch, use_cache=False).logits
    finally:
        model.set_attn_implementation(previous)
    if check:
        check_rollout_groups(info)
    log_probs = rollout_logprobs(logits, info, temperature=temperature)
    entropy = None
    if calculate_entropy:
        per_row, mask = completion_values(_entropy_rows(logits, temperature), info.info, shift=True)
        seq = torch.from_numpy(info.seq_of_row).to(per_row.device)
        per_row, mask = per_row[seq], mask[seq]
        n = min(width, per_row.shape[1])
        entropy = per_row.new_zeros((len(info.rows), width))
        entropy[:, :n] = per_row[:, :n].masked_fill(~mask[:, :n], 0)
    return entropy, log_probs


class MultiTurnTree:
    """What :func:`multi_turn_tree_batch` returns: ``batch`` (the shared-prefix model batch), ``info`` (for
    :func:`packkit.shared_prefix.completion_logprobs` / ``completion_values``) and :meth:`to_verl`, which maps any
    ``[N, W]`` per-token result (log-probs, values, entropy) back to verl's ``[B, response_length]`` layout."""

    def __init__(self, batch, info, rows, cols, packed_cols, shape):
        self.batch, self.info = batch, info
        self._rows, self._cols, self._packed_cols, self._shape = rows, cols, packed_cols, shape

    def to_verl(self, padded: torch.Tensor) -> torch.Tensor:
        """``[B, response_length]``: each response token's entry where ``response_mask`` is 1, zeros elsewhere (tool
        output and padding); differentiable."""
        if not isinstance(padded, torch.Tensor) or padded.dim() < 2 or padded.shape[0] != self._shape[0]:
            raise ValueError(f"to_verl takes the [N={self._shape[0]}, W] result of completion_logprobs(...).padded or "
                             f"completion_values, got {getattr(padded, 'shape', type(padded).__name__)}")
        device = padded.device
        rows, cols, packed = (torch.from_numpy(a).to(device) for a in (self._rows, self._cols, self._packed_cols))
        out = padded.new_zeros((*self._shape, *padded.shape[2:]))
        return out.index_put((rows, cols), padded[rows, packed])


def multi_turn_tree_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor, uids,
                          **pack_kwargs) -> MultiTurnTree:
    """verl multi-turn rollouts (its agent loop: ``input_ids`` / ``attention_mask`` ``[B, S]`` = a left-padded prompt
    then a right-padded response of ``response_length`` columns holding assistant turns and tool output;
    ``response_mask`` ``[B, response_length]``, verl's ``response_mask`` / Megatron's ``loss_mask``: 1 = generated,
    0 = tool output or padding; ``uids`` one id per row) -> a shared-prefix tree batch: each uid one tree, every
    shared prefix (the prompt, and any turns rows share) forwarded once, exactly the generated tokens scored
    (``labels``). The tokens are read on the host (one device-to-host copy of the three tensors): the tree is built
    there. ``pack_kwargs`` go to :func:`packkit.shared_prefix.pack_tree` (``capacity``, ``dp_size``, ``device`` ...).

    Refused, by name: masks holding other values than 0 / 1, a response_mask of 1 on padding (``attention_mask`` 0),
    shapes that do not line up."""
    from ..shared_prefix import pack_tree

    for name, value in (("input_ids", input_ids), ("attention_mask", attention_mask), ("response_mask", response_mask)):
        if not isinstance(value, torch.Tensor) or value.dim() != 2:
            what = f"a {value.dim()}-d tensor" if isinstance(value, torch.Tensor) else type(value).__name__
            raise TypeError(f"{name} must be a [batch, length] tensor, got {what}")
    if input_ids.is_floating_point() or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    b, s = input_ids.shape
    r = response_mask.shape[1]
    if tuple(attention_mask.shape) != (b, s) or response_mask.shape[0] != b or r > s:
        raise ValueError(f"attention_mask {tuple(attention_mask.shape)} must be input_ids' {(b, s)} and response_mask "
                         f"{tuple(response_mask.shape)} [{b}, response_length <= {s}]")
    ids = input_ids.detach().cpu().numpy().astype(np.int64, copy=False)
    am = attention_mask.detach().cpu().numpy()
    rm = response_mask.detach().cpu().numpy()
    for name, m in (("attention_mask", am), ("response_mask", rm)):
        if m.size and not np.isin(m, (0, 1)).all():
            raise ValueError(f"{name} holds a value other than 0 and 1")
    am, rm = am.astype(bool), rm.astype(bool)
    on_pad = rm & ~am[:, s - r:]
    if on_pad.any():
        row, col = (int(v) for v in np.argwhere(on_pad)[0])
        raise ValueError(f"response_mask[{row}, {col}] is 1 on padding (attention_mask[{row}, {s - r + col}] is 0): "
                         "only real tokens can be scored")
    keys = np.asarray(uids, dtype=object)
    if keys.shape != (b,):
        raise ValueError(f"uids must hold one id per row ({b}), got shape {keys.shape}")
    _, groups = np.unique(keys.astype(str), return_inverse=True)
    labels = np.full((b, s), -100, np.int64)
    labels[:, s - r:] = np.where(rm, ids[:, s - r:], -100)
    lengths = am.sum(1).astype(np.int64)
    batch, info = pack_tree(ids[am], groups.astype(np.int64), labels=labels[am], lengths=lengths, **pack_kwargs)
    # verl column c of row b is token (valid prompt tokens of b) + c of its trajectory; packed column = that minus
    # the trajectory's first scored token.
    prompt_valid = am[:, :s - r].sum(1)
    rows, cols = np.nonzero(rm)
    packed = prompt_valid[rows] + cols - info.forest.score_start[rows]
    return MultiTurnTree(batch, info, rows.astype(np.int64), cols.astype(np.int64), packed.astype(np.int64), (b, r))
