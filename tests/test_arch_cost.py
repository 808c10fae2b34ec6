"""``transformer_cost`` per architecture (issue 50 §6): MoE active experts, MLA head sizes, sliding-window, chunked
and linear-attention layers, checked on every zoo architecture's tiny model.

* The per-token part against torch's FLOP counter: a forward pass with the attention core hidden from the counter
  (every matmul outside it counted: projections, MLPs, routed experts, the LM head, a linear-attention layer's
  convolution and chunked delta rule) equals ``linear / 3`` per token (forward = a third of training) within 5%.
* The per-pair part: the eager attention's forward FLOPs (it computes the whole ``l x l`` square, masked or not)
  equal ``pair_flops / 3`` per square token of every attention layer (MLA's ``d_qk + d_v`` included), and the pairs
  a layer computes equal a brute-force count of transformers' own mask functions (causal, sliding window, chunked)
  for documents shorter and longer than the window.
* Controls: the dense Llama pair is exact (the old count), and a dense count of a windowed model overstates a
  long document's cost by the factor the window saves.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import packkit
from packkit.planning.arch_cost import DocumentCost, pairs

pytestmark = pytest.mark.core

transformers = pytest.importorskip("transformers")
model_zoo = pytest.importorskip("model_zoo")

# The zoo's attention models that take transformers' attention interface (so the attention core can be hidden from
# the counter) and the hybrids with a count. transformers' Llama 4 eager experts run every expert on every token
# (router scores zero the rest): its FLOPs are not a MoE's, so only its pairs are checked.
PER_TOKEN = ["llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
             "phi3", "olmo2", "granite", "cohere2", "glm4", "smollm3", "gpt_oss", "deepseek_v3", "deepseek_v3 (MLA v8)",
             "starcoder2", "ministral", "qwen3_5_text", "qwen3_next", "olmo_hybrid", "lfm2"]
# Recurrent mixers without a validated count: refused by name, never counted as dense attention. (Mamba 1 / 2
# mixers are counted and checked in tests/test_mixer_cost.py.)
NO_COUNT = ["kimi_linear", "bailing_hybrid", "rwkv", "xlstm", "recurrent_gemma", "deepseek_v4", "inkling_text",
            "minimax", "zaya"]


def _uncounted_attention():
    from torch.utils._python_dispatch import _disable_current_modes
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    def uncounted(module, query, key, value, attention_mask, **kwargs):  # the attention core, hidden from the counter
        with _disable_current_modes():
            return eager_attention_forward(module, query, key, value, attention_mask, **kwargs)
    transformers.AttentionInterface.register("packkit_test_uncounted", uncounted)
    return "packkit_test_uncounted"


def _forward_flops(config, attn: str, length: int) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn,
                                                              experts_implementation="eager").eval()
    # frozen: FlopCounterMode's module tracker hooks the grads of every module call's inputs, and transformers >= 5.25
    # calls a conv1d weight through the kernels package's Func module (under no_grad it finds no grad_fn and raises)
    model.requires_grad_(False)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(input_ids=torch.randint(3, 100, (1, length)), use_cache=False)
    return counter.get_total_flops()


def _parts(cost):
    if isinstance(cost, DocumentCost):
        return cost.linear, [(k, limit, f) for k, limit, f in cost.layers]
    a, b = cost
    return a - b, None


@pytest.mark.parametrize("name", PER_TOKEN)
def test_per_token_part_matches_the_flop_counter(name):
    config = model_zoo.tiny_config(name)
    cost = packkit.transformer_cost(config)
    linear, _ = _parts(cost)
    length = 128  # two linear-attention chunks, so no chunk is padded
    per_token = linear + sum(s(np.array([length]))[0] for s in getattr(cost, "scans", ())) / length
    counted = _forward_flops(config, _uncounted_attention(), length)
    assert counted == pytest.approx(per_token / 3 * length, rel=0.05), name


@pytest.mark.parametrize("name", ["llama", "gemma2", "deepseek_v3", "gpt_oss", "llama4_text", "mistral"])
def test_pair_flops_match_the_eager_square(name):
    config = model_zoo.tiny_config(name)
    cost = packkit.transformer_cost(config)
    length = 24
    square = _forward_flops(config, "eager", length) - _forward_flops(config, _uncounted_attention(), length)
    if isinstance(cost, DocumentCost):
        per_square_token = sum(f for _, _, f in cost.layers) / 3
    else:
        per_square_token = 2 * cost[1] / 3  # b is half the pair cost (l (l + 1) / 2 pairs)
    assert square == pytest.approx(per_square_token * length ** 2, rel=1e-9), name


def _brute_pairs(kind, limit, length):
    from transformers import masking_utils as mu

    fn = {"full": lambda: mu.causal_mask_function, "window": lambda: mu.sliding_window_causal_mask_function(limit),
          "chunk": lambda: mu.chunked_causal_mask_function(limit, torch.zeros(1, dtype=torch.long))}[kind]()
    zero = torch.tensor(0)
    return sum(bool(fn(zero, zero, torch.tensor(q), torch.tensor(k))) for q in range(length) for k in range(length))


@settings(max_examples=30, deadline=None)
@given(kind=st.sampled_from(["full", "window", "chunk"]), limit=st.integers(1, 9), length=st.integers(1, 30))
def test_pair_counts_equal_transformers_masks(kind, limit, length):
    assert pairs(kind, limit, np.array([length]))[0] == _brute_pairs(kind, limit, length)


@pytest.mark.parametrize("name", [n for n in NO_COUNT if n in model_zoo.ARCHITECTURES])
def test_recurrent_mixers_without_a_count_are_refused_by_name(name):
    config = model_zoo.tiny_config(name)
    with pytest.raises(ValueError, match=str(config.model_type)):
        packkit.transformer_cost(config)


def test_every_zoo_architecture_has_a_cost_or_a_named_refusal_and_windows_are_counted():
    for name in model_zoo.ARCHITECTURES:
        if name in NO_COUNT:
            continue
        cost = packkit.transformer_cost(model_zoo.tiny_config(name))
        kinds = model_zoo.tiny_config(name).to_dict().get("layer_types") or []
        if isinstance(cost, DocumentCost):
            long, short = cost(np.array([200])), cost(np.array([3]))
            assert long[0] > 0 and short[0] > 0
        else:
            assert set(kinds) <= {"full_attention"}, name


def test_control_a_dense_count_overstates_a_windowed_model():
    config = model_zoo.tiny_config("mistral")  # window 5 on every layer
    cost = packkit.transformer_cost(config)
    dense = packkit.transformer_cost(model_zoo.tiny_config("llama"))  # same sizes, full attention
    l = np.array([4, 4000])
    dense_cost = dense[0] * l + dense[1] * l ** 2
    assert cost(l)[0] == pytest.approx(dense_cost[0])  # shorter than the window: the same
    assert dense_cost[1] > 5 * cost(l)[1]  # longer: the dense count is wrong by far


def test_moe_counts_active_experts_only():
    dense = model_zoo.tiny_config("mistral")
    moe = model_zoo.tiny_config("mixtral")  # 4 experts, top 2: two MLPs a token, plus the router
    assert moe.num_local_experts == 4 and moe.num_experts_per_tok == 2
    mlp = 3 * 64 * 64 * 6 * 2  # one gated MLP, training, two layers
    router = 64 * 4 * 6 * 2
    assert packkit.transformer_cost(moe).linear == pytest.approx(packkit.transformer_cost(dense).linear + mlp + router)


def test_mla_pairs_use_qk_and_v_head_sizes():
    config = model_zoo.tiny_config("deepseek_v3")
    config.v_head_dim = 24
    a, b = packkit.transformer_cost(config)
    heads, d_qk = config.num_attention_heads, config.qk_nope_head_dim + config.qk_rope_head_dim
    assert b == 3 * heads * (d_qk + 24) * config.num_hidden_layers


def test_plan_balances_under_the_document_cost():
    config = model_zoo.tiny_config("gemma3_text")
    cost = packkit.transformer_cost(config)
    lengths = np.random.default_rng(0).integers(1, 300, 64)
    plan = packkit.plan(lengths, 512, algorithm="ogbfd", dp_size=2, cost=cost)
    assert plan.rank_costs.sum() == pytest.approx(cost(lengths).sum())
    direct = packkit.plan(lengths, 512, algorithm="ogbfd", dp_size=2, cost=config)  # a config as cost= too
    assert np.array_equal(direct.rank_costs, plan.rank_costs)


def test_bad_configs_are_named():
    config = model_zoo.tiny_config("gemma2")
    config.sliding_window = None
    with pytest.raises(ValueError, match="sliding window"):
        packkit.transformer_cost(config)
    config = model_zoo.tiny_config("llama")
    config.__dict__["layer_types"] = ["full_attention", "compressed_sparse_attention"]  # past HF's validator
    with pytest.raises(ValueError, match="compressed_sparse_attention"):
        packkit.transformer_cost(config)
    config = model_zoo.tiny_config("qwen3_5_text")
    config.__dict__["linear_key_head_dim"] = None
    with pytest.raises(ValueError, match="linear-attention key head size"):
        packkit.transformer_cost(config)
    with pytest.raises(TypeError, match="no \\(a, b\\) pair"):
        a, b = packkit.transformer_cost(model_zoo.tiny_config("mistral"))


def test_a_loaded_vlm_config_is_costed_by_its_text_part():
    """A Qwen2.5-VL config whose loader copied the text part's hidden_size to the top level (ms-swift does) but
    not its layer count: costed by the text part, as the plain config is (it raised 'needs the layer count')."""
    text = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]})
    config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=dict(depth=1, hidden_size=16,
                                                                                  out_hidden_size=32))
    want = packkit.transformer_cost(config.text_config)
    assert packkit.transformer_cost(config) == want
    config.hidden_size = 32
    assert packkit.transformer_cost(config) == want
