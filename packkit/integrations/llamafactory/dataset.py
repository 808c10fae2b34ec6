"""A LLaMA-Factory packed dataset from its unpacked one: one global plan (:func:`.rows.plan_rows`), rows built by
``datasets.map`` (cached, parallel with ``num_proc``) with the columns ``PackedSupervisedDatasetProcessor`` writes."""
from __future__ import annotations

import numpy as np

from .rows import RowPlan, build_rows, plan_rows

MARKER = "packkit-planned"  # in ``dataset.info.description``: the trainer's sampler must keep the row order
_ROW = "_packkit_row"
_MASK = "_packkit_attention_mask"  # renamed at the end: datasets narrows a column named attention_mask to int8


def example_lengths(dataset) -> np.ndarray:
    """int64 token count of every example (``input_ids``), read from the Arrow column without decoding it."""
    import pyarrow.compute as pc

    if "input_ids" not in dataset.column_names:
        raise ValueError(f"dataset must have an input_ids column (LLaMA-Factory's SupervisedDatasetProcessor output), "
                         f"got columns {dataset.column_names}")
    column = dataset.with_format("arrow")["input_ids"]
    return np.asarray(pc.list_value_length(column).to_numpy(zero_copy_only=False), dtype=np.int64)


def planned_figures(dataset) -> dict | None:
    """``{"rows", "dp_size", "rows_per_rank", "balance", "efficiency"}`` of a :func:`pack_dataset` result (read back
    from its description, which survives LLaMA-Factory's dataset handling), else None."""
    if not is_planned(dataset):
        return None
    import re

    found = dict(re.findall(r"(\w+)=([0-9.]+)", dataset.info.description))
    rows = re.match(rf"{MARKER}: (\d+) rows", dataset.info.description)
    if rows is None or not {"dp_size", "rows_per_rank", "balance", "efficiency"} <= found.keys():
        return None
    return {"rows": int(rows.group(1)), "dp_size": int(found["dp_size"]),
            "rows_per_rank": int(found["rows_per_rank"]), "balance": float(found["balance"]),
            "efficiency": float(found["efficiency"])}


def is_planned(dataset) -> bool:
    """Whether ``dataset`` came from :func:`pack_dataset` (its row order is the plan's)."""
    info = getattr(dataset, "info", None)
    return bool(info is not None and (info.description or "").startswith(MARKER))


def pack_dataset(dataset, cutoff_len: int, *, neat_packing: bool, pad_token_id: int, dp_size: int = 1,
                 rows_per_rank: int = 1, cost="attention", seed: int = 0, shuffle: bool = True,
                 num_proc: int | None = None, batch_size: int = 256) -> tuple:
    """``(packed, plan)``: ``dataset`` (a ``datasets.Dataset`` of unpacked examples: ``input_ids``, ``labels``,
    ``images``, ``videos``, ``audios``) packed by one :func:`.rows.plan_rows` plan into rows of ``cutoff_len + 1``
    tokens, in the plan's rank order (keep it: a sequential sampler). ``plan`` is the :class:`.rows.RowPlan`.
    """
    import datasets

    if not isinstance(dataset, datasets.Dataset):
        raise TypeError(f"dataset must be a map-style datasets.Dataset (a global plan needs every length), got "
                        f"{type(dataset).__name__}")
    missing = [c for c in ("input_ids", "labels", "images", "videos", "audios") if c not in dataset.column_names]
    if missing:
        raise ValueError(f"dataset lacks the columns {missing} of LLaMA-Factory's SupervisedDatasetProcessor output")
    if not isinstance(neat_packing, bool):
        raise TypeError(f"neat_packing must be a bool, got {type(neat_packing).__name__} {neat_packing!r}")
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, (int, np.integer)):
        raise TypeError(f"pad_token_id must be an int (the tokenizer's pad_token_id), got {pad_token_id!r}")
    plan: RowPlan = plan_rows(example_lengths(dataset), cutoff_len, dp_size=dp_size, rows_per_rank=rows_per_rank,
                              cost=cost, seed=seed, shuffle=shuffle)
    source = dataset.select_columns(["input_ids", "labels", "images", "videos", "audios"])

    def build(batch: dict) -> dict:
        rows = batch[_ROW]
        flat = [i for row in rows for i in row]
        examples = source[flat]  # one gather per batch of rows
        local, k = [], 0
        for row in rows:
            local.append(range(k, k + len(row)))
            k += len(row)
        out = build_rows(examples, local, cutoff_len=cutoff_len, neat_packing=neat_packing,
                         pad_token_id=int(pad_token_id))
        out[_MASK] = out.pop("attention_mask")
        return out

    if plan.rows:
        table = datasets.Dataset.from_dict({_ROW: [list(map(int, r)) for r in plan.rows]}, features=datasets.Features(
            {_ROW: datasets.Sequence(datasets.Value("int64"))}))
        packed = table.map(build, batched=True, batch_size=batch_size, remove_columns=[_ROW], num_proc=num_proc,
                           desc="packkit: packing rows").rename_column(_MASK, "attention_mask")
    else:  # nothing fits (or no examples): no rows, the packed columns (LLaMA-Factory then reports no valid samples)
        packed = datasets.Dataset.from_dict(build_rows({}, [], cutoff_len=cutoff_len, neat_packing=neat_packing,
                                                       pad_token_id=int(pad_token_id)))
    packed.info.description = (f"{MARKER}: {len(plan.rows)} rows, dp_size={plan.dp_size}, rows_per_rank="
                               f"{plan.rows_per_rank}, balance={plan.balance:.6f}, efficiency={plan.efficiency:.6f}")
    return packed, plan
