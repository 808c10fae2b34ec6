"""Vision-language prompts in ``pack_groups``: bad input is refused by name, and (hypothesis) every visual token of
a packed batch belongs to exactly one image of exactly one packed prompt copy, once, with that image's pixels.
No model runs here (configs only)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from packkit import shared_prefix as sp

pytest.importorskip("transformers")
from vlm_helpers import IMAGE, MERGE, VIDEO, make_sample, tiny_config  # noqa: E402

pytestmark = pytest.mark.core

CONFIG = tiny_config("qwen2_5_vl")


def _one_image(seed=0):
    return make_sample(np.random.default_rng(seed), [("text", 2), ("image", (4, 4)), ("text", 3)])


def test_plain_token_prompts_are_unchanged():
    prompts, completions = [[1, 2, 3], [4]], [[[5], [6, 7]], [[8]]]
    batch, info = sp.pack_groups(prompts, completions)
    assert set(batch) == {"input_ids", "position_ids", "shared_prefix"} and info.vision is None
    assert batch["position_ids"].shape == batch["input_ids"].shape
    # With mrope= and text-only groups: [4, R, S], every row the text positions.
    vbatch, vinfo = sp.pack_groups(prompts, completions, mrope=CONFIG)
    assert torch.equal(vbatch["input_ids"], batch["input_ids"])
    assert torch.equal(vbatch["position_ids"], batch["position_ids"].expand(4, -1, -1))
    assert "pixel_values" not in vbatch and vinfo.vision.images_forwarded == 0


def test_processor_shaped_prompt_is_accepted():
    p = _one_image()
    processor = {**p, "input_ids": torch.tensor([p["input_ids"]]),
                 "mm_token_type_ids": torch.tensor([p["mm_token_type_ids"]]),
                 "attention_mask": torch.ones(1, len(p["input_ids"]), dtype=torch.int64)}
    a, _ = sp.pack_groups([p], [[[5, 6], [7]]], mrope=CONFIG)
    b, _ = sp.pack_groups([processor], [[[5, 6], [7]]], mrope=CONFIG)
    for k in ("input_ids", "position_ids", "pixel_values", "image_grid_thw", "mm_token_type_ids"):
        assert torch.equal(a[k], b[k]), k


def test_completion_positions_continue_the_prompt_walk():
    """Text after a 4x4 (merged 2x2) image: the walk moves by max(h, w) / merge = 2, not by the 4 tokens."""
    p = _one_image()
    batch, _ = sp.pack_groups([p], [[[5, 6], [7]]], mrope=CONFIG)
    pos = batch["position_ids"][:, 0]
    # prompt: text 0,1 | VSTART 2 | image (3, 3+h, 3+w) | VEND 5 | text 6,7,8; completions then 9, 10 and 9.
    assert pos[1:, -3:].tolist() == [[9, 10, 9]] * 3
    assert pos[0, -3:].tolist() == [11, 12, 11]  # row 0: the tree's text positions (prompt length + j)


def bad(match, prompts, completions=None, **kw):
    with pytest.raises((ValueError, TypeError), match=match):
        sp.pack_groups(prompts, completions or [[[5]] for _ in prompts], **kw)


def test_bad_inputs_are_refused_by_name():
    from transformers import LlamaConfig

    p = _one_image()
    bad(r"prompts\[0\] holds vision inputs.*mrope=", [p])
    bad(r"mrope= needs the config .* model_type='llama'", [p], mrope=LlamaConfig())
    short = {**p, "input_ids": p["input_ids"][:4] + p["input_ids"][5:],
             "mm_token_type_ids": p["mm_token_type_ids"][:4] + p["mm_token_type_ids"][5:]}
    bad(r"prompts\[0\]: image block 0 has 3 tokens but its grid", [short], mrope=CONFIG)
    bad(r"prompts\[0\].*image_grid_thw has 1 grid\(s\) but mm_token_type_ids has 0", [
        {**p, "input_ids": [1] * len(p["input_ids"]), "mm_token_type_ids": [0] * len(p["input_ids"])}], mrope=CONFIG)
    bad(r"prompts.*sample 0: pixel_values .* implies 16 patch rows", [{**p, "pixel_values": p["pixel_values"][:-1]}],
        mrope=CONFIG)
    bad(r"prompts\[1\]: image block 1 .* has no grid", [p, [3, IMAGE, IMAGE, IMAGE, IMAGE, 4]], mrope=CONFIG)
    bad(r"prompts\[0\]: token 3 disagrees between input_ids .* and mm_token_type_ids",
        [{**p, "mm_token_type_ids": [0] * len(p["input_ids"])}], mrope=CONFIG)
    bad(r"completions\[0\]\[1\]\[1\] is the image/video token id 90", [p], [[[5], [6, IMAGE]]], mrope=CONFIG)
    bad(r"pad_id=91 is the model's image/video token id", [p], mrope=CONFIG, pad_id=VIDEO)
    bad(r"prompts\[0\] has key\(s\) \['labels'\]", [{**p, "labels": [1]}], mrope=CONFIG)
    bad(r"prompts\[0\]\['attention_mask'\] holds zeros", [{**p, "attention_mask": [0] + [1] * 9}], mrope=CONFIG)
    bad(r"prompts\[0\] is a dict without 'input_ids'", [{"pixel_values": p["pixel_values"]}], mrope=CONFIG)


def _expected_blocks(prompt) -> list:
    """(token offset in the prompt, pixel rows) of each image of a prompt, in token order."""
    types = np.asarray(prompt["mm_token_type_ids"])
    starts = np.flatnonzero((types == 1) & (np.concatenate([[0], types[:-1]]) != 1))
    grids = prompt.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.int64))
    rows = np.concatenate([[0], np.cumsum(grids.prod(-1).numpy())])
    return [(int(s), prompt["pixel_values"][rows[k]:rows[k + 1]]) for k, s in enumerate(starts)]


group = st.tuples(st.lists(st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from([1, 2, 3])), max_size=3),
                  st.integers(0, 4), st.lists(st.integers(0, 9), min_size=1, max_size=8))


@settings(max_examples=40, deadline=None)
@given(st.lists(group, min_size=1, max_size=4), st.sampled_from([None, 48, 64]), st.integers(0, 2**31))
def test_every_visual_token_belongs_to_one_image_of_one_prompt_once(groups, capacity, seed):
    rng = np.random.default_rng(seed)
    prompts, completions = [], []
    for images, text, sizes in groups:
        blocks = [("text", text)] + [b for h, w in images for b in (("image", (h * MERGE, w * MERGE)), ("text", 1))]
        prompts.append(make_sample(rng, blocks))
        completions.append([rng.integers(1, 80, n).tolist() for n in sizes])
    try:
        batch, info = sp.pack_groups(prompts, completions, mrope=CONFIG, capacity=capacity)
    except ValueError as e:  # a prompt + completion over capacity (overlong='error'): refused whole, nothing packed
        assert capacity is not None and ("capacity" in str(e))
        return
    report, lay, forest = info.vision, info.layout, info.forest
    types = batch["mm_token_type_ids"].reshape(-1).numpy()
    grids = batch.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.int64))
    tokens = (grids.prod(-1) // MERGE ** 2).numpy()
    pixels = batch.get("pixel_values", torch.zeros(0, 24, dtype=torch.float64))
    visual = np.flatnonzero(types == 1)
    assert len(visual) == tokens.sum() == report.visual_tokens_forwarded
    # Packed prompt copies in packed order, each with its group (a copy starts at its prompt's source offset).
    roots = [p for p in range(len(lay.order)) if forest.parent[lay.order[p]] < 0 and lay.length[p] > 0]
    sizes = [len(p["input_ids"]) + sum(map(len, c)) for p, c in zip(prompts, completions)]
    prompt_src = {int(s): g for g, s in enumerate(np.cumsum([0] + sizes[:-1])) if len(prompts[g]["input_ids"])}
    seen, t0, r0 = [], 0, 0
    for i, (n, g) in enumerate(zip(tokens, report.image_groups)):
        run = visual[t0:t0 + n]
        t0 += n
        assert np.array_equal(run, np.arange(run[0], run[0] + n))  # one contiguous block per image
        node = [p for p in roots if lay.dst[p] <= run[0] and run[-1] < lay.dst[p] + lay.length[p]]
        assert len(node) == 1  # inside exactly one packed prompt copy ...
        assert prompt_src[int(lay.src[node[0]])] == g  # ... of the group the batch says
        offset = int(run[0] - lay.dst[node[0]])
        k = [o for o, _ in _expected_blocks(prompts[g])].index(offset)  # ... at one of that prompt's images
        rows = int(grids[i].prod())
        assert torch.equal(pixels[r0:r0 + rows], _expected_blocks(prompts[g])[k][1])  # with that image's pixels
        r0 += rows
        seen.append((node[0], k))
    assert len(set(seen)) == len(seen) and r0 == len(pixels)  # each image of each copy once
    copies = {p: prompt_src[int(lay.src[p])] for p in roots}
    assert sorted(seen) == sorted((p, k) for p, g in copies.items() for k in range(len(groups[g][0])))
    per_group = np.array([len(g[0]) for g in groups])
    assert report.copied_images == report.images_forwarded - per_group.sum()
    if capacity is None or not info.plan.report.split_groups:
        assert report.copied_images == 0
