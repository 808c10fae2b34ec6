"""Registrations of the smaller public helpers: shared-prefix forests and plans, status readers, rollout layouts,
CP unsharding, Megatron's pad multiple and CP split."""
from __future__ import annotations

import numpy as np
import torch

import packkit
from packkit import rl
from packkit import shared_prefix as sp

from .checks import CAPACITY, ID0, LENGTHS, check_tokens, sources
from .core import Api, Variant
from .reg_rl_sp import rollouts

SEQS = [[ID0, ID0 + 1, ID0 + 2, 2 * ID0], [ID0, ID0 + 1, 3 * ID0], [4 * ID0, 4 * ID0 + 1]]


def _forest():
    return sp.build_tree(SEQS)


def _check_forest_of(forest, seqs=SEQS):
    sp.check_forest(forest)
    assert len(forest.seq_node) == len(seqs)


def forest_apis() -> list:
    prompts, completions = [[ID0, ID0 + 1]], [[[2 * ID0], [3 * ID0, 3 * ID0 + 1]]]
    return [
        Api("packkit.shared_prefix.build_tree", sp.build_tree, lambda: dict(sequences=SEQS),
            lambda f, kw: _check_forest_of(f, kw["sequences"]), variants=[
                Variant("degenerate", "sequences", "empty", "either", lambda kw: {**kw, "sequences": []}),
                Variant("stale", "group_ids", "one id short", "refuse", lambda kw: {**kw, "group_ids": [0, 1]})]),
        Api("packkit.shared_prefix.sequences_forest", sp.sequences_forest, lambda: dict(sequences=SEQS),
            lambda f, kw: _check_forest_of(f, kw["sequences"])),
        Api("packkit.shared_prefix.groups_forest", sp.groups_forest,
            lambda: dict(prompts=prompts, completions=completions),
            lambda f, kw: _check_forest_of(f, [0, 1]), skip=("labels",)),
        Api("packkit.shared_prefix.check_forest", sp.check_forest, lambda: dict(forest=_forest()),
            lambda out, kw: None, skip=("name",), variants=[  # name: the argument's name in messages
                Variant("stale", "forest", "seq_node out of range", "refuse",
                        lambda kw: {**kw, "forest": kw["forest"]._replace(
                            seq_node=kw["forest"].seq_node + len(kw["forest"].parent))})]),
        Api("packkit.shared_prefix.plan_trees", sp.plan_trees, lambda: dict(forest=_forest(), capacity=16),
            lambda p, kw: None),
        Api("packkit.shared_prefix.split_oversized", sp.split_oversized, lambda: dict(forest=_forest(), capacity=16),
            lambda r, kw: None),
        Api("packkit.shared_prefix.tree_costs", sp.tree_costs, lambda: dict(forest=_forest()),
            lambda c, kw: np.testing.assert_array_equal(np.isfinite(c), True), skip=("cost",)),
        Api("packkit.shared_prefix.tree_micro_batches", sp.tree_micro_batches,
            lambda: dict(forest=_forest(), max_tokens=16, dp_size=2), lambda m, kw: None, skip=("cost",)),
        Api("packkit.shared_prefix.pack_forest", sp.pack_forest,
            lambda: dict(tree_plan=sp.plan_trees(_forest(), 16)),
            lambda out, kw: check_tokens(out[0]["input_ids"], [[ID0, ID0 + 1], [ID0 + 2, 2 * ID0], [3 * ID0],
                                                               [4 * ID0, 4 * ID0 + 1]], kw.get("pad_id", 0))),
    ]


def status_apis() -> list:
    def status_info():
        _, info = sp.pack_groups([[1, 2]], [[[3], [4]]])
        return info

    return [
        Api("packkit.shared_prefix.status_errors", sp.status_errors, lambda: dict(status=3),
            lambda out, kw: None if len(out) == bin(int(kw["status"]) & 31).count("1") else 1 / 0),
        Api("packkit.shared_prefix.check_status", sp.check_status, lambda: dict(info=status_info()),
            lambda out, kw: None),
        Api("packkit.rl.rollout_layout", rl.rollout_layout, lambda: dict(attention_mask=rollouts()[1]),
            lambda lay, kw: None if lay.length.tolist() == kw["attention_mask"].sum(1).tolist() else 1 / 0,
            variants=[Variant("degenerate", "attention_mask", "all masked", "either",
                              lambda kw: {**kw, "attention_mask": torch.zeros(4, 6, dtype=torch.int64)}),
                      Variant("degenerate", "attention_mask", "two runs in a row", "refuse",
                              lambda kw: {**kw, "attention_mask": torch.tensor([[1, 0, 1, 0, 0, 0]] * 4)})]),
        Api("packkit.rl.check_rollouts", rl.check_rollouts,
            lambda: dict(info=rl.pack_rollouts(*rollouts(), [0, 1])[1]), lambda out, kw: None),
    ]


def cp_unshard_api() -> Api:
    def base():
        batch = packkit.pack_sequences(sources(), capacity=CAPACITY)
        parts = [packkit.shard_context_parallel(batch, 2, r, return_info=True) for r in range(2)]
        gathered = torch.stack([p[0]["input_ids"].reshape(-1) for p in parts])
        return dict(gathered=gathered, info=parts[0][1])

    def check(out, kw):
        check_tokens(out, sources(), 0)

    return Api("packkit.unshard_context_parallel", packkit.unshard_context_parallel, base, check, variants=[
        Variant("stale", "gathered", "one rank missing", "refuse", lambda kw: {**kw, "gathered": kw["gathered"][:1]})])


def megatron_apis() -> list:
    from packkit.integrations import megatron

    def split_base():
        out, params = megatron.packed_seq_params(packkit.pack_sequences(sources(), capacity=CAPACITY), cp_size=2)
        return dict(batch=out, params=params, cp_size=2, cp_rank=1)

    def split_check(part, kw):
        full = split_base()["batch"]["tokens"].reshape(-1)
        got = part["tokens"].reshape(-1)
        assert got.numel() * int(kw["cp_size"]) == full.numel()

    return [Api("packkit.integrations.megatron.megatron_pad_multiple", megatron.megatron_pad_multiple,
                lambda: dict(cp_size=2, tp_size=2, sequence_parallel=True),
                lambda m, kw: None if m % (2 * int(kw["cp_size"])) == 0 or int(kw["cp_size"]) == 1 else 1 / 0),
            Api("packkit.integrations.megatron.thd_batch_on_cp_rank", megatron.thd_batch_on_cp_rank, split_base,
                split_check, skip=("params",))]


def register(reg: dict) -> None:
    apis = forest_apis() + status_apis() + [cp_unshard_api()]
    try:
        apis += megatron_apis()
    except ImportError:
        pass
    for api in apis:
        reg[api.name] = api
    register_more(reg)


def logprob_apis() -> list:
    def packed():
        batch, info = sp.pack_groups([[1, 2, 3]], [[[4, 5], [6]]], capacity=8)
        info.attention.calls += 1  # the random logits stand in for a model's forward through the batch's attention
        logits = torch.randn(*batch["input_ids"].shape, 8, generator=torch.Generator().manual_seed(0),
                             dtype=torch.float64)
        return batch, info, logits

    def values_base():
        batch, info, _ = packed()
        return dict(values=torch.arange(batch["input_ids"].numel(), dtype=torch.float64).reshape(
            batch["input_ids"].shape), info=info)

    def dpo_base():
        _, info, logits = packed()
        return dict(result=sp.completion_logprobs(logits, info), info=info)

    def collate(**kw):
        return sp.SharedPrefixCollator(**kw)([{"prompt_ids": [1, 2, 3], "chosen_ids": [4, 5], "rejected_ids": [6]}])

    def collate_check(out, kw):
        batch, info = out
        check_tokens(batch["input_ids"], [[1, 2, 3], [4, 5], [6]], 0)

    return [
        Api("packkit.shared_prefix.completion_values", sp.completion_values, values_base,
            lambda out, kw: None),
        Api("packkit.shared_prefix.dpo_logps", sp.dpo_logps, dpo_base,
            lambda out, kw: None if all(torch.isfinite(t).all() for t in out) else 1 / 0),
        Api("packkit.shared_prefix.SharedPrefixCollator", sp.SharedPrefixCollator, lambda: dict(capacity=16),
            collate_check, call=collate, aliases={"completion_keys": ("chosen_ids",)}),
    ]


def rollout_group_apis() -> list:
    from .reg_rl_sp import pack_rollout_groups_api

    def packed():
        api = pack_rollout_groups_api()
        kw = api.baseline()
        return api.invoke(kw)

    def logprobs_base():
        batch, info = packed()
        info.info.attention.calls += 1
        logits = torch.randn(*batch["input_ids"].shape, 2000, generator=torch.Generator().manual_seed(0),
                             dtype=torch.float64)
        return dict(logits=logits, info=info)

    return [
        Api("packkit.shared_prefix.rollout_logprobs", sp.rollout_logprobs, logprobs_base,
            lambda out, kw: None if torch.isfinite(out).all() else 1 / 0),
        Api("packkit.shared_prefix.check_rollout_groups", sp.check_rollout_groups,
            lambda: dict(info=packed()[1]), lambda out, kw: None),
    ]


def pack_on_device_api() -> Api:
    def base():
        flat = torch.tensor([v for s in sources() for v in s])
        return dict(input_ids=flat, lengths=torch.tensor(LENGTHS), capacity=CAPACITY)

    return Api("packkit.pack_on_device", packkit.pack_on_device, base,
               lambda out, kw: check_tokens(out[0]["input_ids"], sources(), 0), skip=("labels",))


def pack_on_device_plan_api() -> Api:
    """plan="device" (issue 62 part 5): fixed num_rows / max_sequences (options, not drawn), the rest fuzzed."""
    def base():
        flat = torch.tensor([v for s in sources() for v in s])
        return dict(input_ids=flat, lengths=torch.tensor(LENGTHS), capacity=CAPACITY, plan="device")

    def call(**kw):
        return packkit.pack_on_device(**kw, num_rows=len(LENGTHS), max_sequences=4)

    return Api("packkit.pack_on_device plan=device", packkit.pack_on_device, base,
               lambda out, kw: check_tokens(out[0]["input_ids"], sources(), 0), call=call, skip=("labels",))


def register_more(reg: dict) -> None:
    for api in logprob_apis() + rollout_group_apis() + [pack_on_device_api(), pack_on_device_plan_api()]:
        reg[api.name] = api
