"""Bad input to ``packkit.shared_prefix`` is a clear ValueError / TypeError naming the argument, never a silent
wrong result, a torch / numpy internal error or an allocation out of proportion to the tokens (issue 39 §1).

Each test pairs the refusal with a control: the nearest valid call still works (and gives the right value),
so a check that refused everything, or nothing, fails here.
"""
from __future__ import annotations

import re
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from packkit import rl, shared_prefix as sp
from packkit.shared_prefix.checks import PAD_SLOTS_FLOOR, PAD_SLOTS_PER_TOKEN
from packkit.shared_prefix.planning import split_oversized, tree_costs

from shared_prefix_models import PROMPT, grpo_rollouts

pytestmark = pytest.mark.core

P = [[1, 2, 3], [4, 5]]
C = [[[6, 7], [8]], [[9], [10, 11]]]  # 11 tokens, 4 sequences


def batch_and_logits(vocab=16, prompts=P, completions=C, **kwargs):
    batch, info = sp.pack_groups(prompts, completions, **kwargs)
    info.attention.calls += 1  # the random logits stand in for a model's forward through the batch's attention
    torch.manual_seed(0)
    logits = torch.randn(*batch["input_ids"].shape, vocab, dtype=torch.float64, requires_grad=True)
    return batch, info, logits


# --- pack_tree with a PrefixForest: group_ids / score_from were ignored ---------------------------------------

@pytest.mark.parametrize("kwargs", [{"score_from": [0, 0]}, {"group_ids": [0, 1]}])
def test_pack_tree_refuses_group_ids_and_score_from_with_a_forest(kwargs):
    sequences = [[1, 2], [1, 3]]
    forest = sp.build_tree(sequences)
    with pytest.raises(ValueError, match=f"PrefixForest and {next(iter(kwargs))}.*build_tree"):
        sp.pack_tree(forest, **kwargs)
    # Control: given to build_tree they apply; the forest alone packs as before.
    _, applied = sp.pack_tree(sp.build_tree(sequences, **kwargs))
    _, plain = sp.pack_tree(forest)
    assert applied.forest.score_start.tolist() != plain.forest.score_start.tolist() or "group_ids" in kwargs
    assert plain.num_sequences == 2


# --- GRPO loss: shapes exactly [N] / [N, W], lists accepted --------------------------------------------------

def grpo_case():
    """N == W == 2: the case where a [1, W] or [W] tensor used to broadcast silently."""
    batch, info, logits = batch_and_logits(prompts=[[1, 2]], completions=[[[3, 4], [5, 6]]])
    lp = sp.completion_logprobs(logits, info)
    assert lp.padded.shape == (2, 2)
    return lp


def test_grpo_loss_refuses_broadcastable_shapes():
    lp = grpo_case()
    with pytest.raises(ValueError, match=r"advantages must have shape \[2\] or \[2, 2\], got \[1, 2\]"):
        sp.grpo_token_mean_loss(lp, torch.tensor([[1.0, 3.0]]))
    with pytest.raises(ValueError, match=r"advantages must have shape .* got \[2, 1\]"):
        sp.grpo_token_mean_loss(lp, torch.tensor([[1.0], [3.0]]))
    with pytest.raises(ValueError, match=r"old_logprobs must have shape \[2, 2\], got \[2\]"):
        sp.grpo_token_mean_loss(lp, torch.tensor([1.0, 3.0]), lp.padded.detach()[0])
    with pytest.raises(ValueError, match=r"old_logprobs must have shape \[2, 2\], got \[1, 2\]"):
        sp.grpo_token_mean_loss(lp, torch.tensor([1.0, 3.0]), lp.padded.detach()[:1])


def test_grpo_loss_values_for_accepted_shapes_and_lists():
    lp = grpo_case()
    # ratio 1 (old = current): the loss is -(mean advantage over tokens) = -(1 + 1 + 3 + 3) / 4.
    want = -2.0
    per_seq = sp.grpo_token_mean_loss(lp, torch.tensor([1.0, 3.0]))
    assert float(per_seq) == pytest.approx(want)
    assert float(sp.grpo_token_mean_loss(lp, [1.0, 3.0])) == pytest.approx(want)  # a list: accepted
    assert float(sp.grpo_token_mean_loss(lp, np.array([1, 3]))) == pytest.approx(want)  # ints are exact
    per_token = sp.grpo_token_mean_loss(lp, torch.tensor([[1.0, 1.0], [3.0, 3.0]]))
    assert float(per_token) == pytest.approx(want)
    old = lp.padded.detach().tolist()
    assert float(sp.grpo_token_mean_loss(lp, [1.0, 3.0], old)) == pytest.approx(want)


@pytest.mark.parametrize("advantages, error, match", [
    ({"a": 1}, TypeError, "advantages must be a tensor, numpy array or list"),
    (torch.tensor([True, False]), TypeError, "advantages must hold real numbers"),
    (["x", "y"], TypeError, "advantages must hold real numbers"),
    ([[1.0], [2.0, 3.0]], ValueError, "advantages must be a rectangular array"),
])
def test_grpo_loss_refuses_unreadable_advantages(advantages, error, match):
    with pytest.raises(error, match=match):
        sp.grpo_token_mean_loss(grpo_case(), advantages)


@pytest.mark.parametrize("clip_eps", [-0.1, 1.0, float("nan"), True])
def test_grpo_loss_refuses_bad_clip_eps(clip_eps):
    with pytest.raises((ValueError, TypeError), match="clip_eps"):
        sp.grpo_token_mean_loss(grpo_case(), [1.0, 3.0], clip_eps=clip_eps)


# --- allocation bounded by the tokens ------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [{"capacity": 10**8}, {"capacity": 16, "dp_size": 2**24},
                                    {"capacity": 16, "dp_size": 10**6}, {"capacity": 2**21, "dp_size": 4},
                                    {"capacity": 4, "dp_size": 2**20}])
def test_allocation_out_of_proportion_to_the_tokens_is_refused_at_once(kwargs):
    start = time.perf_counter()
    with pytest.raises(ValueError, match="(token slots|rows) .*for 11 tokens"):
        sp.pack_groups(P, C, **kwargs)
    assert time.perf_counter() - start < 1.0  # refused before planning or allocating


def test_allocation_bound_keeps_real_configurations():
    batch, info = sp.pack_groups(P, C, capacity=8192, dp_size=8)  # 7 empty rows for idle ranks: legitimate
    assert batch["input_ids"].shape == (8, 8192)
    batch, _ = sp.pack_groups(P, C, capacity=PAD_SLOTS_FLOOR)  # one row at the floor
    assert batch["input_ids"].shape == (1, PAD_SLOTS_FLOOR)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 2**16), st.integers(1, 2**10), st.integers(1, 6))
def test_allocation_never_exceeds_the_bound(capacity, dp_size, groups):
    prompts = [[1, 2, 3]] * groups
    completions = [[[4, 5], [6]]] * groups
    tokens = 6 * groups
    try:
        batch, _ = sp.pack_groups(prompts, completions, capacity=capacity, dp_size=dp_size, overlong="truncate")
    except ValueError as exc:
        if "token slots" in str(exc):
            assert capacity * dp_size > max(PAD_SLOTS_FLOOR, PAD_SLOTS_PER_TOKEN * tokens)
            return
        assert "leaves no room" in str(exc)  # capacity below a prompt + one token
        return
    assert batch["input_ids"].numel() <= max(PAD_SLOTS_FLOOR, PAD_SLOTS_PER_TOKEN * tokens * 2)  # splits copy


def test_hand_made_tree_plan_with_too_many_rows_is_refused():
    forest = sp.groups_forest(P, C)
    good = sp.plan_trees(forest, 64)
    bad = good._replace(rows=list(good.rows) + [np.zeros(0, np.int64)] * (2 * PAD_SLOTS_FLOOR // 64))
    with pytest.raises(ValueError, match="rows for 11 tokens"):
        sp.pack_forest(bad)
    wide = sp.plan_trees(forest, PAD_SLOTS_FLOOR // 2)
    wide = wide._replace(rows=list(wide.rows) + [np.zeros(0, np.int64)] * 2)
    with pytest.raises(ValueError, match="3 rows of capacity=2097152 would allocate 6,291,456 token slots"):
        sp.pack_forest(wide)
    twice = good._replace(rows=list(good.rows) + list(good.rows))
    with pytest.raises(ValueError, match="name each of the forest's 2 roots exactly once"):
        sp.pack_forest(twice)
    assert sp.pack_forest(good)[0]["input_ids"].shape == (1, 64)


# --- every argument checked, with or without capacity -------------------------------------------------------

BAD_OPTIONS = [
    ({"dp_size": 0}, ValueError, "dp_size must be a positive integer"),
    ({"dp_size": 1.5}, TypeError, "dp_size must be a positive integer"),
    ({"algorithm": "nope"}, ValueError, "unknown algorithm 'nope'"),
    ({"overlong": "bogus"}, ValueError, "unknown overlong policy 'bogus'"),
    ({"overlong": "drop"}, ValueError, "unknown overlong policy 'drop'"),
    ({"cost": "flops"}, ValueError, "unknown cost 'flops'"),
    ({"cost": np.array([1.0, 2.0])}, TypeError, "cost must be .* got a ndarray"),
    ({"cost": (1.0, -1.0)}, ValueError, "cost coefficients"),
    ({"attention": "fast"}, ValueError, "unknown attention 'fast'"),
    ({"backend": "gpu"}, ValueError, "unknown backend 'gpu'"),
    ({"pad_id": -1}, ValueError, "pad_id must be a token id in \\[0, "),
    ({"pad_id": 2**70}, ValueError, "pad_id must be a token id"),
    ({"pad_id": True}, TypeError, "pad_id must be an int"),
    ({"pad_id": 1.0}, TypeError, "pad_id must be an int"),
    ({"device": "tpu"}, ValueError, "device='tpu'"),
    ({"device": 3.5}, TypeError, "device must be"),
]


@pytest.mark.parametrize("capacity", [None, 32])
@pytest.mark.parametrize("kwargs, error, match", BAD_OPTIONS)
def test_every_option_is_checked_with_or_without_capacity(capacity, kwargs, error, match):
    with pytest.raises(error, match=match):
        sp.pack_groups(P, C, capacity=capacity, **kwargs)
    with pytest.raises(error, match=match):
        sp.pack_tree([[1, 2, 3], [1, 2, 4]], capacity=capacity, **kwargs)


def test_dp_size_needs_capacity_and_valid_choices_still_work():
    with pytest.raises(ValueError, match="dp_size=2 needs capacity"):
        sp.pack_groups(P, C, dp_size=2)
    with pytest.raises(ValueError, match="dp_size=2 needs capacity"):
        sp.plan_trees(sp.groups_forest(P, C), dp_size=2)
    for kwargs in ({"algorithm": "ffd", "overlong": "truncate", "cost": "attention"}, {"cost": (1.0, 0.5)}):
        for capacity in (None, 32):
            batch, info = sp.pack_groups(P, C, capacity=capacity, **kwargs)
            assert int(batch["input_ids"].ne(0).sum()) == 11


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_device_without_cuda_names_the_argument():
    with pytest.raises(ValueError, match="device='cuda' but no CUDA device is available"):
        sp.pack_groups(P, C, device="cuda")
    with pytest.raises(ValueError, match="device='cuda:1' but no CUDA device"):
        sp.pack_tree([[1, 2]], device="cuda:1")
    with pytest.raises(ValueError, match="device='cuda' but no CUDA device"):
        sp.SharedPrefixCollator(device="cuda")


# --- token ids ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("prompts, completions, error, match", [
    ([[1, -1]], [[[2]]], ValueError, r"prompts\[0\]\[1\] is -1: token ids .* must be >= 0"),
    ([[1]], [[[2], np.array([3, -7])]], ValueError, r"completions\[0\]\[1\]\[1\] is -7"),
    ([torch.tensor([-2])], [[[2]]], ValueError, r"prompts\[0\]\[0\] is -2"),
    ([[True, False]], [[[2]]], TypeError, r"prompts\[0\] holds a bool"),
    ([np.array([True])], [[[2]]], TypeError, "integer token id"),
    ([[1.5]], [[[2]]], TypeError, "integer token id"),
    ([[1]], [[torch.tensor([2.0])]], TypeError, "integer token ids, got dtype torch.float32"),
    ([[1]], [[torch.tensor([1 + 2j])]], TypeError, "integer token ids, got dtype torch.complex64"),
    ([[2**64]], [[[2]]], TypeError, "integer token id"),
])
def test_bad_token_ids_are_refused_at_packing_time(prompts, completions, error, match):
    with pytest.raises(error, match=match):
        sp.pack_groups(prompts, completions)


def test_negative_ids_in_trees_and_forests_are_refused_but_labels_may_be_negative():
    with pytest.raises(ValueError, match=r"sequences\[1\]\[2\] is -4"):
        sp.pack_tree([[1, 2, 3], [1, 2, -4]])
    with pytest.raises(ValueError, match=r"sequences\[0\]\[0\] is -1"):
        sp.sequences_forest([[-1]])
    forest = sp.groups_forest([[1]], [[[2, 3]]])
    bad = forest._replace(tokens=torch.tensor([1, -5, 3]))  # a hand-made forest
    with pytest.raises(ValueError, match=r"token id -5 at tokens\[1\] \(node 1\)"):
        sp.pack_tree(bad)
    # Control: labels use -100 (ignored) and are not token ids.
    _, info = sp.pack_groups([[1]], [[[2, 3]]], labels=[[[-100, 3]]])
    assert info.labels.tolist() == [[-100, -100, 3]]


def test_small_integer_dtypes_are_widened_not_refused():
    want, _ = sp.pack_groups([[1, 2]], [[[3], [4]]])
    for dtype in (torch.uint8, torch.int16, torch.int32):
        got, _ = sp.pack_groups([torch.tensor([1, 2], dtype=dtype)], [[torch.tensor([3], dtype=dtype),
                                                                       torch.tensor([4], dtype=dtype)]])
        assert got["input_ids"].tolist() == want["input_ids"].tolist()


# --- empty input: one behaviour -----------------------------------------------------------------------------

@pytest.mark.parametrize("pack", [lambda **k: sp.pack_groups([], [], **k), lambda **k: sp.pack_tree([], **k)])
@pytest.mark.parametrize("capacity", [None, 16])
def test_empty_input_is_an_empty_batch_for_groups_and_trees(pack, capacity):
    batch, info = pack(capacity=capacity)
    assert batch["input_ids"].shape[1] in (0, 16) and int(batch["input_ids"].ne(0).sum()) == 0
    assert info.num_sequences == 0
    lp = sp.completion_logprobs(torch.zeros(*batch["input_ids"].shape, 5), info)
    assert lp.padded.shape == (0, 0)
    assert float(sp.grpo_token_mean_loss(lp, torch.zeros(0))) == 0.0
    chosen, rejected = sp.dpo_logps(lp, info)
    assert float(sp.dpo_loss(chosen, rejected, chosen, rejected)) == 0.0  # no pairs: 0, not NaN


# --- completion_logprobs / completion_values -------------------------------------------------------------------

@pytest.mark.parametrize("logits, error, match", [
    (torch.tensor(1.0), ValueError, "logits must be \\[1, 11, ...\\] .* got a 0-d tensor"),
    (np.zeros((1, 11, 16)), TypeError, "logits must be a torch.Tensor .* got ndarray \\(use torch.from_numpy\\)"),
    ([[0.0]], TypeError, "logits must be a torch.Tensor .* got list"),
    ({"logits": 1}, TypeError, "logits must be a torch.Tensor .* got dict"),
    (torch.zeros(1, 11, 16, dtype=torch.int64), TypeError, "logits must be a floating tensor .*int64"),
    (torch.zeros(1, 11, 16, dtype=torch.bool), TypeError, "logits must be a floating tensor .*bool"),
    (torch.zeros(1, 11, 16, dtype=torch.complex64), TypeError, "logits must be a floating tensor .*complex64"),
    (torch.zeros(1, 11, 5), ValueError, "vocabulary of 5, but the batch holds token id 11"),
    (torch.zeros(1, 10, 16), ValueError, "logits must be \\[1, 11, ...\\]"),
])
def test_completion_logprobs_refuses_bad_logits(logits, error, match):
    _, info, _ = batch_and_logits()
    with pytest.raises(error, match=match):
        sp.completion_logprobs(logits, info)


@pytest.mark.parametrize("temperature, error", [(float("inf"), ValueError), (True, TypeError), (1e-310, ValueError),
                                                (float("nan"), ValueError), (0, ValueError), (-1.0, ValueError),
                                                ("1", TypeError), (torch.tensor(True), TypeError)])
def test_completion_logprobs_refuses_bad_temperature(temperature, error):
    _, info, logits = batch_and_logits()
    with pytest.raises(error, match="temperature"):
        sp.completion_logprobs(logits, info, temperature=temperature)


def test_completion_logprobs_accepts_real_temperatures_and_vocab_equal_to_max_id_plus_one():
    _, info, logits = batch_and_logits(vocab=12)  # ids go up to 11
    ref = torch.log_softmax(logits[0] / 0.7, -1)
    for t in (0.7, np.float64(0.7), torch.tensor(0.7)):
        lp = sp.completion_logprobs(logits, info, temperature=t)
        first = ref[2, 6]  # the prompt's last position predicts completion 0's first token (6)
        assert float(lp.padded[0, 0]) == pytest.approx(float(first))
        assert torch.isfinite(lp.padded).all()


def test_completion_logprobs_refuses_bad_input_ids_and_info():
    batch, info, logits = batch_and_logits()
    with pytest.raises(TypeError, match="input_ids must hold integer token ids"):
        sp.completion_logprobs(logits, info, input_ids=batch["input_ids"].float())
    with pytest.raises(ValueError, match="vocabulary of 16, but the batch holds token id 99"):
        sp.completion_logprobs(logits, info, input_ids=batch["input_ids"].clamp(min=99))
    with pytest.raises(TypeError, match="info must be the SharedPrefixInfo"):
        sp.completion_logprobs(logits, {"info": 1})


@pytest.mark.parametrize("values, kwargs, error, match", [
    (torch.tensor(1.0), {}, ValueError, "values must be .* got a 0-d tensor"),
    ([1.0], {}, TypeError, "values must be a torch.Tensor"),
    (torch.zeros(1, 11, dtype=torch.int64), {"fill": float("nan")}, ValueError, "fill=nan cannot be stored"),
    (torch.zeros(1, 11), {"fill": "x"}, TypeError, "fill must be a number"),
    (torch.zeros(1, 11), {"shift": 1}, TypeError, "shift must be True or False"),
])
def test_completion_values_refuses_bad_input(values, kwargs, error, match):
    _, info, _ = batch_and_logits()
    with pytest.raises(error, match=match):
        sp.completion_values(values, info, **kwargs)


# --- DPO -------------------------------------------------------------------------------------------------------

def test_dpo_loss_names_mismatched_and_non_tensor_arguments():
    x = torch.zeros(2)
    with pytest.raises(ValueError, match=r"must all be \[P\].*rejected \[3\]"):
        sp.dpo_loss(x, torch.zeros(3), x, x)
    with pytest.raises(ValueError, match=r"must all be \[P\]"):
        sp.dpo_loss(torch.zeros(2, 1), torch.zeros(2, 1), torch.zeros(2, 1), torch.zeros(2, 1))
    with pytest.raises(TypeError, match="ref_chosen must be a tensor"):
        sp.dpo_loss(x, x, [0.0, 0.0], x)
    with pytest.raises(TypeError, match="rejected must be a floating tensor"):
        sp.dpo_loss(x, torch.zeros(2, dtype=torch.long), x, x)
    for beta in (0.0, -1.0, float("inf"), True):
        with pytest.raises((ValueError, TypeError), match="beta"):
            sp.dpo_loss(x, x, x, x, beta=beta)
    assert float(sp.dpo_loss(x, x, x, x)) == pytest.approx(float(np.log(2)))  # control


def test_dpo_logps_refuses_pairs_that_are_not_adjacent():
    batch, info = sp.pack_tree([[1, 2, 3], [1, 2, 4], [5, 6], [5, 7]], group_ids=[0, 1, 0, 1])
    info.attention.calls += 1  # zero logits stand in for a forward
    lp = sp.completion_logprobs(torch.zeros(*batch["input_ids"].shape, 8), info)
    with pytest.raises(ValueError, match="sequences 0 and 1 are in groups 0 and 1: DPO pairs must be adjacent"):
        sp.dpo_logps(lp, info)
    batch, info = sp.pack_tree([[1, 2, 3], [1, 2, 4], [5, 6], [5, 7]], group_ids=[0, 0, 1, 1])  # control
    info.attention.calls += 1
    assert sp.dpo_logps(sp.completion_logprobs(torch.zeros(*batch["input_ids"].shape, 8), info), info)[0].shape == (2,)
    with pytest.raises(TypeError, match="result must be the CompletionLogprobs"):
        sp.dpo_logps(lp.padded, info)


def test_collator_checks_its_options_at_construction():
    with pytest.raises(TypeError, match="ignore_keys must be a list of field names, got str"):
        sp.SharedPrefixCollator(ignore_keys="foo")
    with pytest.raises(ValueError, match="capacity must be a positive integer"):
        sp.SharedPrefixCollator(capacity=0)
    with pytest.raises(ValueError, match="unknown overlong policy 'drop'"):
        sp.SharedPrefixCollator(overlong="drop")
    with pytest.raises(ValueError, match="unknown attention"):
        sp.SharedPrefixCollator(attention="fast")
    with pytest.raises(ValueError, match="completion_keys must name at least one"):
        sp.SharedPrefixCollator(completion_keys=[])
    collate = sp.SharedPrefixCollator(completions_key="completion_ids")
    with pytest.raises(TypeError, match="'completion_ids' must be a list of token sequences"):
        collate([{"prompt_ids": [1], "completion_ids": "abc"}])
    with pytest.raises(TypeError, match="integer token ids, got dtype torch.float32"):
        sp.SharedPrefixCollator()([{"prompt_ids": torch.tensor([1.0]), "chosen_ids": [2], "rejected_ids": [3]}])
    batch, info = collate([{"prompt_ids": torch.tensor([1, 2]), "completion_ids": [[3], [4, 5]]}])
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5]]


# --- forests, planning, micro-batches ---------------------------------------------------------------------------

def test_inconsistent_forests_are_refused_before_packing():
    forest = sp.groups_forest([[1, 2]], [[[3], [4]]])
    cases = [
        (forest._replace(parent=np.array([-1, 0, 2])), "parent\\[2\\] = 2: nodes must be in preorder"),
        (forest._replace(src=np.array([0, 2, 9])), "node 2 \\(src=9, length=1\\) is not inside its 4 tokens"),
        (forest._replace(length=np.array([2, -1, 1])), "node 1 .* is not inside"),
        (forest._replace(seq_node=np.array([1, 5])), "seq_node names a node outside"),
        (forest._replace(score_start=np.array([2, 4])), "score_start\\[1\\] = 4 is outside sequence 1 of 3 tokens"),
        (forest._replace(tokens=torch.tensor([1.0, 2.0, 3.0, 4.0])), "tokens must be a 1-D int64 or int32 tensor"),
        (forest._replace(parent=[-1, 0, 0]), "parent must be a 1-D integer numpy array"),
    ]
    for bad, match in cases:
        for call in (lambda f: sp.pack_tree(f), lambda f: sp.plan_trees(f, 8), lambda f: split_oversized(f, 8),
                     lambda f: sp.tree_micro_batches(f, 8), lambda f: tree_costs(f)):
            with pytest.raises((ValueError, TypeError), match=match):
                call(bad)
    with pytest.raises(TypeError, match="forest must be a PrefixForest"):
        sp.plan_trees([[1, 2]], 8)
    assert sp.pack_tree(forest)[0]["input_ids"].tolist() == [[1, 2, 3, 4]]  # control


def test_planning_functions_check_their_numbers():
    forest = sp.groups_forest(P, C)
    with pytest.raises(ValueError, match="capacity must be a positive integer"):
        split_oversized(forest, 0)
    with pytest.raises(TypeError, match="capacity must be a positive integer"):
        split_oversized(forest, 8.0)
    with pytest.raises(ValueError, match="max_tokens must be a positive integer"):
        sp.tree_micro_batches(forest, 0)
    with pytest.raises(ValueError, match="unknown overlong policy 'split'"):
        sp.tree_micro_batches(forest, 8, overlong="split")
    with pytest.raises(ValueError, match=r"cost callable returned costs of shape \(\) for \d+ lengths; it must "
                                         r"return one cost per length"):
        tree_costs(forest, lambda lengths: 5.0)  # a scalar would broadcast to every node
    with pytest.raises(ValueError, match="returned a negative cost"):
        tree_costs(forest, lambda lengths: -lengths.astype(float))
    with pytest.raises(ValueError, match="non-decreasing"):
        tree_costs(forest, lambda lengths: 9.0 - lengths.astype(float))
    squares = tree_costs(forest, lambda lengths: lengths.astype(float) ** 2)  # root L^2, each branch its own part
    assert squares.tolist() == [9.0 + (25 - 9) + (16 - 9), 4.0 + (9 - 4) + (16 - 4)]
    with pytest.raises(TypeError, match="cost must be"):
        sp.tree_micro_batches(forest, 8, cost=np.array([1.0, 0.0]))


def test_build_tree_refuses_what_it_cannot_compare():
    with pytest.raises(TypeError, match="sequences must be a list"):
        sp.build_tree(torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="group_ids must be 2 integers"):
        sp.build_tree([[1], [2]], group_ids=[0.0, 1.0])
    with pytest.raises(ValueError, match="score_from must be 2 integers"):
        sp.build_tree([[1], [2]], score_from=[True, False])
    with pytest.raises(ValueError, match="score_from must be 1 integers"):
        sp.sequences_forest([[1, 2]], score_from=[1.7])  # was cast to 1 silently
    assert sp.build_tree([[], [1, 2]]).score_start.tolist() == [0, 1]  # an empty sequence scores nothing


# --- verl rollouts ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [2, 0.5, -1])
def test_rollout_mask_values_other_than_0_1_set_the_status_without_a_sync(value):
    ids, mask, uids = grpo_rollouts()
    layout = rl.rollout_layout(mask)  # of the good mask: the no-sync path, as within a verl step
    bad = mask.to(torch.float32 if value == 0.5 else mask.dtype).clone()
    bad[bad == 1] = value
    _, info = sp.pack_rollout_groups(ids, bad, uids, [0, 1, 2], layout, prompt_length=PROMPT)
    assert isinstance(info.status, torch.Tensor) and int(info.status) == 2
    with pytest.raises(ValueError, match="attention_mask holds a value other than 0 and 1"):
        sp.check_rollout_groups(info)
    _, good = sp.pack_rollout_groups(ids, mask, uids, [0, 1, 2], layout, prompt_length=PROMPT)  # control
    assert int(good.status) == 0
    _, good = sp.pack_rollout_groups(ids, mask.bool(), uids, [0, 1, 2], layout, prompt_length=PROMPT)
    assert int(good.status) == 0


def test_rollout_input_types_are_refused_by_name():
    ids, mask, uids = grpo_rollouts()
    with pytest.raises(TypeError, match="attention_mask must be a \\[batch, seq_len\\] tensor of 0 and 1, got list"):
        sp.pack_rollout_groups(ids, mask.tolist(), uids, [0], prompt_length=PROMPT)
    with pytest.raises(TypeError, match="input_ids must hold integer token ids, got dtype torch.float32"):
        sp.pack_rollout_groups(ids.float(), mask, uids, [0], prompt_length=PROMPT)
    with pytest.raises(TypeError, match="input_ids must be a \\[batch, seq_len\\] tensor, got list"):
        sp.pack_rollout_groups(ids.tolist(), mask, uids, [0], prompt_length=PROMPT)
    bad = ids.clone()
    row = 0
    bad[row, int(torch.nonzero(mask[row]).flatten()[-1])] = -3
    with pytest.raises(ValueError, match="token id -3"):  # host tokens: refused at once
        sp.pack_rollout_groups(bad, mask, uids, [row], prompt_length=PROMPT)
    _, info = sp.pack_rollout_groups(ids, mask, uids, [0], prompt_length=PROMPT)
    with pytest.raises(ValueError, match="temperature"):
        sp.rollout_logprobs(torch.zeros(1, 1, 1), info, temperature=float("inf"))
    with pytest.raises(TypeError, match="info must be the RolloutGroupsInfo"):
        sp.check_rollout_groups(info.info)


def test_status_bits_and_messages():
    assert sp.status_errors(0) == []
    assert len(sp.status_errors(7)) == 3
    assert sp.check_status(sp.pack_groups(P, C)[1]) is None  # host tokens: checked already, status None
    info = sp.pack_groups(P, C)[1]._replace(status=torch.tensor(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="a packed token id is negative"):
        sp.check_status(info)


def test_verl_integration_checks_the_micro_batch():
    from packkit.integrations.verl_shared_prefix import shared_prefix_log_probs

    ids, mask, uids = grpo_rollouts()
    micro = {"input_ids": ids, "attention_mask": mask, "responses": ids[:, PROMPT:]}
    with pytest.raises(ValueError, match="micro_batch lacks \\['responses'\\]"):
        shared_prefix_log_probs(None, {"input_ids": ids, "attention_mask": mask}, uids)
    with pytest.raises(ValueError, match="responses.* at most"):
        shared_prefix_log_probs(None, dict(micro, responses=torch.zeros(len(ids), ids.shape[1] + 1)), uids)
    with pytest.raises(ValueError, match="uids must hold one id per row"):
        shared_prefix_log_probs(None, micro, uids[:-1])
    with pytest.raises(ValueError, match="temperature"):
        shared_prefix_log_probs(None, micro, uids, temperature=0.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="device token ids: the no-sync status path needs CUDA")
def test_negative_device_token_ids_set_the_status_not_a_sync():
    prompts = [torch.tensor([1, 2], device="cuda")]
    completions = [[torch.tensor([3, -1], device="cuda")]]
    batch, info = sp.pack_groups(prompts, completions)
    assert info.status is not None and info.status.device.type == "cuda"
    with pytest.raises(ValueError, match="negative"):
        sp.check_status(info)
    logits = torch.zeros(*batch["input_ids"].shape, 3, device="cuda")
    good_prompts = [torch.tensor([1, 2], device="cuda")]
    batch, info = sp.pack_groups(good_prompts, [[torch.tensor([3, 7], device="cuda")]])
    lp = sp.completion_logprobs(torch.zeros(*batch["input_ids"].shape, 5, device="cuda"), info)
    assert torch.isnan(lp.padded[0, 1]) and torch.isfinite(lp.padded[0, 0])  # id 7 >= vocab 5: NaN, no assert
    del logits


def test_values_on_another_device_than_the_batch_are_named():
    _, info, logits = batch_and_logits()
    with pytest.raises(ValueError, match="logits are on meta but the packed batch \\(info\\) is on cpu"):
        sp.completion_logprobs(torch.zeros(1, 11, 16, device="meta"), info)
    with pytest.raises(ValueError, match="values are on meta"):
        sp.completion_values(torch.zeros(1, 11, device="meta"), info)


def test_non_finite_host_values_are_refused_where_the_loss_reads_them():
    lp = grpo_case()
    with pytest.raises(ValueError, match="advantages holds a non-finite value"):
        sp.grpo_token_mean_loss(lp, [1.0, float("nan")])
    old = lp.padded.detach().clone()
    old[1, 0] = float("-inf")
    with pytest.raises(ValueError, match="old_logprobs holds a non-finite value"):
        sp.grpo_token_mean_loss(lp, [1.0, 3.0], old)
    x = torch.zeros(2)
    with pytest.raises(ValueError, match="chosen holds a non-finite value"):
        sp.dpo_loss(torch.tensor([0.0, float("inf")]), x, x, x)
    # Control: a NaN where the loss does not read (past a sequence's end) is harmless and accepted.
    _, info, logits = batch_and_logits()
    lp = sp.completion_logprobs(logits, info)
    old = lp.padded.detach().masked_fill(~lp.mask, float("nan"))
    assert torch.isfinite(sp.grpo_token_mean_loss(lp, [1.0, 2.0, 3.0, 4.0], old))


@pytest.mark.parametrize("bad", [None, "abc", {"a": 1}, 5, np.int64(5), torch.tensor(5)])
def test_a_sequence_that_is_not_a_sequence_is_named_at_its_own_index(bad):
    with pytest.raises(TypeError, match=r"completions\[0\]\[1\] must be a token sequence"):
        sp.pack_groups([[1]], [[[2], bad]])
    with pytest.raises(TypeError, match=r"sequences\[1\] must be a token sequence"):
        sp.build_tree([[1], bad])
    with pytest.raises(TypeError, match=r"example 0: 'rejected_ids' must be a token sequence|must be a token sequence"):
        sp.SharedPrefixCollator()([{"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": bad}])


def test_collator_refuses_a_batch_that_is_not_a_list_of_examples():
    for bad in (None, {"prompt_ids": [1]}, "abc"):
        with pytest.raises(TypeError, match="list of example dicts"):
            sp.SharedPrefixCollator()(bad)
    with pytest.raises(ValueError, match="empty list of examples"):
        sp.SharedPrefixCollator()([])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_an_integer_device_without_cuda_is_named():
    with pytest.raises(ValueError, match="device=0 \\(a CUDA index\\) but no CUDA device"):
        sp.pack_groups(P, C, device=0)
    with pytest.raises(TypeError, match="status must be an int or a 0-d tensor"):
        sp.status_errors("x")


def test_narrow_integer_rollout_ids_are_widened():
    ids, mask, uids = grpo_rollouts()
    want, _ = sp.pack_rollout_groups(ids, mask, uids, [0, 1, 2], prompt_length=PROMPT)
    got, info = sp.pack_rollout_groups(ids.to(torch.uint8), mask, uids, [0, 1, 2], prompt_length=PROMPT)
    assert got["input_ids"].tolist() == want["input_ids"].tolist() and int(info.status) == 0


group_st = st.lists(st.tuples(st.lists(st.integers(0, 50), max_size=4),
                              st.lists(st.lists(st.integers(0, 50), max_size=4), min_size=1, max_size=3)),
                    min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(group_st, st.data())
def test_one_negative_id_anywhere_is_refused_at_its_own_index(groups, data):
    prompts = [p for p, _ in groups]
    completions = [c for _, c in groups]
    sp.pack_groups(prompts, completions)  # control: all ids >= 0
    slots = [("prompts", g, None, i) for g, p in enumerate(prompts) for i in range(len(p))]
    slots += [("completions", g, j, i) for g, cs in enumerate(completions) for j, c in enumerate(cs)
              for i in range(len(c))]
    if not slots:
        return
    kind, g, j, i = data.draw(st.sampled_from(slots))
    value = data.draw(st.integers(-(2**40), -1))
    if kind == "prompts":
        prompts[g] = prompts[g][:i] + [value] + prompts[g][i + 1:]
        where = f"prompts[{g}][{i}]"
    else:
        completions[g] = [list(c) for c in completions[g]]
        completions[g][j][i] = value
        where = f"completions[{g}][{j}][{i}]"
    with pytest.raises(ValueError, match=rf"^{re.escape(where)} is {value}: token ids"):
        sp.pack_groups(prompts, completions)


@settings(max_examples=80, deadline=None)
@given(group_st, st.sampled_from(["parent", "length", "src", "seq_node", "score_start", "seq_group"]), st.data())
def test_a_corrupted_forest_is_refused_or_packs_never_crashes(groups, field, data):
    forest = sp.groups_forest([p for p, _ in groups], [c for _, c in groups])
    values = getattr(forest, field).copy()
    if len(values) == 0:
        return
    values[data.draw(st.integers(0, len(values) - 1))] = data.draw(st.integers(-3, forest.num_nodes + 8))
    bad = forest._replace(**{field: values})
    try:
        batch, info = sp.pack_tree(bad, capacity=data.draw(st.sampled_from([None, 64])))
    except (ValueError, TypeError):
        return  # refused by name
    # Accepted: every sequence still reads back exactly its own tokens at its packed positions.
    flat = batch["input_ids"].reshape(-1)
    for s in range(bad.num_sequences):
        assert flat[torch.from_numpy(info.layout.seq_positions[s])].tolist() == bad.sequence_tokens(s).tolist()


def test_logits_of_a_forward_that_never_called_the_attention_are_refused():
    # A recurrent model (mamba, rwkv) or one with its own attention code never calls the registered function:
    # its logits saw each row as one plain sequence.
    batch, info = sp.pack_groups(P, C)
    logits = torch.randn(*batch["input_ids"].shape, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="shared-prefix attention was never called with this batch"):
        sp.completion_logprobs(logits, info)
    with pytest.raises(ValueError, match="never called"):
        sp.completion_values(logits[..., 0], info)
    q = torch.randn(1, 2, batch["input_ids"].shape[1], 4, dtype=torch.float64)
    batch["shared_prefix"](q, q, q, None)  # one attention call through the batch's metadata
    assert sp.completion_logprobs(logits, info).padded.shape[0] == 4
    empty, info = sp.pack_groups([], [])  # nothing to attend over: nothing to refuse
    assert sp.completion_logprobs(torch.zeros(1, 0, 16), info).padded.shape[0] == 0


@pytest.mark.parametrize("kind", ["bloom", "mamba"])
def test_models_that_never_call_a_registered_attention_are_refused(kind):
    transformers = pytest.importorskip("transformers")
    config = (transformers.BloomConfig(vocab_size=32, hidden_size=32, n_layer=2, n_head=2) if kind == "bloom" else
              transformers.MambaConfig(vocab_size=32, hidden_size=32, num_hidden_layers=2, state_size=4))
    model = transformers.AutoModelForCausalLM.from_config(config).double()
    model.config._attn_implementation = sp.register_attention()  # bloom refuses set_attn_implementation
    batch, info = sp.pack_groups(P, C)
    logits = model(**batch, use_cache=False).logits  # runs: the model ignores the tree
    with pytest.raises(ValueError, match="never called"):
        sp.completion_logprobs(logits, info)
