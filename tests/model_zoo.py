"""The model zoo: tiny random-init decoder-only HF models, fp64 end to end, and every CPU packing path packkit
offers run on them against per-sample references (tests/test_model_zoo.py, tools/model_zoo_table.py).

The cases, their comparison and the table are in tests/model_zoo_cases.py.

fp64 end to end: transformers computes norms, rotary tables, routers and the eager softmax in fp32 even in an
fp64 model, which caps agreement at ~1e-7 (REFERENCE §12, §15). :func:`fp64_everywhere` recompiles those
functions of the model's own modeling module with fp32 replaced by fp64 (the source is the model's, only the
dtype changes). The reference runs each sample alone with SDPA, or, for models transformers runs without SDPA
(softcap, sinks: Gemma 2, GPT-OSS), with the model's own eager attention, now fp64.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import re
import sys
import textwrap
import warnings
from typing import Optional

import torch

VOCAB, WINDOW, CHUNK = 128, 5, 4

# The architectures the suite runs (model_type of transformers' causal-LM auto mapping), and what each tiny
# config needs beyond the common one. Windows (5) and chunks (4) are shorter than the documents (up to 13).
SLIDING_FULL = ["sliding_attention", "full_attention"]
ARCHITECTURES = {
    "llama": {},
    "mistral": dict(sliding_window=WINDOW),
    "mixtral": dict(sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2),
    "qwen2": dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, layer_types=SLIDING_FULL),
    "qwen2_moe": dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, layer_types=SLIDING_FULL,
                      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=32, decoder_sparse_step=1),
    "qwen3": dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, layer_types=SLIDING_FULL),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1),
    "gemma": {},
    "gemma2": dict(sliding_window=WINDOW, layer_types=SLIDING_FULL, attn_logit_softcapping=2.0,
                   final_logit_softcapping=5.0, query_pre_attn_scalar=16),
    "gemma3_text": dict(sliding_window=WINDOW, layer_types=SLIDING_FULL, query_pre_attn_scalar=16),
    "phi3": dict(sliding_window=WINDOW),
    "olmo2": {},
    "granite": {},
    "cohere2": dict(sliding_window=WINDOW, layer_types=SLIDING_FULL),
    "glm4": {},
    "smollm3": {},
    "gpt_oss": dict(sliding_window=WINDOW, layer_types=SLIDING_FULL, num_local_experts=4, num_experts_per_tok=2),
    "deepseek_v3": dict(kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                        first_k_dense_replace=1, n_group=1, topk_group=1, head_dim=8, num_key_value_heads=4),
    # MLA with value heads smaller than the query/key heads (16): DeepSeek-V3 / Kimi-K2 shapes
    "deepseek_v3 (MLA v8)": dict(model_type="deepseek_v3", kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
                                 qk_nope_head_dim=8, v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
                                 topk_group=1, head_dim=8, num_key_value_heads=4),
    "llama4_text": dict(attention_chunk_size=CHUNK, layer_types=["chunked_attention", "full_attention"],
                        no_rope_layers=[1, 0], num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=64,
                        interleave_moe_layer_step=1),
    "starcoder2": dict(sliding_window=WINDOW),
    "ministral": dict(sliding_window=WINDOW, layer_types=["sliding_attention", "sliding_attention"]),
    # Windows longer than every document and tree path: the shared-prefix paths run, and softcap / sinks count.
    "gemma2 (window 64)": dict(model_type="gemma2", sliding_window=64, layer_types=SLIDING_FULL,
                               attn_logit_softcapping=2.0, final_logit_softcapping=5.0, query_pre_attn_scalar=16),
    "gpt_oss (window 64)": dict(model_type="gpt_oss", sliding_window=64, layer_types=SLIDING_FULL,
                                num_local_experts=4, num_experts_per_tok=2),
    "qwen3_5_text": dict(layer_types=["linear_attention", "full_attention"], linear_key_head_dim=8,
                         linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=2),
    # Hybrid / state-space families (issue 50): their recurrent layers run per document after prepare_model where
    # the kernel packages are absent. Scan chunks (8) shorter than the longest document (13).
    "qwen3_next": dict(layer_types=["linear_attention", "full_attention"], linear_key_head_dim=8,
                       linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=2, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32),
    "olmo_hybrid": dict(layer_types=["linear_attention", "full_attention"], linear_key_head_dim=8,
                        linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=2),
    "bamba": dict(attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=32, mamba_d_state=8, mamba_chunk_size=8),
    "granitemoehybrid": dict(layer_types=["linear_attention", "full_attention"], num_local_experts=4,
                             mamba_n_heads=4, mamba_d_head=32, mamba_d_state=8, mamba_chunk_size=8),
    "nemotron_h": dict(layers_block_type=["linear_attention", "full_attention"], mamba_num_heads=4,
                       mamba_head_dim=32, ssm_state_size=8, n_groups=1, chunk_size=8),
    "falcon_h1": dict(mamba_d_ssm=128, mamba_n_heads=4, mamba_d_head=32, mamba_d_state=8, mamba_chunk_size=8),
    "mamba2": dict(num_heads=4, head_dim=32, state_size=8, n_groups=1, chunk_size=8),
    "zamba2": dict(layers_block_type=["linear_attention", "hybrid"], n_mamba_heads=4, mamba_d_state=8,
                   chunk_size=8, adapter_rank=8),
    "lfm2": dict(layer_types=["conv", "full_attention"], full_attn_idxs=[1]),
    "kimi_linear": dict(layer_types=["linear_attention", "full_attention"], linear_head_dim=8, linear_num_heads=2,
                        mlp_layer_types=["dense", "sparse"], num_experts=4, num_experts_per_token=2,
                        moe_intermediate_size=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, num_key_value_heads=4,
                        kv_lora_rank=16),
    # Families found silently wrong by the survey on some paths: exact where prepare_model lets them run, refused
    # (by prepare_model or the path's entry point) elsewhere.
    "opt": {},
    "bloom": {},
    "biogpt": {},
    "ctrl": {},
    "git": dict(num_hidden_layers=1, vision_config=dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                                                         num_attention_heads=2, image_size=32, patch_size=16)),
    "cpmant": dict(num_hidden_layers=1),
    "deepseek_v4": {},
    "afmoe": dict(num_experts=4, num_experts_per_tok=2, num_shared_experts=1, moe_intermediate_size=32,
                  sliding_window=WINDOW, global_attn_every_n_layers=2),
    "doge": {},
    "xlstm": {},
    "recurrent_gemma": {},
    "rwkv": {},
    "bailing_hybrid": dict(layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "sparse"],
                           num_local_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, moe_intermediate_size=32,
                           kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                           num_key_value_heads=4, first_k_dense_replace=1, num_mtp_layers=0),
    "mamba": {},
    "falcon_mamba": {},
    # short convolutions called without seq_idx (the survey): refused on sdpa, the other paths by their entry points
    "inkling_text": dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1),
    # lightning-attention layers without document boundaries (the survey): refused on every path
    "minimax": dict(layer_types=["linear_attention", "full_attention"], num_local_experts=4, num_experts_per_tok=2,
                    block_size=4),
    # their own attention code over the whole row (the survey, once a flex crash no longer hid their other cells)
    "mpt": {},
    "openai-gpt": {},
    "xlm": {},
    # the survey's 2e-10 mismatch was its attention's fp32 cast in _attn (now fp64): exact on sdpa / varlen
    "gpt_neo": dict(attention_types=[[["global", "local"], 1]], window_size=WINDOW),
    "zaya": {},  # its compressed convolutional attention convolves over the whole row: refused on every path
    "jamba": dict(attn_layer_period=2, attn_layer_offset=1, num_experts=4, expert_layer_period=2,
                  expert_layer_offset=1, use_mamba_kernels=False),
}
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, use_cache=False,
              tie_word_embeddings=False, attention_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2)

# path -> (column title, gradients checked). FlexAttention has no backward on the CPU (torch raises).
PATHS = {
    "sft": ("SFT `PackingCollator`, position_ids (sdpa)", True),
    "sft_varlen": ("SFT `register_varlen_attention()` (per-document kernel)", True),
    "sft_flex": ("SFT `return_block_mask=True, model_config=`, flex", False),
    "sft_flex_plain": ("SFT `return_block_mask=True` (no config), flex", False),
    "groups_varlen": ("`pack_groups` varlen", True),
    "groups_flex": ("`pack_groups` flex", False),
    "groups_dense": ("`pack_groups` dense", True),
    "tree_varlen": ("`pack_tree` varlen", True),
    "tree_flex": ("`pack_tree` flex", False),
    "tree_dense": ("`pack_tree` dense", True),
}


# -- fp64 end to end --------------------------------------------------------------------------------------
_FP32 = re.compile(r"torch\.float32\b|torch\.float\b(?!\d)")


def _fp64_source(function, owner: Optional[type] = None) -> Optional[str]:
    if getattr(function, "_zoo_fp64", False):  # already recompiled (another model of the session shares it)
        return None
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return None
    if not (_FP32.search(source) or ".float()" in source) or ("super()" in source and owner is None):
        return None
    if owner is not None:  # a recompiled method has no __class__ cell: name the class (module level) instead
        source = source.replace("super()", f"super({owner.__name__}, self)")
    return _FP32.sub("torch.float64", source).replace(".float()", ".double()")


def _recompiled(function, owner: Optional[type] = None):
    """``function`` compiled again from its source with fp32 replaced by fp64, in its own module's globals."""
    source = _fp64_source(function, owner)
    if source is None:
        return None
    module = sys.modules[function.__module__]
    namespace = {}
    try:  # a decorator that only works inside its class body: leave the function as it is (the case shows it)
        exec(compile(source, f"<fp64 {function.__qualname__}>", "exec"), module.__dict__, namespace)
        (recompiled,) = namespace.values()
    except Exception:  # noqa: BLE001
        return function
    recompiled._zoo_fp64 = True
    return recompiled


def fp64_everywhere(model, monkeypatch) -> None:
    """Make every fp32 cast of ``model``'s own classes (norms, rotary, routers) and of its modeling module's
    module functions (``eager_attention_forward``, rotary helpers) an fp64 one (``monkeypatch``: a pytest
    MonkeyPatch, undone by its owner)."""
    classes = {type(m) for m in model.modules() if type(m).__module__.startswith("transformers.models.")}
    for cls in classes:
        function = inspect.unwrap(cls.forward) if "forward" in vars(cls) else None
        if function is not None and _fp64_source(function, cls) is not None:
            monkeypatch.setattr(cls, "forward", _recompiled(cls.forward, cls))
        for attr, method in list(vars(cls).items()):  # helpers forward calls (GPT-Neo's _attn casts to fp32)
            if attr != "forward" and inspect.isfunction(method) and _fp64_source(method, cls) is not None:
                monkeypatch.setattr(cls, attr, _recompiled(method, cls))
    for name in {c.__module__ for c in classes}:  # module functions: eager attention, rotary helpers
        module = sys.modules[name]
        for attr, function in list(vars(module).items()):
            if hasattr(function, "__packkit_original__"):  # a stand-in prepare_model installed: it wraps, not casts
                continue
            if inspect.isfunction(function) and function.__module__ == name and _fp64_source(function) is not None:
                monkeypatch.setattr(module, attr, _recompiled(function))
            elif isinstance(function, torch.nn.Module) and not isinstance(function, type):
                # transformers >= 5.25: a kernel function decorated by the kernels package is a Func module around
                # the module's function; recompiling that function's source (its decorator lines included) builds
                # a new one
                from packkit.models.kernels import _inner_functions

                inner = next((f for f in _inner_functions(function) if f.__module__ == name
                              and _fp64_source(f) is not None), None)
                if inner is not None:
                    monkeypatch.setattr(module, attr, _recompiled(inner))


def eager_flex_attention(monkeypatch) -> None:
    """transformers compiles flex_attention (inductor, minutes on this CPU); its eager form computes the same
    mask and score_mod exactly (dense math): the zoo checks masks and arguments, not the kernel."""
    from torch.nn.attention.flex_attention import flex_attention
    from transformers.integrations import flex_attention as hf_flex

    monkeypatch.setattr(hf_flex, "compile_friendly_flex_attention",
                        lambda q, k, v, training=False, **kw: flex_attention(q, k, v, **kw))


_SESSION = []  # the MonkeyPatch of the open zoo_session()
CACHES = []  # lru_caches of models and references: emptied when the session ends


@contextlib.contextmanager
def zoo_session():
    """fp64 patches and eager flex for the zoo's models; everything undone (and the model caches emptied) after."""
    import pytest

    patch = pytest.MonkeyPatch()
    _SESSION.append(patch)
    eager_flex_attention(patch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only add contention
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        _SESSION.remove(patch)
        patch.undo()
        for cache in CACHES:
            cache.cache_clear()


# -- models ---------------------------------------------------------------------------------------------------
# Cells where transformers itself, not packkit, is silently wrong: packkit.prepare_model refuses them, and the suite
# checks that unprepared they still are wrong (so a fixed transformers shows up).
TRANSFORMERS_MISMATCHES = {
    ("gpt_oss", "sft"): "transformers' GptOssModel builds its masks without position_ids, so the packed "
                        "documents attend to each other (no packed-sequence detection) on sdpa / eager",
    ("granitemoehybrid", "sft"): "transformers' GraniteMoeHybridModel builds its masks without position_ids",
    ("afmoe", "sft"): "transformers' AfmoeModel builds its masks without position_ids",
}
TRANSFORMERS_MISMATCHES[("gpt_oss (window 64)", "sft")] = TRANSFORMERS_MISMATCHES[("gpt_oss", "sft")]


def tiny_config(name: str):
    """The tiny config of a zoo entry (an ``ARCHITECTURES`` key: a model type, or a variant naming one)."""
    from transformers import AutoConfig

    spec = dict(ARCHITECTURES[name])
    model_type = spec.pop("model_type", name)
    return AutoConfig.for_model(model_type, **{**COMMON, **spec})


@functools.lru_cache(maxsize=None)
def tiny_model(model_type: str):
    """(model, reference attention) — fp64, eval mode (no dropout), weights from seed 0."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # experts: the per-expert loop (torch's grouped_mm has no fp64 on the CPU)
        model = AutoModelForCausalLM.from_config(tiny_config(model_type), attn_implementation="eager",
                                                 experts_implementation="eager")
    model = model.to(torch.float64).eval()
    if not _SESSION:
        raise RuntimeError("build zoo models inside model_zoo.zoo_session()")
    fp64_everywhere(model, _SESSION[-1])
    reference = "sdpa" if getattr(model, "_supports_sdpa", False) else "eager"
    model.set_attn_implementation(reference)
    return model, reference
