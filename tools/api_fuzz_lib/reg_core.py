"""Registrations of packkit's core APIs (planner, packing, collator, sampler, streaming, context parallelism):
a valid baseline and an invariant checker each, plus the degenerate / stale / determinism variants."""
from __future__ import annotations

import numpy as np
import torch

import packkit
from packkit import PackedBatchSampler, PackedIterableDataset, PackingCollator, Plan

from .checks import (CAPACITY, LENGTHS, check_batch, check_plan_invariants, check_tokens, digest, source_labels,
                     sources)
from .core import Api, Variant


def _lengths_of(kw, key="sequences"):
    return [len(s) for s in kw[key]]


def _check_plan(plan, kw):
    assert plan.dp_size == int(kw.get("dp_size", 1))
    if plan.num_bins <= 4096:
        check_plan_invariants(np.asarray(kw["lengths"]), int(kw["capacity"]), plan, kw.get("overlong", "error"))
        return
    # Many (empty) bins: the same facts, vectorized (tests/plan_checks.py walks the bins in Python).
    seq, start, length, offsets = plan.segments
    lengths = np.asarray(kw["lengths"], np.int64)
    covered = np.zeros(len(lengths), np.int64)
    for k in np.lexsort((start, seq)):
        assert start[k] == covered[seq[k]], "gap or overlap"
        covered[seq[k]] += length[k]
    assert np.array_equal(covered, lengths) and np.all(np.diff(offsets) >= 0) and offsets[-1] == len(seq)
    per_bin = np.add.reduceat(np.append(length, 0), offsets[:-1]) * (np.diff(offsets) > 0)
    assert per_bin.max() <= int(kw["capacity"]) and plan.num_bins == plan.num_steps * plan.dp_size


def _twice(api, kw):
    first, second = api.invoke(dict(kw)), api.invoke(dict(kw))
    view = (lambda p: (tuple(p.segments), p.rank_costs)) if isinstance(first, Plan) else (lambda x: x)
    assert digest(view(first)) == digest(view(second)), "two calls with the same input and seed differ"
    return first


def plan_api() -> Api:
    return Api("packkit.plan", packkit.plan, lambda: dict(lengths=list(LENGTHS), capacity=CAPACITY, dp_size=2),
               _check_plan, variants=[
                   Variant("degenerate", "lengths", "empty", "either", lambda kw: {**kw, "lengths": []}),
                   Variant("degenerate", "lengths", "all zero", "either", lambda kw: {**kw, "lengths": [0, 0]}),
                   Variant("degenerate", "lengths", "numpy 0-d", "refuse", lambda kw: {**kw, "lengths": np.int64(3)}),
                   Variant("degenerate", "lengths", "2-D tensor", "refuse",
                           lambda kw: {**kw, "lengths": torch.ones(2, 2, dtype=torch.int64)}),
                   Variant("determinism", "lengths", "same input twice", "accept", run=_twice),
                   Variant("degenerate", "extra_cost", "zeros", "accept",
                           lambda kw: {**kw, "extra_cost": np.zeros(len(kw["lengths"]))}),
                   Variant("degenerate", "extra_cost", "one short", "refuse",
                           lambda kw: {**kw, "extra_cost": np.ones(len(kw["lengths"]) - 1)}),
                   Variant("degenerate", "extra_cost", "nan", "refuse",
                           lambda kw: {**kw, "extra_cost": [float("nan")] * len(kw["lengths"])}),
                   Variant("degenerate", "extra_cost", "negative", "refuse",
                           lambda kw: {**kw, "extra_cost": [-1.0] * len(kw["lengths"])})])


def from_bins_api() -> Api:
    def base():
        return dict(lengths=list(LENGTHS), bins=[[0, 1], [2, 3], [4]], capacity=CAPACITY)

    def check(plan, kw):
        check_plan_invariants(np.asarray(kw["lengths"]), int(kw["capacity"]), plan)

    return Api("packkit.Plan.from_bins", Plan.from_bins, base, check, skip=("algorithm",),
               aliases={"bins": ("bin",)}, variants=[
        Variant("stale", "bins", "bins of another input (index 5 of 5)", "refuse",
                lambda kw: {**kw, "bins": [[0, 1], [2, 3], [5]]}),
        Variant("stale", "bins", "a sequence missing", "refuse", lambda kw: {**kw, "bins": [[0, 1], [2, 3]]}),
        Variant("stale", "bins", "a sequence twice", "refuse", lambda kw: {**kw, "bins": [[0, 1], [2, 3], [4, 0]]}),
        Variant("degenerate", "bins", "empty input", "either", lambda kw: {**kw, "lengths": [], "bins": []})])


def _pack_check(batch, kw):
    if kw.get("return_info"):
        batch = batch[0]
    check_batch(batch, kw["sequences"], kw)


def pack_sequences_api() -> Api:
    def base():
        return dict(sequences=sources(), labels=source_labels(), capacity=CAPACITY)

    def stale_plan(kw):
        return {**kw, "plan": packkit.plan([5, 3, 7, 6, 2], CAPACITY)}

    return Api("packkit.pack_sequences", packkit.pack_sequences, base, _pack_check,
               skip=("mrope", "out", "fields", "pad_values"), aliases={"sequences": ("sequence",)}, variants=[
                   Variant("degenerate", "sequences", "empty", "either",
                           lambda kw: {**kw, "sequences": [], "labels": []}),
                   Variant("degenerate", "sequences", "one token", "either",
                           lambda kw: {**kw, "sequences": [[ID1]], "labels": [[LABEL1]]}),
                   Variant("degenerate", "sequences", "zero-length sequences", "either",
                           lambda kw: {**kw, "sequences": [[], [ID1], []], "labels": [[], [LABEL1], []]}),
                   Variant("stale", "plan", "plan of other lengths (same count)", "refuse", stale_plan),
                   Variant("stale", "labels", "labels of another batch (other lengths)", "refuse",
                           lambda kw: {**kw, "labels": source_labels([5, 3, 7, 6, 2])}),
                   Variant("degenerate", "sequences", "a generator", "either",
                           lambda kw: {**kw, "sequences": (s for s in kw["sequences"])}),
                   Variant("determinism", "sequences", "same input twice", "accept", run=_twice)])


ID1 = 1000  # sources()[0][0]
LABEL1 = 10**6 + ID1


def unpack_api() -> Api:
    def base():
        batch, info = packkit.pack_sequences(sources(), capacity=CAPACITY, layout="padded", return_info=True)
        return dict(packed=batch["input_ids"], info=info)

    def check(out, kw):
        flat = out if not kw.get("padded") else None
        if flat is not None:
            assert flat.tolist() == [v for s in sources() for v in s]
        else:
            for i, s in enumerate(sources()):
                assert out[i, :len(s)].tolist() == s

    def stale_info(kw):
        _, other = packkit.pack_sequences(sources([5, 3, 7, 6, 2]), capacity=CAPACITY, layout="padded",
                                          return_info=True)
        return {**kw, "info": other}

    return Api("packkit.unpack_sequences", packkit.unpack_sequences, base, check, variants=[
        Variant("stale", "info", "info of another batch of the same token count", "either", stale_info),
        Variant("stale", "packed", "packed of another shape", "refuse",
                lambda kw: {**kw, "packed": kw["packed"][:, :-1]}),
        Variant("degenerate", "packed", "a 0-d tensor", "refuse", lambda kw: {**kw, "packed": torch.tensor(3)})])


def pack_layout_api() -> Api:
    def base():
        return dict(segments=packkit.plan(LENGTHS, CAPACITY).segments, flat=False, row_len=CAPACITY)

    def check(layout, kw):
        assert layout.num_rows * layout.row_len >= sum(LENGTHS)
        assert layout.num_rows >= 1 and layout.row_len >= max(LENGTHS)

    return Api("packkit.pack_layout", packkit.pack_layout, base, check)


def collator_api() -> Api:
    def use(**kw):
        collate = PackingCollator(**kw)
        return collate([{"input_ids": s, "labels": lab} for s, lab in zip(sources(), source_labels())])

    def check(batch, kw):
        check_batch(batch, sources(), {**kw, "separator_id": kw.get("separator_id", -100)}, labels=False)

    return Api("packkit.PackingCollator", PackingCollator, lambda: dict(capacity=CAPACITY), check, call=use,
               skip=("mrope", "model_config", "context_parallel", "pad_values"),
               aliases={"capacity": ("rows",)})


def sampler_api() -> Api:
    def use(**kw):
        sampler = PackedBatchSampler(**kw)
        return [list(b) for b in sampler]

    def check(batches, kw):
        seen = sorted(i for b in batches for i in b)
        n = len(kw["lengths"])
        assert len(seen) == len(set(seen)) and all(0 <= i < n for i in seen), f"samples {seen}"
        if not kw.get("drop_last") and kw.get("world_size") == 1:  # one rank: every sample with tokens
            assert {i for i in range(n) if kw["lengths"][i] > 0} <= set(seen), f"samples {seen}"

    def base():
        return dict(lengths=list(LENGTHS), capacity=CAPACITY, rank=0, world_size=1, seed=3)

    return Api("packkit.PackedBatchSampler", PackedBatchSampler, base, check, call=use, skip=("group",),
               variants=[Variant("degenerate", "lengths", "empty", "either", lambda kw: {**kw, "lengths": []}),
                         Variant("degenerate", "lengths", "all zero", "either", lambda kw: {**kw, "lengths": [0, 0]}),
                         Variant("determinism", "seed", "same seed twice", "accept", run=_twice),
                         Variant("degenerate", "extra_cost", "uneven", "accept",
                                 lambda kw: {**kw, "extra_cost": np.arange(len(kw["lengths"])) * 1e3}),
                         Variant("degenerate", "extra_cost", "inf", "refuse",
                                 lambda kw: {**kw, "extra_cost": [float("inf")] * len(kw["lengths"])})])


def streaming_api() -> Api:
    def use(**kw):
        ds = PackedIterableDataset(**kw)
        return [item for _, item in zip(range(64), ds)]

    def check(items, kw):
        src = kw["source"]
        expected = [list(e["input_ids"]) for e in src] if isinstance(src, list) else []
        pad = kw.get("pad_token_id", 0)
        check_tokens(torch.cat([it["input_ids"].reshape(-1) for it in items]) if items else torch.zeros(0),
                     expected, pad)

    def base():
        return dict(source=[{"input_ids": s} for s in sources()], capacity=CAPACITY, buffer_size=4)

    def exhausted(kw):
        gen = iter(kw["source"])
        list(gen)
        return {**kw, "source": gen}

    return Api("packkit.PackedIterableDataset", PackedIterableDataset, base, check, call=use,
               skip=("mrope", "context_parallel", "pad_values"), variants=[
                   Variant("degenerate", "source", "empty list", "either", lambda kw: {**kw, "source": []}),
                   Variant("degenerate", "source", "an exhausted generator", "either", exhausted),
                   Variant("degenerate", "source", "1-token documents", "either",
                           lambda kw: {**kw, "source": [{"input_ids": [ID1 + i]} for i in range(3)]}),
                   Variant("determinism", "source", "same input twice", "accept", run=_twice)])


def block_mask_api() -> Api:
    def base():
        return dict(seq_idx=torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2]], dtype=torch.int32), block_size=4)

    def check(mask, kw):
        assert mask is not None

    return Api("packkit.document_causal_block_mask", packkit.document_causal_block_mask, base, check, variants=[
        Variant("degenerate", "seq_idx", "empty", "either",
                lambda kw: {**kw, "seq_idx": torch.zeros(1, 0, dtype=torch.int32)}),
        Variant("degenerate", "seq_idx", "float", "refuse", lambda kw: {**kw, "seq_idx": kw["seq_idx"].float()})])


def transformer_cost_api() -> Api:
    def base():
        return dict(hidden_size=64, num_layers=2, intermediate_size=128, num_heads=4, vocab_size=100)

    def check(cost, kw):
        a, b = cost
        assert np.isfinite(a) and np.isfinite(b) and a > 0 and b >= 0, cost

    return Api("packkit.transformer_cost", packkit.transformer_cost, base, check, skip=("config",))


def _vision_signature(image_grid_thw=None, video_grid_thw=None, train_vision: bool = True):
    """The options fuzzed: one sample's grids (variants) and the frozen-tower flag."""


def vision_cost_api() -> Api:
    import transformers

    def run(image_grid_thw, video_grid_thw, train_vision):
        config = transformers.Qwen2_5_VLConfig(vision_config=dict(
            depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=2,
            spatial_merge_size=2, temporal_patch_size=2, window_size=8, fullatt_block_indexes=[1]))
        return packkit.vision_cost(config, train_vision=train_vision)(image_grid_thw, video_grid_thw)

    def check(cost, kw):
        assert isinstance(cost, float) and np.isfinite(cost) and cost >= 0, cost
        assert (cost > 0) == bool(np.size(kw["image_grid_thw"] or []) or np.size(kw["video_grid_thw"] or [])), cost

    def grids(name, value, expect, label):
        return Variant("degenerate", name, label, expect, lambda kw: {**kw, name: value})
    return Api("packkit.vision_cost", _vision_signature,
               lambda: dict(image_grid_thw=[[1, 4, 6]], video_grid_thw=[[3, 2, 2]], train_vision=True), check,
               call=run, variants=[
                   grids("image_grid_thw", [], "accept", "empty"),
                   grids("image_grid_thw", [[1, 0, 4]], "refuse", "zero side"),
                   grids("image_grid_thw", [[1, 3, 4]], "refuse", "side not a multiple of the merge size"),
                   grids("image_grid_thw", [[1.0, 2.0, 2.0]], "refuse", "float grid"),
                   grids("image_grid_thw", [[1, 2]], "refuse", "two columns"),
                   grids("video_grid_thw", torch.tensor([[2, 4, 4]]), "accept", "tensor"),
                   grids("video_grid_thw", [[-1, 4, 4]], "refuse", "negative t")])


def register(reg: dict) -> None:
    for make in (plan_api, from_bins_api, pack_sequences_api, unpack_api, pack_layout_api, collator_api,
                 sampler_api, streaming_api, block_mask_api, transformer_cost_api, vision_cost_api):
        api = make()
        reg[api.name] = api
