"""The model zoo's cases (tests/model_zoo.py builds the models): the data, each packing path run against every
sample alone, the one comparison, and the table of docs/reliability.md.

A case is **exact** (log-probs rel <= 1e-10, parameter gradients rel <= 1e-9), **refused** (a ValueError: the
message names what cannot be exact) or a **mismatch** (silently wrong: the suite fails). Any other exception
propagates.
"""
from __future__ import annotations

import functools
import re
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from model_zoo import ARCHITECTURES, CACHES, PATHS, TRANSFORMERS_MISMATCHES, VOCAB, tiny_model

REL_LOGP, REL_GRAD = 1e-10, 1e-9


# -- data -----------------------------------------------------------------------------------------------------
def _ids(rng, n):
    return rng.integers(3, VOCAB, n).tolist()


def sft_sequences():
    rng = np.random.default_rng(0)
    return [_ids(rng, n) for n in (13, 8, 2, 11)]


def groups():
    """Prompts 7 / 0 / 9 tokens; completions 0-8 tokens (one empty), G = 3, 1, 2."""
    rng = np.random.default_rng(1)
    prompts = [_ids(rng, n) for n in (7, 0, 9)]
    completions = [[_ids(rng, n) for n in sizes] for sizes in ((5, 0, 8), (6,), (4, 7))]
    return prompts, completions


def tree():
    """Conversations sharing prefixes at several depths, and where scoring starts in each."""
    rng = np.random.default_rng(2)
    a, b, c = _ids(rng, 5), _ids(rng, 3), _ids(rng, 4)
    convs = [a + b + _ids(rng, 3), a + b + _ids(rng, 2), a + c, _ids(rng, 6)]
    return convs, [8, 8, 5, 0]


def _weights(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(n, generator=g, dtype=torch.float64) + 0.5 for n in lengths]


# -- one case -------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    kind: str  # "exact", "refused" or "mismatch" ("error": the survey's record of another exception)
    detail: str = ""
    logp_rel: float = 0.0
    grad_rel: float = 0.0

    def cell(self) -> str:
        if self.kind == "exact":
            return "exact"
        if self.kind == "refused":
            return "refused: " + self.detail.split(". ")[0].split("; ")[0].replace("|", "/").replace("\n", " ")
        if self.kind == "error":
            return "error: " + self.detail
        return f"MISMATCH (log-probs {self.logp_rel:.1e}, grads {self.grad_rel:.1e})"


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    diff = float((got - ref).abs().max()) if ref.numel() else 0.0
    return diff / max(scale, 1e-300) if diff else 0.0


def compare(got_logp, ref_logp, got_grads=None, ref_grads=None) -> Outcome:
    """The suite's one comparison: flat log-prob vectors (and parameter gradients) against the reference."""
    logp = _rel(got_logp, ref_logp)
    grad = 0.0
    if got_grads is not None:
        for name, ref in ref_grads.items():
            grad = max(grad, _rel(got_grads[name], ref))
    kind = "exact" if logp <= REL_LOGP and grad <= REL_GRAD else "mismatch"
    return Outcome(kind, logp_rel=logp, grad_rel=grad)


def _grads(model):
    return {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}


def _token_logp(logits, ids):
    return torch.log_softmax(logits[:-1], -1).gather(1, ids[1:, None])[:, 0]


def _loss(parts, seed):
    weights = _weights([len(p) for p in parts], seed)
    return sum((w * p).sum() for w, p in zip(weights, parts))


def _sample_logp(model, seqs, starts):
    """Per-sample log-probs of tokens starts[i].. of each sequence (each run alone)."""
    out = []
    for seq, start in zip(seqs, starts):
        logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0]
        out.append(_token_logp(logits, torch.tensor(seq))[max(start - 1, 0):])
    return out


def _sp_samples(dataset):
    if dataset == "groups":
        prompts, completions = groups()
        seqs = [p + c for p, cs in zip(prompts, completions) for c in cs]
        starts = [len(p) for p, cs in zip(prompts, completions) for _ in cs]
        return seqs, starts
    return tree()


@functools.lru_cache(maxsize=None)
def reference(model_type: str, dataset: str):
    """(flat log-probs, gradients of the weighted log-prob sum) with every sample run alone."""
    model, attn = tiny_model(model_type)
    model.set_attn_implementation(attn)
    model.zero_grad(set_to_none=True)
    if dataset == "sft":
        seqs = sft_sequences()
        parts = _sample_logp(model, seqs, [1] * len(seqs))
    else:
        parts = _sample_logp(model, *_sp_samples(dataset))
    _loss(parts, 7).backward()
    grads = _grads(model)
    model.zero_grad(set_to_none=True)
    return torch.cat(parts).detach(), grads


CACHES.append(reference)


def _set_attn(model, name):
    model.set_attn_implementation(name)


def _sft(model, attn, path):
    import packkit

    seqs = sft_sequences()
    flex = path.startswith("sft_flex")
    collate = packkit.PackingCollator(return_block_mask=flex, model_config=model.config if path == "sft_flex" else None)
    batch = collate([{"input_ids": s} for s in seqs])
    batch.pop("labels")
    varlen = path == "sft_varlen"
    _set_attn(model, "flex_attention" if flex else packkit.register_varlen_attention() if varlen else attn)
    logits = model(**batch, use_cache=False).logits[0]
    cu = batch["cu_seq_lens_q"].tolist()
    ids = batch["input_ids"][0]
    return [_token_logp(logits[a:b], ids[a:b]) for a, b in zip(cu, cu[1:])]


def _shared_prefix(model, path):
    from packkit import shared_prefix as sp

    dataset, attention = path.split("_")
    _set_attn(model, sp.register_attention())
    if dataset == "groups":
        batch, info = sp.pack_groups(*groups(), attention=attention)
    else:
        convs, score_from = tree()
        batch, info = sp.pack_tree(convs, score_from=score_from, attention=attention)
    logits = model(**batch, use_cache=False).logits
    result = sp.completion_logprobs(logits, info)
    seqs, starts = _sp_samples(dataset)
    parts = []
    for s, (seq, start) in enumerate(zip(seqs, starts)):
        n = len(seq) - max(start, 1)
        if not bool(result.mask[s, len(seq) - start - n:len(seq) - start].all()):
            raise AssertionError(f"completion_logprobs masks a scored token of sample {s}")
        parts.append(result.padded[s, len(seq) - start - n:len(seq) - start])
    return parts


# zoo path -> packkit.prepare_model's path (packkit.models.verdicts.PATHS)
PREPARE_PATHS = {"sft": "position_ids", "sft_varlen": "packkit_varlen", "sft_flex": "flex_attention",
                 "sft_flex_plain": "flex_attention"}


def prepare_path(path: str) -> str:
    return PREPARE_PATHS.get(path, "shared_prefix")


def run_case(model_type: str, path: str, prepare: bool = True) -> Outcome:
    """One architecture x path: exact, refused (ValueError: by ``packkit.prepare_model`` or by the path's entry
    point) or mismatch. ``prepare=False`` runs the path on the model as transformers builds it (controls)."""
    import packkit

    model, attn = tiny_model(model_type)
    grads = PATHS[path][1]
    if prepare:  # refused before anything runs; the reference is computed on the unprepared model
        try:
            packkit.prepare_model(model, path=prepare_path(path))
        except ValueError as exc:
            return Outcome("refused", str(exc))
        finally:
            packkit.unprepare_model(model)
    ref_logp, ref_grads = reference(model_type, "sft" if path.startswith("sft") else path.split("_")[0])
    model.zero_grad(set_to_none=True)
    try:
        if prepare:
            packkit.prepare_model(model, path=prepare_path(path))
        with torch.set_grad_enabled(grads), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parts = _sft(model, attn, path) if path.startswith("sft") else _shared_prefix(model, path)
            if grads:
                _loss(parts, 7).backward()
    except ValueError as exc:
        return Outcome("refused", str(exc))
    finally:
        packkit.unprepare_model(model)
        model.set_attn_implementation(attn)
    got = torch.cat(parts).detach()
    outcome = compare(got, ref_logp, _grads(model) if grads else None, ref_grads)
    model.zero_grad(set_to_none=True)
    return outcome


# -- the table (docs/reliability.md) ----------------------------------------------------------------------------
BEGIN, END = "<!-- model-zoo-table: begin (tools/model_zoo_table.py) -->", "<!-- model-zoo-table: end -->"


def _reason(outcome: Outcome, name: str) -> str:
    """The refusal's first sentence, with the model and the sizes generic (one legend entry per kind)."""
    text = " ".join(outcome.detail.split()).split(". ")[0].split("; ")[0].replace("|", "/").rstrip(".")
    model_type = ARCHITECTURES[name].get("model_type", name)
    text = re.sub(rf"\b{re.escape(model_type)}\b", "<model>", text)
    return re.sub(r"\b\d+\b", "N", text)


def render_table(results: dict) -> str:
    """Markdown: architecture x path -> exact / refused (n) / MISMATCH, and the numbered refusal reasons."""
    import transformers

    reasons, lines = [], []
    lines.append(f"transformers {transformers.__version__}, torch {torch.__version__.split('+')[0]}; fp64, "
                 "log-probs rel <= 1e-10 and (where marked *) parameter gradients rel <= 1e-9 against each "
                 "sample run alone.")
    lines.append("")
    head = ["architecture"] + [title + (" *" if grads else "") for title, grads in PATHS.values()]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for name in ARCHITECTURES:
        row = [name]
        for path in PATHS:
            outcome = results[(name, path)]
            if outcome.kind == "exact":
                row.append("exact")
                continue
            if outcome.kind == "refused":
                text = _reason(outcome, name)
            elif outcome.kind == "error":  # the survey only: an exception other than a refusal (not silent)
                text = "fails with " + " ".join(outcome.detail.split()).replace("|", "/")[:160]
            else:
                text = TRANSFORMERS_MISMATCHES.get(
                    (name, path), "silent mismatch: not refused, and log-probs / gradients differ from per-sample")
            if text not in reasons:
                reasons.append(text)
            kind = {"refused": "refused", "error": "error"}.get(outcome.kind, "**MISMATCH**")
            row.append(f"{kind} ({reasons.index(text) + 1})")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines += [f"{i}. {text}" for i, text in enumerate(reasons, 1)]
    return "\n".join(lines)


def table_in(document: str) -> str:
    start, end = document.index(BEGIN) + len(BEGIN), document.index(END)
    return document[start:end].strip("\n")
