"""The one global plan of a whole dataset, its rows in output order, and the report of what packing did.

Shared by the ``datasets.Dataset`` path (:mod:`.hf_datasets`) and the Ray Data path (:mod:`.ray_data`).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..planning import step_order
from ..planning.planner import CostSpec, Plan, Segments, _cost_model, check_plan_choices, plan as make_plan


@dataclass
class PackReport:
    """What :func:`pack_dataset` did. Index arrays name input rows (positions in the input dataset)."""

    sequences: int
    rows: int
    tokens: int  # tokens in the output
    seq_length: int
    algorithm: str
    overlong: str
    lower_bound: int
    efficiency: float  # tokens / (rows * seq_length)
    columns: list
    excluded_columns: list
    dp_size: int = 1
    balance: float = 1.0  # per-step balance under the cost model (dp_size > 1)
    empty_rows_removed: int = 0  # empty rows of the last data-parallel step (they would be empty examples)
    truncated_tokens: int = 0
    dropped: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    truncated: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    split: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    zero_length: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def summary(self) -> dict:
        """Plain-Python figures (counts, not index lists), as written to ``info.description``."""
        out = {k: getattr(self, k) for k in ("sequences", "rows", "tokens", "seq_length", "algorithm", "overlong",
                                             "lower_bound", "efficiency", "columns", "excluded_columns", "dp_size",
                                             "balance", "empty_rows_removed", "truncated_tokens")}
        out.update({k: int(len(getattr(self, k))) for k in ("dropped", "truncated", "split", "zero_length")})
        return out


def report_from_plan(p: Plan, *, lengths: np.ndarray, seq_length: int, columns, excluded, empty_removed: int,
                     rows: int) -> PackReport:
    truncated_tokens = int((lengths[p.truncated] - seq_length).sum()) if len(p.truncated) else 0
    return PackReport(sequences=p.num_sequences, rows=rows, tokens=p.kept_tokens, seq_length=seq_length,
                      algorithm=p.algorithm, overlong=p.overlong, lower_bound=p.lower_bound,
                      efficiency=p.kept_tokens / (rows * seq_length) if rows else 1.0, columns=list(columns),
                      excluded_columns=list(excluded), dp_size=p.dp_size, balance=p.balance,
                      empty_rows_removed=empty_removed, truncated_tokens=truncated_tokens, dropped=p.dropped,
                      truncated=p.truncated, split=p.split, zero_length=p.zero_length)


def plan_rows(lengths: np.ndarray, seq_length: int, *, algorithm: Optional[str], overlong: str, dp_size: int,
              cost: CostSpec, shuffle: bool, seed: int, extra_cost=None) -> tuple[Plan, Segments, int]:
    """The global plan and its rows in output order: (plan, segments, empty rows removed).

    With ``dp_size > 1`` consecutive groups of ``dp_size`` rows are one balanced step. The steps (rows with
    ``dp_size == 1``) are emitted in a ``seed``-ed random order (``shuffle``), else in the source order of each
    step's longest sequence (:mod:`packkit.planning.step_order`); never in the planner's order, which runs from
    the longest sequences to the shortest. A step with empty rows stays last and its empty rows are removed (an
    empty example would break trainers). ``extra_cost``: ``packkit.plan``'s, one value per length.
    """
    if algorithm is None:
        algorithm = "ogbfd" if dp_size > 1 else "obfd"
    p = make_plan(lengths, seq_length, algorithm=algorithm, dp_size=dp_size, cost=cost, overlong=overlong,
                  extra_cost=extra_cost)
    seq, start, length, offsets = p.segments
    counts = np.diff(offsets)
    steps = np.arange(p.num_bins, dtype=np.int64).reshape(-1, p.dp_size)
    with_empty = (counts.reshape(-1, p.dp_size) == 0).any(axis=1)
    full = steps[~with_empty]
    keys = None
    if not shuffle:
        seg_step = np.repeat(np.arange(p.num_bins, dtype=np.int64), counts) // p.dp_size
        keys = step_order.source_keys(seg_step, length, seq, p.num_steps)[~with_empty]
    rng = np.random.default_rng(seed)
    full = full[step_order.order_steps(len(full), shuffle=shuffle, rng=rng, keys=keys)]
    order = np.concatenate([full.reshape(-1), steps[with_empty].reshape(-1)])
    order = order[counts[order] > 0]
    if len(order) == p.num_bins and (order == np.arange(p.num_bins)).all():
        return p, p.segments, 0  # the plan's order as is: no copy of the segments
    new_counts = counts[order]
    new_offsets = np.concatenate(([0], np.cumsum(new_counts))).astype(np.int64)
    take = np.arange(int(new_offsets[-1]), dtype=np.int64) + np.repeat(offsets[order] - new_offsets[:-1], new_counts)
    segments = Segments(seq[take], start[take], length[take], new_offsets)
    return p, segments, int(p.num_bins - len(order))


def extra_cost_column(extra_cost, column_names) -> Optional[str]:
    """The column ``extra_cost`` names (a ``str``), else None; ValueError listing the columns if there is none."""
    if not isinstance(extra_cost, str):
        return None
    if extra_cost not in column_names:
        raise ValueError(f"extra_cost names the column {extra_cost!r}, which the dataset does not have; its columns: "
                         f"{', '.join(map(repr, column_names))}")
    return extra_cost


def check_extra_cost_type(arrow_type, name: str) -> None:
    import pyarrow as pa

    if not (pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)):
        raise TypeError(f"the extra_cost column {name!r} must hold one number per row, got Arrow type {arrow_type}")


def extra_cost_values(column, name: str) -> np.ndarray:
    """A numeric Arrow column as float64 (``as_extra_cost`` then checks finite and >= 0); TypeError / ValueError
    naming the column for any other type or a null."""
    check_extra_cost_type(column.type, name)
    if column.null_count:
        raise ValueError(f"the extra_cost column {name!r} has {column.null_count} null(s); give every row a cost")
    return np.asarray(column.to_numpy(), dtype=np.float64)


def check_options(algorithm, overlong, cost, shuffle, seed, position_ids) -> tuple[bool, int, bool]:
    """Validate pack_dataset's options before any work (a Ray pass over the data, say); returns
    ``(shuffle, seed, position_ids)`` (``seed=None``, the old default, is 0)."""
    check_plan_choices("obfd" if algorithm is None else algorithm, overlong)
    _cost_model(cost)
    if not isinstance(shuffle, (bool, np.bool_)):
        raise TypeError(f"shuffle must be True or False, got {shuffle!r}")
    if seed is not None and (isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral)):
        raise TypeError(f"seed must be None or an int >= 0, got {seed!r}")
    if seed is not None and seed < 0:
        raise ValueError(f"seed must be None or an int >= 0, got {seed}")
    if not isinstance(position_ids, (bool, np.bool_)):
        raise TypeError(f"position_ids must be True or False, got {position_ids!r}")
    return bool(shuffle), 0 if seed is None else int(seed), bool(position_ids)
