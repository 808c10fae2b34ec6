"""The recommended max length, and training dynamics padded vs packed (seed 001's table).

``batch_size`` is the effective batch: rows (sequences) per optimizer step, the same number in both
modes as in seed 001 (``effective_batch_size: 128``). A padded row holds one sample; a packed row holds
``samples_per_pack`` samples, so packing takes ~``samples_per_pack`` x fewer optimizer steps with as
many x more samples per step. ``equal_samples_per_step`` gives the packed batch that keeps the padded
run's samples per step instead.
"""
from __future__ import annotations

import math

_PREFERENCE = ("ogbfd", "obfd", "bfd", "ffd", "nf")


def best_per_max_length(rows: list[dict]) -> list[dict]:
    """For each max length, the row of the most efficient algorithm (ties: lower per-step balance when
    data-parallel, then ogbfd > obfd > bfd > ffd > nf). Sorted by max length."""
    best: dict[int, dict] = {}

    def key(r):
        balance = r["balance"] if r["balance"] is not None else 1.0
        return (-round(r["efficiency"], 12), balance, _PREFERENCE.index(r["algorithm"]))

    for r in rows:
        current = best.get(r["max_length"])
        if current is None or key(r) < key(current):
            best[r["max_length"]] = r
    return [best[m] for m in sorted(best)]


def _accumulation(rows_per_step: int, per_device: int, dp_size: int, mode: str, notes: list) -> int:
    per_micro_step = per_device * dp_size
    accumulation = math.ceil(rows_per_step / per_micro_step)
    if accumulation * per_micro_step != rows_per_step:
        notes.append(f"{mode}: {rows_per_step} rows per step is not a multiple of per-device batch x dp size "
                     f"= {per_micro_step}; {accumulation} accumulation steps give {accumulation * per_micro_step}")
    return accumulation


def training_dynamics(*, num_samples: int, kept_samples: int, packs: int, max_length: int, kept_tokens: int,
                      padded_token_slots: int | None, padded_tokens: int | None, batch_size: int, epochs: int,
                      dp_size: int, per_device_batch_size: int, padded_micro_batch_size: int) -> dict:
    notes: list[str] = []
    samples_per_pack = kept_samples / packs if packs else 0.0
    padding = {
        "rows_per_epoch": num_samples,
        "steps_per_epoch": num_samples / batch_size,
        "optimizer_steps": math.ceil(num_samples * epochs / batch_size),
        "samples_per_step": float(batch_size),
        "total_samples": num_samples * epochs,
        "per_device_batch_size": padded_micro_batch_size,
        "gradient_accumulation": _accumulation(batch_size, padded_micro_batch_size, dp_size, "padding", notes),
        "token_slots_per_epoch": padded_token_slots,
        "tokens_per_epoch": padded_tokens,
    }
    packing = {
        "rows_per_epoch": packs,
        "steps_per_epoch": packs / batch_size,
        "optimizer_steps": math.ceil(packs * epochs / batch_size),
        "samples_per_step": batch_size * samples_per_pack,
        "total_samples": kept_samples * epochs,
        "per_device_batch_size": per_device_batch_size,
        "gradient_accumulation": _accumulation(batch_size, per_device_batch_size, dp_size, "packing", notes),
        "token_slots_per_epoch": packs * max_length,
        "tokens_per_epoch": kept_tokens,
    }
    unit = per_device_batch_size * dp_size
    equal_packs = max(unit, round(batch_size / samples_per_pack / unit) * unit) if samples_per_pack else unit
    equal = {
        "packs_per_step": equal_packs,
        "optimizer_steps": math.ceil(packs * epochs / equal_packs),
        "samples_per_step": equal_packs * samples_per_pack,
        "gradient_accumulation": equal_packs // unit,
    }

    def ratio(a, b):
        return a / b if a is not None and b else None

    return {
        "batch_size": batch_size, "epochs": epochs, "dp_size": dp_size,
        "padding": padding, "packing": packing,
        "ratios": {
            "optimizer_steps": ratio(padding["optimizer_steps"], packing["optimizer_steps"]),
            "samples_per_step": ratio(packing["samples_per_step"], padding["samples_per_step"]),
            "token_slots_per_epoch": ratio(padding["token_slots_per_epoch"], packing["token_slots_per_epoch"]),
        },
        "equal_samples_per_step": equal,
        "notes": notes,
    }


def _brief(r: dict, batch_size: int) -> dict:
    return {"max_length": r["max_length"], "algorithm": r["algorithm"], "efficiency": r["efficiency"],
            "packs": r["packs"], "samples_per_pack": r["samples_per_pack"], "dropped": r["dropped"],
            "truncated": r["truncated"], "lost_fraction": r["lost_fraction"],
            "steps_per_epoch": r["packs"] / batch_size}


def recommend(stats: dict, rows: list[dict], padding: list[dict], *, target_efficiency: float,
              max_dropped_fraction: float, batch_size: int, epochs: int, dp_size: int,
              per_device_batch_size: int, padded_micro_batch_size: int, overlong: str, cost: str) -> dict:
    """The smallest swept max length whose best algorithm reaches ``target_efficiency`` while losing
    (dropping or truncating) at most ``max_dropped_fraction`` of the samples.

    Otherwise: the most efficient max length within the loss budget (``meets_target`` false), or, if
    every max length loses too many samples, the one that loses fewest.
    """
    best = best_per_max_length(rows)
    ok = [r for r in best if r["efficiency"] >= target_efficiency and r["lost_fraction"] <= max_dropped_fraction]
    within = [r for r in best if r["lost_fraction"] <= max_dropped_fraction]
    if ok:
        chosen, meets = ok[0], True
        reason = (f"smallest max length where {ok[0]['algorithm']} reaches >= {target_efficiency:.2%} efficiency "
                  f"with <= {max_dropped_fraction:.3%} of samples dropped or truncated")
    elif within:
        chosen, meets = max(within, key=lambda r: (round(r["efficiency"], 12), -r["max_length"])), False
        reason = (f"no swept max length reaches {target_efficiency:.2%} efficiency within the loss budget "
                  f"({max_dropped_fraction:.3%}); this is the most efficient one within it")
    else:
        chosen, meets = min(best, key=lambda r: (r["lost_fraction"], r["max_length"])), False
        reason = (f"every swept max length drops or truncates more than {max_dropped_fraction:.3%} of samples; "
                  "this one loses the fewest (sweep larger max lengths or use --overlong split)")
    index = best.index(chosen)
    alternatives = []
    if index > 0:
        alternatives.append({"label": "smaller (less memory per row)", **_brief(best[index - 1], batch_size)})
    if index + 1 < len(best):
        alternatives.append({"label": "larger (fewer rows, fewer samples lost)", **_brief(best[index + 1], batch_size)})
    pad = next((p for p in padding if p["max_length"] == chosen["max_length"]), None)
    dynamics = training_dynamics(
        num_samples=stats["count"], kept_samples=chosen["kept_samples"], packs=chosen["packs"],
        max_length=chosen["max_length"], kept_tokens=chosen["kept_tokens"],
        padded_token_slots=pad["token_slots"] if pad else None, padded_tokens=pad["tokens"] if pad else None,
        batch_size=batch_size, epochs=epochs, dp_size=dp_size, per_device_batch_size=per_device_batch_size,
        padded_micro_batch_size=padded_micro_batch_size)
    recommended = {**_brief(chosen, batch_size), "lower_bound": chosen["lower_bound"],
                   "dropped_fraction": chosen["dropped_fraction"], "split": chosen["split"],
                   "balance": chosen["balance"], "rank_balance": chosen["rank_balance"],
                   "padding_efficiency": pad["efficiency"] if pad else None,
                   "meets_target": meets, "reason": reason}
    return {
        "criteria": {"target_efficiency": target_efficiency, "max_dropped_fraction": max_dropped_fraction,
                     "overlong": overlong, "algorithms": sorted({r["algorithm"] for r in rows}, key=_PREFERENCE.index),
                     "max_lengths": [r["max_length"] for r in best]},
        "recommended": recommended,
        "alternatives": alternatives,
        "training": dynamics,
        "config": {
            "packing": True, "global_max_length": chosen["max_length"],
            "per_device_train_batch_size": per_device_batch_size, "effective_batch_size": batch_size,
            "num_train_epochs": epochs,
            "packkit_plan": {"capacity": chosen["max_length"], "algorithm": chosen["algorithm"],
                             "overlong": overlong, "dp_size": dp_size, "cost": cost},
        },
    }
