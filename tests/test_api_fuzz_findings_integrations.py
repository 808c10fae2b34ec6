"""The API fuzzer's findings in the Megatron-Core and torchtitan integrations (tests/test_api_fuzz_findings.py holds
the rest): the full tier, where megatron-core and torchtitan are installed."""
from __future__ import annotations

import pytest
import torch

import packkit

pytestmark = pytest.mark.full

SEQS = [[1000 + t for t in range(n)] for n in (5, 3, 7)]


def test_packed_seq_params_names_pad_token_id_for_int32_ids():
    pytest.importorskip("megatron.core")
    from packkit.integrations.megatron import packed_seq_params

    batch = packkit.pack_sequences(SEQS, capacity=16)
    batch["input_ids"] = batch["input_ids"].to(torch.int32)
    with pytest.raises(ValueError, match=r"pad_token_id=1099511627776 cannot be stored in the batch's torch.int32"):
        packed_seq_params(batch, pad_token_id=2**40)
    out, _ = packed_seq_params(batch, pad_token_id=2**31 - 1)
    assert out["tokens"].dtype == torch.int32


def test_megatron_parallel_sizes_bounded_and_named():
    pytest.importorskip("megatron.core")
    from packkit.integrations.megatron import megatron_pad_multiple, packed_seq_params

    with pytest.raises(ValueError, match="cp_size must be in"):
        megatron_pad_multiple(2**64, 1, False)
    batch = packkit.pack_sequences(SEQS, capacity=16)
    with pytest.raises(ValueError, match=r"cp_size must be in \[1, 65536\], got 16777216"):  # sized by cp_size
        packed_seq_params(batch, cp_size=2**24)
    with pytest.raises(ValueError, match=r"multiple of 4294967296 for cp_size=65536, tp_size=65536"):
        packed_seq_params(batch, cp_size=2**16, tp_size=2**16, sequence_parallel=True)


def test_torchtitan_stream_sizes_named_before_allocating():
    pytest.importorskip("torchtitan")
    from packkit.integrations.torchtitan import BalancedDocumentStream

    docs = [{"input_ids": s} for s in SEQS]
    with pytest.raises(ValueError, match="local_batch_size x seq_len"):
        BalancedDocumentStream(docs, seq_len=2**31, local_batch_size=1)
    with pytest.raises(ValueError, match=r"dp_world_size x local_batch_size = 2147483648 rows per step; at most 2\^16"):
        BalancedDocumentStream(docs, seq_len=8, local_batch_size=1, dp_world_size=2**31)


def test_thd_split_bounds_cp_size():
    pytest.importorskip("megatron.core")
    from packkit.integrations.megatron import packed_seq_params, thd_batch_on_cp_rank

    out, params = packed_seq_params(packkit.pack_sequences(SEQS, capacity=16), cp_size=2)
    with pytest.raises(ValueError, match="cp_size must be in"):
        thd_batch_on_cp_rank(out, params, 2**63 - 1, 0)
    assert thd_batch_on_cp_rank(out, params, 2, 1)["tokens"].numel() * 2 == out["tokens"].numel()
