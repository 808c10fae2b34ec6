"""`tests/gpu/run.sh session` under a fake 30-second deadline with its self-check step made slow on purpose
(PACKKIT_SESSION_SLOW): session.json must show the step before it finished, the slow one stopped at the deadline,
every later one `skipped: deadline`, and stay within the device's limits on what comes back. Forced to the CPU mode
(CUDA_VISIBLE_DEVICES=""), so it runs the same on a GPU machine."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
import pytest

pytestmark = pytest.mark.full

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 30


def test_session_keeps_what_finished_and_skips_the_rest_at_the_deadline(tmp_path):
    env = dict(os.environ, PACKKIT_DEADLINE=str(DEADLINE), PACKKIT_SESSION_SLOW="selfcheck:600",
               PACKKIT_GPU_OUT=str(tmp_path), PACKKIT_BUNDLE="build/no-such-bundle", CUDA_VISIBLE_DEVICES="")
    start = time.monotonic()
    proc = subprocess.run(["bash", "tests/gpu/run.sh", "session"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=DEADLINE + 240)
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "session.json").read_text())
    steps = {row["step"]: row for row in doc["steps"]}
    assert list(steps) == ["install", "selfcheck", "diagnose", "tests", "bench", "prefix", "memcheck"]
    assert doc["mode"] == "cpu" and doc["deadline_s"] == DEADLINE
    assert steps["install"]["result"] == "PASS", steps["install"]
    assert "packkit from" in steps["install"]["detail"]
    slow = steps["selfcheck"]
    assert slow["result"] == "FAIL" and slow["detail"].startswith("stopped at the deadline"), slow
    assert 0 < slow["seconds"] <= DEADLINE
    for name in ("diagnose", "tests", "bench", "prefix", "memcheck"):
        assert (steps[name]["result"], steps[name]["detail"]) == ("SKIP", "skipped: deadline"), steps[name]
    # The deadline holds (the slow step's sleep was killed with its process group), and what would come back
    # from the device fits its limits: at most 8 files (here session.json + the setup log), 16 MiB each.
    assert elapsed < DEADLINE + 60, elapsed
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["session.json", "setup.log"], files
    assert all((tmp_path / f).stat().st_size < 16 << 20 for f in files)
    assert "sleep 600" in (tmp_path / "setup.log").read_text()
