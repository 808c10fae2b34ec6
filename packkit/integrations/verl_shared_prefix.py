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
