"""One GPU session in one device call: ``bash tests/gpu/run.sh session`` (issue 48, part 1).

Works in priority order under one global deadline (``PACKKIT_DEADLINE`` seconds from its start, default 520) and
writes ``session.json`` (a row per step) into ``$PACKKIT_GPU_OUT`` the moment each step ends, with at most six log
files beside it that the steps write as they run, so a call killed at its limit still returns all done so far:

1. ``install``   the carried wheel (``$PACKKIT_BUNDLE``, default ``gpu-bundle/``: tools/gpu_bundle.sh), never a build;
                 without one on a GPU: a build of this tree; on the CPU: this tree's build as it is
2. ``selfcheck`` ``packkit info``: every op per backend (CUDA, compiled Triton, CPU), each in a child process,
                 crash signals recorded (its JSON goes into the step's row)
3. ``diagnose``  only if a backend crashed: the stable-ABI bisect (tests/gpu/abi_bisect: its table goes into the
                 step's row), run.sh diagnose (toolchain, throw probe, cuda-gdb backtraces), torch's build facts,
                 a build from source here and the same self-check; then the session stops
4. ``tests``     tests/gpu and every CUDA / compiled-Triton case of the pack, out-variant, context-parallel (static
                 and per pass of a dynamic plan), tree-pack, shared-prefix and training-semantics tests:
                 pytest-xdist, a per-test timeout, failures listed by name
5. ``bench``     benchmarks/bench_pack_gpu.py --quick, then benchmarks/bench_device_plan.py --quick (planning from
                 lengths on the device: ms and host syncs per call; both documents go into the step's row)
6. ``prefix``    the shared-prefix training step (benchmarks/bench_shared_prefix.py, bf16) and packkit_varlen /
                 FlexAttention steps of a tiny Llama against per-sample references
7. ``memcheck``  compute-sanitizer memcheck over tests/gpu/test_cuda_plan_safety.py, with what time is left

A step the deadline leaves no time for is ``SKIP`` with ``skipped: deadline``; one the deadline cuts is ``FAIL``
with ``stopped at the deadline``. Without a GPU the same steps run their CPU variants (the harness check).
``PACKKIT_SESSION_SLOW=STEP:SECONDS`` makes a step slow on purpose (tests/gpu/test_session.py).
"""
from __future__ import annotations

import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEPS = ("install", "selfcheck", "diagnose", "tests", "bench", "prefix", "memcheck")
LOG = {"install": "setup.log", "selfcheck": "setup.log", "diagnose": "diagnose.log", "tests": "tests.log",
       "bench": "bench.log", "prefix": "prefix.log", "memcheck": "memcheck.log"}  # six files at most
CAP = {"install": 120, "selfcheck": 150, "bisect": 150, "tests": 210, "bench": 150, "device_plan": 60, "prefix": 120}  # seconds; the rest: what is left
MIN_START = {"tests": 30, "bench": 25, "prefix": 20, "memcheck": 20}  # below this, the step is not started
RESERVE_S = 5  # kept for writing the JSON after the last step
MAX_LOG_BYTES = 15 << 20  # the device returns files up to 16 MiB
DEVICE_TEST_FILES = ("tests/gpu", "tests/test_pack_ops.py", "tests/test_pack_out_ops.py", "tests/test_pack_sequences.py",
                     "tests/test_context_parallel.py", "tests/test_cp_fused.py", "tests/test_context_parallel_pass.py",
                     "tests/test_tree_pack.py", "tests/test_device_plan.py",
                     "tests/test_shared_prefix_inputs.py", "tests/test_training_semantics.py")


class Session:
    def __init__(self):
        self.start = time.monotonic()
        self.deadline = float(os.environ.get("PACKKIT_DEADLINE") or 520)
        self.out = Path(os.environ.get("PACKKIT_GPU_OUT") or ROOT / "build" / "gpu-run" / "session")
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = ROOT / "build" / "gpu-run"  # scratch: never returned (the junit XML, info JSON, neutral cwd)
        self.neutral = self.work / "cwd"  # pytest / python -c run here: ./packkit would shadow an installed wheel
        self.neutral.mkdir(parents=True, exist_ok=True)
        self.py = os.environ.get("PYTHON") or sys.executable
        self.gpu = _has_gpu(self.py)
        slow = os.environ.get("PACKKIT_SESSION_SLOW", "")
        self.slow = {slow.split(":")[0]: float(slow.split(":")[1])} if ":" in slow else {}
        self.env = {k: v for k, v in os.environ.items() if k != "PACKKIT_GPU_OUT"}  # run.sh steps copy no summary
        self.env.update(PYTHONUNBUFFERED="1", PACKKIT_CACHE_DIR=str(self.work / "cache"))
        self.doc = {"started": _now(), "deadline_s": self.deadline, "mode": "gpu" if self.gpu else "cpu",
                    "python": self.py, "steps": [{"step": s, "result": "PENDING", "seconds": 0.0,
                                                  "detail": "not reached: the call was cut off before this step"}
                                                 for s in STEPS]}
        for name in set(LOG.values()):
            (self.out / name).unlink(missing_ok=True)
        self.save()

    # --- bookkeeping ----------------------------------------------------------------------------------------
    def left(self) -> float:
        return self.deadline - (time.monotonic() - self.start) - RESERVE_S

    def save(self) -> None:
        self.doc["elapsed_s"] = round(time.monotonic() - self.start, 1)
        tmp = self.out / "session.json.tmp"
        tmp.write_text(json.dumps(self.doc, indent=1) + "\n")
        tmp.replace(self.out / "session.json")

    def record(self, step: str, result: str, seconds: float, detail: str, **data) -> None:
        row = next(r for r in self.doc["steps"] if r["step"] == step)
        row.update(result=result, seconds=round(seconds, 1), detail=detail, at=_now(), **data)
        self.save()
        print(f"[session {time.monotonic() - self.start:6.1f} s] {step:<9} {result:<5} {detail}", flush=True)

    def log(self, step: str, text: str) -> None:
        with open(self.out / LOG[step], "a") as f:
            f.write(text)

    def run(self, step: str, cmd: list, cap: float = None, cwd=None, env=None) -> tuple:
        """(exit status or "deadline" / "limit", seconds): ``cmd`` with its output appended to the step's log,
        killed with its whole process group at the deadline (or at ``cap``)."""
        limit = self.left() if cap is None else min(cap, self.left())
        if step in self.slow:  # the seam: the step made slow on purpose
            cmd = ["bash", "-c", f'sleep {self.slow[step]}; exec "$@"', "_", *cmd]
        begin = time.monotonic()
        self.log(step, f"\n$ {' '.join(map(str, cmd))}   (limit {limit:.0f} s)\n")
        with open(self.out / LOG[step], "ab") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd or ROOT, env=env or self.env,
                                    start_new_session=True)
            try:
                status = proc.wait(timeout=max(limit, 1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                status = "deadline" if cap is None or limit < cap else "limit"
        _trim(self.out / LOG[step])
        return status, time.monotonic() - begin

    def skip_rest(self, after: str, why: str) -> None:
        for s in STEPS[STEPS.index(after) + 1:]:
            self.record(s, "SKIP", 0.0, why)

    def started(self, step: str) -> bool:
        """False (and the step recorded ``skipped: deadline``) when too little time is left to start it."""
        if self.left() < MIN_START.get(step, 1):
            self.record(step, "SKIP", 0.0, "skipped: deadline")
            return False
        return True

    def outcome(self, step: str, status, seconds: float, detail: str = "", **data) -> bool:
        if status == 0:
            self.record(step, "PASS", seconds, detail, **data)
            return True
        why = {"deadline": "stopped at the deadline", "limit": f"stopped at the step limit ({CAP.get(step)} s)"}
        self.record(step, "FAIL", seconds, f"{why.get(status, f'exit status {status}')}"
                    + (f"; {detail}" if detail else "") + f" (log: {LOG[step]})", **data)
        return False

    # --- the steps --------------------------------------------------------------------------------------------
    def install(self) -> bool:
        bundle = ROOT / os.environ.get("PACKKIT_BUNDLE", "gpu-bundle")
        tag = "cp%d%d" % _py_version(self.py)
        wheels = sorted(bundle.glob(f"packkit-*-{tag}-*.whl"))
        deps = sorted(p for p in bundle.glob("*.whl") if not p.name.startswith("packkit-"))
        marker = self.work / "installed_from"
        if wheels:
            pip = [self.py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--force-reinstall",
                   str(wheels[-1]), *map(str, deps)]
            status, secs = self.run("install", pip, CAP["install"])
            if status == 1 and "externally-managed" in (self.out / LOG["install"]).read_text():
                status, more = self.run("install", pip + ["--break-system-packages"], CAP["install"])
                secs += more
            source = f"wheel {wheels[-1].name}" + (f" + {len(deps)} dependency wheels" if deps else "")
            marker.write_text("wheel\n")
        elif self.gpu:  # no wheel carried: the tree's build is all there is
            status, secs = self.run("install", ["bash", "tests/gpu/run.sh", "build"], CAP["install"])
            source = "no wheel in the bundle: built from this tree"
        else:
            status, secs, source = 0, 0.0, "CPU mode, no wheel: this tree's build"
        where = subprocess.run([self.py, "-c", "import packkit; print(packkit.__file__)"], capture_output=True,
                               text=True, cwd=self.neutral, env=self.env, timeout=max(self.left(), 1))
        self.log("install", where.stdout + where.stderr)
        if status == 0 and where.returncode != 0:
            status = "import failed"
        return self.outcome("install", status, secs, f"{source}; packkit from {where.stdout.strip() or '?'}")

    def selfcheck(self) -> bool:
        """Runs `packkit info`; returns whether a backend crashed."""
        report = self.work / "info.json"
        report.unlink(missing_ok=True)
        env = dict(self.env, PACKKIT_CHECK_TIMEOUT=str(int(min(120, max(self.left() / 3, 10)))))
        status, secs = self.run("selfcheck", [self.py, "-m", "packkit", "info", "--save", str(report)], CAP["selfcheck"],
                                cwd=self.neutral, env=env)
        info = json.loads(report.read_text()) if report.exists() else {}
        summary, crashed = [], False
        for r in info.get("selfcheck", []):
            checks = r["checks"]
            bad = [c for c in checks if c["result"] != "PASS"]
            crashed |= any(c["result"] == "CRASH" for c in checks)
            summary.append(f"{r['backend']} skipped ({r['skipped']})" if "skipped" in r else
                           f"{r['backend']} {len(checks) - len(bad)}/{len(checks)} pass"
                           + (f" ({bad[0]['result']} {bad[0]['check']}: {bad[0]['detail']})" if bad else ""))
        data = {k: info[k] for k in ("environment", "backends", "selfcheck", "problems") if k in info}
        self.outcome("selfcheck", status, secs, "; ".join(summary) or "no report", info=data)
        return crashed

    def bisect(self) -> dict:
        """The stable-ABI bisect (tests/gpu/abi_bisect): each facility of the CUDA op host code in its own child,
        first, so its table is in session.json even if the slower diagnosis after it is cut off."""
        out = self.work / "abi_bisect"
        (out / "bisect.json").unlink(missing_ok=True)
        cap = min(CAP["bisect"], max(self.left() / 2, 1))
        per_step = os.environ.get("PACKKIT_BISECT_TIMEOUT") or str(int(max(cap / 8, 10)))
        cmd = [self.py, "tests/gpu/abi_bisect/run_bisect.py", str(out), "--timeout", per_step]
        status, secs = self.run("diagnose", cmd, cap)
        doc = json.loads((out / "bisect.json").read_text()) if (out / "bisect.json").exists() else {}
        doc["exit"] = status
        rows = [f"{r['step']}: {r['verdict']}" for r in doc.get("steps", [])]
        self.record("diagnose", "RUNNING", secs, f"bisect: {doc.get('summary', f'no summary (exit {status})')}; "
                    "the rest of the diagnosis is running", bisect=doc)
        self.log("diagnose", "\nbisect verdicts: " + ", ".join(rows) + "\n")
        return doc

    def diagnose(self) -> None:
        bisect = self.bisect()
        facts = ("import torch, sys; print(torch.__version__, torch.version.cuda, torch.version.git_version); "
                 "print('cxx11 abi', torch.compiled_with_cxx11_abi()); print(torch.__config__.show())")
        script = (f"{shlex.join([self.py, '-c', facts])}; bash tests/gpu/run.sh diagnose; bash tests/gpu/run.sh build "
                  f"&& bash tests/gpu/run.sh diagnose && bash tests/gpu/run.sh compare")
        env = dict(self.env, PACKKIT_BISECT_DONE="the session's diagnose step, before this")  # not twice
        status, secs = self.run("diagnose", ["bash", "-c", script], env=env)
        self.outcome("diagnose", status, secs, f"bisect: {bisect.get('summary', 'no summary')}; a backend crashed: "
                     "toolchain, throw probe, backtraces, a build from source here and its self-check "
                     "(build/gpu-run/diagnose-*.json)", bisect=bisect)

    def tests(self) -> None:
        junit = self.work / "junit.xml"
        junit.unlink(missing_ok=True)
        cmd = [self.py, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
               f"--junitxml={junit}", "-k",  # not itself again, nor the bisect's CPU test (the diagnose step's)
               "(cuda or triton or gpu) and not test_session and not test_abi_bisect"]
        if _importable(self.py, "xdist"):
            cmd += ["-n", os.environ.get("PACKKIT_TEST_WORKERS", "8" if self.gpu else "2"), "--dist", "loadfile"]
        if _importable(self.py, "pytest_timeout"):
            cmd += ["--timeout", "120"]
        cmd += [str(ROOT / f) for f in DEVICE_TEST_FILES]
        env = dict(self.env, PACKKIT_REQUIRE_GPU="1") if self.gpu else self.env
        status, secs = self.run("tests", cmd, CAP["tests"], cwd=self.neutral, env=env)
        failed, counts = _junit(junit)
        self.outcome("tests", status, secs, counts + (f"; failed: {', '.join(failed[:20])}" if failed else ""),
                     failed=failed)

    def bench(self) -> None:
        out = self.work / "bench.json"
        out.unlink(missing_ok=True)
        cmd = [self.py, "benchmarks/bench_pack_gpu.py", "--quick", "--out", str(out)] + ([] if self.gpu else ["--cpu"])
        status, secs = self.run("bench", cmd, CAP["bench"])
        doc = json.loads(out.read_text()) if out.exists() else {}
        rows = [r for r in doc.get("rows", []) if not r.get("skipped")]
        # Planning from lengths on the device (issue 62 part 5): plan + pack timed, host syncs counted (0 expected).
        plan_out = self.work / "device_plan.json"
        plan_out.unlink(missing_ok=True)
        plan_cmd = [self.py, "benchmarks/bench_device_plan.py", "--quick", "--out", str(plan_out)] + (
            [] if self.gpu else ["--cpu"])
        plan_status, plan_secs = self.run("bench", plan_cmd, CAP["device_plan"])
        plan_doc = json.loads(plan_out.read_text()) if plan_out.exists() else {}
        self.outcome("bench", status if status != 0 else plan_status, secs + plan_secs,
                     f"{len(rows)} rows; failures: {len(doc.get('failures', []))}; device plan: "
                     f"{len(plan_doc.get('rows', []))} rows, failures: {len(plan_doc.get('failures', []))}",
                     benchmark=doc, device_plan=plan_doc)

    def prefix(self) -> None:
        mode = ["--device", "cuda", "--dtype", "bf16"] if self.gpu else ["--quick"]
        semantics = [self.py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT), "-k",
                     "varlen_attention_with_packkit or flex_attention_with_packkit",
                     str(ROOT / "tests/test_training_semantics.py")]
        script = (f"{shlex.join([self.py, 'benchmarks/bench_shared_prefix.py', *mode])} || exit 1; "
                  f"cd {shlex.quote(str(self.neutral))} && {shlex.join(semantics)}")
        status, secs = self.run("prefix", ["bash", "-c", script], CAP["prefix"])
        if status == 0 and "LOSS DIFFERS" in (self.out / LOG["prefix"]).read_text():
            status = "a loss differs"
        self.outcome("prefix", status, secs, "shared-prefix step (two-pass varlen / Flex / unshared) and the tiny "
                     "Llama's packkit_varlen / Flex steps against per-sample references")

    def memcheck(self) -> None:
        tool = shutil.which("compute-sanitizer") or next(
            (p for p in ("/usr/local/cuda/bin/compute-sanitizer",) if os.path.exists(p)), None)
        if not self.gpu or tool is None:
            self.record("memcheck", "SKIP", 0.0, "no GPU" if not self.gpu else "compute-sanitizer not found")
            return
        env = dict(self.env, PYTORCH_NO_CUDA_MEMORY_CACHING="1", PACKKIT_SAFETY_EXAMPLES="20")
        cmd = [tool, "--tool", "memcheck", "--error-exitcode", "3", "--print-limit", "20", self.py, "-m", "pytest",
               "-q", "-x", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
               str(ROOT / "tests/gpu/test_cuda_plan_safety.py")]
        status, secs = self.run("memcheck", cmd, None, cwd=self.neutral, env=env)
        self.outcome("memcheck", status, secs, "inconsistent plans through every device op (20 per backend)")

    def main(self) -> int:
        if not self.install():
            self.skip_rest("install", "skipped: the install failed")
            return 1
        if not self.started("selfcheck"):
            self.skip_rest("selfcheck", "skipped: deadline")
            return 1
        crashed = self.selfcheck()
        if self.left() <= 0:
            self.skip_rest("selfcheck", "skipped: deadline")
            return 1
        if crashed:
            if self.started("diagnose"):
                self.diagnose()
            self.skip_rest("diagnose", "skipped: a backend crashed (diagnosed instead: diagnose.log)")
            return 1
        self.record("diagnose", "SKIP", 0.0, "no backend crashed")
        for step in ("tests", "bench", "prefix", "memcheck"):
            if self.started(step):
                getattr(self, step)()
        return int(any(r["result"] == "FAIL" for r in self.doc["steps"]))


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _has_gpu(py: str) -> bool:
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([py, "-c", probe], capture_output=True).returncode == 0


def _py_version(py: str) -> tuple:
    out = subprocess.run([py, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True)
    return tuple(map(int, out.stdout.split()))


def _importable(py: str, module: str) -> bool:
    return subprocess.run([py, "-c", f"import {module}"], capture_output=True).returncode == 0


def _junit(path: Path) -> tuple:
    """(names of failed / errored tests, "N passed, N failed, ...") from pytest's JUnit XML."""
    if not path.exists():
        return [], "no test report (cut off before pytest finished)"
    root = ET.parse(path).getroot()
    failed, counts = [], {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    for case in root.iter("testcase"):
        kinds = {child.tag for child in case}
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if kinds & {"failure", "error"}:
            failed.append(name)
            counts["failed" if "failure" in kinds else "errors"] += 1
        elif "skipped" in kinds:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return failed, ", ".join(f"{n} {k}" for k, n in counts.items())


def _trim(path: Path) -> None:
    """Keeps a log under the device's per-file limit: its head and its tail."""
    if path.exists() and path.stat().st_size > MAX_LOG_BYTES:
        data = path.read_bytes()
        half = MAX_LOG_BYTES // 2
        path.write_bytes(data[:half] + b"\n[... trimmed ...]\n" + data[-half:])


if __name__ == "__main__":
    sys.exit(Session().main())
