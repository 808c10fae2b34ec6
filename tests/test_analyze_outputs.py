"""``packkit analyze`` output side: every output file's schema and values (checked against numpy and
``packkit.plan`` directly), the recommendation rules, the training-dynamics table, figures, re-runs."""
from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

import packkit
from packkit.__main__ import main
from analyze_helpers import (SCHEMAS, check_png, check_schema, no_partial_outputs, run_cli, schema_keys,
                             write_lengths_text)
from packkit.analyze import analyze_lengths
from packkit.analyze.recommend import recommend, training_dynamics
from packkit.analyze.simulate import auto_max_lengths, nice_ceil, parse_max_lengths

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lengths():
    rng = np.random.default_rng(11)
    x = np.maximum(np.round(np.exp(rng.normal(np.log(700), 1.0, 6000))), 1).astype(np.int64)
    x[:5] = 0  # zero-length samples are allowed and reported
    return x


@pytest.fixture(scope="module")
def run(tmp_path_factory, lengths):
    """One CLI run with figures, dp 4 and every algorithm; returns (out dir, parsed --json stdout)."""
    pytest.importorskip("matplotlib")
    root = tmp_path_factory.mktemp("analyze")
    data = write_lengths_text(lengths, root / "lengths.txt")
    out = root / "out"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["analyze", str(data), "-o", str(out), "--max-lengths", "auto,3000", "--algorithms", "all",
                     "--dp-size", "4", "--batch-size", "64", "--epochs", "3", "--padded-micro-batch-size", "4",
                     "--target-efficiency", "0.98", "--max-dropped-fraction", "0.01", "--no-progress", "--json"])
    assert code == 0
    return out, json.loads(stdout.getvalue())


def _load(out: Path, name: str) -> dict:
    return json.loads((out / name).read_text())


def test_every_output_file_exists_and_matches_its_schema(run):
    out, summary = run
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert names == sorted(["dataset_stats.json", "packing_simulations.json", "recommendations.json", "report.md",
                            "figures/length_distribution.png", "figures/efficiency_vs_max_length.png",
                            "figures/dropped_vs_max_length.png"])
    assert summary["files"][-1] == "report.md" and sorted(summary["files"]) == names
    for name, schema in SCHEMAS.items():
        doc = _load(out, name)
        check_schema(doc, schema)
        assert doc["schema"] == f"packkit.analyze.{name[:-5]}/1" and doc["generator"].startswith("packkit ")
    for name in names:
        if name.endswith(".png"):
            check_png(out / name)
    assert no_partial_outputs(out.parent)


def test_dataset_stats_match_numpy(run, lengths):
    out, summary = run
    stats = _load(out, "dataset_stats.json")
    assert stats["count"] == lengths.size and stats["total_tokens"] == int(lengths.sum())
    assert stats["min"] == 0 and stats["max"] == int(lengths.max()) and stats["zero_length"] == 5
    assert stats["mean"] == pytest.approx(lengths.mean()) and stats["std"] == pytest.approx(lengths.std())
    for key, q in [("p10", 10), ("p25", 25), ("median", 50), ("p75", 75), ("p90", 90), ("p95", 95), ("p99", 99),
                   ("p999", 99.9)]:
        assert stats[key] == pytest.approx(np.percentile(lengths, q)), key
    h = stats["histogram"]
    edges = np.asarray(h["bin_edges"])
    assert len(h["counts"]) == len(edges) - 1 and np.all(np.diff(edges) > 0)
    assert sum(h["counts"]) == lengths.size - 5  # zero lengths counted apart
    np.testing.assert_array_equal(h["counts"], np.histogram(lengths[lengths > 0], bins=edges)[0])
    assert h["scale"] == "log"  # max > 20 x median
    assert stats["source"]["format"] == "text" and stats["source"]["samples"] == lengths.size
    assert summary["stats"] == {k: v for k, v in stats.items() if k not in ("histogram", "schema", "generator", "source")}


def test_simulations_match_packkit_plan(run, lengths):
    out, _ = run
    sims = _load(out, "packing_simulations.json")
    stats = _load(out, "dataset_stats.json")
    assert sims["max_lengths"] == sorted(set(auto_max_lengths(stats)) | {3000})
    assert sims["algorithms"] == list(packkit.ALGORITHMS) and sims["dp_size"] == 4 and sims["cost"] == "attention"
    assert len(sims["results"]) == len(sims["max_lengths"]) * len(packkit.ALGORITHMS)
    for row in sims["results"]:
        p = packkit.plan(lengths, row["max_length"], algorithm=row["algorithm"], overlong="drop", dp_size=4,
                         cost="attention")
        assert row["packs"] == p.num_bins and row["lower_bound"] == p.lower_bound
        assert row["efficiency"] == pytest.approx(p.efficiency)
        assert row["dropped"] == len(p.dropped) == int(np.count_nonzero(lengths > row["max_length"]))
        assert row["dropped_tokens"] == int(lengths[lengths > row["max_length"]].sum())
        assert row["kept_tokens"] == p.kept_tokens == int(lengths.sum()) - row["dropped_tokens"]
        assert row["samples_per_pack"] == pytest.approx((lengths.size - row["dropped"]) / p.num_bins)
        assert row["steps"] == p.num_steps and row["balance"] == pytest.approx(p.balance)
        assert row["rank_balance"] == pytest.approx(p.rank_balance)
        assert row["zero_length"] == 5 and row["truncated"] == 0 and row["split"] == 0
    effs = {(r["max_length"], r["algorithm"]): r["efficiency"] for r in sims["results"]}
    big = max(sims["max_lengths"])
    assert effs[(big, "obfd")] > effs[(big, "nf")]  # the sweep shows a real difference


def test_padding_baseline_recomputed(run, lengths):
    out, _ = run
    sims = _load(out, "packing_simulations.json")
    shuffled = lengths[np.random.default_rng(sims["seed"]).permutation(lengths.size)]
    for row in sims["padding"]:
        clipped = np.minimum(shuffled, row["max_length"])
        slots = sum(int(clipped[i:i + 4].max()) * len(clipped[i:i + 4]) for i in range(0, lengths.size, 4))
        assert row["token_slots"] == slots and row["tokens"] == int(clipped.sum())
        assert row["efficiency"] == pytest.approx(clipped.sum() / slots) and row["micro_batch_size"] == 4


def test_recommendation_follows_its_rules(run, lengths):
    out, summary = run
    rec = _load(out, "recommendations.json")
    sims = _load(out, "packing_simulations.json")
    r = rec["recommended"]
    assert rec["criteria"]["target_efficiency"] == 0.98 and rec["criteria"]["max_dropped_fraction"] == 0.01
    # the smallest max length whose best algorithm meets both criteria
    ok = sorted({row["max_length"] for row in sims["results"]
                 if row["efficiency"] >= 0.98 and row["dropped"] / lengths.size <= 0.01})
    assert r["meets_target"] and r["max_length"] == ok[0]
    best = max((row for row in sims["results"] if row["max_length"] == r["max_length"]), key=lambda x: x["efficiency"])
    assert r["efficiency"] == pytest.approx(best["efficiency"]) and r["packs"] == best["packs"]
    assert rec["config"]["global_max_length"] == r["max_length"] and rec["config"]["effective_batch_size"] == 64
    t = rec["training"]
    assert t["packing"]["optimizer_steps"] == math.ceil(r["packs"] * 3 / 64)
    assert t["padding"]["optimizer_steps"] == math.ceil(lengths.size * 3 / 64)
    assert t["padding"]["gradient_accumulation"] == 64 // (4 * 4) and t["packing"]["gradient_accumulation"] == 64 // 4
    assert summary["recommended"] == r
    labels = [a["label"].split()[0] for a in rec["alternatives"]]
    assert labels == ["smaller", "larger"]


def test_report_holds_the_tables(run):
    out, _ = run
    report = (out / "report.md").read_text()
    rec = _load(out, "recommendations.json")["recommended"]
    for heading in ("## Data", "## Recommendation", "## Training dynamics", "## Packing simulations", "## Figures"):
        assert heading in report
    assert f"**max length {rec['max_length']:,} with `{rec['algorithm']}`**" in report
    assert "| optimizer steps (3 epochs) |" in report and "| samples per step |" in report
    assert "| gradient accumulation steps |" in report
    for fig in ("figures/length_distribution.png", "figures/efficiency_vs_max_length.png"):
        assert f"]({fig})" in report
    sweep = report.split("## Packing simulations")[1].split("Padding baseline")[0]
    assert sweep.count("| ogbfd |") == len(_load(out, "packing_simulations.json")["max_lengths"])
    assert "packkit analyze" in report and "--max-lengths auto,3000" in report  # the command to reproduce


def test_rerun_replaces_outputs_and_removes_stale_ones(tmp_path, capsys):
    data = write_lengths_text(np.arange(1, 500), tmp_path / "a.txt")
    out = tmp_path / "out"
    code, _, err = run_cli(["analyze", data, "-o", out, "--max-lengths", "512"], capsys)
    assert code == 0, err
    assert (out / "figures" / "length_distribution.png").exists()
    (out / "notes.txt").write_text("mine")  # not ours: kept
    data2 = write_lengths_text(np.arange(1, 100), tmp_path / "b.txt")
    code, _, err = run_cli(["analyze", data2, "-o", out, "--max-lengths", "256", "--no-figures", "--save-lengths"],
                           capsys)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["dataset_stats.json", "lengths.npy", "notes.txt",
                                                     "packing_simulations.json", "recommendations.json", "report.md"]
    assert _load(out, "dataset_stats.json")["count"] == 99
    np.testing.assert_array_equal(np.load(out / "lengths.npy"), np.arange(1, 100))
    code, stdout, err = run_cli(["analyze", out / "lengths.npy", "-o", tmp_path / "again", "--no-figures", "--json"],
                                capsys)  # the saved lengths are an input again
    assert code == 0 and json.loads(stdout)["stats"]["total_tokens"] == sum(range(1, 100)), err
    assert no_partial_outputs(tmp_path)


@pytest.mark.parametrize("overlong", ["truncate", "split"])
def test_overlong_policies(overlong):
    x = np.array([100, 900, 2500, 50, 4000, 700] * 50, dtype=np.int64)
    result = analyze_lengths(x, None, max_lengths=[1000, 8192], overlong=overlong, algorithms="obfd",
                             max_dropped_fraction=0.0, target_efficiency=0.5)
    row = result.result(1000, "obfd")
    p = packkit.plan(x, 1000, overlong=overlong)
    assert row["packs"] == p.num_bins and row["dropped"] == 0
    if overlong == "truncate":
        assert row["truncated"] == 100 and row["truncated_tokens"] == int((x[x > 1000] - 1000).sum())
        assert row["lost_samples"] == 100 and row["kept_tokens"] == int(np.minimum(x, 1000).sum())
        assert result.recommended["max_length"] == 8192  # 1000 loses samples, over the 0 budget
    else:
        assert row["split"] == 100 and row["lost_samples"] == 0 and row["kept_tokens"] == int(x.sum())
        assert row["segments_per_pack"] > row["samples_per_pack"]
        assert result.recommended["max_length"] == 1000


def test_no_out_dir_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = analyze_lengths([5, 6, 7, 800], None, max_lengths="auto")
    assert list(tmp_path.iterdir()) == [] and result.files == [] and "## Recommendation" in result.report


def test_auto_sweep_and_parsing():
    seed_like = {"median": 864.0, "p99": 7888.1, "max": 66930}
    assert auto_max_lengths(seed_like) == [1024, 2048, 4096, 8000, 8192, 16384, 32768, 65536, 70000, 131072]
    assert parse_max_lengths("auto, 20000", seed_like) == sorted({*auto_max_lengths(seed_like), 20000})
    assert parse_max_lengths([4096, "2048"], seed_like) == [2048, 4096]
    assert parse_max_lengths("16_384", None) == [16384]
    assert [nice_ceil(v) for v in (0.5, 7, 7888.1, 20000, 20001, 66930)] == [1, 7, 8000, 20000, 25000, 70000]
    # narrow data: a handful of points
    assert auto_max_lengths({"median": 100.0, "p99": 120.0, "max": 130}) == [120, 128, 150, 256]


def test_recommendation_fallbacks():
    stats = {"count": 1000}

    def row(m, eff, lost):
        return {"max_length": m, "algorithm": "obfd", "efficiency": eff, "packs": 10, "lower_bound": 10,
                "samples_per_pack": 100.0, "dropped": lost, "truncated": 0, "split": 0, "kept_samples": 1000 - lost,
                "kept_tokens": 10, "lost_fraction": lost / 1000, "dropped_fraction": lost / 1000, "balance": None,
                "rank_balance": None}

    kw = dict(max_dropped_fraction=0.01, batch_size=8, epochs=1, dp_size=1, per_device_batch_size=1,
              padded_micro_batch_size=1, overlong="drop", cost="tokens")
    rows = [row(1024, 0.90, 50), row(2048, 0.95, 5), row(4096, 0.93, 0)]
    r = recommend(stats, rows, [], target_efficiency=0.99, **kw)["recommended"]
    assert (r["max_length"], r["meets_target"]) == (2048, False) and "most efficient one within it" in r["reason"]
    r = recommend(stats, rows, [], target_efficiency=0.92, **kw)["recommended"]
    assert (r["max_length"], r["meets_target"]) == (2048, True)
    r = recommend(stats, rows[:1], [], target_efficiency=0.5, **kw)["recommended"]
    assert (r["max_length"], r["meets_target"]) == (1024, False) and "loses the fewest" in r["reason"]


def test_training_dynamics_reproduce_seed_001_table():
    """Seed 001's own numbers (99,388 samples, 7,091 packs, 101 dropped, effective batch 128, 4 epochs,
    4 GPUs with micro-batch 2 padded / 1 packed) give its table: 3,106 vs 222 steps, 128 vs 1,792
    samples per step, 397,552 vs 397,148 samples, 16 vs 32 accumulation steps."""
    t = training_dynamics(num_samples=99_388, kept_samples=99_388 - 101, packs=7_091, max_length=20_000,
                          kept_tokens=131_506_000, padded_token_slots=None, padded_tokens=None, batch_size=128,
                          epochs=4, dp_size=4, per_device_batch_size=1, padded_micro_batch_size=2)
    pad, pk = t["padding"], t["packing"]
    assert (pad["optimizer_steps"], pk["optimizer_steps"]) == (3106, 222)
    assert pad["samples_per_step"] == 128 and round(pk["samples_per_step"]) == 1792
    assert (pad["total_samples"], pk["total_samples"]) == (397_552, 397_148)
    assert (pad["gradient_accumulation"], pk["gradient_accumulation"]) == (16, 32)
    assert round(t["ratios"]["optimizer_steps"], 1) == 14.0 and round(t["ratios"]["samples_per_step"], 1) == 14.0
    assert pk["steps_per_epoch"] == pytest.approx(7091 / 128)
    eq = t["equal_samples_per_step"]  # ~128 samples per step again: 8 packs of ~14
    assert eq["packs_per_step"] == 8 and eq["gradient_accumulation"] == 2 and eq["optimizer_steps"] == math.ceil(7091 * 4 / 8)
    assert t["notes"] == []
    t = training_dynamics(num_samples=100, kept_samples=100, packs=10, max_length=100, kept_tokens=1, padded_token_slots=1,
                          padded_tokens=1, batch_size=10, epochs=1, dp_size=4, per_device_batch_size=1,
                          padded_micro_batch_size=1)
    assert t["packing"]["gradient_accumulation"] == 3 and "12" in t["notes"][0]


def test_docs_describe_every_output_key():
    docs = (ROOT / "docs" / "analyze.md").read_text()
    missing = sorted(k for schema in SCHEMAS.values() for k in schema_keys(schema) if f"`{k}`" not in docs)
    assert not missing, f"docs/analyze.md does not mention: {missing}"
