"""Every keyword argument transformers passes to packkit's attention functions is implemented or refused by name.

* The table (``packkit.training.attention_args.ARGUMENTS``) is exactly each function's keyword list, and covers what
  transformers 5.x passes for several model families (recorded by running them).
* ``packkit_varlen`` (torch's varlen_attn on CUDA, packkit's per-document attention on the CPU): every refusal fires
  before a kernel runs; the sliding window (keyword or read from the layer) and Llama 4 chunks reach the CPU kernel
  and match per-sample SDPA (a kernel ignoring them fails the same check); non-causal layers run non-causal.
* ``packkit_shared_prefix``: positions must be the batch's own tensor (a call without ``position_ids`` is refused,
  so is a copy); a user ``attention_mask`` is refused for both functions although transformers never hands it to
  them; dropout, a KV cache, non-causal layers, short windows, flat-batch metadata, bad sinks are refused naming the
  feature and the model type.
"""
from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

import packkit
from packkit import shared_prefix as sp
from packkit.shared_prefix import hf
from packkit.training import attention_args, hf_attention

import attention_models
from shared_prefix_models import VOCAB

pytestmark = [pytest.mark.core, pytest.mark.exactness]

transformers = pytest.importorskip("transformers")

FUNCTIONS = {"packkit_varlen": hf_attention.varlen_attention_forward,
             "packkit_shared_prefix": hf.shared_prefix_attention_forward}
POSITIONAL = ["module", "query", "key", "value", "attention_mask"]


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_the_table_is_each_functions_keyword_list(name):
    params = inspect.signature(FUNCTIONS[name]).parameters
    named = [p for p, v in params.items() if v.kind != inspect.Parameter.VAR_KEYWORD]
    assert named[:5] == POSITIONAL
    assert sorted(named[5:]) == sorted(attention_args.ARGUMENTS)
    assert [v.kind for v in params.values()][-1] == inspect.Parameter.VAR_KEYWORD  # only to refuse the rest
    for arg, rule in attention_args.ARGUMENTS.items():
        assert rule.meaning and rule.varlen and rule.shared_prefix, arg


def _tiny(kind, **overrides):
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=128, use_cache=False)
    extra = {"gpt_oss": {"num_local_experts": 4, "num_experts_per_tok": 2, "experts_implementation": "eager"},
             "mistral": {"sliding_window": 3}, "gemma2": {"sliding_window": 3}, "cohere2": {"sliding_window": 3}}
    config = transformers.AutoConfig.for_model(kind, **{**common, **extra.get(kind, {}), **overrides})
    return transformers.AutoModelForCausalLM.from_config(config)


RECORDED = []


def _recording(module, query, key, value, attention_mask, **kwargs):
    RECORDED.append(set(kwargs))
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=kwargs.get("dropout", 0.0),
                                  scaling=kwargs.get("scaling"))


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen3", "gemma2", "gpt_oss", "cohere2", "olmo2", "phi3"])
def test_the_table_covers_what_transformers_passes(kind):
    """A packed PackingCollator batch (cu_seq_lens, seq_idx, num_items_in_batch), the model-call flags, a
    shared-prefix entry: every keyword that reaches the attention is in the table."""
    transformers.AttentionInterface.register("packkit_test_recording", _recording)
    model = _tiny(kind, **({"pad_token_id": 0} if kind == "phi3" else {}))
    model.set_attn_implementation("packkit_test_recording")
    batch = packkit.PackingCollator(16, return_num_items=True)([{"input_ids": [1, 2, 3, 4]}, {"input_ids": [5, 6]}])
    RECORDED.clear()
    with torch.no_grad():
        model(**batch, use_cache=False, output_attentions=True, output_hidden_states=True)
        model(input_ids=batch["input_ids"], use_cache=False, shared_prefix="x")
    seen = set().union(*RECORDED)
    assert {"dropout", "scaling", "cu_seq_lens_q", "shared_prefix"} <= seen
    assert seen <= set(attention_args.ARGUMENTS), sorted(seen - set(attention_args.ARGUMENTS))


# --- direct calls: refusals first, on CPU tensors (the varlen kernel is CUDA-only) ------------------------------
def _module(model_type="llama", causal=True):
    module = torch.nn.Module()
    module.is_causal = causal
    module.config = transformers.PretrainedConfig()
    module.config.model_type = model_type
    return module


def _varlen(module=None, length=6, **kw):
    q, kv = torch.zeros(1, 4, length, 8), torch.zeros(1, 2, length, 8)
    kw = {"cu_seq_lens_q": torch.tensor([0, length], dtype=torch.int32), "max_length_q": length, **kw}
    return hf_attention.varlen_attention_forward(module or _module(), q, kv, kv, None, **kw)


@pytest.mark.parametrize("kwargs, match", [
    ({"position_bias": torch.zeros(1)}, "model type 'gemma_x'.*position_bias.*neither implements nor knows"),
    ({"softcap": 0.0}, "model type 'gemma_x'.*softcap=0.0 is refused: a soft-cap must be a number > 0"),
    ({"s_aux": torch.zeros(2)}, "model type 'gemma_x'.*s_aux of shape \\(2,\\) is refused.*shape \\(4,\\)"),
    ({"cu_seq_lens_q": torch.tensor([0, 4])}, "model type 'gemma_x'.*cu_seq_lens_q = \\[0, 4\\] is refused.*6 tokens"),
    ({"cu_seq_lens_q": torch.tensor([0, 4, 2, 6])}, "cu_seq_lens_q = \\[0, 4, 2, 6\\] is refused"),
    ({"cu_seq_lens_k": torch.tensor([[0, 6]])}, "cu_seq_lens_k of shape \\(1, 2\\)"),
    ({"max_length_q": 5}, "max_length 5 below the longest document of cu_seq_lens_q \\(6\\)"),
    ({"dropout": 0.1}, "model type 'gemma_x'.*attention dropout \\(0.1\\) is refused"),
    ({"output_attentions": True}, "output_attentions=True is refused"),
    ({"shared_prefix": object()}, "a shared-prefix batch is refused"),
])
def test_varlen_refuses_by_name_before_the_kernel(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _varlen(_module("gemma_x"), **kwargs)


def test_varlen_refuses_cached_keys_devices_dtypes_and_windows_it_cannot_run():
    q, kv = torch.zeros(1, 4, 1, 8), torch.zeros(1, 2, 6, 8)
    with pytest.raises(ValueError, match="cached keys \\(6 keys for 1 queries\\)"):
        hf_attention.varlen_attention_forward(_module(), q, kv, kv, None, cu_seq_lens_q=torch.tensor([0, 1]),
                                              max_length_q=1)
    with pytest.raises(ValueError, match="sliding window of 3 on a non-causal layer"):
        _varlen(_module(causal=False), sliding_window=3)
    q = torch.zeros(1, 4, 6, 8, device="meta")
    with pytest.raises(ValueError, match="model type 'llama'.*tensors on meta is refused"):
        hf_attention.varlen_attention_forward(_module(), q, q, q, None, cu_seq_lens_q=torch.tensor([0, 6]),
                                              max_length_q=6)
    q = torch.zeros(1, 4, 6, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="torch.int32 on the CPU is refused"):
        hf_attention.varlen_attention_forward(_module(), q, q, q, None, cu_seq_lens_q=torch.tensor([0, 6]),
                                              max_length_q=6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_varlen_refuses_fp32_and_fp64_on_cuda_by_name(dtype):
    """On CUDA varlen_attn is FlashAttention (fp16 / bf16): fp32 / fp64 are refused by name before torch's own error
    surfaces from the first layer; the CPU path runs them."""
    with pytest.raises(ValueError, match=f"model type 'llama'.*{dtype} on CUDA is refused: .*bfloat16 and float16 "
                                         "only"):
        hf_attention.check_dtype(_module(), "cuda", dtype)
    hf_attention.check_dtype(_module(), "cpu", dtype)
    for ok in (torch.bfloat16, torch.float16):
        hf_attention.check_dtype(_module(), "cuda", ok)


def test_varlen_kernel_modes():
    """transformers' window w (a query sees keys i - j < w) is flash-attn's left window w - 1."""
    new, old = {"window_size": None}, {"is_causal": None}
    assert hf_attention._kernel_mode(new, True, None) == {"window_size": (-1, 0)}
    assert hf_attention._kernel_mode(new, True, 3) == {"window_size": (2, 0)}
    assert hf_attention._kernel_mode(new, False, None) == {"window_size": (-1, -1)}
    assert hf_attention._kernel_mode(old, False, None) == {"is_causal": False}
    with pytest.raises(ValueError, match="no window_size"):
        hf_attention._kernel_mode(old, True, 3)


def windowed_per_document(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, window=None):
    """varlen_attn's contract with transformers' window rule (i - j < w), one SDPA call per document."""
    out = []
    bounds = cu_q.tolist()
    for a, b in zip(bounds, bounds[1:]):
        i, j = torch.arange(b - a)[:, None], torch.arange(b - a)[None, :]
        visible = (j <= i) if causal else torch.ones(b - a, b - a, dtype=torch.bool)
        if window is not None:
            visible = visible & (i - j < window)
        out.append(F.scaled_dot_product_attention(q[a:b].transpose(0, 1), k[a:b].transpose(0, 1),
                                                  v[a:b].transpose(0, 1), attn_mask=visible,
                                                  scale=scale).transpose(0, 1))
    return torch.cat(out)


# Qwen2-MoE windows its sliding layers through the mask only (no sliding_window keyword reaches the attention).
QWEN2_MOE_WINDOW = dict(use_sliding_window=True, sliding_window=3, max_window_layers=1,
                        layer_types=["sliding_attention", "full_attention"], num_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=32, shared_expert_intermediate_size=32, experts_implementation="eager")


def _varlen_mistral_error(monkeypatch, kernel, kind="mistral", **overrides):
    if kernel is not None:
        monkeypatch.setattr(hf_attention, "_cpu_kernel", kernel)
    model = _tiny(kind, **overrides).to(torch.float64)
    seqs = [[3, 9, 4, 17, 22, 5, 8], [11, 2, 6], [7, 30, 12, 1, 9]]
    with torch.no_grad():
        alone = [model(input_ids=torch.tensor([s]), use_cache=False).logits[0] for s in seqs]  # SDPA, windowed
        model.set_attn_implementation(packkit.register_varlen_attention())
        batch = packkit.PackingCollator(16)([{"input_ids": s} for s in seqs])
        logits = model(**batch, use_cache=False).logits[0]
    starts = [0, 7, 10]
    return max(float((logits[a:a + len(s)] - ref).abs().max()) for a, s, ref in zip(starts, seqs, alone))


_REAL_CPU_KERNEL = hf_attention._cpu_kernel
DROPPED = []


def _dropping_window(*args, window=None, **kwargs):  # the CPU kernel losing the window (a control)
    DROPPED.append(window)
    return _REAL_CPU_KERNEL(*args, **kwargs)


def test_varlen_sliding_window_reaches_the_kernel(monkeypatch):
    """Mistral, window 3, documents of 7, 3 and 5 tokens, the CPU per-document attention: equal to per-sample SDPA;
    the reference kernel of the same contract agrees; a kernel that drops the window fails the same comparison."""
    assert _varlen_mistral_error(monkeypatch, None) <= 1e-12
    assert _varlen_mistral_error(monkeypatch, lambda *a, window=None, **k: windowed_per_document(
        *a, window=window)) <= 1e-12
    DROPPED.clear()
    assert _varlen_mistral_error(monkeypatch, _dropping_window) > 1e-3
    assert set(DROPPED) == {3}


def test_varlen_window_of_a_model_that_passes_none():
    """Qwen2-MoE passes no sliding_window keyword: the window is read from the layer (module.sliding_window,
    config.layer_types), so the packed run still equals per-sample SDPA; the shared-prefix attention refuses it."""
    mp = pytest.MonkeyPatch()
    try:
        assert _varlen_mistral_error(mp, None, "qwen2_moe", **QWEN2_MOE_WINDOW) <= 1e-12
        mp.undo()
        assert _varlen_mistral_error(mp, _dropping_window, "qwen2_moe", **QWEN2_MOE_WINDOW) > 1e-3  # control
    finally:
        mp.undo()
    model, batch = _shared("qwen2_moe", **QWEN2_MOE_WINDOW)
    with pytest.raises(ValueError, match="model type 'qwen2_moe'.*sliding window of 3 tokens, shorter"):
        model(**batch, use_cache=False)


def test_layer_limits_and_chunked_layers(monkeypatch):
    module = _module("llama4_text")
    module.layer_idx = 1
    module.config.layer_types = ["full_attention", "chunked_attention", "sliding_attention"]
    module.config.attention_chunk_size, module.config.sliding_window = 4, 7
    assert attention_args.layer_limits(module, None) == (None, 4)
    module.layer_idx = 2
    assert attention_args.layer_limits(module, None) == (7, None)
    assert attention_args.layer_limits(module, 5) == (5, None)  # the keyword wins
    module.sliding_window = False  # not a window: the layer type still is
    assert attention_args.layer_limits(module, None) == (7, None)
    module.config.layer_types[2] = "full_attention"
    assert attention_args.layer_limits(module, None) == (None, None)
    module.layer_idx = 1
    calls = []
    monkeypatch.setattr(hf_attention, "_cpu_kernel", lambda *a, **k: calls.append(k) or a[0])
    _varlen(module, length=6)  # the CPU kernel gets the chunk
    _varlen(module, length=4)  # one chunk holds every document: no effect
    assert calls == [{"softcap": None, "sink": None, "chunk": 4}, {"softcap": None, "sink": None}]
    with pytest.raises(ValueError, match="model type 'llama4_text'.*attention_chunk_size=4\\) on a non-causal layer"):
        _varlen(module, length=6, is_causal=False)
    attn = sp.pack_groups(PROMPTS, COMPLETIONS)[0]
    q = torch.zeros(1, 4, attn["input_ids"].shape[1], 8)
    with pytest.raises(ValueError, match="attention_chunk_size=4, shorter than the longest tree path"):
        hf.shared_prefix_attention_forward(module, q, q, q, None, shared_prefix=attn["shared_prefix"],
                                           position_ids=attn["position_ids"])


def test_varlen_non_causal_layer_runs_non_causal(monkeypatch):
    calls = []
    monkeypatch.setattr(hf_attention, "_cpu_kernel", lambda *a, **k: calls.append((a[8], k.get("window"))) or a[0])
    _varlen(_module(causal=False))
    _varlen(_module(causal=True), is_causal=False)
    _varlen(_module(), sliding_window=6)  # as long as the longest document: no window needed
    _varlen(_module(), sliding_window=5)
    assert calls == [(False, None), (False, None), (True, None), (True, 5)]


# --- shared-prefix: positions, masks and the refusals, through real models -----------------------------------
PROMPTS, COMPLETIONS = [[5, 9, 2, 33], [7, 1]], [[[18, 4], [60, 11, 3]], [[8], [21, 22]]]


def _shared(kind="llama", **overrides):
    model = _tiny(kind, **overrides).to(torch.float64)
    model.set_attn_implementation(sp.register_attention())
    batch, info = sp.pack_groups(PROMPTS, COMPLETIONS, attention="dense")
    return model, batch


def test_shared_prefix_positions_must_be_the_batchs_own():
    model, batch = _shared()
    with torch.no_grad():
        model(**batch, use_cache=False)  # the batch as packed: accepted
        with pytest.raises(ValueError, match="model type 'llama'.*position_ids is refused: they are not the batch"):
            model(input_ids=batch["input_ids"], shared_prefix=batch["shared_prefix"], use_cache=False)
        with pytest.raises(ValueError, match="position_ids is refused: they are not the batch"):
            model(**{**batch, "position_ids": batch["position_ids"].clone()}, use_cache=False)
    attn, q = batch["shared_prefix"], torch.zeros(1, 4, batch["input_ids"].shape[1], 8)
    with pytest.raises(ValueError, match="position_ids is refused: this model does not pass position_ids"):
        hf.shared_prefix_attention_forward(_module(), q, q, q, None, shared_prefix=attn)
    assert attn.positions_match(batch["position_ids"][:])  # a view of the same storage is the same positions


@pytest.mark.parametrize("register, pack", [
    (sp.register_attention, lambda: sp.pack_groups(PROMPTS, COMPLETIONS)[0]),
    (packkit.register_varlen_attention, lambda: packkit.PackingCollator(16)([{"input_ids": [1, 2, 3]}])),
])
@pytest.mark.parametrize("mask", ["ones", "zeros"])
def test_a_user_attention_mask_is_refused_although_transformers_drops_it(register, pack, mask):
    model = _tiny("llama")
    name = register()
    model.set_attn_implementation(name)
    batch = pack()
    attention_mask = torch.ones_like(batch["input_ids"])
    if mask == "zeros":
        attention_mask[:, -1] = 0
    with pytest.raises(ValueError, match=f"{name} on model type 'llama'.*called with an attention_mask"):
        model(**batch, attention_mask=attention_mask, use_cache=False)


def test_shared_prefix_refuses_by_name():
    model, batch = _shared()
    with torch.no_grad():
        with pytest.raises(ValueError, match="model type 'llama'.*KV cache"):
            model(**batch, use_cache=True)
        with pytest.raises(ValueError, match="model type 'llama'.*output_attentions=True is refused"):
            model(**batch, use_cache=False, output_attentions=True)
        with pytest.raises(ValueError, match="model type 'llama'.*cu_seq_lens_q, max_length_q next to a shared"):
            model(**batch, use_cache=False, cu_seq_lens_q=torch.tensor([0, 3]), max_length_q=3)
        with pytest.raises(ValueError, match="model type 'llama'.*the argument\\(s\\) mystery"):
            model(**batch, use_cache=False, mystery=1)
        with pytest.raises(ValueError, match="model type 'llama'.*seq_idx next to a shared"):
            model(**batch, use_cache=False, seq_idx=torch.zeros_like(batch["input_ids"]))
        with pytest.raises(ValueError, match="model type 'llama'.*a call without the batch's 'shared_prefix' entry"):
            model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
    model, batch = _shared(attention_dropout=0.1)
    model.train()
    with pytest.raises(ValueError, match="model type 'llama'.*attention dropout \\(0.1\\) is refused"):
        model(**batch, use_cache=False)
    model, batch = _shared("gemma2")  # sliding window 3 < the longest path (6 tokens)
    with pytest.raises(ValueError, match="model type 'gemma2'.*sliding window of 3 tokens, shorter than the longest"):
        model(**batch, use_cache=False)
    model, batch = _shared("gemma3_text", use_bidirectional_attention=True, sliding_window=64)
    with pytest.raises(ValueError, match="model type 'gemma3_text'.*non-causal"):
        model(**batch, use_cache=False)
    attn, q = batch["shared_prefix"], torch.zeros(1, 4, batch["input_ids"].shape[1], 8)
    pos = batch["position_ids"]
    with pytest.raises(ValueError, match="model type 'gpt_oss'.*s_aux of shape \\(2,\\)"):
        hf.shared_prefix_attention_forward(_module("gpt_oss"), q, q, q, None, shared_prefix=attn, position_ids=pos,
                                           s_aux=torch.zeros(2))
    with pytest.raises(ValueError, match="softcap=0.0"):
        hf.shared_prefix_attention_forward(_module(), q, q, q, None, shared_prefix=attn, position_ids=pos,
                                           softcap=0.0)
    with pytest.raises(ValueError, match="model type 'llama'.*non-causal"):
        hf.shared_prefix_attention_forward(_module(), q, q, q, None, shared_prefix=attn, position_ids=pos,
                                           is_causal=False)


def test_gemma2_and_gpt_oss_reach_the_shared_prefix_attention_with_softcap_and_sinks(monkeypatch):
    """The arguments arrive (not just the model runs): recorded at the attention."""
    seen = []
    forward = hf.shared_prefix_attention_forward
    monkeypatch.setattr(hf, "shared_prefix_attention_forward",
                        lambda *a, **k: seen.append((k.get("softcap"), k.get("s_aux") is not None)) or forward(*a, **k))
    for kind in ("gemma2", "gpt_oss"):
        model = attention_models.tiny(kind)
        model.set_attn_implementation(sp.register_attention())
        with torch.no_grad():
            model(**sp.pack_groups(PROMPTS, COMPLETIONS)[0], use_cache=False)
    assert seen == [(1.0, False)] * 2 + [(None, True)] * 2
