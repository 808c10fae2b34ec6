"""packkit.transformer_cost: hand count and torch's FLOP counter on a real (tiny) Llama."""
from __future__ import annotations

import pytest
import torch

import packkit

pytestmark = pytest.mark.core

transformers = pytest.importorskip("transformers")


def tiny_llama_config():
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=1000, max_position_embeddings=512)


def test_hand_count():
    # head_dim 16. Per layer: Q 64*64 + K, V 2*64*32 + O 64*64 + MLP 3*64*176 = 46080 weights;
    # 2 layers + LM head 64*1000 = 156160. Attention per pair: 12 * 4 heads * 16 * 2 layers = 1536;
    # causal l(l+1)/2 pairs -> b = 768 and 768 more per token.
    a, b = packkit.transformer_cost(tiny_llama_config())
    assert (a, b) == (6 * 156160 + 768, 768)
    assert packkit.transformer_cost(hidden_size=64, num_layers=2, intermediate_size=176, num_heads=4, num_kv_heads=2,
                                    vocab_size=1000) == (a, b)
    assert packkit.transformer_cost(tiny_llama_config().to_dict()) == (a, b)


def test_forward_flops_match_torch_flop_counter():
    # Eager attention computes the full l x l score matrix, so forward FLOPs are 2*P*l + 4*n*d*L*l^2,
    # i.e. (a - b)/3 per token and 2b/3 per square token: the same weights and pair cost as (a, b).
    from torch.utils.flop_counter import FlopCounterMode

    config = tiny_llama_config()
    config._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(config).eval()
    a, b = packkit.transformer_cost(config)
    for length in (7, 33):
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model(torch.zeros(1, length, dtype=torch.long), use_cache=False)
        assert counter.get_total_flops() == (a - b) / 3 * length + 2 * b / 3 * length ** 2


def test_llama3_8b_ratio():
    a, b = packkit.transformer_cost(hidden_size=4096, num_layers=32, intermediate_size=14336, num_heads=32,
                                    num_kv_heads=8, vocab_size=128256)
    assert 57_000 < a / b < 57_500  # the document length where attention costs as much as the rest


def test_bad_input():
    with pytest.raises(ValueError, match="num_layers"):
        packkit.transformer_cost(hidden_size=64, intermediate_size=176, num_heads=4, vocab_size=10)
    with pytest.raises(TypeError, match="hidden_size"):
        packkit.transformer_cost(hidden_size=64.0, num_layers=2, intermediate_size=176, num_heads=4, vocab_size=10)
    with pytest.raises(ValueError, match="multiple"):
        packkit.transformer_cost(hidden_size=64, num_layers=2, intermediate_size=176, num_heads=4, num_kv_heads=3,
                                 vocab_size=10)


def test_plan_and_sampler_take_the_model_cost():
    cost = packkit.transformer_cost(tiny_llama_config())
    lengths = [300, 20, 512, 97, 150, 400, 33, 5]
    plan = packkit.plan(lengths, 512, algorithm="ogbfd", dp_size=2, cost=cost)
    a, b = cost
    assert plan.rank_costs.sum() == pytest.approx(sum(a * l + b * l * l for l in lengths))
    sampler = packkit.PackedBatchSampler(lengths, 512, rank=0, world_size=2, cost=cost)
    assert sampler.plan.rank_costs.sum() == pytest.approx(plan.rank_costs.sum())
    # a config is accepted directly as cost= too
    assert packkit.plan(lengths, 512, algorithm="ogbfd", dp_size=2, cost=tiny_llama_config()).cost_ab == cost
