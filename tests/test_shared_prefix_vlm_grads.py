"""GRPO token-mean and DPO losses through a vision-language shared-prefix batch give every parameter's gradient of
the per-sample runs, the vision tower's (and Qwen3-VL's deepstack mergers') included: fp64, rel <= 1e-9."""
from __future__ import annotations

import pytest
import torch

from packkit import shared_prefix as sp

pytest.importorskip("transformers")
from shared_prefix_vlm_helpers import (fp64_vlm_norms, grads, per_sample_logprobs, shared, vlm_groups,  # noqa: E402
                                       worst_grad)
from vlm_helpers import tiny_model  # noqa: E402

pytestmark = [pytest.mark.core, pytest.mark.exactness]

REL_GRAD = 1e-9


@pytest.fixture(autouse=True)
def _fp64(monkeypatch):
    fp64_vlm_norms(monkeypatch)


def _grpo_both_ways(model, prompts, completions):
    n = sum(len(g) for g in completions)
    advantages = torch.linspace(-1, 1, n, dtype=torch.float64)
    model.zero_grad(set_to_none=True)
    ref = per_sample_logprobs(model, prompts, completions)
    tokens = sum(len(r) for r in ref)
    (sum(-(a * r).sum() for a, r in zip(advantages, ref)) / tokens).backward()
    expected = grads(model)
    model.zero_grad(set_to_none=True)
    result, _, _ = shared(model, prompts, completions)
    sp.grpo_token_mean_loss(result, advantages).backward()  # on-policy: ratio 1, gradient -adv * grad logp
    return grads(model), expected


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_grpo_gradients_include_the_vision_tower(family):
    model = tiny_model(family)
    prompts, completions = vlm_groups(family, seed=1, sizes=(2, 1, 2, 1))
    got, expected = _grpo_both_ways(model, prompts, completions)
    tower = [n for n in expected if ".visual." in n or n.startswith("visual.")]
    assert tower and all(float(expected[n].abs().max()) > 0 for n in tower if "merger" in n or "blocks" in n)
    if family == "qwen3_vl":
        assert any("deepstack" in n for n in tower)  # deepstack mergers are trained through the packed batch
    assert worst_grad(got, expected)[0] <= REL_GRAD


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_dpo_gradients_include_the_vision_tower(family):
    model = tiny_model(family)
    prompts, completions = vlm_groups(family, seed=2, sizes=(2, 2, 2, 2))
    completions = [[c or [7] for c in g] for g in completions]  # DPO answers are not empty
    torch.manual_seed(1)
    ref_sums = torch.randn(8, dtype=torch.float64)  # a frozen reference model's sums (constants here)

    def dpo(s):
        return sp.dpo_loss(s[0::2], s[1::2], ref_sums[0::2], ref_sums[1::2], beta=0.1)

    model.zero_grad(set_to_none=True)
    dpo(torch.stack([r.sum() for r in per_sample_logprobs(model, prompts, completions)])).backward()
    expected = grads(model)
    model.zero_grad(set_to_none=True)
    result, _, info = shared(model, prompts, completions)
    chosen, rejected = sp.dpo_logps(result, info)
    sp.dpo_loss(chosen, rejected, ref_sums[0::2], ref_sums[1::2], beta=0.1).backward()
    assert worst_grad(grads(model), expected)[0] <= REL_GRAD


