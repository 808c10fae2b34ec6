"""Writes the seed corpus (tests/fuzz/corpus/TARGET/seed-*): a few random inputs per target and, for
analyze, a small valid file of every format. Re-run only to change the seeds; crash inputs found
by the fuzzer are added beside them by hand (crash-*), never regenerated."""
from __future__ import annotations

import io
import json
import random
from pathlib import Path

import numpy as np

from targets import _SUFFIXES, TARGETS

CORPUS = Path(__file__).parent / "corpus"


def analyze_seeds() -> dict[str, bytes]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"n": i % 7 + 1, "ids": list(range(i % 5)), "a": {"b": i}} for i in range(6)]
    files = {
        ".jsonl": "".join(json.dumps(r) + "\n" for r in rows).encode(),
        ".jsonl.gz": "".join(json.dumps(r) + "\n" for r in rows).encode(),  # the target gzips it
        ".json": json.dumps(rows).encode(),
        ".txt": b"3\n\n# comment\n17\n5\n",
        "": b"12\n4\n",
    }
    table = pa.table({"n": [r["n"] for r in rows], "ids": [r["ids"] for r in rows]})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    files[".parquet"] = buf.getvalue()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    files[".arrow"] = sink.getvalue().to_pybytes()
    buf = io.BytesIO()
    np.save(buf, np.array([5, 0, 9], dtype=np.int64))
    files[".npy"] = buf.getvalue()
    # selector bytes: suffix index, field (1 = "n"), no cut; see targets.fuzz_analyze
    return {f"seed-{suffix.strip('.').replace('.', '-') or 'noext'}": bytes([_SUFFIXES.index(suffix), 1, 1]) + content
            for suffix, content in files.items()}


def main() -> None:
    rng = random.Random(14)
    for name in TARGETS:
        folder = CORPUS / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(6):
            (folder / f"seed-random-{i}").write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(4, 64))))
    for file_name, data in analyze_seeds().items():
        (CORPUS / "analyze" / file_name).write_bytes(data)


if __name__ == "__main__":
    main()
