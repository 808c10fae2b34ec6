"""`packkit demo`, the README's main job: runs end to end, prints the table, writes the report."""
from __future__ import annotations

import json

import pytest

import packkit
from packkit.tools import demo
from packkit.__main__ import main
from packkit.analyze.simulate import padding_baseline

pytestmark = pytest.mark.core

pytest.importorskip("matplotlib")


def test_demo_prints_table_and_writes_report(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    for algorithm in packkit.ALGORITHMS:
        assert f"\n{algorithm} " in out
    assert "backend that packed: C++ CPU kernels" in out or "backend that packed: CUDA" in out
    # The printed obfd row holds the planner's figures for the profile, computed here.
    lengths = demo.demo_lengths()
    obfd = packkit.plan(lengths, demo.PROFILE["capacity"], overlong="drop")
    line = next(x for x in out.splitlines() if x.startswith("obfd "))
    assert line.split()[1:4] == [f"{obfd.num_bins:,}", f"{obfd.lower_bound:,}", f"{obfd.efficiency * 100:.3f}"], line
    assert "a Qwen3-VL SFT dataset's published length profile" in out  # the data, named by what it is
    assert "that dataset's own packer: 92.73% efficiency" in out  # the bar it is compared against
    # One padding baseline, defined, with its efficiency computed here.
    (pad,) = padding_baseline(lengths, [demo.PROFILE["capacity"]], demo.PADDED_MICRO_BATCH)
    assert f"each padded to its longest sample\n  (dynamic padding): {pad['efficiency']:.2%} efficiency" in out
    assert f"each padded to its longest sample): {pad['efficiency']:.2%} efficiency" in (
        tmp_path / "report" / "report.md").read_text()
    report = tmp_path / "report"
    assert (report / "report.md").stat().st_size > 0
    sims = json.loads((report / "packing_simulations.json").read_text())
    at_capacity = [r for r in sims["results"] if r["max_length"] == 20000 and r["algorithm"] == "obfd"]
    assert at_capacity and at_capacity[0]["efficiency"] > 0.9273


def test_demo_rows_beat_next_fit(capsys, monkeypatch):
    clock = iter(range(10**6))  # every perf_counter() call is one second later: tokens/s = kept tokens / 1 s
    monkeypatch.setattr(demo.time, "perf_counter", lambda: float(next(clock)))
    rows = demo.run(out=None, sample=512)
    by_name = {r["algorithm"]: r for r in rows}
    assert by_name["obfd"]["bins"] == by_name["obfd"]["lower_bound"] or by_name["obfd"]["efficiency"] > 0.999
    assert by_name["obfd"]["waste_vs_nf"] < 0.01
    lengths, capacity = demo.demo_lengths(), demo.PROFILE["capacity"]
    nf = packkit.plan(lengths, capacity, algorithm="nf", overlong="drop")
    nf_waste = nf.num_bins * capacity - nf.kept_tokens
    (pad,) = padding_baseline(lengths, [capacity], demo.PADDED_MICRO_BATCH)
    pad_tokens = pad["token_slots"] - pad["tokens"]
    for r in rows:  # every figure recomputed here from the planner
        dp = 8 if r["algorithm"] == "ogbfd" else 1
        p = packkit.plan(lengths, capacity, algorithm=r["algorithm"], overlong="drop", dp_size=dp, cost="attention")
        assert r["bins"] == p.num_bins and r["waste_tokens"] == p.num_bins * capacity - p.kept_tokens
        assert r["waste_vs_nf"] == pytest.approx(r["waste_tokens"] / nf_waste)
        assert r["waste_vs_padding_baseline"] == pytest.approx(r["waste_tokens"] / pad_tokens)
        head = packkit.plan(lengths[:512], capacity, algorithm=r["algorithm"], overlong="drop", dp_size=dp,
                            cost="attention")
        assert r["pack_tokens_per_s"] == pytest.approx(head.kept_tokens), r["algorithm"]
