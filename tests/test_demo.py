"""`packkit demo`, the README's main job: runs end to end, prints the table, writes the report."""
from __future__ import annotations

import json

import pytest

import packkit
from packkit.tools import demo
from packkit.__main__ import main

pytest.importorskip("matplotlib")


def test_demo_prints_table_and_writes_report(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    for algorithm in packkit.ALGORITHMS:
        assert f"\n{algorithm} " in out
    assert "backend that packed: C++ CPU kernels" in out or "backend that packed: CUDA" in out
    assert "92.73%" in out  # the bar it is compared against
    report = tmp_path / "report"
    assert (report / "report.md").stat().st_size > 0
    sims = json.loads((report / "packing_simulations.json").read_text())
    at_capacity = [r for r in sims["results"] if r["max_length"] == 20000 and r["algorithm"] == "obfd"]
    assert at_capacity and at_capacity[0]["efficiency"] > 0.9273


def test_demo_rows_beat_next_fit(capsys):
    rows = demo.run(out=None, sample=512)
    by_name = {r["algorithm"]: r for r in rows}
    assert by_name["obfd"]["bins"] == by_name["obfd"]["lower_bound"] or by_name["obfd"]["efficiency"] > 0.999
    assert by_name["obfd"]["waste_vs_nf"] < 0.01
    assert all(r["pack_tokens_per_s"] > 0 for r in rows)
