"""Launching gloo worker processes on CPU, shared by the torch.distributed tests (test_sampler.py,
test_cp_training.py): one launcher, so the port, environment and timeout handling stay the same."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_gloo_workers(script: str, world_size: int, out: Path, timeout: float) -> tuple[list[int], list[str]]:
    """Run ``tests/<script> rank world_size init_method out`` for every rank; (exit codes, logs) in rank order.
    A worker past the shared deadline is killed and its log ends with ``[timed out]``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # containers without a resolvable hostname
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([sys.executable, str(HERE / script), str(r), str(world_size), init, str(out)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world_size)]
    deadline = time.monotonic() + timeout
    logs, codes = [], []
    try:
        for p in procs:
            try:
                stdout, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, _ = p.communicate()
                stdout = (stdout or "") + "\n[timed out]"
            logs.append(stdout or "")
            codes.append(p.returncode)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return codes, logs
