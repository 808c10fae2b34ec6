"""A tiny random-init LlamaForCausalLM and the packed-vs-unpacked comparison the training-semantics
tests share (tests/test_hf_model.py on CPU, tests/test_training_semantics.py on CPU and GPU).

The reference runs each sequence alone and averages per token (sum of token losses / token count),
which is what a packed batch's loss is. Models are called with ``use_cache=False``: with a KV cache
transformers skips its packed-sequence detection and packed documents would attend to each other.
"""
from __future__ import annotations

import numpy as np
import torch

CAPACITY = 48
VOCAB = 97


def tiny_llama(seed=0, attn="sdpa", device="cpu", dtype=torch.float32):
    import transformers
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      use_cache=False, attn_implementation=attn)
    # Initialised in fp32 on the CPU, then cast: every (device, dtype, attention) gets the same weights.
    model = transformers.LlamaForCausalLM(config).to(torch.float32).to(device=device, dtype=dtype)
    model.config.use_cache = False
    return model


def sequences(seed=0):
    rng = np.random.default_rng(seed)
    lengths = [2, CAPACITY, 17, 5, 31, 9, 44, 3, 23]  # a 2-token sequence and one of exactly capacity
    return [rng.integers(1, VOCAB, n).tolist() for n in lengths]


def loss_and_grads(model, run):
    model.zero_grad(set_to_none=True)
    loss = run()
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def unpacked_reference(model, seqs, **model_kwargs):
    """Each sequence alone; per-token mean over the whole batch."""
    device = next(model.parameters()).device

    def run():
        total, count = 0.0, 0
        for s in seqs:
            ids = torch.tensor([s], device=device)
            out = model(input_ids=ids, labels=ids, use_cache=False, **model_kwargs)
            total = total + out.loss.float() * (len(s) - 1)
            count += len(s) - 1
        return total / count
    return loss_and_grads(model, run)


def rel_err(a, b) -> float:
    """max |a - b| over max |b|, in fp64."""
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-12)


def worst_rel_err(grads, ref_grads) -> float:
    return max(rel_err(g, ref_grads[n]) for n, g in grads.items())


def assert_close(a, b, rel=1e-5):
    scale = max(float(b.abs().max()), 1e-12)
    assert float((a - b).abs().max()) <= rel * scale + 1e-7, (float((a - b).abs().max()), scale)
