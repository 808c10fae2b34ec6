"""Runs fuzz cases, each in a forked child under an address-space limit and a timeout; a pool of ``jobs``
children at a time. The parent only imports and forks (it never runs torch work, so a fork is safe and cheap);
the child builds the baseline, draws the value from its label, calls and judges."""
from __future__ import annotations

import json
import os
import random
import resource
import select
import signal
import sys
import time
from collections import defaultdict

from .core import judge

MEMORY = 4 * 2**30
TIMEOUT = 20.0


def _child(api, case, memory: int, quiet: bool) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    if quiet:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
    import torch
    torch.set_num_threads(1)
    return judge(api, *case)


def run_cases(registry: dict, cases: list, *, jobs: int = 2, timeout: float = TIMEOUT, memory: int = MEMORY,
              budget: float = float("inf"), quiet: bool = True, progress=None) -> list:
    """``cases``: [(api_name, param, cls, label, expect)]. Returns one dict per case run (in ``budget`` seconds:
    the rest are not started)."""
    start = time.monotonic()
    pending, running, results = list(cases), {}, []
    while pending or running:
        while pending and len(running) < jobs and time.monotonic() - start < budget:
            case = pending.pop(0)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child
                os.close(r)
                try:
                    out = _child(registry[case[0]], case[1:], memory, quiet)
                except BaseException as exc:  # noqa: BLE001
                    out = {"outcome": "fail", "detail": f"{type(exc).__name__} escaped the judge: {exc}"[:400]}
                data = json.dumps(out).encode()
                os.write(w, data)
                os._exit(0)
            os.close(w)
            running[r] = (pid, case, time.monotonic(), b"")
        if not pending or time.monotonic() - start >= budget:
            pending = [] if time.monotonic() - start >= budget else pending
        if not running:
            break
        ready, _, _ = select.select(list(running), [], [], 0.05)
        now = time.monotonic()
        for fd in list(running):
            pid, case, t0, buf = running[fd]
            if fd in ready:
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    running[fd] = (pid, case, t0, buf + chunk)
                    continue
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                del running[fd]
                if buf:
                    out = json.loads(buf)
                elif os.WIFSIGNALED(status):
                    out = {"outcome": "fail", "detail": f"crash: killed by signal {os.WTERMSIG(status)}"}
                else:
                    out = {"outcome": "fail", "detail": f"crash: exit status {os.WEXITSTATUS(status)}, no result"}
                out["seconds"] = round(now - t0, 3)
            elif now - t0 > timeout:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os.close(fd)
                del running[fd]
                out = {"outcome": "fail", "detail": f"hang: no result in {timeout:g} s", "seconds": timeout}
            else:
                continue
            api, param, cls, label, expect = case
            out.update(api=api, param=param, cls=cls, label=label, expect=expect)
            results.append(out)
            if progress:
                progress(out)
    return results


def all_cases(registry: dict, names=None) -> list:
    out = []
    for name in names or registry:
        out += [(name, *c) for c in registry[name].cases()]
    return out


def schedule(cases: list, seed: int) -> list:
    """Seeded order: shuffled within each API, then round-robin over APIs (a short budget still reaches every
    API), baselines first."""
    rng = random.Random(seed)
    by_api = defaultdict(list)
    for c in cases:
        by_api[c[0]].append(c)
    lanes = []
    for name in sorted(by_api):
        lane = by_api[name]
        head = [c for c in lane if c[2] == "baseline"]
        rest = [c for c in lane if c[2] != "baseline"]
        rng.shuffle(rest)
        lanes.append(head + rest)
    rng.shuffle(lanes)
    order = []
    while any(lanes):
        for lane in lanes:
            if lane:
                order.append(lane.pop(0))
    return order


def table(results: list) -> str:
    """Markdown: per API and per class, calls / clear errors / checked results / failures."""
    counts = defaultdict(lambda: [0, 0, 0, 0])
    for r in results:
        for key in ((r["api"], r["cls"]), (r["api"], "all"), ("all", r["cls"]), ("all", "all")):
            row = counts[key]
            row[0] += 1
            row[{"clear": 1, "checked": 2, "fail": 3}[r["outcome"]]] += 1
    lines = ["| API | class | calls | clear errors | checked results | failures |", "|---|---|---:|---:|---:|---:|"]
    for (api, cls), row in sorted(counts.items(), key=lambda kv: (kv[0][0] == "all", kv[0][0], kv[0][1] != "all",
                                                                   kv[0][1])):
        lines.append(f"| {api} | {cls} | {row[0]} | {row[1]} | {row[2]} | {row[3]} |")
    return "\n".join(lines)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
