"""Model-zoo exactness suite: every packing path packkit offers on the CPU, through every decoder-only text
architecture of tests/model_zoo.py (tiny, random, fp64 end to end), is exact against each sample run alone
(log-probs rel <= 1e-10, parameter gradients rel <= 1e-9) or refused with a ValueError that names what cannot
be exact. A silent mismatch fails. docs/reliability.md holds the table (tools/model_zoo_table.py writes it);
the last test checks it is what this suite produces.

Each case first calls ``packkit.prepare_model`` for its path (per-document stand-ins of recurrent kernels, or a
refusal by name). Controls (the same comparison must flag them): the refused cells run unprepared; the stand-ins
running each packed row as one sequence; dropping ``softcap`` (Gemma 2) or ``s_aux`` (GPT-OSS sinks)
before packkit's shared-prefix attention sees them; BlockMasks without the sliding window (the issue's bug);
``packkit_varlen`` losing ``sliding_window``.
"""
from __future__ import annotations

import pathlib

import pytest

pytest.importorskip("transformers")

import model_zoo as zoo  # noqa: E402
import model_zoo_cases as cases  # noqa: E402

pytestmark = pytest.mark.full

RESULTS = {}
DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "reliability.md"


@pytest.fixture(scope="module", autouse=True)
def _zoo():
    with zoo.zoo_session():
        yield


def outcome(name, path):
    if (name, path) not in RESULTS:
        RESULTS[(name, path)] = cases.run_case(name, path)
    return RESULTS[(name, path)]


@pytest.mark.parametrize("path", list(zoo.PATHS))
@pytest.mark.parametrize("name", list(zoo.ARCHITECTURES))
def test_exact_or_refused(name, path):
    result = outcome(name, path)
    assert result.kind in ("exact", "refused"), f"{name} / {path}: {result.cell()}"
    if result.kind == "refused":
        assert len(result.detail) > 20, result.detail  # a reason, not a bare error


# Cells prepare_model refuses because they are silently wrong without it: the same comparison flags each of them when
# the model is run unprepared (so a refusal that is no longer needed, e.g. transformers fixed, shows up), and the
# per-document stand-ins / mixers are what makes the hybrid cells exact.
UNPREPARED_MISMATCHES = [("gpt_oss", "sft"), ("granitemoehybrid", "sft"), ("opt", "sft"), ("mamba", "sft"),
                         ("mamba2", "sft"), ("inkling_text", "sft"), ("minimax", "sft"),
                         ("mpt", "sft"), ("openai-gpt", "sft_varlen"), ("xlm", "sft"), ("zaya", "sft")]


@pytest.mark.parametrize("name, path", UNPREPARED_MISMATCHES)
def test_control_unprepared_model_is_caught(monkeypatch, name, path):
    from packkit.models import verdicts

    prepared = outcome(name, path)
    if name in verdicts.MIXERS:  # run per document by prepare_model: unprepared, the mixers run across documents
        assert prepared.kind == "exact", prepared.cell()
        result = cases.run_case(name, path, prepare=False)
    else:  # refused by prepare_model: without the refusal (stand-ins still installed), silently wrong
        assert prepared.kind == "refused" and "prepare_model" in prepared.detail, prepared.cell()
        model_type = zoo.ARCHITECTURES[name].get("model_type", name)
        monkeypatch.setitem(verdicts.REFUSED, model_type, {})
        result = cases.run_case(name, path)
    # caught: silently wrong by far, or (transformers >= 5.25, whose mixers hand the batch's boundaries to the
    # kernels' torch references) refused by transformers itself
    assert (result.kind == "mismatch" and result.logp_rel > 1e3 * cases.REL_LOGP) or (
        result.kind == "refused" and "can't keep packed sequences apart" in result.detail), result.cell()


@pytest.mark.parametrize("name", ["qwen3_5_text"])
def test_control_stand_in_across_documents_is_caught(monkeypatch, name):
    """The per-document kernels run each packed row as one sequence: the comparison flags it."""
    from packkit.models import kernels

    monkeypatch.setattr(kernels, "document_spans", lambda kwargs, rows, length, where: [
        (row, 0, length) for row in range(rows)] if kwargs.get("cu_seq_lens_q") is not None or kwargs.get(
        "cu_seqlens") is not None or kwargs.get("seq_idx") is not None else None)
    result = cases.run_case(name, "sft")
    assert result.kind == "mismatch" and result.logp_rel > 1e3 * cases.REL_LOGP, result.cell()


@pytest.mark.parametrize("name, path, argument", [
    ("gemma2 (window 64)", "groups_dense", "softcap"),
    ("gemma2 (window 64)", "tree_varlen", "softcap"),
    ("gpt_oss (window 64)", "groups_varlen", "s_aux"),
    ("gpt_oss (window 64)", "tree_dense", "s_aux"),
])
def test_control_dropped_argument_is_caught(monkeypatch, name, path, argument):
    """The attention function loses the argument before packkit's shared-prefix attention sees it."""
    from packkit.shared_prefix import hf

    original = hf.shared_prefix_attention_forward

    def dropping(*args, **kwargs):
        kwargs.pop(argument, None)
        return original(*args, **kwargs)

    monkeypatch.setattr(hf, "shared_prefix_attention_forward", dropping)
    result = cases.run_case(name, path)
    assert result.kind == "mismatch", result.cell()
    assert result.logp_rel > 1e3 * cases.REL_LOGP


def test_control_block_mask_without_windows_is_caught(monkeypatch):
    """The issue's bug: the collator's BlockMasks lose the sliding window (every layer type treated as full). The
    document-causal mask's own guard refuses that; without the guard too, the comparison flags it."""
    from packkit.training import block_masks

    monkeypatch.setattr(block_masks, "model_layer_types", lambda config: ["full_attention"])
    assert cases.run_case("mistral", "sft_flex").kind == "refused"
    monkeypatch.setattr(block_masks, "_refuse_windowed_use", lambda max_document: None)
    result = cases.run_case("mistral", "sft_flex")
    assert result.kind == "mismatch" and result.logp_rel > 1e3 * cases.REL_LOGP, result.cell()


def test_control_varlen_without_window_is_caught(monkeypatch):
    """packkit_varlen loses sliding_window on its way to the kernel."""
    from packkit.training import hf_attention

    original = hf_attention.varlen_attention_forward

    def dropping(*args, **kwargs):
        kwargs.pop("sliding_window", None)
        return original(*args, **kwargs)

    monkeypatch.setattr(hf_attention, "varlen_attention_forward", dropping)
    result = cases.run_case("mistral", "sft_varlen")
    assert result.kind == "mismatch" and result.logp_rel > 1e3 * cases.REL_LOGP, result.cell()


def test_docs_table_is_what_the_suite_produces():
    results = {(n, p): outcome(n, p) for n in zoo.ARCHITECTURES for p in zoo.PATHS}
    assert cases.table_in(DOC.read_text()) == cases.render_table(results), "run: python tools/model_zoo_table.py"
