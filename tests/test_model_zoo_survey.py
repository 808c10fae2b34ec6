"""tools/model_zoo_table.py --survey's bookkeeping (no model is built): a crash on one path is that cell's error and
the other paths still run (a crash must not hide a silent mismatch elsewhere), a type whose every path fails the
same way is listed as not running, and --retry-failed runs the failed types again."""
from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

pytestmark = pytest.mark.full

pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("model_zoo_table", ROOT / "tools" / "model_zoo_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_survey_crash_on_one_path_keeps_the_other_cells(tool, monkeypatch):
    def run_case(model_type, path):
        if path == "sft_flex_plain":
            raise AttributeError("'DocumentCausalBlockMask' object has no attribute 'ndim'")
        if path == "sft":
            return tool.cases.Outcome("mismatch", logp_rel=0.1, grad_rel=0.1)
        return tool.cases.Outcome("exact")

    monkeypatch.setattr(tool.cases, "run_case", run_case)
    outcomes = tool.survey_cases("some_type")
    assert list(outcomes) == list(tool.zoo.PATHS)  # every path ran
    assert outcomes["sft_flex_plain"].kind == "error"
    assert "AttributeError" in outcomes["sft_flex_plain"].detail
    assert outcomes["sft"].kind == "mismatch"  # what the old survey lost behind the crash
    monkeypatch.setattr(tool.cases, "ARCHITECTURES", {"some_type": {}})
    table = tool.cases.render_table({("some_type", p): o for p, o in outcomes.items()})
    assert "**MISMATCH** (1)" in table and "error (2)" in table
    assert "2. fails with AttributeError" in table


def test_survey_time_out_ends_the_type(tool, monkeypatch):
    def run_case(model_type, path):
        raise TimeoutError

    monkeypatch.setattr(tool.cases, "run_case", run_case)
    with pytest.raises(TimeoutError):
        tool.survey_cases("some_type")


def test_survey_store_retry_failed(tool, monkeypatch, tmp_path):
    store = tmp_path / "store.jsonl"
    entries = [dict(model_type="llama", failed="surveyed before it joined the zoo"),  # the suite's table has it
               dict(model_type="a_type", skipped="encoder-decoder"),
               dict(model_type="b_type", failed="not surveyed: its cases take over 60 s"),
               *[dict(model_type="c_type", path=path, kind="exact", detail="", logp_rel=0.0, grad_rel=0.0)
                 for path in tool.zoo.PATHS]]
    store.write_text("".join(json.dumps(e) + "\n" for e in entries))
    import transformers.models.auto.modeling_auto as auto

    monkeypatch.setattr(auto, "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
                        {t: "" for t in ("llama", "a_type", "b_type", "c_type")})
    monkeypatch.setattr(tool.resource, "setrlimit", lambda *a: None)
    text = tool.survey(str(store), run_new=False)
    assert "`b_type`: not surveyed: its cases take over 60 s" in text
    assert "llama" not in text
    tool.survey(str(store), run_new=False, retry=True)  # run_new=False: the retried type is listed as not run
    kept = [json.loads(line)["model_type"] for line in store.read_text().splitlines()]
    assert kept == ["a_type"] + ["c_type"] * len(tool.zoo.PATHS)
