"""The tiny fp64 Llama, the step's documents and the per-sample reference shared by the pipeline tests
(tests/test_pipeline_microbatches.py in one process, tests/test_pipeline_run.py over gloo workers)."""
from __future__ import annotations

import numpy as np
import torch

VOCAB, LAYERS, CAPACITY = 97, 8, 32
LENGTHS = [2, 31, 17, 5, 24, 9, 30, 3, 23, 12, 7, 19, 14, 6, 27, 11]  # a 2-token document, one of capacity - 1


def tiny_llama(attn: str, monkeypatch, layers: int = LAYERS):
    """Seed-0 fp64 Llama (the same weights in every process), fp32 casts of norms / rotary made fp64."""
    import transformers

    from model_zoo import fp64_everywhere

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=256, use_cache=False)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation=attn).to(torch.float64)
    fp64_everywhere(model, monkeypatch)
    return model


def documents(seed: int = 0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, VOCAB, n).tolist() for n in LENGTHS]


def per_sample_reference(model, seqs):
    """Each document alone through the unsplit ``model`` with SDPA (its attention set back after), token losses
    summed over the step's label tokens: (loss, {name: grad})."""
    before = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    model.zero_grad(set_to_none=True)
    count = sum(len(s) - 1 for s in seqs)
    total = torch.zeros((), dtype=torch.float64)
    for s in seqs:
        ids = torch.tensor([s])
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="sum") / count
        loss.backward()
        total += loss.detach()
    model.set_attn_implementation(before)
    return total, {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def tolerance(seqs) -> float:
    """fp64 relative tolerance: Higham's gamma_n = n u per dot product of length n, the longest reduction here
    max(intermediate 64, tokens of a micro-batch, vocab 97) <= 97, compounded over the depth a value passes through
    (2 sub-layers per layer, forward and backward: 4 * LAYERS + 2 for embeddings and head). The packed and the
    per-sample runs differ only in summation order, so their gap is within twice that."""
    n = max(64, VOCAB, CAPACITY)
    return 2 * (4 * LAYERS + 2) * n * 2.0 ** -53


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-300)
