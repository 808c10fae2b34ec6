"""Registrations of the verl drop-ins (``balance_batch`` on a verl ``DataProto``, ``rearrange_micro_batches`` on a
TensorDict, built fresh per draw as tests/test_rl_verl.py builds them) and of the trainer plugins' planners (ms-swift's
``plan_packed_idx`` / ``plan_buffer``, LLaMA-Factory's ``plan_rows``, axolotl's ``MultipackBatchSampler``). Each
registers only where its framework imports (verl, tensordict); the checkers say what every result must hold: each row
planned exactly once, no micro-batch or row over its token cap."""
from __future__ import annotations

import numpy as np
import torch

from .checks import CAPACITY, LENGTHS
from .core import Api, Variant

N, S, CAP = 8, 16, 40  # rows, padded sequence length, token cap of a micro-batch (verl's a float: drawn as a real)


def _mask(n=N, s=S) -> torch.Tensor:
    return (torch.arange(s)[None, :] < torch.tensor([3, 9, 16, 5, 12, 1, 7, 10][:n])[:, None]).long()


def _tensordict(n=N):
    from tensordict import TensorDict

    mask = _mask(n)
    ids = (torch.arange(n * S).reshape(n, S) + 1) * mask
    return TensorDict({"input_ids": ids, "attention_mask": mask}, batch_size=[n])


def _dataproto(n=N):
    from verl import DataProto

    return DataProto(batch=_tensordict(n))


def _check_parts(parts, n, tokens, cap):
    flat = sorted(int(i) for part in parts for i in part)
    assert flat == list(range(n)), f"rows planned {flat}, want each of {n} once"
    for part in parts:
        assert sum(int(tokens[i]) for i in part) <= cap, f"a micro-batch over {cap} tokens: {list(part)}"


def _check_balance(plan, kw):
    batch = kw["batch"]
    n = len(batch)
    tokens = batch.batch["attention_mask"].sum(-1)  # after the reorder: the batch's rows in the plan's order
    step = batch.batch["packkit_micro_batch"]
    assert step.shape == (n,) and plan.dp_size == kw["dp_size"]
    per_rank = n // plan.dp_size
    cap = int(float(kw["max_token_len"]))
    for r in range(plan.dp_size):
        rows = torch.arange(r * per_rank, (r + 1) * per_rank)
        for k in step[rows].unique().tolist():
            assert int(tokens[rows[step[rows] == k]].sum()) <= cap, f"rank {r} micro-batch {k} over {cap} tokens"
    _check_parts([part for rank in plan.indices for part in rank], n, _mask(n).sum(-1).tolist(), cap)


def _check_rearrange(out, kw):
    micro, index = out
    tokens = kw["batch"]["attention_mask"].sum(-1).tolist()
    assert len(micro) == len(index)
    _check_parts(index, len(tokens), tokens, int(float(kw["max_token_len"])))


def verl_apis() -> list:
    try:
        import tensordict  # noqa: F401
        import verl  # noqa: F401

        from packkit.integrations import verl as pv
    except Exception:  # noqa: BLE001 - verl absent: not registered here (the full tier has it)
        return []
    return [
        Api("packkit.integrations.verl.balance_batch", pv.balance_batch,
            lambda: dict(batch=_dataproto(), dp_size=2, max_token_len=float(CAP)), _check_balance, variants=[
                Variant("degenerate", "batch", "no attention_mask", "refuse",
                        lambda kw: {**kw, "batch": _drop_mask(kw["batch"])}),
                Variant("degenerate", "batch", "rows not a multiple of dp_size", "refuse",
                        lambda kw: {**kw, "batch": _dataproto(7)}),
                Variant("degenerate", "max_token_len", "below the longest sequence", "refuse",
                        lambda kw: {**kw, "max_token_len": 15})],
            aliases={"batch": ("attention_mask", "DataProto", "rows", "sequences"),
                     "max_token_len": ("tokens", "max_tokens")}),
        Api("packkit.integrations.verl.rearrange_micro_batches", pv.rearrange_micro_batches,
            lambda: dict(batch=_tensordict(), max_token_len=float(CAP)), _check_rearrange,
            skip=("dp_group",),  # a torch.distributed group (tests/test_rl_verl_dist.py runs two gloo ranks)
            variants=[Variant("degenerate", "batch", "no attention_mask", "refuse",
                              lambda kw: {**kw, "batch": _tensordict().exclude("attention_mask")}),
                      Variant("degenerate", "min_num_micro_batch", "more micro-batches than rows", "either",
                              lambda kw: {**kw, "min_num_micro_batch": 3 * N})],
            aliases={"batch": ("attention_mask",), "max_token_len": ("max_token_len must be",)}),
    ]


def _drop_mask(batch):
    from verl import DataProto

    return DataProto(batch=batch.batch.exclude("attention_mask"))


def _check_packed_idx(out, kw):
    lengths = [int(x) for x in kw["lengths"]]
    rows = out.packed_idx
    flat = sorted(i for row in rows for i in row)
    assert flat == sorted(set(range(len(lengths))) - set(out.dropped)), f"rows {rows}, dropped {out.dropped}"
    for row, total in zip(rows, out.packed_length):
        assert sum(lengths[i] for i in row) == total <= int(kw["packing_length"]), f"row {row}: {total} tokens"


def _check_buffer(out, kw):
    rows, carry = out
    data = kw["data"]
    got = sorted([s for row in rows for s, _ in row] + [s for s, _ in carry])
    assert got == sorted(s for s, _ in data), "a sample lost or planned twice"
    for row in rows:
        assert sum(n for _, n in row) <= int(kw["packing_length"])


def _check_row_plan(out, kw):
    lengths = [int(x) for x in kw["lengths"]]
    flat = sorted(int(i) for row in out.rows for i in row)
    kept = sorted(set(range(len(lengths))) - set(out.dropped.tolist()) - set(out.zero_length.tolist()))
    assert flat == kept, f"rows {flat}, want {kept}"
    for row in out.rows:
        assert sum(lengths[int(i)] for i in row) <= int(kw["cutoff_len"])


def _sampler_epoch(**kw):
    from packkit.integrations.axolotl import MultipackBatchSampler

    sampler = MultipackBatchSampler(**kw)
    return list(sampler)  # the plan (and a cost callable's values) is made when an epoch is read


def _check_sampler(batches, kw):
    lengths = np.asarray(kw["lengths"])
    seen = sorted(int(i) for batch in batches for row in batch for i in row)
    assert len(seen) == len(set(seen)) and set(seen) <= set(range(len(lengths))), f"indices {seen}"
    for batch in batches:
        for row in batch:
            assert int(lengths[list(row)].sum()) <= int(kw["batch_max_len"])


def trainer_apis() -> list:
    from packkit.integrations import llamafactory as lf
    from packkit.integrations import swift as sw
    from packkit.integrations.axolotl import MultipackBatchSampler

    pairs = [(f"s{i}", n) for i, n in enumerate(LENGTHS)]
    return [
        Api("packkit.integrations.swift.plan_packed_idx", sw.plan_packed_idx,
            lambda: dict(lengths=list(LENGTHS), packing_length=CAPACITY, dp_size=2), _check_packed_idx,
            variants=[Variant("degenerate", "lengths", "empty", "either", lambda kw: {**kw, "lengths": []})]),
        Api("packkit.integrations.swift.plan_buffer", sw.plan_buffer,
            lambda: dict(data=list(pairs), packing_length=CAPACITY, finished=True, dp_size=2, batch_size=1,
                         cost="attention", algorithm="obfd"), _check_buffer,
            skip=("seed",),  # any int or tuple of ints (numpy's default_rng)
            variants=[Variant("degenerate", "data", "empty", "either", lambda kw: {**kw, "data": []})],
            aliases={"data": ("sample",)}),
        Api("packkit.integrations.llamafactory.plan_rows", lf.plan_rows,
            lambda: dict(lengths=list(LENGTHS), cutoff_len=CAPACITY, dp_size=2), _check_row_plan,
            variants=[Variant("degenerate", "lengths", "all zero", "either", lambda kw: {**kw, "lengths": [0, 0]})]),
        Api("packkit.integrations.axolotl.MultipackBatchSampler", MultipackBatchSampler,
            lambda: dict(sampler=range(len(LENGTHS)), batch_size=1, batch_max_len=CAPACITY,
                         lengths=np.asarray(LENGTHS), bin_size=None, dp_size=2), _check_sampler, call=_sampler_epoch,
            aliases={"batch_max_len": ("capacity",)}),
    ]


CALLBACK_APIS = {"packkit.integrations.swift.plan_packed_idx": ("cost",),
                 "packkit.integrations.llamafactory.plan_rows": ("cost",),
                 "packkit.integrations.axolotl.MultipackBatchSampler": ("cost",)}


def register(reg: dict) -> None:
    for api in verl_apis() + trainer_apis():
        reg[api.name] = api
