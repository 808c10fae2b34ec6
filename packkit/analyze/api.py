"""Python API: ``analyze(data, out_dir)`` for files, ``analyze_lengths(lengths, out_dir)`` for arrays."""
from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._version import __version__
from ..planning.planner import as_lengths
from .errors import AnalyzeError
from .lengths import LengthSpec, read_lengths
from .outputs import Staging
from .recommend import recommend
from .report import render
from .simulate import padding_baseline, parse_algorithms, parse_max_lengths, simulate
from .stats import dataset_stats

SCHEMA_VERSION = 1
COSTS = ("tokens", "attention")
OVERLONG = ("drop", "truncate", "split")


def _generator() -> str:
    return f"packkit {__version__} analyze"


@dataclass
class AnalyzeResult:
    """What ``analyze``/``analyze_lengths`` computed (the dicts are the JSON files' contents)."""

    stats: dict
    simulations: dict
    recommendations: dict
    report: str
    source: dict | None = None
    out_dir: Path | None = None
    files: list[str] = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    lengths: np.ndarray | None = field(default=None, repr=False)

    @property
    def recommended(self) -> dict:
        return self.recommendations["recommended"]

    def result(self, max_length: int, algorithm: str) -> dict:
        """The simulation row for one (max length, algorithm)."""
        for r in self.simulations["results"]:
            if r["max_length"] == max_length and r["algorithm"] == algorithm:
                return r
        raise KeyError((max_length, algorithm))

    def summary(self) -> dict:
        """The short JSON summary ``packkit analyze --json`` prints."""
        stats = {k: v for k, v in self.stats.items() if k not in ("histogram", "schema", "generator", "source")}
        return {
            "out_dir": None if self.out_dir is None else str(self.out_dir),
            "files": self.files,
            "source": self.source,
            "stats": stats,
            "recommended": self.recommended,
            "training": self.recommendations["training"],
            "simulations": [{k: r[k] for k in ("max_length", "algorithm", "packs", "efficiency", "samples_per_pack",
                                               "dropped", "truncated", "split", "balance")}
                            for r in self.simulations["results"]],
            "timings": self.timings,
        }


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise AnalyzeError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _fraction(value, name: str, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise AnalyzeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not ((0 <= value if allow_zero else 0 < value) and value <= 1):
        raise AnalyzeError(f"{name} must be in {'[0, 1]' if allow_zero else '(0, 1]'} (a fraction, e.g. 0.99), got {value}")
    return value


@dataclass
class Options:
    """Sweep and recommendation options (validated on construction; see :func:`analyze_lengths`)."""

    max_lengths: object = "auto"
    algorithms: object = None
    overlong: str = "drop"
    dp_size: int = 1
    cost: str = "attention"
    target_efficiency: float = 0.99
    max_dropped_fraction: float = 0.001
    batch_size: int = 128
    epochs: int = 1
    per_device_batch_size: int = 1
    padded_micro_batch_size: int = 8
    seed: int = 0
    figures: bool = True
    save_lengths: bool = False
    cp_sizes: object = None  # context-parallel sizes whose padding cost the report states

    def __post_init__(self):
        if self.overlong not in OVERLONG:
            raise AnalyzeError(f"overlong must be one of {', '.join(OVERLONG)}, got {self.overlong!r}")
        if self.cost not in COSTS:
            raise AnalyzeError(f"cost must be one of {', '.join(COSTS)}, got {self.cost!r}")
        for name in ("dp_size", "batch_size", "epochs", "per_device_batch_size", "padded_micro_batch_size"):
            setattr(self, name, _positive_int(getattr(self, name), name))
        self.target_efficiency = _fraction(self.target_efficiency, "target_efficiency", allow_zero=False)
        self.max_dropped_fraction = _fraction(self.max_dropped_fraction, "max_dropped_fraction", allow_zero=True)
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) or self.seed < 0:
            raise AnalyzeError(f"seed must be a non-negative integer, got {self.seed!r}")
        self.seed = int(self.seed)
        self.algorithms = parse_algorithms(self.algorithms, self.dp_size)
        if self.cp_sizes is not None:
            values = self.cp_sizes.split(",") if isinstance(self.cp_sizes, str) else self.cp_sizes
            try:
                self.cp_sizes = [_positive_int(int(v) if isinstance(v, str) else v, "cp_sizes") for v in values]
            except ValueError:
                raise AnalyzeError(f"cp_sizes must be positive integers, got {self.cp_sizes!r}") from None
        if isinstance(self.max_lengths, str) or not hasattr(self.max_lengths, "__iter__"):
            parse_max_lengths(self.max_lengths, None)  # syntax check ("auto" needs the data)
        else:
            self.max_lengths = list(self.max_lengths)
            parse_max_lengths(self.max_lengths, None)


def analyze_lengths(lengths, out_dir: str | Path | None = None, *, max_lengths="auto", algorithms=None,
                    overlong: str = "drop", dp_size: int = 1, cost: str = "attention",
                    target_efficiency: float = 0.99, max_dropped_fraction: float = 0.001, batch_size: int = 128,
                    epochs: int = 1, per_device_batch_size: int = 1, padded_micro_batch_size: int = 8, seed: int = 0,
                    figures: bool = True, save_lengths: bool = False, progress: bool | None = None,
                    source: dict | None = None, command: str | None = None, cp_sizes=None) -> AnalyzeResult:
    """Statistics, packing sweep, recommendation and report for an in-memory array of lengths.

    Args:
        lengths: 1-D non-negative integers (list, numpy array or integer tensor).
        out_dir: where to write ``dataset_stats.json``, ``packing_simulations.json``,
            ``recommendations.json``, ``report.md`` and ``figures/*.png`` (atomically); None writes nothing.
        max_lengths: ``"auto"``, ints, or a list mixing ints and ``"auto"`` (``"auto,20000"``).
        algorithms: list or comma string from ``packkit.ALGORITHMS`` or ``"all"``; default nf + obfd
            (+ ogbfd when ``dp_size > 1``).
        overlong: ``drop`` (default, as seed 001), ``truncate`` or ``split``.
        dp_size, cost: data-parallel ranks and the cost model the step/rank balance is measured (and
            ogbfd balances) under.
        target_efficiency, max_dropped_fraction: the recommendation's criteria (fractions).
        batch_size: effective batch, rows per optimizer step (seed 001's ``effective_batch_size``).
        epochs, per_device_batch_size (packed rows per device micro-batch), padded_micro_batch_size
            (samples per device micro-batch in the padded baseline), seed (its shuffle).
        figures: write the PNG figures (needs matplotlib). save_lengths: also write ``lengths.npy``.
        source: description of where the lengths came from (set by :func:`analyze`).
        command: the command line, quoted in the report.
        cp_sizes: context-parallel sizes (ints or a comma string): the report adds the tokens zigzag CP
            padding (each document to a multiple of ``2 * cp``) costs, and the packs a padding-aware plan
            (``plan(..., pad_to_multiple_of=2 * cp)``) needs at the recommended max length.
    """
    o = Options(max_lengths=max_lengths, algorithms=algorithms, overlong=overlong, dp_size=dp_size, cost=cost,
                target_efficiency=target_efficiency, max_dropped_fraction=max_dropped_fraction,
                batch_size=batch_size, epochs=epochs, per_device_batch_size=per_device_batch_size,
                padded_micro_batch_size=padded_micro_batch_size, seed=seed, figures=figures,
                save_lengths=save_lengths, cp_sizes=cp_sizes)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    where = source.get("path") if source else None
    try:
        lengths = as_lengths(lengths)
    except (TypeError, ValueError) as e:
        raise AnalyzeError(f"lengths: {e}") from None
    if lengths.size == 0:
        raise AnalyzeError("no samples (empty lengths)", where)
    if lengths.min() < 0:
        i = int(np.argmax(lengths < 0))
        raise AnalyzeError(f"negative length {int(lengths[i])} at index {i}", where)
    if lengths.max() == 0:
        raise AnalyzeError(f"all {lengths.size:,} samples have length 0", where)
    overlong, dp_size, cost, algorithms, seed = o.overlong, o.dp_size, o.cost, o.algorithms, o.seed
    target_efficiency, max_dropped_fraction = o.target_efficiency, o.max_dropped_fraction

    sorted_lengths = np.sort(lengths)
    stats = dataset_stats(lengths, sorted_lengths=sorted_lengths)
    capacities = parse_max_lengths(o.max_lengths, stats)
    timings["stats"] = time.perf_counter() - t0

    t = time.perf_counter()
    rows = simulate(lengths, capacities, algorithms, overlong=overlong, dp_size=dp_size, cost=cost, progress=progress)
    padding = padding_baseline(lengths, capacities, o.padded_micro_batch_size, seed, sorted_lengths=sorted_lengths)
    timings["simulate"] = time.perf_counter() - t
    recommendations = recommend(stats, rows, padding, target_efficiency=target_efficiency,
                                max_dropped_fraction=max_dropped_fraction, batch_size=o.batch_size, epochs=o.epochs,
                                dp_size=dp_size, per_device_batch_size=o.per_device_batch_size,
                                padded_micro_batch_size=o.padded_micro_batch_size, overlong=overlong, cost=cost)
    generator = _generator()
    stats_doc = {"schema": f"packkit.analyze.dataset_stats/{SCHEMA_VERSION}", "generator": generator,
                 "source": source, **stats}
    sims_doc = {"schema": f"packkit.analyze.packing_simulations/{SCHEMA_VERSION}", "generator": generator,
                "overlong": overlong, "dp_size": dp_size, "cost": cost, "seed": seed, "algorithms": algorithms,
                "max_lengths": capacities, "results": rows, "padding": padding}
    rec_doc = {"schema": f"packkit.analyze.recommendations/{SCHEMA_VERSION}", "generator": generator,
               **recommendations}
    if o.cp_sizes:
        sims_doc["context_parallel"] = context_parallel_cost(lengths, o.cp_sizes, recommendations, overlong)
    result = AnalyzeResult(stats_doc, sims_doc, rec_doc, "", source=source, lengths=lengths, timings=timings)

    if out_dir is None:
        result.report = render(stats, sims_doc, rec_doc, figures=[], source=source, command=command)
        timings["total"] = time.perf_counter() - t0
        return result
    t = time.perf_counter()
    timings["figures"] = 0.0
    with Staging(out_dir) as staging:
        figure_files = []
        if o.figures:
            from .figures import write_figures

            figure_files = write_figures(staging.dir, sorted_lengths, stats, rows, padding, rec_doc,
                                         target=target_efficiency, budget=max_dropped_fraction, overlong=overlong)
            for name in figure_files:
                staging.path(name)
            timings["figures"] = time.perf_counter() - t
        staging.write_json("dataset_stats.json", stats_doc)
        staging.write_json("packing_simulations.json", sims_doc)
        staging.write_json("recommendations.json", rec_doc)
        if o.save_lengths:
            np.save(staging.path("lengths.npy"), lengths)
        result.report = render(stats, sims_doc, rec_doc, figures=figure_files, source=source, command=command)
        staging.write_text("report.md", result.report)
        result.files = staging.commit()
    result.out_dir = Path(out_dir)
    timings["write"] = time.perf_counter() - t - timings["figures"]
    timings["total"] = time.perf_counter() - t0
    return result


def analyze(data: str | Path, out_dir: str | Path | None = None, *, format: str = "auto", split: str | None = None,
            max_samples: int | None = None, length_fields=(), ids_fields=(), text_fields=(),
            tokenizer: str | Path | None = None, add_special_tokens: bool = True, extra_tokens: int = 0,
            image_size_fields=(), image_width_field: str | None = None, image_height_field: str | None = None,
            vision_model: str | None = None, patch_size: int | None = None, merge_size: int | None = None,
            min_pixels: int | None = None, max_pixels: int | None = None, image_extra_tokens: int = 0,
            progress: bool | None = None, command: str | None = None, **options) -> AnalyzeResult:
    """Reads every sample's length from ``data`` (JSONL/JSON, Parquet, Arrow, a saved ``datasets`` folder,
    a text file or ``.npy`` of lengths), then runs :func:`analyze_lengths` (``options``) on them.

    Length of a sample = sum of ``length_fields`` (token counts) + lengths of ``ids_fields`` (token id
    lists) + tokens of ``text_fields`` (strings or chat messages, with the local ``tokenizer`` folder)
    + ``extra_tokens``. With no field given, a field named like ``length``/``num_tokens`` or
    ``input_ids`` is used (or ``text`` when a tokenizer is given).

    Vision-language data: ``image_size_fields`` (``{"width", "height"}`` dicts or ``[W, H]`` pairs, or lists
    of them per sample) or ``image_width_field`` + ``image_height_field`` add each image's tokens by the
    resize rule of ``vision_model`` ("qwen2-vl", "qwen2.5-vl", "qwen3-vl"; ``patch_size``, ``merge_size``,
    ``min_pixels``, ``max_pixels`` override its numbers) plus ``image_extra_tokens`` per image.
    """
    Options(**options)  # bad options fail before a long read
    vision = None
    if vision_model is not None:
        from .vision_tokens import VisionTokenRule

        vision = VisionTokenRule.for_family(vision_model, patch_size=patch_size, merge_size=merge_size,
                                            min_pixels=min_pixels, max_pixels=max_pixels,
                                            extra_tokens_per_image=image_extra_tokens)
    elif any(v is not None for v in (patch_size, merge_size, min_pixels, max_pixels)) or image_extra_tokens:
        raise AnalyzeError("patch_size/merge_size/min_pixels/max_pixels/image_extra_tokens need vision_model "
                           "(--vision-model qwen2-vl|qwen2.5-vl|qwen3-vl)")
    spec = LengthSpec(count_fields=length_fields, ids_fields=ids_fields, text_fields=text_fields,
                      tokenizer=None if tokenizer is None else str(tokenizer), add_special_tokens=add_special_tokens,
                      extra_tokens=extra_tokens, image_size_fields=image_size_fields,
                      image_width_field=image_width_field, image_height_field=image_height_field, vision=vision)
    t = time.perf_counter()
    read = read_lengths(data, spec, format=format, split=split, max_samples=max_samples, progress=progress)
    seconds = time.perf_counter() - t
    result = analyze_lengths(read.lengths, out_dir, progress=progress, source=read.info, command=command, **options)
    result.timings = {"read": seconds, **result.timings, "total": seconds + result.timings["total"]}
    return result


def context_parallel_cost(lengths: np.ndarray, cp_sizes, recommendations: dict, overlong: str) -> list[dict]:
    """Per cp size: the tokens zigzag CP padding adds (each document rounded up to ``2 * cp``) and the packs a
    padding-aware plan needs at the recommended max length, next to the plain plan's."""
    from ..context_parallel import cp_padded_lengths
    from ..planning.planner import plan

    rec = recommendations["recommended"]
    capacity, algorithm = int(rec["max_length"]), rec["algorithm"]
    total = int(lengths.sum())
    plain = plan(lengths, capacity, algorithm=algorithm, overlong=overlong)
    out = []
    for cp in cp_sizes:
        m = 2 * cp
        extra = int(cp_padded_lengths(lengths, cp).sum()) - total
        cap = capacity // m * m
        aware = plan(lengths, cap, algorithm=algorithm, overlong=overlong, pad_to_multiple_of=m) if cap else None
        out.append({"cp_size": cp, "multiple": m, "extra_tokens": extra, "extra_fraction": extra / total if total else 0.0,
                    "capacity": cap, "plain_packs": plain.num_bins,
                    "padding_aware_packs": aware.num_bins if aware else None,
                    "padding_aware_efficiency": aware.efficiency if aware else None})
    return out
