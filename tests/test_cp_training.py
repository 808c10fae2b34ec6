"""Training semantics of context parallelism (issue 25): cp 2 and 4 as gloo processes on CPU, a tiny fp64
Llama whose attention all-gathers K/V across ranks (tests/cp_dist_worker.py). The loss (sum of the ranks'
token losses / global token count) and the all-reduced gradients equal the unpacked per-sequence run to
rel 1e-10 for zigzag and contiguous shards; a control that shifts labels after the split does not."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(world: int, out: Path, timeout: float = 240.0):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    init = f"tcp://127.0.0.1:{_free_port()}"
    procs = [subprocess.Popen([sys.executable, str(HERE / "cp_dist_worker.py"), str(r), str(world), init, str(out)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    deadline = time.monotonic() + timeout
    logs, codes = [], []
    for p in procs:
        try:
            stdout, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, _ = p.communicate()
            stdout = (stdout or "") + "\n[timed out]"
        logs.append(stdout or "")
        codes.append(p.returncode)
    return codes, logs


def test_cp_loss_and_gradients_equal_unpacked_run(tmp_path):
    out = tmp_path / "result.json"
    codes, logs = _run(4, out)  # ranks 0-1 run cp 2, then all four run cp 4
    assert codes == [0] * 4, "\n".join(log[-3000:] for log in logs)
    result = json.loads(out.read_text())
    for cp in (2, 4):
        for mode in ("zigzag", "contiguous"):
            r = result[f"cp{cp}_{mode}"]
            assert r["loss_rel"] < 1e-10 and r["grad_rel"] < 1e-10, (cp, mode, r)
        control = result[f"cp{cp}_zigzag_control"]
        assert control["loss_rel"] > 1e-3 and control["grad_rel"] > 1e-3, (cp, control)
