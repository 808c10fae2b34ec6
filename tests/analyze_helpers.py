"""Shared helpers of the ``packkit analyze`` tests: small datasets in every input format, a tiny local
tokenizer, the output schemas, and a CLI runner."""
from __future__ import annotations

import gzip
import json
import struct
import zlib
from pathlib import Path

import numpy as np

from packkit.__main__ import main

WORDS = ["hello", "world", "pack", "the", "rows", "tight", "token", "length", "a", "b"]
N = 40


def records(n: int = N) -> list[dict]:
    """Records with every kind of length source; expected lengths come from ``expected``."""
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        text_words = int(rng.integers(1, 30))
        out.append({
            "id": i,
            "num_tokens": int(rng.integers(1, 3000)),
            "image_tokens": int(rng.integers(0, 500)),
            "input_ids": list(range(int(rng.integers(0, 60)))),
            "text": " ".join(WORDS[(i + k) % len(WORDS)] for k in range(text_words)),
            "meta": {"n": int(rng.integers(1, 100))},
        })
    return out


def expected(recs: list[dict], source: str) -> np.ndarray:
    """Lengths of ``recs`` under a source: count, ids, text (tiny tokenizer, with its BOS), sum, nested."""
    if source == "count":
        values = [r["num_tokens"] for r in recs]
    elif source == "ids":
        values = [len(r["input_ids"]) for r in recs]
    elif source == "text":
        values = [len(r["text"].split()) + 1 for r in recs]
    elif source == "sum":
        values = [r["num_tokens"] + r["image_tokens"] for r in recs]
    elif source == "nested":
        values = [r["meta"]["n"] for r in recs]
    else:
        raise ValueError(source)
    return np.asarray(values, dtype=np.int64)


def source_kwargs(source: str, tokenizer: Path | None = None) -> dict:
    return {
        "count": {"length_fields": ["num_tokens"]},
        "ids": {"ids_fields": ["input_ids"]},
        "text": {"text_fields": ["text"], "tokenizer": tokenizer},
        "sum": {"length_fields": ["num_tokens", "image_tokens"]},
        "nested": {"length_fields": ["meta.n"]},
    }[source]


def spec_for(source: str, tokenizer: Path | None = None):
    """The :class:`~packkit.analyze.LengthSpec` of a source."""
    from packkit.analyze import LengthSpec

    kw = source_kwargs(source, tokenizer)
    return LengthSpec(count_fields=tuple(kw.get("length_fields", ())), ids_fields=tuple(kw.get("ids_fields", ())),
                      text_fields=tuple(kw.get("text_fields", ())),
                      tokenizer=None if kw.get("tokenizer") is None else str(kw["tokenizer"]))


def source_args(source: str, tokenizer: Path | None = None) -> list[str]:
    return {
        "count": ["--length-field", "num_tokens"],
        "ids": ["--ids-field", "input_ids"],
        "text": ["--text-field", "text", "--tokenizer", str(tokenizer)],
        "sum": ["--length-field", "num_tokens,image_tokens"],
        "nested": ["--length-field", "meta.n"],
    }[source]


# ---------------------------------------------------------------------------------------------
# files


def write(fmt: str, recs: list[dict], folder: Path) -> Path:
    """``recs`` written as ``fmt`` under ``folder``; returns the path to pass to analyze."""
    folder.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        path = folder / "data.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    elif fmt == "jsonl.gz":
        path = folder / "data.jsonl.gz"
        with gzip.open(path, "wt") as f:
            f.write("".join(json.dumps(r) + "\n" for r in recs))
    elif fmt == "json":
        path = folder / "data.json"
        path.write_text(json.dumps(recs, indent=1))
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = folder / "data.parquet"
        pq.write_table(pa.Table.from_pylist(recs), path, row_group_size=16)
    elif fmt in ("arrow", "arrow-stream"):
        import pyarrow as pa

        path = folder / ("data.arrow" if fmt == "arrow" else "data.stream")
        table = pa.Table.from_pylist(recs)
        opener = pa.ipc.new_file if fmt == "arrow" else pa.ipc.new_stream
        with pa.OSFile(str(path), "wb") as sink, opener(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=16):
                writer.write_batch(batch)
    elif fmt == "hf":
        import datasets

        path = folder / "saved_dataset"
        datasets.Dataset.from_list(recs).save_to_disk(str(path))
    else:
        raise ValueError(fmt)
    return path


def write_lengths_text(lengths, path: Path) -> Path:
    path.write_text("".join(f"{int(x)}\n" for x in lengths))
    return path


def make_tokenizer(folder: Path, *, truncation: int | None = None, chat: bool = True) -> Path:
    """A WordLevel tokenizer over ``WORDS`` that prepends [BOS], saved with ``save_pretrained``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[BOS]": 1, "user": 2, "assistant": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", 1)])
    if truncation:
        tok.enable_truncation(truncation)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="[BOS]")
    if chat:
        fast.chat_template = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    fast.save_pretrained(str(folder))
    tok.save(str(folder / "tokenizer.json"))  # keeps the truncation setting in the file, if any
    return folder


# ---------------------------------------------------------------------------------------------
# output schemas: key -> type, a nested schema dict, or [type] for a list of that type

NUM = (int, float)
OPT_NUM = (int, float, type(None))
HISTOGRAM = {"scale": str, "bin_edges": [int], "counts": [int]}
SOURCE = {"path": str, "format": str, "split": (str, type(None)), "samples": int, "max_samples": (int, type(None)),
          "reader": str, "length_source": {"count_fields": [str], "ids_fields": [str], "text_fields": [str],
                                           "tokenizer": (str, type(None)), "add_special_tokens": (bool, type(None)),
                                           "extra_tokens": int}}
DATASET_STATS = {"schema": str, "generator": str, "source": (dict, type(None)), "count": int, "total_tokens": int,
                 "mean": NUM, "std": NUM, "min": int, "max": int, "p10": NUM, "p25": NUM, "median": NUM, "p75": NUM,
                 "p90": NUM, "p95": NUM, "p99": NUM, "p999": NUM, "zero_length": int, "histogram": HISTOGRAM}
SIM_ROW = {"max_length": int, "algorithm": str, "packs": int, "lower_bound": int, "efficiency": NUM,
           "samples_per_pack": NUM, "segments_per_pack": NUM, "kept_samples": int, "kept_tokens": int, "dropped": int,
           "dropped_fraction": NUM, "dropped_tokens": int, "truncated": int, "truncated_tokens": int, "split": int,
           "zero_length": int, "empty_packs": int, "lost_samples": int, "lost_fraction": NUM, "dp_size": int,
           "steps": (int, type(None)), "balance": OPT_NUM, "rank_balance": OPT_NUM, "seconds": NUM}
PADDING_ROW = {"max_length": int, "micro_batch_size": int, "rows": int, "token_slots": int, "tokens": int,
               "efficiency": NUM, "truncated": int}
PACKING_SIMULATIONS = {"schema": str, "generator": str, "overlong": str, "dp_size": int, "cost": str, "seed": int,
                       "algorithms": [str], "max_lengths": [int], "results": [SIM_ROW], "padding": [PADDING_ROW]}
BRIEF = {"max_length": int, "algorithm": str, "efficiency": NUM, "packs": int, "samples_per_pack": NUM,
         "dropped": int, "truncated": int, "lost_fraction": NUM, "steps_per_epoch": NUM}
MODE = {"rows_per_epoch": int, "steps_per_epoch": NUM, "optimizer_steps": int, "samples_per_step": NUM,
        "total_samples": int, "per_device_batch_size": int, "gradient_accumulation": int,
        "token_slots_per_epoch": (int, type(None)), "tokens_per_epoch": (int, type(None))}
RECOMMENDATIONS = {
    "schema": str, "generator": str,
    "criteria": {"target_efficiency": NUM, "max_dropped_fraction": NUM, "overlong": str, "algorithms": [str],
                 "max_lengths": [int]},
    "recommended": {**BRIEF, "lower_bound": int, "dropped_fraction": NUM, "split": int, "balance": OPT_NUM,
                    "rank_balance": OPT_NUM, "padding_efficiency": OPT_NUM, "meets_target": bool, "reason": str},
    "alternatives": [{"label": str, **BRIEF}],
    "training": {"batch_size": int, "epochs": int, "dp_size": int, "padding": MODE, "packing": MODE,
                 "ratios": {"optimizer_steps": OPT_NUM, "samples_per_step": OPT_NUM, "token_slots_per_epoch": OPT_NUM},
                 "equal_samples_per_step": {"packs_per_step": int, "optimizer_steps": int, "samples_per_step": NUM,
                                            "gradient_accumulation": int},
                 "notes": [str]},
    "config": {"packing": bool, "global_max_length": int, "per_device_train_batch_size": int,
               "effective_batch_size": int, "num_train_epochs": int,
               "packkit_plan": {"capacity": int, "algorithm": str, "overlong": str, "dp_size": int, "cost": str}},
}
SCHEMAS = {"dataset_stats.json": DATASET_STATS, "packing_simulations.json": PACKING_SIMULATIONS,
           "recommendations.json": RECOMMENDATIONS}


def check_schema(value, schema, where: str = "$") -> None:
    """Asserts ``value`` has exactly the keys of ``schema`` with the given types (bools are not numbers)."""
    if isinstance(schema, dict):
        assert isinstance(value, dict), f"{where}: expected an object, got {type(value).__name__}"
        assert set(value) == set(schema), f"{where}: keys differ: extra {set(value) - set(schema)}, " \
                                          f"missing {set(schema) - set(value)}"
        for key, sub in schema.items():
            check_schema(value[key], sub, f"{where}.{key}")
    elif isinstance(schema, list):
        assert isinstance(value, list), f"{where}: expected an array, got {type(value).__name__}"
        for i, item in enumerate(value):
            check_schema(item, schema[0], f"{where}[{i}]")
    else:
        types = schema if isinstance(schema, tuple) else (schema,)
        if isinstance(value, bool):
            assert bool in types, f"{where}: unexpected boolean {value!r}"
        else:
            assert isinstance(value, types), f"{where}: {value!r} is not {types}"


def schema_keys(schema, prefix: str = "") -> set[str]:
    keys = set()
    if isinstance(schema, dict):
        for key, sub in schema.items():
            keys.add(key)
            keys |= schema_keys(sub)
    elif isinstance(schema, list):
        keys |= schema_keys(schema[0])
    return keys


def check_png(path: Path) -> tuple[int, int]:
    """Asserts ``path`` is a complete PNG (signature, IHDR, CRCs, IEND) with a real image; returns (w, h)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG"
    pos, chunks = 8, []
    while pos < len(data):
        (size,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + size]
        (crc,) = struct.unpack(">I", data[pos + 8 + size:pos + 12 + size])
        assert zlib.crc32(kind + body) == crc, f"{path}: bad CRC in {kind!r}"
        chunks.append((kind, body))
        pos += 12 + size
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND", f"{path}: truncated PNG"
    width, height = struct.unpack(">II", chunks[0][1][:8])
    assert width >= 300 and height >= 200, f"{path}: {width}x{height} is too small"
    assert sum(len(b) for k, b in chunks if k == b"IDAT") > 5000, f"{path}: almost no image data"
    return width, height


# ---------------------------------------------------------------------------------------------
# CLI


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """``packkit <args>`` in this process: (exit code, stdout, stderr)."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:  # argparse errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def no_partial_outputs(folder: Path) -> bool:
    """True when no staging folder of an analyze run is left in ``folder``."""
    return not any(p.name.startswith(".") and ".partial-" in p.name for p in folder.iterdir())
