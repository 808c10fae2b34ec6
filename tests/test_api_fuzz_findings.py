"""What the API fuzzer (tools/api_fuzz.py, issue 46) found, and the cases issue 46 listed: each refused by name now
(each test fails on the code before the fix), with a working control beside it."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import packkit
from packkit import rl
from packkit import shared_prefix as sp
from packkit.training import hf_attention

pytestmark = pytest.mark.core

SEQS = [[1000 + t for t in range(n)] for n in (5, 3, 7)]


# -- issue 46's list ------------------------------------------------------------------------------------------------
def _layer():
    module = torch.nn.Module()
    module.is_causal = True
    return module


def _varlen(**kw):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64) for _ in range(3))
    kw = {"cu_seq_lens_q": torch.tensor([0, 2, 6], dtype=torch.int32), "max_length_q": 4, **kw}
    return hf_attention.varlen_attention_forward(_layer(), q, k, v, None, **kw)[0]


@pytest.mark.parametrize("kw, match", [
    ({"softcap": True}, r"softcap=True is refused: a soft-cap must be a number > 0"),
    ({"softcap": math.inf}, r"softcap=inf is refused"),
    ({"scaling": True}, r"scaling=True is refused"),
    ({"scaling": math.nan}, r"scaling=nan is refused"),
    ({"sliding_window": False}, r"sliding_window=False is refused"),
    ({"sliding_window": 2.5}, r"sliding_window=2.5 is refused"),
    ({"dropout": False}, r"dropout=False is refused"),
    ({"max_length_q": 4.5}, r"max_length_q=4.5 is refused"),
])
def test_varlen_refuses_bools_and_non_numbers_where_numbers_are_meant(kw, match):
    with pytest.raises(ValueError, match=match):
        _varlen(**kw)


def test_varlen_softcap_number_still_runs():
    assert torch.isfinite(_varlen(softcap=5.0, scaling=0.5, sliding_window=0)).all()


def test_pack_rollout_groups_catches_a_layout_of_another_mask():
    ids = torch.arange(1000, 1024).reshape(4, 6)
    mask = torch.tensor([[0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]])
    ids[1, :3] = ids[0, :3]
    uids = ["a", "a", "b", "c"]
    stale = rl.rollout_layout(torch.tensor([[0, 1, 1, 1, 1, 1]] * 4))  # same shape, another batch
    _, info = sp.pack_rollout_groups(ids, mask, uids, [0, 1, 2, 3], stale, prompt_length=3)
    with pytest.raises(ValueError, match="not the run the given layout recorded"):
        sp.check_rollout_groups(info)
    _, info = sp.pack_rollout_groups(ids, mask, uids, [0, 1, 2, 3], rl.rollout_layout(mask), prompt_length=3)
    sp.check_rollout_groups(info)  # its own layout: fine


def test_pack_groups_refuses_pixel_values_without_grids():
    pytest.importorskip("transformers")
    from vlm_helpers import make_sample, tiny_config

    p = make_sample(np.random.default_rng(0), [("text", 2), ("image", (4, 4)), ("text", 3)])
    config = tiny_config("qwen2_5_vl")
    text = {"input_ids": [1, 2, 3], "pixel_values": p["pixel_values"]}
    with pytest.raises(ValueError, match=r"prompts\[0\] has pixel_values but no image_grid_thw"):
        sp.pack_groups([text], [[[5], [6]]], mrope=config)
    batch, _ = sp.pack_groups([p], [[[5], [6]]], mrope=config)
    assert torch.equal(batch["pixel_values"], torch.as_tensor(p["pixel_values"]))


# -- found by the fuzzer --------------------------------------------------------------------------------------------
def test_unpack_sequences_refuses_a_float_max_len():
    batch, info = packkit.pack_sequences(SEQS, capacity=8, return_info=True)
    for bad in (2.5, math.nan):
        with pytest.raises(ValueError, match="max_len must be a non-negative int"):
            packkit.unpack_sequences(batch["input_ids"], info, max_len=bad)
    assert packkit.unpack_sequences(batch["input_ids"], info, padded=True, max_len=7).shape == (3, 7)


def test_flat_num_rows_true_is_not_one():
    with pytest.raises(ValueError, match="num_rows must be a non-negative int, got True"):
        packkit.pack_sequences(SEQS, capacity=8, num_rows=True)
    assert packkit.pack_sequences(SEQS, capacity=16, num_rows=1)["input_ids"].shape == (1, 15)


def test_pack_layout_size_error_names_the_counts():
    segments = packkit.plan([5, 3], 8).segments
    with pytest.raises(ValueError, match="num_rows x row_len = 1 x 1099511627776"):
        packkit.pack_layout(segments, flat=False, row_len=2**40)


def test_extra_fields_policy_checked_without_fields():
    with pytest.raises(ValueError, match="unknown extra_fields policy ''"):
        packkit.pack_sequences(SEQS, capacity=8, extra_fields="")


def test_collator_num_buffers_checked_without_reuse_and_input_key_named():
    for bad in (math.nan, "2", complex(2, 0)):
        with pytest.raises(TypeError, match="num_buffers must be an int"):
            packkit.PackingCollator(8, num_buffers=bad)
    with pytest.raises(ValueError, match=r"feature 0 has no '' key \(the input_key"):
        packkit.PackingCollator(8, input_key="")([{"input_ids": [1, 2]}])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU build: CUDA cannot be served")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", 0, "meta"])
def test_devices_the_build_cannot_serve_are_named(device):
    with pytest.raises(ValueError, match="device="):
        packkit.PackingCollator(8, device=device)
    with pytest.raises(ValueError, match="device="):
        packkit.pack_sequences(SEQS, capacity=8, device=device)


def test_block_mask_arguments():
    seq_idx = torch.tensor([[0, 0, 1, 1]], dtype=torch.int32)
    with pytest.raises(TypeError, match="block_size must be an int"):
        packkit.document_causal_block_mask(seq_idx, 2.5)
    with pytest.raises(TypeError, match="block_size must be an int, got bool"):
        packkit.document_causal_block_mask(seq_idx, True)
    with pytest.raises(ValueError, match=r"block_size must be in \[1, 65536\]"):
        packkit.document_causal_block_mask(seq_idx, 2**40)
    with pytest.raises(TypeError, match="max_document must be an int"):
        packkit.document_causal_block_mask(seq_idx, 4, max_document=2.5)
    with pytest.raises(TypeError, match="seq_idx must be an integer tensor"):
        packkit.document_causal_block_mask(seq_idx.float(), 4)
    assert packkit.document_causal_block_mask(seq_idx, 4, max_document=2).packkit_max_document == 2


def test_context_parallel_sizes_bounded_and_named():
    batch = packkit.pack_sequences(SEQS, capacity=16)
    for cp in (2**40, 2**63 - 1):
        with pytest.raises(ValueError, match="cp_size must be in"):
            packkit.shard_context_parallel(batch, cp, 0)
    with pytest.raises(ValueError, match=r"cp_size=8388608.*refuses more than"):
        packkit.shard_context_parallel(batch, 2**23, 0)  # each segment padded to 2^24 tokens, for 16 tokens
    assert packkit.shard_context_parallel(batch, 2, 1)["input_ids"].numel() > 0


def test_micro_batches_bounds():
    with pytest.raises(ValueError, match=r"max_tokens must be an int in \[1, 2\^63 - 1\]"):
        rl.micro_batches([3, 4], 2**64)
    with pytest.raises(ValueError, match="more than the 65,536 micro_batches lays out for 2 sequences"):
        rl.micro_batches([3, 4], 10, dp_size=2**20)
    assert len(rl.micro_batches([3, 4], 10, dp_size=2**16).indices) == 2**16


@pytest.mark.parametrize("indices", [0, np.int64(1), torch.tensor(2), [[0, 1]]])
def test_rollout_indices_must_be_one_dimensional(indices):
    ids, mask = torch.arange(1, 13).reshape(3, 4), torch.ones(3, 4, dtype=torch.int64)
    with pytest.raises(TypeError, match="indices must be a 1-D sequence of row indices"):
        rl.pack_rollouts(ids, mask, indices)


def test_pack_dataset_return_report_is_a_bool():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"input_ids": SEQS})
    with pytest.raises(TypeError, match="return_report must be True or False"):
        packkit.pack_dataset(ds, 8, return_report=0)


def test_status_errors_refuses_a_float_status():
    with pytest.raises(TypeError, match="status must be an integer 0-d tensor"):
        sp.status_errors(torch.tensor(3.5))
    assert len(sp.status_errors(torch.tensor(3, dtype=torch.int32))) == 2


def test_pack_on_device_size_error_names_capacity():
    flat = torch.arange(1, 16)
    with pytest.raises(ValueError, match="row_len is the capacity"):
        packkit.pack_on_device(flat, torch.tensor([5, 3, 7]), 2**40)
