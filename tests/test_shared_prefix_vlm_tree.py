"""``pack_tree(..., mrope=config)``: multi-turn vision-language conversations whose first turn holds the image.
Shared turns (image included) are forwarded once; conversations with equal placeholder tokens but different
pictures are not merged; every scored token's log-prob equals the conversation run alone (fp64, rel <= 1e-10)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from packkit import shared_prefix as sp

pytest.importorskip("transformers")
from shared_prefix_vlm_helpers import PROMPT_FIELDS, fp64_vlm_norms  # noqa: E402
from vlm_helpers import make_sample, tiny_model  # noqa: E402

pytestmark = [pytest.mark.core, pytest.mark.exactness]


@pytest.fixture(autouse=True)
def _fp64(monkeypatch):
    fp64_vlm_norms(monkeypatch)


def _extend(sample, tokens):
    return {**sample, "input_ids": sample["input_ids"] + tokens, "mm_token_type_ids": sample["mm_token_type_ids"] +
            [0] * len(tokens)}


def conversations(family):
    rng = np.random.default_rng(0)
    turn1 = make_sample(rng, [("text", 3), ("image", (4, 4)), ("text", 2)], family)
    answer = rng.integers(1, 80, 4).tolist()
    other = make_sample(rng, [("text", 3), ("image", (4, 4)), ("text", 2)], family)
    other = {**other, "input_ids": turn1["input_ids"]}  # same placeholder tokens, different picture
    seqs = [_extend(turn1, answer + [5, 6, 7]),              # turn 2, branch A
            _extend(turn1, answer + [8, 9]),                 # turn 2, branch B
            _extend(turn1, rng.integers(1, 80, 3).tolist()),  # another first answer
            _extend(other, answer + [5, 6]),                 # another picture: its own tree
            rng.integers(1, 80, 6).tolist()]                 # text only
    score_from = [len(turn1["input_ids"])] * 4 + [1]
    return seqs, score_from


def alone(model, seq, start):
    inputs = {"input_ids": torch.tensor([seq["input_ids"] if isinstance(seq, dict) else seq])}
    if isinstance(seq, dict):
        inputs.update({k: v for k, v in seq.items() if k in PROMPT_FIELDS})
        inputs["mm_token_type_ids"] = torch.tensor([seq["mm_token_type_ids"]])
    logits = model(**inputs, use_cache=False).logits[0]
    ids = inputs["input_ids"][0]
    return torch.log_softmax(logits[:-1], -1).gather(1, ids[1:, None])[:, 0][start - 1:]


@pytest.mark.parametrize("family, capacity", [("qwen2_5_vl", None), ("qwen3_vl", None), ("qwen2_5_vl", 20)])
def test_tree_with_image_in_first_turn_equals_each_conversation_alone(family, capacity):
    model = tiny_model(family)
    seqs, score_from = conversations(family)
    with torch.no_grad():
        refs = [alone(model, seq, score_from[s]) for s, seq in enumerate(seqs)]
        model.set_attn_implementation(sp.register_attention())
        batch, info = sp.pack_tree(seqs, score_from=score_from, mrope=model.config, capacity=capacity)
        result = sp.completion_logprobs(model(**batch, use_cache=False).logits, info)
        for s, ref in enumerate(refs):
            got = result.per_sequence[s]
            assert got.shape == ref.shape
            assert float((got - ref).abs().max()) <= 1e-10 * float(ref.abs().max()), s
    v = info.vision
    assert v.images_unshared == 4
    if capacity is None:  # the shared first turn's image once, the other picture once
        assert (v.images_forwarded, v.copied_images) == (2, 0) and sorted(v.image_groups.tolist()) == [0, 3]
    else:
        assert info.plan.report.split_groups and v.copied_images >= 1  # the split tree re-carries its image
        assert v.images_forwarded == 2 + v.copied_images
    assert int((batch["mm_token_type_ids"] == 1).sum()) == v.visual_tokens_forwarded


def test_tree_refusals():
    from vlm_helpers import tiny_config

    config = tiny_config("qwen2_5_vl")
    seqs, score_from = conversations("qwen2_5_vl")
    forest = sp.build_tree([[1, 2], [1, 3]])
    with pytest.raises(ValueError, match="PrefixForest and mrope="):
        sp.pack_tree(forest, mrope=config)
    with pytest.raises(ValueError, match=r"sequences\[0\] holds vision inputs.*mrope="):
        sp.pack_tree(seqs)
    with pytest.raises(ValueError, match=r"sequences\[1\]: image block 0 has 3 tokens"):
        s = seqs[1]
        sp.pack_tree([seqs[0], {**s, "input_ids": s["input_ids"][:4] + s["input_ids"][5:],
                                "mm_token_type_ids": s["mm_token_type_ids"][:4] + s["mm_token_type_ids"][5:]}],
                     mrope=config)
