"""packkit.pack_dataset on Ray Data: a ray.data.Dataset in, a packed ray.data.Dataset out, one global plan.

    python examples/ray_data_pack.py

A local cluster (`ray.init(num_cpus=2)`) stands in for a real one: one task per input block reads its
lengths, the driver plans once, tasks cut and pack the rows. The script checks that every token arrives
exactly once and that the rows are the single-process path's plan: Ray plans rows in content order (its blocks
arrive in the scheduler's order), the single process in dataset order, so row for row the same document lengths,
holding other documents of those lengths.
"""
from __future__ import annotations

import datasets
import numpy as np
import pyarrow as pa
import ray

import packkit

SEQ_LENGTH = 512


def main() -> int:
    rng = np.random.default_rng(0)
    ids = [rng.integers(1, 32000, n).tolist() for n in rng.integers(16, 400, 2000)]
    table = pa.table({"input_ids": pa.array(ids, type=pa.list_(pa.int32()))})

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        source = ray.data.from_arrow([table.slice(i, 500) for i in range(0, len(ids), 500)])  # 4 blocks
        packed, report = packkit.pack_dataset(source, SEQ_LENGTH, return_report=True)
        batches = list(packed.iter_batches(batch_format="pyarrow", batch_size=None))
        rows = [r for batch in batches for r in batch.column("input_ids").to_pylist()]
        seq_lengths = [r for batch in batches for r in batch.column("seq_lengths").to_pylist()]
    finally:
        ray.shutdown()

    single = packkit.pack_dataset(datasets.Dataset(table), SEQ_LENGTH)
    tokens = sum(len(r) for r in rows)
    assert sorted(t for r in rows for t in r) == sorted(t for s in ids for t in s), "a token was lost or duplicated"
    assert [sorted(r) for r in seq_lengths] == [sorted(r) for r in single["seq_lengths"]], "Ray's plan differs"
    print(f"rows {len(rows)}  tokens {tokens}  efficiency {report.efficiency:.4f}  (the single-process plan)")
    return len(rows)


if __name__ == "__main__":
    main()
