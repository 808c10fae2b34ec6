"""What packkit knows about each model family on each packing path: exact, exact once ``prepare_model`` has installed
its per-document stand-ins, or refused (and why).

The paths (how a packed batch reaches the model's attention):

- ``position_ids``: ``attn_implementation`` ``"sdpa"`` / ``"eager"``; transformers finds the documents from the
  batch's restarting ``position_ids`` (its packed-sequence detection) and recurrent layers get ``cu_seq_lens_q`` /
  ``seq_idx``.
- ``flash_attention``: transformers' ``flash_attention_2`` / ``_3`` (and hub kernels): ``cu_seq_lens_q`` reach the
  kernel (a GPU path; the zoo does not run it).
- ``packkit_varlen``: ``packkit.register_varlen_attention()``.
- ``flex_attention``: ``PackingCollator(return_block_mask=True, model_config=...)``.
- ``shared_prefix``: ``packkit.shared_prefix`` (``pack_groups`` / ``pack_tree``, any of its attentions).

The refusals come from reading transformers' modeling code and from the model zoo / survey (tests/model_zoo.py,
tools/model_zoo_table.py), which found each of them silently wrong without it. Model types neither the zoo nor the
survey ran are "unverified".
"""
from __future__ import annotations

PATHS = ("position_ids", "flash_attention", "packkit_varlen", "flex_attention", "shared_prefix")
ALL = PATHS

_NO_BOUNDARIES = ("its recurrent layers take no document boundaries from transformers (the state runs from one packed "
                  "document into the next) and packkit has no per-document stand-in for them")
_MASK_ROW = ("builds {what} from the attention mask over the whole row (its own attention code, which reads neither "
             "the packed position_ids nor cu_seq_lens_q)")

# DeepSeek Sparse Attention (the survey: a TypeError inside transformers on these paths, now refused by name)
_SPARSE_INDEXER = ("its sparse-attention indexer (DeepSeek Sparse Attention) picks each query's keys from the 4-D "
                   "causal mask, which transformers builds only for sdpa / eager / flex (use the position_ids path)")

# model_type -> {path: why it cannot be exact}. Found silently wrong by the survey (docs/reliability.md) unless noted.
_NO_DETECTION = ("transformers' {} builds its masks without position_ids, so the packed documents attend to each "
                 "other (no packed-sequence detection) on sdpa / eager")
REFUSED = {
    "gpt_oss": {"position_ids": _NO_DETECTION.format("GptOssModel")},
    "afmoe": {"position_ids": _NO_DETECTION.format("AfmoeModel")},
    "granitemoehybrid": {"position_ids": _NO_DETECTION.format("GraniteMoeHybridModel")},
    "deepseek_v4": {"position_ids": "its compressed-attention layers pool keys over the whole row, across the packed "
                                    "documents",
                    "packkit_varlen": "its compressed-attention layers' parameter gradients differ from per-sample "
                                      "(found by packkit's model zoo; the log-probs agree)"},
    "doge": {"flex_attention": "its own flex attention (doge_flex_attention) adds a dynamic mask that does not keep to "
                               "the packed BlockMask's documents"},
    "bloom": {**{p: "BLOOM " + _MASK_ROW.format(what="its ALiBi biases and causal mask") for p in
                 ("position_ids", "flash_attention", "packkit_varlen", "shared_prefix")},
              "flex_attention": "BLOOM's own attention code takes no BlockMask (it fails unpacking one)"},
    "opt": {p: "OPT " + _MASK_ROW.format(what="its learned positions (the mask's cumulative sum)") for p in
            ("position_ids", "flash_attention", "packkit_varlen", "shared_prefix")},
    "biogpt": {p: "BioGPT " + _MASK_ROW.format(what="its learned positions (the mask's cumulative sum)") for p in
               ("position_ids", "flash_attention")},
    "ctrl": {p: "CTRL " + _MASK_ROW.format(what="its causal mask") for p in
             ("position_ids", "flash_attention", "packkit_varlen")},
    "git": {p: "GIT " + _MASK_ROW.format(what="its causal mask") for p in
            ("position_ids", "flash_attention", "packkit_varlen", "shared_prefix")},
    "cpmant": {p: "CPM-Ant " + _MASK_ROW.format(what="its position bias and causal mask") for p in
               ("position_ids", "flash_attention", "packkit_varlen", "flex_attention", "shared_prefix")},
    # Found by the survey once it stopped skipping GPT-NeoX configs (an `is_decoder` field) as encoders: a TypeError
    # inside transformers, where its own attention adds the mask to the scores.
    "gpt_neox_japanese": {"flex_attention": "GPT-NeoX-Japanese's own attention code adds the attention mask to its "
                                            "scores, which a BlockMask cannot be (it fails inside transformers)",
                          "shared_prefix": "GPT-NeoX-Japanese's own attention code does not call transformers' "
                                           "attention interface, so packkit's shared-prefix attention is never called"},
    "beam": {"shared_prefix": "silently wrong on every shared-prefix attention in packkit's model survey (its attention "
                              "does not keep to the tree's branches)"},
    **{t: {p: _SPARSE_INDEXER for p in ("packkit_varlen", "shared_prefix")}
       for t in ("deepseek_v32", "glm_moe_dsa", "axk2", "hy_v4")},
    "inkling_text": {p: "its short convolutions (the attention's key / value, attention-output and MLP ones) are "
                        "called without the batch's seq_idx, so they run across the packed documents on every "
                        "causal_conv1d_fn, the package's kernel included" for p in ("position_ids", "flash_attention")}
                     | {"packkit_varlen": "its attention passes a learned relative position_bias, which packkit's varlen "
                                          "attention does not implement"},
    "mpt": {**{p: "MPT " + _MASK_ROW.format(what="its ALiBi biases and causal mask") for p in
               ("position_ids", "flash_attention", "packkit_varlen", "shared_prefix")},
            "flex_attention": "MPT's own attention code takes no BlockMask (it fails applying one)"},
    "openai-gpt": {**{p: "OpenAI GPT applies one causal mask over the whole row (its own attention code, which reads "
                         "neither the packed position_ids nor cu_seq_lens_q)" for p in
                      ("position_ids", "flash_attention", "packkit_varlen", "shared_prefix")},
                   "flex_attention": "OpenAI GPT's own attention code takes no BlockMask (it fails applying one)"},
    "gpt_neo": {"shared_prefix": "GPT-Neo's own attention code never calls packkit's shared-prefix attention",
                "flex_attention": "GPT-Neo's own attention code takes no BlockMask (it fails adding one)"},
    "xlm": {**{p: "XLM applies one causal mask over the whole row (its own attention code, which reads neither the "
                  "packed position_ids nor cu_seq_lens_q)" for p in
               ("position_ids", "flash_attention", "packkit_varlen", "shared_prefix")},
            "flex_attention": "XLM's own attention code takes no BlockMask (it fails applying one)"},
    "zaya": {p: "its compressed convolutional attention (CCA) runs a causal convolution over the whole row "
                "(transformers' own PyTorch code, given no document boundaries)" for p in PATHS},
    "minimax": {p: "its lightning-attention (linear attention) layers are transformers' own PyTorch code and take no "
                   "document boundaries (the state runs from one packed document into the next)" for p in PATHS},
    "rwkv": {p: _NO_BOUNDARIES for p in PATHS},
    "xlstm": {p: _NO_BOUNDARIES for p in PATHS},
    "recurrent_gemma": {p: _NO_BOUNDARIES for p in PATHS},
}

# Families whose recurrent layers packkit runs per document itself (their transformers code passes the layer no
# boundaries): model_type -> the mixer classes. Mamba-1 layers (selective scan); Mamba2ForCausalLM does not pass the
# batch's keywords on to its backbone.
MIXERS = {
    "mamba2": ("Mamba2Mixer",),
    "mamba": ("MambaMixer",),
    "falcon_mamba": ("FalconMambaMixer",),
    "jamba": ("JambaMambaMixer",),
}

# Types the zoo or the survey ran on the pinned transformers (every other cell exact, or refused by its entry point).
VERIFIED = frozenset("""
llama mistral mixtral qwen2 qwen2_moe qwen3 qwen3_moe gemma gemma2 gemma3_text phi3 olmo2 granite cohere2 glm4 smollm3
gpt_oss deepseek_v3 llama4_text starcoder2 ministral qwen3_5_text
apertus apertus1p5_text arcee aria_text bailing_hybrid bitnet cohere cohere2_moe cwm diffllama dory ernie4_5
ernie4_5_moe exaone exaone4 exaone_moe falcon_h1 flex_olmo flint gemma4_text gemma4_unified_text glm gpt-sw3 gpt2
gpt_bigcode granite_swa granitemoe granitemoe_swa granitemoeshared helium hrm_text hunyuan_v1_dense hunyuan_v1_moe
hyperclovax inkling2_loop_text inkling2_text internlm3 iquestcoder jais2 jetmoe lara_mini mellum minimax_m2
minimax_m3_vl_text ministral3 modernbert-decoder moshi nanochat nemotron olmo olmo3 olmo_hybrid olmoe persimmon phi
phimoe seed_oss stablelm vaultgemma
afmoe beam biogpt bloom cpmant ctrl deepseek_v4 doge falcon_mamba git jamba mamba opt recurrent_gemma rwkv xlstm
inkling_text minimax mpt openai-gpt xlm zaya gpt_neo gpt_neox gpt_neox_japanese
axk1 axk2 codegen deepseek_v2 deepseek_v32 dots1 glm4_moe glm4_moe_lite glm_moe_dsa gptj hy_v3 hy_v4 kolibri1 laguna
lfm2_moe lfm3 longcat_flash mimo_v2_flash minicpm3 qwen3_5_moe_text qwen4_exp_text sarvam_mla sarvam_moe solar_open youtu
qwen3_next bamba granitemoehybrid nemotron_h mamba2 zamba2 lfm2 kimi_linear
""".split())

# Recurrent families whose per-document stand-ins / mixers the zoo checks exact (others get them, "unverified").
STAND_INS_VERIFIED = frozenset("""
qwen3_5_text qwen3_next olmo_hybrid bamba granitemoehybrid nemotron_h falcon_h1 mamba2 zamba2 lfm2 kimi_linear
bailing_hybrid mamba falcon_mamba jamba
""".split())

FLEX_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


def attention_path(attn_implementation) -> str:
    """The packing path of a model set to ``attn_implementation``."""
    name = str(attn_implementation or "sdpa")
    if name in ("sdpa", "eager"):
        return "position_ids"
    if name.startswith("flash_attention") or "/" in name:
        return "flash_attention"
    if name == "packkit_varlen":
        return "packkit_varlen"
    if name == "flex_attention":
        return "flex_attention"
    if name == "packkit_shared_prefix":
        return "shared_prefix"
    raise ValueError(f"attention implementation {name!r} is not a packing path packkit knows (known: sdpa, eager, "
                     "flash_attention_2 / _3, packkit_varlen, flex_attention, packkit_shared_prefix)")
