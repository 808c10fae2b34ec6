"""Issue 39 §2: the core packing APIs never return a silently wrong result.

Each test names the finding it pins down and, where the bug was a wrong result, has a control that shows the
check passes good input (so a test that only ever raises could not pass by accident). Resume states, CP and
the adversarial pass over argument types/sizes are in tests/test_core_inputs_state.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import packkit
from packkit import PackingCollator, pack_context_parallel, pack_sequences, shard_context_parallel
from llama_helpers import VOCAB, tiny_llama

pytestmark = pytest.mark.core


# -- a plan made for other lengths is refused (coverage, not only bounds) ----------------------------------
def test_plan_of_other_lengths_is_refused():
    plan = packkit.plan([3, 2, 4], 10)
    with pytest.raises(ValueError, match="packs 3 tokens of sequence 0, which has 5"):
        pack_sequences([[1, 2, 3, 31, 32], [4, 5], [6, 7, 8, 9]], plan=plan)
    # Control: the same plan on the lengths it was made for.
    batch = pack_sequences([[1, 2, 3], [4, 5], [6, 7, 8, 9]], plan=plan)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9]]
    # Also through pack_context_parallel (same plan checks).
    with pytest.raises(ValueError, match="plan was made for other lengths"):
        pack_context_parallel([[1, 2, 3, 31, 32], [4, 5], [6, 7, 8, 9]], 2, 0, plan=plan)


def test_dropped_and_truncated_plans_must_match_too():
    seqs = [[1] * 3, [2] * 12, [3] * 4]
    for overlong in ("drop", "truncate", "split"):
        plan = packkit.plan([3, 12, 4], 10, overlong=overlong)
        pack_sequences(seqs, plan=plan)  # made for these lengths: fine
        # Sequence 1 became short: a plan that dropped/truncated/split it is for other lengths.
        with pytest.raises(ValueError, match="other lengths"):
            pack_sequences([[1] * 3, [2] * 6, [3] * 4], plan=plan)
    # Truncated sequences still longer than capacity keep exactly the first capacity tokens either way.
    plan = packkit.plan([3, 12, 4], 10, overlong="truncate")
    pack_sequences([[1] * 3, [2] * 15, [3] * 4], plan=plan)


def test_overlapping_plan_segments_are_refused():
    plan = packkit.plan([4, 4], 8, overlong="split")
    seg = plan.segments
    bad = seg._replace(seq_index=np.array([0, 0]), start=np.array([0, 0]), length=np.array([4, 4]))
    plan.segments = bad  # as a hand-made or deserialised plan could be
    with pytest.raises(ValueError, match="overlap|packs 8 tokens"):
        pack_sequences([[1] * 8, [2] * 4], plan=plan)


@settings(max_examples=40, deadline=None)
@given(a=st.lists(st.integers(0, 12), min_size=1, max_size=6), data=st.data())
def test_property_plan_is_used_only_for_its_lengths(a, data):
    """plan(a) packs sequences of lengths b iff b == a (overlong='error', all sequences fit)."""
    b = data.draw(st.lists(st.integers(0, 12), min_size=len(a), max_size=len(a)))
    plan = packkit.plan(a, 12)
    seqs = [[i + 1] * n for i, n in enumerate(b)]
    if a == b:
        out = pack_sequences(seqs, plan=plan, layout="padded")
        assert int((out["input_ids"] != 0).sum()) == sum(b)
    else:
        with pytest.raises(ValueError, match="other lengths"):
            pack_sequences(seqs, plan=plan, layout="padded")


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), max_size=8), overlong=st.sampled_from(["drop", "truncate", "split"]),
       multiple=st.sampled_from([None, 2, 4]), dp=st.integers(1, 3), algorithm=st.sampled_from(["obfd", "ogbfd", "nf"]))
def test_property_every_planner_plan_is_accepted_for_its_lengths(lengths, overlong, multiple, dp, algorithm):
    """No false alarm: whatever the planner makes (drop/truncate/split, CP padding, dp ranks) passes the coverage
    check for the lengths it was made from, and packs exactly the tokens the plan keeps."""
    plan = packkit.plan(lengths, 16, overlong=overlong, pad_to_multiple_of=multiple, dp_size=dp, algorithm=algorithm)
    seqs = [[i + 1] * n for i, n in enumerate(lengths)]
    out = pack_sequences(seqs, plan=plan, layout="padded")
    assert int((out["input_ids"] != 0).sum()) == plan.kept_tokens


# -- a field named like an output key is refused ------------------------------------------------------------
SEQS = [[1, 2, 3], [4, 5]]


@pytest.mark.parametrize("call", [
    lambda: pack_sequences(SEQS, capacity=8, layout="padded", fields={"labels": [[9, 9, 9], [9, 9]]}),
    lambda: pack_sequences(SEQS, fields={"input_ids": [[9, 9, 9], [9, 9]]}),
    lambda: PackingCollator(label_key="target")([{"input_ids": [1, 2, 3], "target": [7, 7, 7], "labels": [5, 5, 5]}]),
    lambda: PackingCollator(input_key="ids")([{"ids": [1, 2, 3], "input_ids": [5, 5, 5]}]),
    lambda: pack_context_parallel(SEQS, 2, 0, fields={"labels": [[9, 9, 9], [9, 9]]}),
    lambda: pack_context_parallel(SEQS, 2, 0, fields={"shift_labels": [[9, 9, 9], [9, 9]]}),
    lambda: PackingCollator(context_parallel=(2, 0))([{"input_ids": [1, 2], "shift_labels": [1, 1]}]),
    lambda: PackingCollator(return_num_items=True)([{"input_ids": [1, 2], "num_items_in_batch": 5}]),
], ids=["padded-labels", "input_ids", "label_key", "input_key", "cp-labels", "cp-shift_labels", "collator-cp",
        "num_items"])
def test_field_colliding_with_an_output_is_refused(call):
    with pytest.raises(ValueError, match="would (overwrite|be replaced)"):
        call()


def test_colliding_field_dropped_on_request_leaves_the_right_labels():
    batch = PackingCollator(label_key="target", extra_fields="drop")(
        [{"input_ids": [1, 2, 3], "target": [7, 8, 9], "labels": [5, 5, 5]}])
    assert batch["labels"].tolist() == [[-100, 8, 9]]
    batch = PackingCollator(input_key="ids", extra_fields="drop")([{"ids": [1, 2, 3], "input_ids": [5, 5, 5]}])
    assert batch["input_ids"].tolist() == [[1, 2, 3]]


# -- num_items_in_batch is what the loss counts --------------------------------------------------------------
FEATS = [{"input_ids": [1, 2, 3, 4]}, {"input_ids": [5, 6]}, {"input_ids": [7, 8, 9]}]


@pytest.mark.parametrize("separator", [7, None, -100])
@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_num_items_counts_the_shifted_targets(separator, layout):
    collate = PackingCollator(6 if layout == "padded" else None, layout=layout, separator_id=separator,
                              return_num_items=True)
    batch = collate(FEATS)
    shifted = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[..., 1:]  # what ForCausalLMLoss does
    assert int(batch["num_items_in_batch"]) == int(shifted.ne(-100).sum())
    if separator == 7:  # the numbers: 9 labels, 8 targets in one row, 7 in two rows
        assert int(batch["labels"].ne(-100).sum()) == 9
        assert int(batch["num_items_in_batch"]) == (8 if layout == "flat" else 7)


@pytest.mark.parametrize("separator", [7, None, -100])
@pytest.mark.parametrize("mode", ["zigzag", "contiguous"])
@pytest.mark.parametrize("fused", [True, False])
def test_num_items_under_cp_is_all_ranks_shift_labels(separator, mode, fused):
    feats = [dict(f) for f in FEATS]
    if not fused:  # extra_fields='keep' lists take the pack-then-shard path
        for f in feats:
            f["meta"] = "x"
    counts, reported = 0, set()
    for rank in range(2):
        batch = PackingCollator(separator_id=separator, return_num_items=True, context_parallel=(2, rank, mode),
                                extra_fields="keep" if not fused else "error")(feats)
        counts += int(batch["shift_labels"].ne(-100).sum())
        reported.add(int(batch["num_items_in_batch"]))
    assert reported == {counts} and counts == 6  # 9 tokens, 3 documents: 6 next-token targets


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 12), min_size=1, max_size=6), separator=st.sampled_from([None, 3, -100]),
       cp=st.integers(1, 3), mode=st.sampled_from(["zigzag", "contiguous"]), masked=st.booleans(), data=st.data())
def test_property_num_items_is_what_the_loss_counts(lengths, separator, cp, mode, masked, data):
    """Random labels with ignored positions: the count equals the shifted targets (flat, padded) and, under CP,
    the ranks' shift_labels summed, on every rank."""
    rng = np.random.default_rng(sum(lengths) + cp)
    feats = []
    for n in lengths:
        ids = rng.integers(1, 50, n)
        labels = np.where(rng.random(n) < 0.3, -100, ids) if masked else ids
        feats.append({"input_ids": ids.tolist(), "labels": labels.tolist()})
    for layout, cap in (("flat", None), ("padded", 24)):
        batch = PackingCollator(cap, layout=layout, separator_id=separator, return_num_items=True)(feats)
        shifted = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[..., 1:]
        assert int(batch["num_items_in_batch"]) == int(shifted.ne(-100).sum())
    fields = data.draw(st.sampled_from(["error", "keep"]))  # fused launch, or pack then shard
    if fields == "keep":
        for f in feats:
            f["meta"] = 0
    total, reported = 0, set()
    for rank in range(cp):
        shard = PackingCollator(separator_id=separator, return_num_items=True, context_parallel=(cp, rank, mode),
                                extra_fields=fields)(feats)
        total += int(shard["shift_labels"].ne(-100).sum())
        reported.add(int(shard["num_items_in_batch"]))
    assert reported == {total}


def _model_losses(model, batch, num_items):
    """(loss with num_items_in_batch, per-token CE sum, targets) of a real model on one batch / CP shard."""
    kwargs = {"shift_labels": batch["shift_labels"]} if "shift_labels" in batch else {}
    out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], labels=batch["labels"],
                num_items_in_batch=num_items, **kwargs)
    logits = out.logits.float().reshape(-1, VOCAB)
    targets = batch.get("shift_labels")
    if targets is None:
        targets = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[..., 1:]
    targets = targets.reshape(-1)
    ce = torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")
    return out.loss, ce, int(targets.ne(-100).sum())


@pytest.mark.parametrize("separator", [7, -100])
def test_num_items_gives_a_real_models_mean_loss(separator):
    """transformers' loss / num_items_in_batch is the mean over the targets it counts: with packkit's count,
    the loss equals the per-target mean (flat, padded) and the CP ranks' losses sum to it."""
    model = tiny_llama(seed=3)
    rng = np.random.default_rng(3)
    feats = [{"input_ids": rng.integers(1, VOCAB, n).tolist()} for n in (9, 4, 13, 6)]
    with torch.no_grad():
        for layout in ("flat", "padded"):
            batch = PackingCollator(16, layout=layout, separator_id=separator, return_num_items=True)(feats)
            loss, ce, targets = _model_losses(model, batch, batch["num_items_in_batch"])
            assert int(batch["num_items_in_batch"]) == targets
            torch.testing.assert_close(loss, ce / targets)
        total_loss, total_ce, total_targets = 0.0, 0.0, 0
        for rank in range(2):
            shard = PackingCollator(separator_id=separator, return_num_items=True, context_parallel=(2, rank))(feats)
            loss, ce, targets = _model_losses(model, shard, shard["num_items_in_batch"])
            total_loss, total_ce, total_targets = total_loss + loss, total_ce + ce, total_targets + targets
        assert int(shard["num_items_in_batch"]) == total_targets
        torch.testing.assert_close(total_loss, total_ce / total_targets)


# -- shard_context_parallel cross-checks lengths= ----------------------------------------------------------
def test_shard_lengths_must_match_the_batch():
    batch = pack_sequences([list(range(1, 8)), [1, 2, 3], list(range(1, 12))])
    assert batch["cu_seq_lens_q"].tolist() == [0, 7, 10, 21]
    with pytest.raises(ValueError, match="has 4 entries, not 3"):
        shard_context_parallel(batch, 2, 0, lengths=[10, 11])
    with pytest.raises(ValueError, match="first difference at entry 1"):
        shard_context_parallel(batch, 2, 0, lengths=[10, 1, 10])
    with pytest.raises(TypeError):
        shard_context_parallel(batch, 2, 0, lengths=[7.5, 3, 10.5])
    # Control: the batch's own lengths give what reading cu_seq_lens_q gives.
    good = shard_context_parallel(batch, 2, 0, lengths=[7, 3, 11])
    ref = shard_context_parallel(batch, 2, 0)
    assert all(torch.equal(good[k], ref[k]) for k in ("input_ids", "shift_labels", "position_ids"))
    # pack_info of another batch is refused the same way.
    _, other = pack_sequences([[1] * 10, [2] * 11], return_info=True)
    with pytest.raises(ValueError, match="pack_info= gives segments"):
        shard_context_parallel(batch, 2, 0, pack_info=other)


# -- token ids and pad ids are embedding indices ------------------------------------------------------------
@pytest.mark.parametrize("call, match", [
    (lambda: pack_sequences([[1, -2, 3]]), "negative token id .sequence 0, token 1: -2"),
    (lambda: pack_sequences([torch.tensor([1, -2], dtype=torch.int32)]), "negative token id"),
    (lambda: pack_sequences(torch.tensor([3, 4, -1]), [1, 2]), "sequence 1, token 1"),
    (lambda: pack_sequences([[1, 2, 3]], pad_token_id=-1, capacity=4, layout="padded"), "pad_token_id must be >= 0"),
    (lambda: PackingCollator(pad_token_id=-1), "pad_token_id must be >= 0"),
    (lambda: PackingCollator()([{"input_ids": [1, -2]}]), "negative token id"),
    (lambda: pack_context_parallel([[1, -2]], 2, 0), "negative token id"),
    (lambda: pack_context_parallel([[1, 2]], 2, 0, pad_token_id=-1), "pad_token_id must be >= 0"),
    (lambda: shard_context_parallel(pack_sequences([[1, 2]]), 2, 0, pad_token_id=-1), "pad_token_id must be >= 0"),
    (lambda: pack_sequences([[1, 2]], position_ids_start=-5), "position_ids_start must be >= 0"),
])
def test_negative_ids_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_ids_are_checked_on_the_device_without_a_sync():
    """On a GPU the id check is torch._assert_async (no host sync); on the CPU _assert_async raises at once,
    which this exercises through the same code path the device takes."""
    from packkit.packing.checks import check_token_ids

    class FakeCuda(torch.Tensor):  # only .device differs: the branch a CUDA tensor takes
        @property
        def device(self):
            return torch.device("meta")

    ok = torch.tensor([1, 2, 3]).as_subclass(FakeCuda)
    check_token_ids(ok, "input ids")
    bad = torch.tensor([1, -2, 3]).as_subclass(FakeCuda)
    with pytest.raises(RuntimeError, match="a token id is negative"):
        check_token_ids(bad, "input ids")
