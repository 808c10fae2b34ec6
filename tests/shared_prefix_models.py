"""Tiny random-init HF models in fp64 end to end and per-sample references, shared by the shared-prefix tests
(tests/test_shared_prefix_model.py, _rollouts.py, _verl.py) and tests/test_rl_semantics.py.

transformers' RMSNorm computes in fp32 even in an fp64 model, which caps agreement at ~1e-7 (REFERENCE §12):
:func:`fp64_norms` makes it compute in the input dtype, so two correct computations agree to ~1e-15.
"""
from __future__ import annotations

import numpy as np
import torch

VOCAB, PROMPT, RESPONSE = 61, 8, 10


def _rmsnorm_in_input_dtype(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def fp64_norms(monkeypatch):
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen2 import modeling_qwen2

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", _rmsnorm_in_input_dtype)
    monkeypatch.setattr(modeling_qwen2.Qwen2RMSNorm, "forward", _rmsnorm_in_input_dtype)
    from transformers.models.qwen3 import modeling_qwen3

    monkeypatch.setattr(modeling_qwen3.Qwen3RMSNorm, "forward", _rmsnorm_in_input_dtype)


def tiny(kind="llama", attn="sdpa"):
    import transformers

    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, use_cache=False, attn_implementation=attn)
    classes = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
               "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
               "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}
    config_cls, model_cls = classes.get(kind, classes["qwen2"])
    if kind == "qwen3":
        common["head_dim"] = 8
    config = config_cls(**common)
    model = model_cls(config)
    return model.to(torch.float64)


def per_sample_groups(model, prompts, completions):
    """Completion log-probs of each (prompt + completion) run alone: a list (group order) of 1-D tensors; a first
    token with no prompt before it has none (NaN placeholder, masked in the packed result)."""
    out = []
    for p, group in zip(prompts, completions):
        for c in group:
            seq = torch.tensor([p + c])
            if seq.shape[1] == 0:
                out.append(torch.zeros(0, dtype=torch.float64))
                continue
            logits = model(input_ids=seq, use_cache=False).logits[0]
            logp = torch.log_softmax(logits[:-1], -1).gather(1, seq[0, 1:, None])[:, 0]
            full = torch.cat([torch.full((1,), float("nan"), dtype=torch.float64), logp])
            out.append(full[len(p):])
    return out


def grpo_rollouts(num_groups=3, group_size=3, seed=0):
    """verl's layout: each uid's prompt left-padded to PROMPT columns, responses right-padded to RESPONSE."""
    g = torch.Generator().manual_seed(seed)
    rows, masks, uids = [], [], []
    for u in range(num_groups):
        p = int(torch.randint(1, PROMPT + 1, (1,), generator=g))
        prompt = torch.randint(1, VOCAB, (p,), generator=g)
        for _ in range(group_size):
            r = int(torch.randint(0, RESPONSE + 1, (1,), generator=g))
            ids = torch.zeros(PROMPT + RESPONSE, dtype=torch.int64)
            ids[PROMPT - p:PROMPT] = prompt
            ids[PROMPT:PROMPT + r] = torch.randint(1, VOCAB, (r,), generator=g)
            mask = torch.zeros_like(ids)
            mask[PROMPT - p:PROMPT + r] = 1
            rows.append(ids)
            masks.append(mask)
            uids.append(f"uid-{u}")
    perm = torch.randperm(len(rows), generator=g)  # groups interleaved, as after verl's balancing
    return torch.stack(rows)[perm], torch.stack(masks)[perm], np.array(uids, dtype=object)[perm.numpy()]


def per_sample_rollouts(model, ids, mask):
    """[B, RESPONSE]: each rollout alone, unpadded; log-prob of response token t given everything before it."""
    out = torch.zeros(ids.shape[0], RESPONSE, dtype=torch.float64)
    for b in range(ids.shape[0]):
        cols = torch.nonzero(mask[b]).flatten()
        seq = ids[b, cols].unsqueeze(0)
        logits = model(input_ids=seq, use_cache=False).logits[0]
        logp = torch.log_softmax(logits[:-1], -1).gather(1, seq[0, 1:, None])[:, 0]
        full = torch.zeros(PROMPT + RESPONSE, dtype=torch.float64)
        full[cols[1:]] = logp
        out[b] = full[PROMPT:]
    return out
