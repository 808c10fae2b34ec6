"""float64 all the way for the entry-point exactness checks (tests/entry_probe_swift.py and its test): transformers
computes RMSNorm in float32 and the causal-LM loss on ``logits.float()``, which rounds an fp64 model's loss to fp32
(agreement then stops near 1e-7). Both shims are the same maths in the input dtype, applied to every run alike."""
from __future__ import annotations

import torch


def rmsnorm_in_input_dtype(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def causal_lm_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None,
                   **kwargs):
    """transformers' ForCausalLMLoss without its ``logits.float()``."""
    if shift_labels is None:
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab_size), shift_labels.reshape(-1).to(logits.device),
                                             ignore_index=ignore_index,
                                             reduction="mean" if num_items_in_batch is None else "sum")
    return loss if num_items_in_batch is None else loss / num_items_in_batch


def to_fp64(model) -> None:
    """``model`` (a transformers Qwen2 / Llama causal LM, or a Qwen-VL with its vision tower) in float64 with the
    shims above: every RMSNorm class the model uses (a ``weight`` and a ``variance_epsilon``) computes in fp64."""
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen2 import modeling_qwen2

    modeling_qwen2.Qwen2RMSNorm.forward = rmsnorm_in_input_dtype
    modeling_llama.LlamaRMSNorm.forward = rmsnorm_in_input_dtype
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            type(module).forward = rmsnorm_in_input_dtype
    model.to(torch.float64)
    model.loss_function = causal_lm_loss
