"""Registrations of packkit.rl and packkit.shared_prefix: baselines, checkers, degenerate / stale variants."""
from __future__ import annotations

import numpy as np
import torch

from packkit import rl
from packkit import shared_prefix as sp

from .checks import ID0, LENGTHS, check_tokens, digest
from .core import Api, Variant

# verl-style rollouts: prompt columns [0, 3) left-padded, response columns [3, 6) right-padded.
MASK = [[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]]
PROMPT = 3


def rollouts(mask=MASK):
    ids = torch.arange(ID0, ID0 + 24, dtype=torch.int64).reshape(4, 6)
    return ids, torch.tensor(mask)


def _kept(ids, mask, rows):
    return [[int(v) for v, m in zip(ids[r].tolist(), mask[r].tolist()) if m] for r in rows]


def _then(out, check_status):
    """The no-sync paths report what only the device data tells in ``info.status``, read by ``check_*(info)`` at a
    point of the caller's choosing: the refusal a user gets is that call's."""
    check_status(out[1])
    return out


def micro_batches_api() -> Api:
    def check(mb, kw):
        lengths = np.asarray(kw["lengths"])
        seen = sorted(int(i) for rank in mb.indices for m in rank for i in m)
        assert seen == list(range(len(lengths))), seen
        for rank in mb.indices:
            assert len(rank) == mb.num_micro_batches
            for m in rank:
                assert lengths[np.asarray(m, np.int64)].sum() <= int(kw["max_tokens"])

    return Api("packkit.rl.micro_batches", rl.micro_batches,
               lambda: dict(lengths=list(LENGTHS), max_tokens=10, dp_size=2), check, variants=[
                   Variant("degenerate", "lengths", "empty", "either", lambda kw: {**kw, "lengths": []}),
                   Variant("degenerate", "lengths", "all zero", "either", lambda kw: {**kw, "lengths": [0, 0, 0]})])


def micro_batches_rank_api() -> Api:
    def call(rank):
        return rl.micro_batches(list(LENGTHS), 10, 2).rank(rank)

    def check(out, kw):
        assert len(out) >= 1

    return Api("packkit.rl.MicroBatches.rank", rl.MicroBatches.rank, lambda: dict(rank=1), check, call=call)


def pack_rollouts_api() -> Api:
    def base():
        ids, mask = rollouts()
        return dict(input_ids=ids, attention_mask=mask, indices=[0, 2, 3])

    def check(out, kw):
        batch, info = out
        rows = [int(i) for i in kw["indices"]]
        expected = _kept(kw["input_ids"], kw["attention_mask"], rows)
        check_tokens(batch["input_ids"], expected, 0)
        if kw.get("layout") is not None and kw.get("check", True):
            rl.check_rollouts(info)

    def stale_layout(kw):
        other = rl.rollout_layout(torch.tensor([[1, 1, 1, 1, 0, 0]] * 4))
        return {**kw, "layout": other}

    return Api("packkit.rl.pack_rollouts", rl.pack_rollouts, base, check, aliases={"layout": ("rollout_layout",)},
               variants=[Variant("stale", "layout", "layout of another mask, same shape", "refuse", stale_layout,
                                 run=lambda api, kw: _then(api.invoke(kw), rl.check_rollouts)),
                         Variant("degenerate", "indices", "empty", "either", lambda kw: {**kw, "indices": []}),
                         Variant("degenerate", "attention_mask", "all masked", "either",
                                 lambda kw: {**kw, "attention_mask": torch.zeros(4, 6, dtype=torch.int64)})])


def unpack_rollouts_api() -> Api:
    def base():
        ids, mask = rollouts()
        batch, info = rl.pack_rollouts(ids, mask, [0, 2, 3])
        return dict(values=batch["input_ids"][0].double(), info=info)

    def check(out, kw):
        ids, mask = rollouts()
        fill = kw.get("fill", 0.0)
        for k, r in enumerate([0, 2, 3]):
            for c in range(6):
                want = float(ids[r, c]) if mask[r, c] else float(fill)
                got = float(out[k, c])
                assert got == want or (got != got and want != want), (k, c, got, want)

    return Api("packkit.rl.unpack_rollouts", rl.unpack_rollouts, base, check)


def pack_groups_api() -> Api:
    prompts = [[ID0 + i for i in range(3)], [2 * ID0 + i for i in range(2)]]
    completions = [[[3 * ID0, 3 * ID0 + 1], [4 * ID0]], [[5 * ID0 + i for i in range(3)]]]

    def check(out, kw):
        batch, info = out
        seqs = [list(p) + list(c) for p, cs in zip(kw["prompts"], kw["completions"]) for c in cs]
        flat = batch["input_ids"].reshape(-1)
        for s, seq in enumerate(seqs):
            got = flat[torch.as_tensor(info.layout.seq_positions[s], dtype=torch.int64)].tolist()
            assert got == seq, f"sequence {s}: {got} != {seq}"
        expected = [list(p) for p in kw["prompts"]] + [list(c) for cs in kw["completions"] for c in cs]
        check_tokens(flat, expected, kw.get("pad_id", 0))

    return Api("packkit.shared_prefix.pack_groups", sp.pack_groups,
               lambda: dict(prompts=prompts, completions=completions, capacity=16), check,
               skip=("mrope", "labels"), variants=[
                   Variant("degenerate", "prompts", "empty", "either",
                           lambda kw: {**kw, "prompts": [], "completions": []}),
                   Variant("degenerate", "completions", "a group without completions", "either",
                           lambda kw: {**kw, "completions": [[], completions[1]]}),
                   Variant("determinism", "prompts", "same input twice", "accept",
                           run=lambda api, kw: _same(api, kw))])


def _same(api, kw):
    a, b = api.invoke(dict(kw)), api.invoke(dict(kw))
    assert digest(a[0]["input_ids"]) == digest(b[0]["input_ids"])
    return a


def pack_tree_api() -> Api:
    seqs = [[ID0, ID0 + 1, ID0 + 2, 2 * ID0], [ID0, ID0 + 1, 3 * ID0], [4 * ID0, 4 * ID0 + 1]]

    def check(out, kw):
        batch, info = out
        flat = batch["input_ids"].reshape(-1)
        for s, seq in enumerate(kw["sequences"]):
            got = flat[torch.as_tensor(info.layout.seq_positions[s], dtype=torch.int64)].tolist()
            assert got == list(seq), f"sequence {s}: {got} != {seq}"

    return Api("packkit.shared_prefix.pack_tree", sp.pack_tree, lambda: dict(sequences=seqs, capacity=16), check,
               skip=("mrope",), variants=[
                   Variant("degenerate", "sequences", "empty", "either", lambda kw: {**kw, "sequences": []}),
                   Variant("degenerate", "sequences", "one token", "either", lambda kw: {**kw, "sequences": [[ID0]]})])


def pack_rollout_groups_api() -> Api:
    def base():
        ids, mask = rollouts()
        ids[1, :PROMPT] = ids[0, :PROMPT]  # rows 0 and 1 share a prompt: group "a"
        mask[1] = torch.tensor([0, 1, 1, 1, 1, 0])
        return dict(input_ids=ids, attention_mask=mask, group_ids=["a", "a", "b", "c"], indices=[0, 1, 2, 3],
                    prompt_length=PROMPT)

    def check(out, kw):
        batch, info = out
        if kw.get("check", True):
            sp.check_rollout_groups(info)
        ids, mask = kw["input_ids"], kw["attention_mask"]
        rows = [int(i) for i in kw["indices"]]
        seen, expected = set(), []
        for r in rows:
            g = kw["group_ids"][r]
            row = _kept(ids, mask, [r])[0]
            prompt_len = sum(int(m) for m in mask[r, :PROMPT].tolist())
            if g not in seen:
                seen.add(g)
                expected.append(row[:prompt_len])
            expected.append(row[prompt_len:])
        check_tokens(batch["input_ids"], expected, 0)

    def stale_layout(kw):
        other = torch.tensor([[0, 1, 1, 1, 1, 1]] * 4)  # what rollout_layout saw of another batch
        return {**kw, "layout": rl.rollout_layout(other)}

    return Api("packkit.shared_prefix.pack_rollout_groups", sp.pack_rollout_groups, base, check,
               skip=("position_ids", "multi_modal_inputs", "mrope"), aliases={"layout": ("rollout_layout",)},
               variants=[Variant("stale", "layout", "layout of another mask, same shape", "refuse", stale_layout,
                                 run=lambda api, kw: _then(api.invoke(kw), sp.check_rollout_groups)),
                         Variant("degenerate", "indices", "empty", "either", lambda kw: {**kw, "indices": []})])


def grpo_api() -> Api:
    def base():
        batch, info = sp.pack_groups([[1, 2, 3]], [[[4, 5], [6]]], capacity=8)
        info.attention.calls += 1  # the random logits stand in for a model's forward through the batch's attention
        logits = torch.randn(*batch["input_ids"].shape, 8, generator=torch.Generator().manual_seed(0),
                             dtype=torch.float64)
        return dict(logprobs=sp.completion_logprobs(logits, info), advantages=torch.tensor([1.0, -1.0],
                                                                                           dtype=torch.float64))

    def check(loss, kw):
        assert torch.isfinite(loss).all(), loss

    return Api("packkit.shared_prefix.grpo_token_mean_loss", sp.grpo_token_mean_loss, base, check)


def completion_logprobs_api() -> Api:
    def base():
        batch, info = sp.pack_groups([[1, 2, 3]], [[[4, 5], [6]]], capacity=8)
        info.attention.calls += 1  # the random logits stand in for a model's forward through the batch's attention
        logits = torch.randn(*batch["input_ids"].shape, 8, generator=torch.Generator().manual_seed(0),
                             dtype=torch.float64)
        return dict(logits=logits, info=info)

    def check(out, kw):
        got = out.padded[out.mask]
        assert torch.isfinite(got).all() and (got <= 0).all(), got

    return Api("packkit.shared_prefix.completion_logprobs", sp.completion_logprobs, base, check,
               skip=("input_ids",))


def dpo_loss_api() -> Api:
    def base():
        t = torch.tensor([-1.0, -2.0], dtype=torch.float64)
        return dict(chosen=t, rejected=t - 1, ref_chosen=t, ref_rejected=t - 0.5)

    def check(loss, kw):
        assert torch.isfinite(loss).all(), loss

    return Api("packkit.shared_prefix.dpo_loss", sp.dpo_loss, base, check)


def register(reg: dict) -> None:
    for make in (micro_batches_api, micro_batches_rank_api, pack_rollouts_api, unpack_rollouts_api, pack_groups_api,
                 pack_tree_api, pack_rollout_groups_api, grpo_api, completion_logprobs_api, dpo_loss_api):
        api = make()
        reg[api.name] = api
