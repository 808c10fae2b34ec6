"""The cases of the adversarial pass (tools/adversarial_pass.py): one per input a user gets wrong, each with the
error it must raise (a regex on the message) or the check its result must pass. Grouped by API; add one for
every finding."""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import numpy as np
import torch

import packkit
from packkit import rl


class Case(NamedTuple):
    api: str
    name: str
    call: Callable
    match: Optional[str]  # regex the error message must match; None: the call must succeed
    check: Optional[Callable] = None  # for a call that must succeed: a predicate on its result


CASES: list = []


def refuses(api: str, name: str, match: str):
    def add(fn):
        CASES.append(Case(api, name, fn, match))
        return fn
    return add


def accepts(api: str, name: str, check: Optional[Callable] = None):
    def add(fn):
        CASES.append(Case(api, name, fn, None, check))
        return fn
    return add


# -- packkit.plan ---------------------------------------------------------------------------------------------------
refuses("plan", "float lengths", "needs integers: integer lengths")(lambda: packkit.plan([1.5, 2], 10))
refuses("plan", "cost as a numpy array", "cost must be")(lambda: packkit.plan([1, 2, 3], 10, dp_size=2,
                                                                            cost=np.array([1, 2])))
refuses("plan", "dp_size 2**40", "dp_size must be in")(lambda: packkit.plan([1, 2], 10, dp_size=2**40))
refuses("plan", "cost (nan, 1)", "must be finite")(lambda: packkit.plan([1, 2], 10, dp_size=2,
                                                                        cost=(float("nan"), 1)))


# -- packkit.rl -----------------------------------------------------------------------------------------------------
def _rollouts():
    ids = torch.arange(1, 13).reshape(3, 4)
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 0], [1, 1, 1, 1]])
    return ids, mask


refuses("rl.pack_rollouts", "attention_mask holding 2", "other than 0 and 1")(
    lambda: rl.pack_rollouts(_rollouts()[0], _rollouts()[1] * 2, [0, 1, 2]))
refuses("rl.pack_rollouts", "attention_mask holding 0.5", "other than 0 and 1")(
    lambda: rl.pack_rollouts(_rollouts()[0], _rollouts()[1] * 0.5, [0, 1, 2]))
refuses("rl.pack_rollouts", "attention_mask as a list", "attention_mask must be a")(
    lambda: rl.pack_rollouts(_rollouts()[0], _rollouts()[1].tolist(), [0]))
refuses("rl.pack_rollouts", "float input_ids", "integer token ids")(
    lambda: rl.pack_rollouts(_rollouts()[0].float(), _rollouts()[1], [0]))
refuses("rl.pack_rollouts", "negative token id", "negative token id")(
    lambda: rl.pack_rollouts(-_rollouts()[0], _rollouts()[1], [0, 1]))
refuses("rl.pack_rollouts", "position_ids_start=-5", "position_ids_start")(
    lambda: rl.pack_rollouts(*_rollouts(), [0], position_ids_start=-5))
refuses("rl.unpack_rollouts", "values as a list", "values must be a tensor")(
    lambda: rl.unpack_rollouts([0.0] * 10, rl.pack_rollouts(*_rollouts(), [0, 1, 2])[1]))
refuses("rl.unpack_rollouts", "fill=0.5 into int64 values", "cannot be held")(
    lambda: rl.unpack_rollouts(torch.zeros(10, dtype=torch.int64), rl.pack_rollouts(*_rollouts(), [0, 1, 2])[1],
                               fill=0.5))
refuses("rl.micro_batches", "equal_count='yes'", "equal_count must be True or False")(
    lambda: rl.micro_batches([3, 4], 10, 2, equal_count="yes"))
refuses("rl.micro_batches", "lengths summing past int64", "more than 2\\^63 - 1")(
    lambda: rl.micro_batches([2**62, 2**62], 2**63 - 1, 2))
refuses("rl.MicroBatches.rank", "rank out of range", "rank must be an int in")(
    lambda: rl.micro_batches([3, 4], 10, 2).rank(5))
accepts("rl.pack_rollouts", "bool mask", lambda r: r[0]["input_ids"].tolist() == [[1, 2, 3, 6, 7]])(
    lambda: rl.pack_rollouts(_rollouts()[0], _rollouts()[1].bool(), [0, 1]))


# -- packkit.pack_dataset -------------------------------------------------------------------------------------------
def _dataset(ids=((1, 2, 3), (4, 5), (6, 7, 8, 9))):
    import datasets

    return datasets.Dataset.from_dict({"input_ids": [list(r) for r in ids]})


refuses("pack_dataset", "seed='x'", "seed must be None or an int")(lambda: packkit.pack_dataset(_dataset(), 10,
                                                                                               seed="x"))
refuses("pack_dataset", "position_ids='yes'", "position_ids must be True or False")(
    lambda: packkit.pack_dataset(_dataset(), 10, position_ids="yes"))
def _negative_token_id_warned():
    """TRL packs a negative id as it is; packkit does too (a drop-in), but never silently: a warning names the row."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = packkit.pack_dataset(_dataset(((1, 2), (3, -4))), 10)
    if not any("row 1 holds a negative token id" in str(w.message) for w in caught):
        raise AssertionError("a negative token id was packed without a warning")
    return out


accepts("pack_dataset", "negative token id (packed as TRL does, warned)", lambda r: r.num_rows == 1)(
    _negative_token_id_warned)


# -- packkit.integrations.verl --------------------------------------------------------------------------------------
def _verl():
    from packkit.integrations import verl

    return verl


def _verl_batch(scale=1):
    from tensordict import TensorDict

    ids = torch.arange(1, 33).reshape(4, 8)
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3, [0] * 2 + [1] * 6, [1] * 3 + [0] * 5]) * scale
    return TensorDict({"input_ids": ids, "attention_mask": mask}, batch_size=[4])


def _verl_dataproto(scale=1):
    from verl import DataProto

    return DataProto.from_dict(tensors=dict(_verl_batch(scale).items()))


refuses("integrations.verl.rearrange_micro_batches", "max_token_len='x'", "max_token_len must be an int")(
    lambda: _verl().rearrange_micro_batches(_verl_batch(), "x"))
refuses("integrations.verl.rearrange_micro_batches", "attention_mask holding 2", "other than 0 and 1")(
    lambda: _verl().rearrange_micro_batches(_verl_batch(2), 64))
refuses("integrations.verl.balance_batch", "attention_mask holding 2", "other than 0 and 1")(
    lambda: _verl().balance_batch(_verl_dataproto(2), 2, 64))
accepts("integrations.verl.rearrange_micro_batches", "a 0/1 mask", lambda r: sorted(sum(r[1], [])) == [0, 1, 2, 3])(
    lambda: _verl().rearrange_micro_batches(_verl_batch(), 16))
refuses("plan", "cost callable whose row sums overflow", "overflow float64")(
    lambda: packkit.plan([3, 4, 5, 6], 10, dp_size=2, cost=lambda x: np.full(len(x), 1e308)))
refuses("plan", "cost pair whose row sums overflow", "overflow float64")(
    lambda: packkit.plan([3, 4, 5, 6], 10, dp_size=2, cost=(1e308, 1e308)))


# -- packkit.shared_prefix (issue 39 §1) ----------------------------------------------------------------------------
def _sp():
    import packkit.shared_prefix as sp

    return sp


_PROMPTS, _COMPLETIONS = [[1, 2, 3], [4, 5]], [[[6, 7], [8]], [[9], [10, 11]]]


def _sp_logprobs():
    sp = _sp()
    batch, info = sp.pack_groups(_PROMPTS, _COMPLETIONS)
    info.attention.calls += 1  # the random logits stand in for a forward through the batch's attention
    logits = torch.randn(1, batch["input_ids"].shape[1], 20, dtype=torch.float64)
    return sp.completion_logprobs(logits, info), batch, info


refuses("shared_prefix.pack_tree", "a PrefixForest with score_from", "score_from")(
    lambda: _sp().pack_tree(_sp().build_tree([[1, 2, 3], [1, 2, 4]]), score_from=[1, 1]))
refuses("shared_prefix.grpo_token_mean_loss", "advantages [1, W] when N == W", "advantages must have shape")(
    lambda: _sp().grpo_token_mean_loss(_sp_logprobs()[0], torch.ones(1, 2)))
refuses("shared_prefix.pack_groups", "capacity=10**8 for 11 tokens", "would allocate")(
    lambda: _sp().pack_groups(_PROMPTS, _COMPLETIONS, capacity=10**8))
refuses("shared_prefix.pack_groups", "dp_size=2**24", "rows for 11 tokens")(
    lambda: _sp().pack_groups(_PROMPTS, _COMPLETIONS, capacity=8, dp_size=2**24))
refuses("shared_prefix.pack_groups", "dp_size=0 without capacity", "dp_size must be a positive integer")(
    lambda: _sp().pack_groups(_PROMPTS, _COMPLETIONS, dp_size=0))
refuses("shared_prefix.pack_groups", "algorithm='nope' without capacity", "unknown algorithm")(
    lambda: _sp().pack_groups(_PROMPTS, _COMPLETIONS, algorithm="nope"))
refuses("shared_prefix.pack_groups", "a negative token id", "must be >= 0")(
    lambda: _sp().pack_groups([[1, -2]], [[[3]]]))
refuses("shared_prefix.pack_groups", "pad_id=2**70", "pad_id must be a token id")(
    lambda: _sp().pack_groups(_PROMPTS, _COMPLETIONS, pad_id=2**70))
accepts("shared_prefix.pack_groups", "no groups: an empty batch", lambda r: r[0]["input_ids"].shape == (1, 0))(
    lambda: _sp().pack_groups([], []))
refuses("shared_prefix.completion_logprobs", "logits narrower than the token ids", "vocabulary of 5")(
    lambda: _sp().completion_logprobs(torch.randn(1, _sp_logprobs()[1]["input_ids"].shape[1], 5), _sp_logprobs()[2]))
refuses("shared_prefix.completion_logprobs", "logits of a forward that never called the attention", "never called")(
    lambda: _sp().completion_logprobs(torch.randn(1, 11, 20), _sp().pack_groups(_PROMPTS, _COMPLETIONS)[1]))
refuses("shared_prefix.completion_logprobs", "integer logits", "must be a floating tensor")(
    lambda: _sp().completion_logprobs(torch.ones(1, _sp_logprobs()[1]["input_ids"].shape[1], 20, dtype=torch.int64),
                                      _sp_logprobs()[2]))
refuses("shared_prefix.completion_logprobs", "temperature=inf", "temperature must be finite")(
    lambda: _sp().completion_logprobs(torch.randn(1, _sp_logprobs()[1]["input_ids"].shape[1], 20), _sp_logprobs()[2],
                                      temperature=float("inf")))


# -- pack_sequences, PackingCollator, context parallel (issue 39 §2) ------------------------------------------------
refuses("pack_sequences", "a plan made for other lengths", "made for other lengths")(
    lambda: packkit.pack_sequences([[1, 2, 3, 31, 32], [4, 5], [6, 7, 8, 9]], plan=packkit.plan([3, 2, 4], 10)))
refuses("pack_sequences", "a field named labels", "would overwrite")(
    lambda: packkit.pack_sequences([[1, 2], [3]], capacity=4, layout="padded", fields={"labels": [[1, 2], [3]]}))
refuses("pack_sequences", "a negative token id", "negative token id")(
    lambda: packkit.pack_sequences([[1, -2]], capacity=4))
refuses("pack_sequences", "pad_token_id=-1", "pad_token_id must be >= 0")(
    lambda: packkit.pack_sequences([[1, 2]], capacity=4, pad_token_id=-1))
refuses("pack_sequences", "capacity=10**9 for 3 tokens", "padding|pad")(
    lambda: packkit.pack_sequences([[1, 2], [3]], capacity=10**9, layout="padded"))
refuses("PackingCollator", "label_key='target' beside a stale labels column", "would overwrite")(
    lambda: packkit.PackingCollator(8, label_key="target")([{"input_ids": [1, 2], "target": [1, 2], "labels": [5, 5]}]))
refuses("shard_context_parallel", "lengths= that disagree with the batch", "cu_seq_lens_q")(
    lambda: packkit.shard_context_parallel(packkit.pack_sequences([list(range(1, 8)), [1, 2, 3], list(range(1, 12))],
                                                                  capacity=32), 2, 0, lengths=[10, 11]))
accepts("PackingCollator", "num_items_in_batch = the shifted targets (flat, separator)",
        lambda b: int(b["num_items_in_batch"]) == int((b["labels"][..., 1:] != -100).sum()))(
    lambda: packkit.PackingCollator(16, separator_id=7, return_num_items=True)(
        [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}, {"input_ids": [6, 7, 8, 9]}]))
