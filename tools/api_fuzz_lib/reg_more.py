"""Registrations of the attention functions, context parallelism, whole datasets, integrations and the CLI."""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile

import numpy as np
import torch

import packkit

from .checks import CAPACITY, ID0, LENGTHS, check_tokens, sources
from .core import Api, Variant


# -- attention ------------------------------------------------------------------------------------------------------
class _Layer(torch.nn.Module):
    is_causal = True


def _qkv():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=g, dtype=torch.float64) for _ in range(3))
    return q, k, v


def _reference(q, k, v, cu, scale, softcap):
    out = torch.empty(q.shape[2], q.shape[1], q.shape[3], dtype=q.dtype)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        s = torch.einsum("hqd,hkd->hqk", q[0, :, a:b], k[0, :, a:b]) * scale
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        s = s.masked_fill(torch.ones(b - a, b - a, dtype=torch.bool).triu(1), -math.inf)
        out[a:b] = torch.einsum("hqk,hkd->qhd", s.softmax(-1), v[0, :, a:b])
    return out


def varlen_api() -> Api:
    def base():
        q, k, v = _qkv()
        return dict(module=_Layer(), query=q, key=k, value=v, attention_mask=None,
                    cu_seq_lens_q=torch.tensor([0, 3, 8], dtype=torch.int32), max_length_q=5, softcap=5.0,
                    scaling=0.5)

    def check(out, kw):
        got = out[0][0]
        scale = kw["query"].shape[-1] ** -0.5 if kw.get("scaling") is None else float(kw["scaling"])
        softcap = kw.get("softcap")
        want = _reference(kw["query"], kw["key"], kw["value"], kw["cu_seq_lens_q"], scale,
                          None if softcap is None else float(softcap))
        assert torch.isfinite(got).all() and torch.allclose(got, want, atol=1e-9), "differs from per-document"

    return Api("packkit.varlen_attention_forward", packkit.varlen_attention_forward, base, check,
               skip=("module", "query", "key", "value", "attention_mask", "s_aux", "position_ids", "seq_idx",
                     "shared_prefix", "use_cache", "output_attentions", "output_hidden_states",
                     "output_router_logits", "num_items_in_batch", "cu_seq_lens_k", "max_length_k", "is_causal"),
               variants=[Variant("stale", "cu_seq_lens_q", "cu_seq_lens of another batch (more tokens)", "refuse",
                                 lambda kw: {**kw, "cu_seq_lens_q": torch.tensor([0, 3, 9], dtype=torch.int32)}),
                         Variant("stale", "max_length_q", "max_length below the longest document", "refuse",
                                 lambda kw: {**kw, "max_length_q": 3})])


# -- megatron -------------------------------------------------------------------------------------------------------
def megatron_api() -> Api:
    from packkit.integrations import megatron

    def base():
        return dict(batch=packkit.pack_sequences(sources(), capacity=CAPACITY), cp_size=2)

    def check(out, kw):
        data, params = out
        pad = kw.get("pad_token_id", 0)
        check_tokens(data["tokens"], sources(), pad)

    def int32(kw):
        b = dict(kw["batch"])
        b["input_ids"] = b["input_ids"].to(torch.int32)
        return {**kw, "batch": b, "pad_token_id": 2**40}

    return Api("packkit.integrations.megatron.packed_seq_params", megatron.packed_seq_params, base, check,
               variants=[Variant("numeric", "pad_token_id", "2**40 with int32 ids", "refuse", int32)])


# -- context parallelism -------------------------------------------------------------------------------------------
def _cp_union(kw, fn, key="input_ids"):
    """The ranks' tokens together (every rank called; for many ranks: ranks 0, the called one and the last, whose
    tokens must then be a duplicate-free part of the source)."""
    cp = int(kw["cp_size"])
    ranks = range(cp) if cp <= 64 else sorted({0, int(kw["cp_rank"]), cp - 1})
    parts = []
    for r in ranks:
        out = fn(**{**kw, "cp_rank": r})
        batch = out[0] if isinstance(out, tuple) else out
        parts.append(batch[key].reshape(-1))
    return torch.cat(parts)


def _check_cp(tokens, kw):
    pad = kw.get("pad_token_id", 0)
    if int(kw["cp_size"]) <= 64:
        check_tokens(tokens, sources(), pad)
        return
    real = [v for v in tokens.tolist() if v != pad]
    assert len(real) == len(set(real)) and set(real) <= {v for s in sources() for v in s}, "tokens lost or doubled"


def cp_pack_api() -> Api:
    def check(out, kw):
        _check_cp(_cp_union(kw, packkit.pack_context_parallel), kw)

    return Api("packkit.pack_context_parallel", packkit.pack_context_parallel,
               lambda: dict(sequences=sources(), cp_size=2, cp_rank=0, capacity=16), check,
               skip=("fields", "pad_values", "plan"))


def cp_shard_api() -> Api:
    def base():
        return dict(batch=packkit.pack_sequences(sources(), capacity=CAPACITY), cp_size=2, cp_rank=1)

    def check(out, kw):
        _check_cp(_cp_union(kw, packkit.shard_context_parallel), kw)

    return Api("packkit.shard_context_parallel", packkit.shard_context_parallel, base, check,
               skip=("pack_info",), variants=[
                   Variant("stale", "lengths", "lengths of another batch", "refuse",
                           lambda kw: {**kw, "lengths": [3, 5, 7, 2, 6] + [0] * 0})])


# -- whole datasets -------------------------------------------------------------------------------------------------
def pack_dataset_api() -> Api:
    def base():
        import datasets

        return dict(dataset=datasets.Dataset.from_dict({"input_ids": sources()}), seq_length=CAPACITY,
                    keep_in_memory=True)

    def check(out, kw):
        ds = out[0] if kw.get("return_report") else out
        ids = [v for row in ds["input_ids"] for v in row]
        check_tokens(torch.tensor(ids, dtype=torch.int64), sources(), -1)
        assert all(len(row) <= int(kw["seq_length"]) for row in ds["input_ids"])

    return Api("packkit.pack_dataset", packkit.pack_dataset, base, check,
               skip=("cache_file_name", "columns", "cost", "keep_in_memory"),
               variants=[Variant("determinism", "seed", "same seed twice", "accept",
                                 run=lambda api, kw: _same_rows(api, {**kw, "seed": 5, "dp_size": 2}))])


def _same_rows(api, kw):
    a, b = api.invoke(dict(kw)), api.invoke(dict(kw))
    assert a["input_ids"] == b["input_ids"], "two runs with one seed differ"
    return a


# -- torchtitan (the stream; bounded take: an infinite stream is read for at most 16 steps) ---------------------------
def torchtitan_api() -> Api:
    from packkit.integrations.torchtitan import BalancedDocumentStream

    docs = [{"input_ids": s} for s in sources()]

    def use(**kw):
        return [step for _, step in zip(range(16), BalancedDocumentStream(**kw))]

    def check(steps, kw):
        want = [s[:-1] for s in sources()] if kw["source"] is docs else []
        got = torch.cat([inputs["input"].reshape(-1) for inputs, _ in steps]) if steps else torch.zeros(0)
        if not kw.get("infinite") and kw.get("dp_world_size", 1) == 1:
            check_tokens(got, want, kw.get("pad_token_id", 0))
        for inputs, labels in steps:
            assert inputs["input"].shape == labels.shape == (int(kw["local_batch_size"]), int(kw["seq_len"]))

    return Api("packkit.integrations.torchtitan.BalancedDocumentStream", BalancedDocumentStream,
               lambda: dict(source=docs, seq_len=8, local_batch_size=1, buffer_size=4), check, call=use,
               skip=("tokenizer", "cost"))


# -- the command line -----------------------------------------------------------------------------------------------
def _cli_signature(max_lengths: str = "64", dp_size: str = "1", max_samples: str = "3", extra_tokens: str = "0",
                   batch_size: str = "4", epochs: str = "1", target_efficiency: str = "0.9"):
    """The options fuzzed, as a signature (values are the strings a shell passes)."""


def cli_api() -> Api:
    from packkit.tools.cli import main

    def run(**kw):
        folder = tempfile.mkdtemp(prefix="packkit-cli-fuzz-")
        data = os.path.join(folder, "data.jsonl")
        with open(data, "w") as f:
            for s in sources():
                f.write(json.dumps({"input_ids": s}) + "\n")
        argv = ["analyze", data, "-o", os.path.join(folder, "out"), "--no-figures", "--no-progress",
                "--max-lengths", str(kw["max_lengths"]), "--dp-size", str(kw["dp_size"]),
                "--max-samples", str(kw["max_samples"]), "--extra-tokens", str(kw["extra_tokens"]),
                "--batch-size", str(kw["batch_size"]), "--epochs", str(kw["epochs"]),
                "--target-efficiency", str(kw["target_efficiency"])]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
        if code == 2:  # argparse / analyze's one-line error: a clear refusal, as ValueError for the judge
            raise ValueError(err.getvalue().strip().splitlines()[-1].replace("-", "_"))
        return code, folder

    def check(out, kw):
        code, folder = out
        assert code == 0, f"exit status {code}"
        assert os.listdir(os.path.join(folder, "out")), "no report written"

    base = dict(max_lengths="64", dp_size="1", max_samples="3", extra_tokens="0", batch_size="4", epochs="1",
                target_efficiency="0.9")
    api = Api("packkit analyze (CLI)", _cli_signature, lambda: dict(base), check, call=run,
              aliases={"max_lengths": ("max lengths",)})
    return api


def register(reg: dict) -> None:
    makers = [varlen_api, cp_pack_api, cp_shard_api, pack_dataset_api, cli_api]
    for optional in (megatron_api, torchtitan_api):
        try:
            makers.append(optional) if optional() else None
        except ImportError:  # the framework is not installed here
            pass
    for make in makers:
        api = make()
        reg[api.name] = api
