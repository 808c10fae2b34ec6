"""``transformer_cost`` of Mamba 1 / Mamba 2 mixers (issue 50 §6; ``packkit.planning.mixer_cost``), checked on the
zoo's tiny models, forward + backward, one document at a time, for documents shorter than, equal to and longer
than a scan chunk (8) and not a multiple of it.

* Matmuls and convolutions: torch's FLOP counter over a whole training step equals ``cost(l)`` exactly, after
  three stated differences between transformers' torch reference and the kernels the cost counts: (1) the
  reference's causal conv1d computes ``l + K - 1`` outputs (zero padding both sides, then sliced), the kernel
  ``l``; (2) the Mamba 2 reference pads each document to whole chunks (mamba-ssm chunks the packed row), repeats B
  and C to every head (``C B^T`` per head, not per group) and passes the state between chunks as a
  ``(c + 1) x (c + 1)`` matmul where the kernel scans; (3) eager attention computes the whole ``l x l`` square where
  the cost counts causal pairs. torch's counter counts a grouped convolution's backward
  as a dense one (groups ignored), so the convolutions' forward count is taken twice for their backward.
* Elementwise recurrence: the operations of the reference scan, counted by a dispatch mode, equal the cost's count
  (Mamba 1: 6 per state entry and token; Mamba 2: 2 per in-chunk pair and head).
* Controls: a count that ignores the chunk padding, leaves the scans out, counts the Zamba2 adapters a layer does
  not run, or has one elementwise operation too few, fails.
"""
from __future__ import annotations

import functools
import math
import warnings

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import packkit
from packkit.planning import mixer_cost
from packkit.planning.arch_cost import DocumentCost

pytestmark = pytest.mark.full

transformers = pytest.importorskip("transformers")
model_zoo = pytest.importorskip("model_zoo")

SCAN_MODELS = ["mamba", "falcon_mamba", "jamba", "mamba2", "bamba", "granitemoehybrid", "nemotron_h", "falcon_h1",
               "nemotron_h (mlp, moe)", "zamba2", "zamba2 (2 shared blocks, adapters)"]
# Nemotron-H's MLP-only and MoE-only layers (the 8B / 30B layouts have them)
NEMOTRON_MLP_MOE = dict(layers_block_type=["linear_attention", "mlp", "full_attention", "moe"], num_hidden_layers=4,
                        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        moe_shared_expert_intermediate_size=32, n_group=1, topk_group=1)
# Zamba2's shared blocks: three hybrid layers over two tied blocks, each layer with its own adapters
ZAMBA2_SHARED = dict(layers_block_type=["hybrid", "linear_attention", "hybrid", "hybrid"], num_hidden_layers=4,
                     num_mem_blocks=2, use_shared_attention_adapter=True, head_dim=32,
                     num_key_value_heads=4)  # the adapters are 2 h -> 2 h: heads of 2 h / heads, no GQA
LENGTHS = [3, 8, 13, 21]  # chunk 8: shorter, one whole chunk, two and three chunks (padded)


def _config(name):
    if name == "nemotron_h (mlp, moe)":
        return transformers.AutoConfig.for_model(
            "nemotron_h", **{**model_zoo.COMMON, **model_zoo.ARCHITECTURES["nemotron_h"], **NEMOTRON_MLP_MOE})
    if name == "zamba2 (2 shared blocks, adapters)":
        return transformers.AutoConfig.for_model(
            "zamba2", **{**model_zoo.COMMON, **model_zoo.ARCHITECTURES["zamba2"], **ZAMBA2_SHARED})
    return model_zoo.tiny_config(name)


@functools.lru_cache(maxsize=4)  # models are only counted (their weights' gradients accumulate, unread)
def _model(name, **overrides):
    config = _config(name)
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                              experts_implementation="eager")
    return model.eval()


def _counted(model, length: int) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        out = model(input_ids=torch.randint(3, 100, (1, length)), use_cache=False)
        out.logits.sum().backward()
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    conv = counts.pop("aten.convolution", 0)
    counts.pop("aten.convolution_backward", None)  # groups ignored by the counter: see the module docstring
    return sum(counts.values()) + 3 * conv


def _reference_excess(model, cost: DocumentCost, length: int) -> float:
    """Training FLOPs transformers' torch reference computes beyond the kernels (module docstring)."""
    extra = 0.0
    for module in model.modules():
        if isinstance(module, torch.nn.Conv1d) and module.groups == module.in_channels:
            extra += 6.0 * (module.kernel_size[0] - 1) * module.weight.numel()
        scan = mixer_cost.scan_of(module)
        if isinstance(scan, mixer_cost.Mamba2Scan):
            h, p, n, g, q = scan
            chunks = math.ceil(length / q)
            padded = scan.matmul_macs(np.array([chunks * q]))[0] - scan.matmul_macs(np.array([length]))[0]
            extra += 6.0 * (padded + chunks * q * (h - g) * q * n + (chunks + 1) ** 2 * h * p * n)
    for kind, _, flops in cost.layers:  # eager: the whole square, not the causal pairs
        if flops:
            extra += flops * (length ** 2 - length * (length + 1) / 2)
    return extra


@pytest.mark.parametrize("name", SCAN_MODELS)
def test_training_flops_match_the_flop_counter(name):
    config = _config(name)
    cost = packkit.transformer_cost(config)
    assert isinstance(cost, DocumentCost) and cost.scans, name
    model = _model(name)
    for length in LENGTHS:
        expected = cost(np.array([length]))[0] - sum(s.elementwise(np.array([length]))[0] * 3 for s in cost.scans)
        expected += _reference_excess(model, cost, length)
        assert _counted(model, length) == pytest.approx(expected, rel=1e-9), (name, length)  # exact (5% asked)


class _Pointwise(TorchDispatchMode):
    """Counts the output elements of pointwise aten ops that ``keep(func, shape)`` selects."""

    def __init__(self, keep):
        super().__init__()
        self.keep, self.total = keep, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if torch.Tag.pointwise in func.tags and isinstance(out, torch.Tensor) and self.keep(func, tuple(out.shape)):
            self.total += out.numel()
        return out


def _scan_elementwise(name, length):
    """(counted by the dispatch mode in the reference scans, the cost's count) for one forward of ``length``."""
    # the zoo's Mamba 2 chunk (8) equals its state size: a chunk of 6 keeps [.., Q, Q] apart from [.., Q, N]
    model = _model(name, chunk_size=6) if name in ("mamba2", "nemotron_h") else _model(name)
    scans = [s for s in (mixer_cost.scan_of(m) for m in model.modules()) if s is not None]
    mamba2 = isinstance(scans[0], mixer_cost.Mamba2Scan)
    if mamba2:  # the decay mask exp(segsum) [.., Q, Q] and its product with C B^T
        q = scans[0].chunk
        ops = (torch.ops.aten.exp.default, torch.ops.aten.mul.Tensor)
        keep = lambda func, shape: func in ops and shape.count(q) >= 2  # noqa: E731
        assert math.ceil(length / q) + 1 != q  # the chunk-to-chunk decay matrix is not Q x Q
    else:  # every op on a [.., D, .., N] tensor: the state update (A = -exp(A_log), [D, N], once a call: not)
        d, n = scans[0]
        keep = lambda func, shape: d in shape and n in shape and shape != (d, n)  # noqa: E731
        assert length not in (d, n)
    mode = _Pointwise(keep)
    with torch.no_grad(), mode:
        model(input_ids=torch.randint(3, 100, (1, length)), use_cache=False)
    if mamba2:  # the reference pads each document to whole chunks, and passes states by matmul: 2 P N per chunk
        padded = math.ceil(length / scans[0].chunk) * scans[0].chunk  # and head are the kernel's only
        per_kernel = sum(s.elementwise(np.array([padded]))[0] - padded // s.chunk * s.heads * 2 * s.head_dim * s.state
                         for s in scans)
    else:
        per_kernel = sum(s.elementwise(np.array([length]))[0] for s in scans)
    return mode.total, per_kernel


@pytest.mark.parametrize("name", ["mamba", "jamba", "mamba2", "nemotron_h"])
def test_elementwise_recurrence_equals_the_reference_scans(name):
    for length in (5, 13, 21):
        counted, expected = _scan_elementwise(name, length)
        assert counted == expected, (name, length)


def test_control_a_wrong_count_fails():
    counted, expected = _scan_elementwise("mamba", 13)
    d, n = mixer_cost.scan_of(_model("mamba").backbone.layers[0].mixer)
    assert counted != expected - 13 * d * n * 2  # one elementwise op per state entry too few (two layers)
    scan = mixer_cost.DeltaScan(2, 8, 8)
    unpadded = 9.0 * 2 * (64 * 24 + 3 * 64)  # 9 tokens, no padded chunk
    assert scan.matmul_macs(np.array([9]))[0] > 5 * unpadded  # fla computes the whole chunk of 64
    model = _model("mamba2")
    cost = packkit.transformer_cost(model_zoo.tiny_config("mamba2"))
    wrong = DocumentCost(cost.model_type, cost.linear, cost.layers)  # the scans left out
    length = 13
    expected = wrong(np.array([length]))[0] + _reference_excess(model, cost, length)
    assert _counted(model, length) != pytest.approx(expected, rel=0.05)


def test_control_zamba2_adapters_a_layer_does_not_run_would_be_counted():
    name = "zamba2 (2 shared blocks, adapters)"
    cost, model = packkit.transformer_cost(_config(name)), _model(name)
    unused = mixer_cost.unused_adapter_macs(model)
    assert unused > 0  # block 0 serves hybrid layers 0 and 2: each copy holds both layers' adapters
    length = 13
    expected = cost(np.array([length]))[0] - sum(s.elementwise(np.array([length]))[0] * 3 for s in cost.scans)
    expected += _reference_excess(model, cost, length)
    # 4% here: inside the 5% the issue asks, caught by the exact check the test above makes
    assert _counted(model, length) != pytest.approx(expected + 6 * unused * length, rel=1e-9)


@pytest.mark.parametrize("name", ["qwen3_5_text", "qwen3_next", "olmo_hybrid"])
def test_gated_deltanet_forward_counts_the_padded_chunk(name):
    # Forward only: the backward of the reference's triangular solves adds matmuls no kernel count has (fla inverts
    # each chunk's system in its own kernel); documents shorter than, equal to and longer than a chunk of 64.
    from test_arch_cost import _forward_flops, _uncounted_attention

    config = model_zoo.tiny_config(name)
    cost = packkit.transformer_cost(config)
    assert any(isinstance(s, mixer_cost.DeltaScan) for s in cost.scans)
    model = _model(name)
    for length in (3, 64, 100):
        expected = (cost(np.array([length]))[0] - cost.attention(np.array([length]))[0]) / 3
        expected += sum((m.kernel_size[0] - 1) * m.weight.numel() * 2 for m in model.modules()
                        if isinstance(m, torch.nn.Conv1d))  # the reference conv1d's l + K - 1 outputs
        counted = _forward_flops(config, _uncounted_attention(), length)
        assert counted == pytest.approx(expected, rel=0.01), (name, length)
        unpadded = expected - sum(s(np.array([length]))[0] - s(np.array([64]))[0] * length / 64 for s in cost.scans) / 3
        if length % 64:  # control: the per-token count of before (no padded chunk) is off
            assert counted != pytest.approx(unpadded, rel=0.01), (name, length)


def test_delta_rule_cost_steps_with_the_chunk_and_mamba2_does_not():
    steps = np.diff(packkit.transformer_cost(model_zoo.tiny_config("qwen3_5_text"))(np.arange(1, 140)))
    assert np.all(steps > 0)
    assert steps[63] > 1.2 * steps[62] and steps[127] > 1.2 * steps[126]  # 64 -> 65, 128 -> 129: a new chunk
    steps = np.diff(packkit.transformer_cost(model_zoo.tiny_config("mamba2"))(np.arange(1, 25)))
    assert np.allclose(steps, steps[0])  # mamba-ssm chunks the packed row: per token


def test_refused_mixers_say_why():
    for name in ("kimi_linear", "rwkv", "xlstm", "recurrent_gemma", "bailing_hybrid"):
        with pytest.raises(ValueError, match=f"{name}: .*(count|run)"):
            packkit.transformer_cost(model_zoo.tiny_config(name))


def test_a_real_mamba_config_without_attention_heads():
    config = transformers.AutoConfig.for_model("mamba2", hidden_size=64, num_hidden_layers=2, num_heads=4, head_dim=32,
                                               state_size=8, n_groups=1, chunk_size=8, vocab_size=128)
    cost = packkit.transformer_cost(config)
    assert cost(np.array([8]))[0] > 0 and all(kind == "scan" for kind, _, _ in cost.layers)
