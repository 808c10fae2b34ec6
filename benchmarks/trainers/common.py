"""What the trainer benchmarks (axolotl.py, swift.py, llamafactory.py) share, so their rows compare.

Contract (issue 40, section 4). Each ``benchmarks/trainers/<name>.py`` is a script::

    python benchmarks/trainers/<name>.py --lengths LENGTHS.npy --capacity C --dp-size W --hidden H --out OUT.json

that writes a JSON list of rows (:func:`result_row`), one per method ("<trainer> own", "packkit"), keys
:data:`ROW_KEYS`:

* ``rows``: non-empty rows the packer made; ``steps``: optimizer steps, ``dp_size`` rows each, as the trainer
  deals the rows to ranks (:func:`deal_round_robin`);
* ``efficiency``: real tokens / (rows * capacity);
* ``balance``: sum over steps of the costliest rank / sum over steps of the mean rank, rank cost
  ``6*h*tokens + sum(l**2)`` (:func:`cost_pair`: packkit's ``(a, b)`` cost model with those coefficients);
* ``plan_seconds``: median wall time of planning one epoch (what the trainer does before step 1: for the
  trainer's own that is its own packing code on the same lengths).

Targets per row (:func:`meets_targets`): packkit's balance <= 1.002, steps <= theirs, plan_seconds <= theirs.
Imports only numpy and packkit, so it runs in every trainer's venv.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROW_KEYS = ("trainer", "method", "n_samples", "capacity", "dp_size", "hidden", "rows", "steps", "efficiency",
            "balance", "plan_seconds")
BALANCE_TARGET = 1.002
DP_SIZES = (8, 32)
# Hidden sizes of real configs: Llama-3-8B (4096) and Llama-3.2-1B (2048).
HIDDEN_SIZES = {4096: "Llama-3-8B", 2048: "Llama-3.2-1B"}


@dataclass(frozen=True)
class Workload:
    """``n`` lognormal lengths (median, sigma), rounded, clipped to [min_length, capacity], fixed seed."""
    name: str
    median: float
    sigma: float
    capacity: int
    n: int = 50_000
    min_length: int = 16
    seed: int = 0

    def lengths(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        raw = np.round(np.exp(rng.normal(math.log(self.median), self.sigma, self.n)))
        return np.clip(raw, self.min_length, self.capacity).astype(np.int64)


# Issue 40's table (50,000 lengths each) and seed 001's profile (REFERENCE.md section 5: 99,388 samples,
# lognormal median 864 sigma 0.932 matches its mean/median/p95/p99; its packer ran at max length 20,000).
SIGMA = 0.932
WORKLOADS = (
    Workload("sft", 800, SIGMA, 8192),
    Workload("long", 3000, SIGMA, 32768),
    Workload("seed001", 864, SIGMA, 20000, n=99_388),
)


def cost_pair(hidden: int) -> tuple[float, float]:
    """``(a, b)`` of the rank cost ``a*tokens + b*sum(l**2)`` = ``6*h*tokens + sum(l**2)``: pass it as
    ``packkit.plan(..., cost=cost_pair(h))``; :func:`step_costs` applies the same pair."""
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden <= 0:
        raise ValueError(f"hidden must be a positive int, got {hidden!r}")
    return 6.0 * hidden, 1.0


def row_costs(lengths: np.ndarray, rows, hidden: int) -> np.ndarray:
    """float64 cost of each row (a list of dataset indices) under :func:`cost_pair`."""
    a, b = cost_pair(hidden)
    lengths = np.asarray(lengths, dtype=np.float64)
    return np.array([a * lengths[r].sum() + b * (lengths[r] ** 2).sum() for r in map(np.asarray, rows)],
                    dtype=np.float64)


def deal_round_robin(items: list, dp_size: int) -> list[list]:
    """Steps of ``dp_size`` items as accelerate's ``BatchSamplerShard`` deals a batch sampler's items with
    ``drop_last=True`` (axolotl's setting) or ``even_batches`` and a whole last step: item ``s*W + r`` goes to rank
    ``r`` at step ``s``; a last partial step is dropped (rank counts are truncated to the shortest)."""
    steps = len(items) // dp_size
    return [items[s * dp_size:(s + 1) * dp_size] for s in range(steps)]


def step_costs(lengths: np.ndarray, steps: list[list], hidden: int) -> np.ndarray:
    """``[num_steps, dp_size]`` rank costs; a rank's item is a row (list of indices) or a list of rows (axolotl
    yields ``batch_size`` rows per item), its cost the sum of its rows' costs."""
    a, b = cost_pair(hidden)
    lengths = np.asarray(lengths, dtype=np.float64)
    out = np.zeros((len(steps), len(steps[0]) if steps else 0), dtype=np.float64)
    for s, step in enumerate(steps):
        for r, item in enumerate(step):
            idx = np.concatenate([np.asarray(x, dtype=np.int64).reshape(-1) for x in _rows_of(item)] or
                                 [np.zeros(0, np.int64)])
            out[s, r] = a * lengths[idx].sum() + b * (lengths[idx] ** 2).sum()
    return out


def _rows_of(item) -> list:
    """An item as a list of rows: a flat list of ints is one row."""
    if len(item) and isinstance(item[0], (int, np.integer)):
        return [item]
    return list(item)


def balance_of(costs: np.ndarray) -> float:
    """Sum over steps of the max rank cost / sum over steps of the mean rank cost (1.0 for no steps)."""
    if costs.size == 0:
        return 1.0
    mean = float(costs.mean(axis=1).sum())
    return float(costs.max(axis=1).sum()) / mean if mean > 0 else 1.0


def median_seconds(fn, repeats: int = 3):
    """(median wall seconds of ``fn()`` over ``repeats`` calls, ``gc.collect()`` before each; the last result)."""
    times, result = [], None
    for _ in range(max(1, repeats)):
        result = None
        gc.collect()
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def result_row(*, trainer: str, method: str, lengths: np.ndarray, capacity: int, dp_size: int, hidden: int,
               rows: list, steps: list[list], plan_seconds: float, **extra) -> dict:
    """One contract row from what a packer produced: ``rows`` = every row it made (lists of indices; empty
    ones are not counted), ``steps`` = the rows as dealt to ranks (:func:`deal_round_robin`). ``extra`` keys
    (e.g. ``trained_samples``) are kept after the contract keys."""
    lengths = np.asarray(lengths, dtype=np.int64)
    nonempty = [r for r in rows if len(r)]
    tokens = int(sum(int(lengths[np.asarray(r, dtype=np.int64)].sum()) for r in nonempty))
    row = {"trainer": trainer, "method": method, "n_samples": int(len(lengths)), "capacity": int(capacity),
           "dp_size": int(dp_size), "hidden": int(hidden), "rows": len(nonempty), "steps": len(steps),
           "efficiency": tokens / (len(nonempty) * capacity) if nonempty else 1.0,
           "balance": balance_of(step_costs(lengths, steps, hidden)), "plan_seconds": float(plan_seconds)}
    row.update(extra)
    return row


def packkit_row(trainer: str, lengths: np.ndarray, capacity: int, dp_size: int, hidden: int, repeats: int = 3,
                **extra) -> dict:
    """packkit's side: ``plan(lengths, capacity, algorithm="ogbfd", dp_size, cost=cost_pair(hidden))``, whose
    bin ``s*dp_size + r`` is rank r's row at step s (the order a round-robin dealer keeps)."""
    import packkit

    seconds, p = median_seconds(lambda: packkit.plan(lengths, capacity, algorithm="ogbfd", dp_size=dp_size,
                                                     cost=cost_pair(hidden)), repeats)
    bins = [b.tolist() for b in p.bins]
    row = result_row(trainer=trainer, method="packkit", lengths=lengths, capacity=capacity, dp_size=dp_size,
                     hidden=hidden, rows=bins, steps=deal_round_robin(bins, dp_size), plan_seconds=seconds, **extra)
    if abs(row["balance"] - p.balance) > 1e-9 * p.balance:  # the dealt steps are the plan's steps
        raise AssertionError(f"dealt balance {row['balance']} != plan.balance {p.balance}")
    return row


def meets_targets(ours: dict, theirs: dict) -> dict:
    """Issue 40's three targets for packkit's row against the trainer's own on the same workload."""
    return {"balance": ours["balance"] <= BALANCE_TARGET, "steps": ours["steps"] <= theirs["steps"],
            "plan_seconds": ours["plan_seconds"] <= theirs["plan_seconds"]}


def parse_args(description: str) -> argparse.Namespace:
    """The command line every trainer script takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--lengths", type=Path, required=True, help=".npy file of int lengths")
    parser.add_argument("--capacity", type=int, required=True, help="tokens per row")
    parser.add_argument("--dp-size", type=int, required=True, help="data-parallel ranks")
    parser.add_argument("--hidden", type=int, required=True, help="hidden size h of the cost 6*h*tokens + sum(l^2)")
    parser.add_argument("--out", type=Path, required=True, help="JSON list of result rows")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of each planner (median)")
    return parser.parse_args()


def load_lengths(path: Path) -> np.ndarray:
    lengths = np.load(path)
    if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(f"{path}: lengths must be a 1-D integer array, got {lengths.dtype} {lengths.shape}")
    return lengths.astype(np.int64)


def write_rows(rows: list[dict], out: Path) -> None:
    """Write the JSON list of rows after checking each has the contract keys."""
    for row in rows:
        missing = [k for k in ROW_KEYS if k not in row]
        if missing:
            raise ValueError(f"result row {row.get('method')!r} lacks {missing}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")


def run(description: str, own_row, packkit_row) -> None:
    """A trainer script's whole run: its own planner's row and packkit's on the same lengths, written and printed."""
    args = parse_args(description)
    lengths = load_lengths(args.lengths)
    rows = [fn(lengths, args.capacity, args.dp_size, args.hidden, args.repeats) for fn in (own_row, packkit_row)]
    write_rows(rows, args.out)
    for row in rows:
        print({k: row[k] for k in ("method", "rows", "steps", "efficiency", "balance", "plan_seconds",
                                   "trained_samples")})
