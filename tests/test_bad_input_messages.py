"""Issue 57 part 3: the wrong messages the issue lists, each now naming its real cause (token ids beyond int64,
meta tensors, what a cost callback returns), with a working control beside each."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import packkit
from packkit import rl
from packkit import shared_prefix as sp

pytestmark = pytest.mark.core

BIG = 2**64 - 1
U64 = r"is 18446744073709551615 \(dtype uint64\), outside int64: token ids must be in \[0, 2\*\*63 - 1\]"


@pytest.mark.parametrize("call, where", [
    (lambda: packkit.pack_sequences([[1, 2], np.array([1, BIG], np.uint64)]), r"sequences\[1\]\[1\] "),
    (lambda: packkit.PackingCollator(capacity=16)([{"input_ids": np.array([1, BIG], np.uint64)}]),
     r"input_ids\[0\]\[1\] "),
    (lambda: sp.pack_tree(np.array([5, 6, BIG], np.uint64), lengths=[3], capacity=8), r"sequences\[2\] "),
    (lambda: sp.pack_tree([np.array([5, 6, 1], np.uint64), np.array([5, 6, BIG], np.uint64)], capacity=16),
     r"sequences\[1\]\[2\] "),
    (lambda: sp.build_tree(np.array([5, 6, BIG], np.uint64), lengths=[3]), r"sequences\[2\] "),
])
def test_uint64_token_named_not_wrapped(call, where):
    with pytest.raises(ValueError, match=where + U64):  # was "int too big to convert", or shown as -1
        call()


def test_python_int_token_beyond_int64_named():
    with pytest.raises(ValueError, match=r"sequences\[0\]\[1\] is 9223372036854775808, outside int64"):
        packkit.pack_sequences([[1, 2**63]])
    with pytest.raises(ValueError, match=r"sequences\[1\]\[2\] is 9223372036854775808, outside int64"):
        sp.pack_tree([np.array([5, 6, 1]), [5, 6, 2**63]], capacity=16)


def test_uint64_tokens_that_fit_still_pack():
    batch = packkit.pack_sequences([np.array([1, 2**40], np.uint64)])
    assert batch["input_ids"].tolist() == [[1, 2**40]]
    batch, _ = sp.pack_tree(np.array([5, 6, 1], np.uint64), lengths=[3], capacity=8)
    assert batch["input_ids"].reshape(-1)[:3].tolist() == [5, 6, 1]


META = r"is a meta tensor: meta tensors carry no data"


@pytest.mark.parametrize("call, name", [
    (lambda m: packkit.pack_sequences([m]), r"sequences\[0\]"),
    (lambda m: packkit.pack_sequences([[1, 2, 3], m]), r"sequences\[1\]"),
    (lambda m: packkit.pack_sequences(m, lengths=[3]), r"sequences"),
    (lambda m: packkit.pack_sequences([[1, 2, 3]], labels=[m]), r"labels\[0\]"),  # was NotImplementedError
    (lambda m: packkit.PackingCollator(capacity=16)([{"input_ids": m}]), r"input_ids\[0\]"),
    (lambda m: packkit.PackingCollator(capacity=16)([{"input_ids": [1, 2, 3], "labels": m}]), r"labels\[0\]"),
    (lambda m: sp.pack_tree([[5, 6, 1], m], capacity=16), r"sequences\[1\]"),
    (lambda m: sp.pack_tree(m, lengths=[3], capacity=16), r"sequences"),
])
def test_meta_tensors_named(call, name):
    with pytest.raises(ValueError, match=name + " " + META):  # was "packs on CPU or CUDA devices, got meta"
        call(torch.tensor([1, 2, 3], device="meta"))
    call(torch.tensor([1, 2, 3]))  # the same call on a CPU tensor packs


BAD_RETURNS = {
    "complex": (lambda x: np.asarray(x, np.float64) + 1j, r"complex"),
    "str": (lambda x: np.asarray(x).astype(str), r"returned str"),
    "object str": (lambda x: np.asarray(x).astype(str).astype(object), r"returned None"),
    "nan": (lambda x: np.full(np.shape(x), np.nan), r"non-finite cost \(nan\)"),
    "inf tensor": (lambda x: torch.full((len(x),), float("inf")), r"non-finite cost \(inf\)"),
    "negative": (lambda x: -1.0 - np.asarray(x, np.float64), r"negative cost"),
    "short": (lambda x: np.asarray(x, np.float64)[:-1], r"returned costs of shape"),
    "bool": (lambda x: torch.as_tensor(np.asarray(x) > 0), r"torch.bool tensor"),
    "None": (lambda x: None, r"returned None"),
}


@pytest.mark.parametrize("label", list(BAD_RETURNS))
@pytest.mark.parametrize("entry", ["pack_tree", "plan_trees", "micro_batches"])
def test_cost_callback_returns_one_rule(entry, label):
    """Every cost callback follows planning.arg_rules.callback_costs: shared_prefix cast a complex or string return
    to float64 (np.asarray(..., float64) dropped the imaginary part, parsed the digits)."""
    bad, match = BAD_RETURNS[label]
    seqs = [[5, 6, 1, 2], [5, 6, 3], [7, 8]]
    calls = {"pack_tree": lambda c: sp.pack_tree(seqs, capacity=16, dp_size=2, cost=c),
             "plan_trees": lambda c: sp.plan_trees(sp.build_tree(seqs), 16, dp_size=2, cost=c),
             "micro_batches": lambda c: rl.micro_batches([4, 3, 2], 16, 2, cost=c)}
    with pytest.raises(ValueError, match=r"cost callable.* " + match):
        calls[entry](bad)
    calls[entry](lambda x: np.asarray(x, np.float64) ** 2)  # a real cost plans


def test_meta_tensors_named_across_entry_points():
    """Found by the API fuzzer's meta draw (every tensor argument moved to the meta device): these raised
    NotImplementedError ("Cannot copy out of meta tensor"), a RuntimeError or a message naming another argument."""
    batch, info = packkit.pack_sequences([[1, 2, 3], [4, 5]], return_info=True)
    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    shard, cp_info = packkit.shard_context_parallel(batch, 2, 0, return_info=True)
    cases = [
        (lambda: packkit.shard_context_parallel(meta, 2, 0), r"batch\['input_ids'\] " + META),
        (lambda: packkit.unpack_sequences(batch["input_ids"].to("meta"), info), r"packed " + META),
        (lambda: packkit.pack_on_device(torch.tensor([1, 2, 3], device="meta"), torch.tensor([3]), 8),
         r"input_ids " + META),
        (lambda: packkit.pack_on_device(torch.tensor([1, 2, 3]), torch.tensor([3], device="meta"), 8),
         r"lengths " + META),
        (lambda: rl.rollout_layout(torch.ones(2, 4, dtype=torch.long, device="meta")), r"attention_mask " + META),
        (lambda: packkit.document_causal_block_mask(torch.zeros(8, dtype=torch.long, device="meta")),
         r"seq_idx " + META),
        (lambda: packkit.unshard_context_parallel(torch.zeros(2, shard["input_ids"].numel(), device="meta"), cp_info),
         r"gathered " + META),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
    assert packkit.unpack_sequences(batch["input_ids"], info).tolist() == [1, 2, 3, 4, 5]
