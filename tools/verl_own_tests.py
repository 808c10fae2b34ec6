"""verl's own distributed micro-batch test, seeded, under packkit's drop-in and under verl's own function.

verl's ``tests/utils/test_seqlen_balancing.py::test_seqlen_balancing_distributed_params`` draws its attention masks
with ``np.random`` unseeded inside each spawned rank, and asserts that the micro-batch count equals
``ceil(tokens / max_token_len)``: a bound a partition of 20-35 rows of 50-90 tokens under a 300-token cap reaches
only on some draws. One run of it says little; this runs it over seeds and reports the pass rate of each function.

    python tools/verl_own_tests.py --verl-test /path/to/verl/tests/utils/test_seqlen_balancing.py --trials 20

The test file is read from a verl checkout (nothing of it is copied here). CPU shims, applied to the test
module's names only: ``set_device`` is a no-op, the backend is gloo, the device is ``cpu`` (verl's own
function puts its count tensor on ``get_device_name()``, so it is pointed at the CPU too). Each trial is the
test's two ``mp.spawn`` calls (``min_num_micro_batch=4``; ``same_micro_num_in_dp=True``) with every rank's
``np.random`` seeded ``seed * 1000 + rank``. Writes ``build/verl-own-tests.json``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

CASES = (("min_num_micro_batch=4", 300, False, 4), ("same_micro_num_in_dp", 300, True, None))


def load(path: str):
    spec = importlib.util.spec_from_file_location("verl_test_seqlen_balancing", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _CpuDevice:
    @staticmethod
    def set_device(_rank):
        return None


def _seeded_worker(rank, path, impl, seed, world_size, init_method, cap, same_dp, min_mb):
    import numpy as np

    import verl.utils.seqlen_balancing as sb

    module = load(path)
    module.get_torch_device = lambda: _CpuDevice
    module.get_nccl_backend = lambda: "gloo"
    module.get_device_name = lambda: "cpu"
    sb.get_device_name = lambda: "cpu"
    if impl == "packkit":
        from packkit.integrations import verl as pv

        pv.install()
        module.rearrange_micro_batches = pv.rearrange_micro_batches  # the test imported verl's by name
    np.random.seed(seed * 1000 + rank)
    module._worker(rank, world_size, init_method, cap, same_dp, min_mb)


def trial(path: str, impl: str, seed: int) -> dict:
    import torch.multiprocessing as mp

    out = {}
    for name, cap, same_dp, min_mb in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            init = Path(tmp) / "dist_init"
            init.write_text("")
            try:
                mp.spawn(_seeded_worker, args=(path, impl, seed, 2, f"file://{init}", cap, same_dp, min_mb),
                         nprocs=2, join=True)
                out[name] = "pass"
            except Exception as exc:  # noqa: BLE001 - a failed rank's assertion is the result being measured
                text = str(exc)
                out[name] = "fail: " + ("assert len(micros) == expected" if "AssertionError" in text
                                        else text.strip().splitlines()[-1][:200])
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verl-test", required=True, help="verl's tests/utils/test_seqlen_balancing.py")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--out", default="build/verl-own-tests.json")
    args = parser.parse_args(argv)
    path = str(Path(args.verl_test).resolve())
    load(path)  # fail early on a wrong path
    import verl

    rows, started = [], time.time()
    for seed in range(args.first_seed, args.first_seed + args.trials):
        for impl in ("packkit", "verl"):
            try:
                result = trial(path, impl, seed)
            except Exception:  # noqa: BLE001
                result = {"error": traceback.format_exc(limit=1)}
            passed = all(v == "pass" for v in result.values())
            rows.append({"seed": seed, "impl": impl, "passed": passed, **result})
            print(f"seed {seed:3d} {impl:8s} {'pass' if passed else 'FAIL'}  {result}", flush=True)
    summary = {impl: sum(r["passed"] for r in rows if r["impl"] == impl) for impl in ("packkit", "verl")}
    both = {(r["seed"]) for r in rows if r["passed"] and r["impl"] == "packkit"} & \
        {(r["seed"]) for r in rows if r["passed"] and r["impl"] == "verl"}
    report = {"verl": verl.__version__, "test": path, "trials": args.trials, "first_seed": args.first_seed,
              "passed": summary, "passed_under_both": len(both), "seconds": round(time.time() - started, 1),
              "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"\npassed of {args.trials} seeded trials: packkit {summary['packkit']}, verl {summary['verl']}; "
          f"both {len(both)}  ({report['seconds']} s) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
