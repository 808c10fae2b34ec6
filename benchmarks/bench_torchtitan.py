"""packkit's torchtitan dataloader against torchtitan 0.3.0's own text dataset on the same documents.

Run from the repository root::

    python benchmarks/bench_torchtitan.py            # full run
    python benchmarks/bench_torchtitan.py --quick    # smoke run: 2,000 documents, nothing written

Documents (fixed seed): lengths of the seed-001 profile (lognormal, median 864, sigma 0.932, clipped to
[2, 32768]); document i is the token ``i + 1`` repeated, so a row shows which documents it holds. torchtitan's
side is its own ``HuggingFaceTextDataset`` (the class behind ``HuggingFaceTextDataLoader``), fed a registered
in-memory ``datasets.Dataset`` whose tokenizer returns those tokens: it shards documents over the dp ranks
(``split_dataset_by_node``), concatenates them and cuts every ``seq_len`` tokens. packkit's side is
``BalancedDocumentStream`` (what ``PackkitDataLoader`` yields), cost = ``transformer_cost`` of Llama-3-8B.

Per (dp ranks, local batch, seq_len): ``cut`` = documents that fit a row (at most seq_len input tokens) but
land in more than one row (torchtitan restarts their positions at the cut: the second part loses its context);
``steps`` (torchtitan: the fewest of its ranks, as training stops at the first exhausted rank; the other
ranks' rows are ``lost``); ``balance`` = sum over steps of the costliest rank / sum of the mean rank under
Llama-3-8B's ``a*l + b*l**2`` per document (as each system's positions make its attention see them);
``fill`` = real tokens / (steps * ranks * batch * seq_len); ``s/rank`` = seconds to produce one rank's epoch
(the ranks run one after another here; torchtitan's rank reads 1/dp of the documents, packkit's reads and
plans all of them and builds its own rows). Results go to
``benchmarks/results/torchtitan_cpu.json``.
"""
from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import numpy as np

import packkit
from packkit.integrations.torchtitan import BalancedDocumentStream

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import machine_info, write_results  # noqa: E402

LLAMA3_8B = packkit.transformer_cost(hidden_size=4096, num_layers=32, intermediate_size=14336, num_heads=32,
                                     num_kv_heads=8, vocab_size=128256)


def lengths_of(n: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.round(np.exp(rng.normal(np.log(864), 0.932, n))), 2, 32768).astype(np.int64)


class IdTokenizer:
    """torchtitan's tokenizer interface over the benchmark's documents: the text is the document's index."""

    def __init__(self, lengths):
        self.lengths = lengths

    def encode(self, text, add_bos=True, add_eos=True):
        i = int(text)
        return [i + 1] * int(self.lengths[i])


def torchtitan_rows(lengths, world, seq_len):
    import datasets
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets import text_datasets as td
    from torchtitan.tools.logging import logger

    logger.setLevel("ERROR")  # "has run out of data", once per rank

    ds = datasets.Dataset.from_dict({"text": [str(i) for i in range(len(lengths))]})
    td.DATASETS["packkit_bench"] = DatasetConfig(path="memory", loader=lambda path: ds,
                                                 sample_processor=lambda sample: sample["text"])
    tok = IdTokenizer(lengths)
    ranks = []
    for r in range(world):
        it = td.HuggingFaceTextDataset("packkit_bench", None, tok, seq_len=seq_len, dp_rank=r, dp_world_size=world)
        ranks.append([(x["input"].numpy(), x["positions"].numpy(), y.numpy()) for x, y in it])
    return ranks


def packkit_rows(lengths, world, batch, seq_len):
    docs = [[i + 1] * int(n) for i, n in enumerate(lengths)]
    ranks = []
    for r in range(world):
        s = BalancedDocumentStream(docs, seq_len=seq_len, local_batch_size=batch, dp_rank=r, dp_world_size=world,
                                   buffer_size=4096, cost=LLAMA3_8B)
        ranks.append([(x["input"][b].numpy(), x["positions"][b].numpy(), y[b].numpy())
                      for x, y in s for b in range(batch)])
    return ranks


def measure(ranks, lengths, world, batch, seq_len, ignore=-100) -> dict:
    a, b = LLAMA3_8B
    steps = min(len(r) for r in ranks) // batch
    rows_of_doc = collections.defaultdict(set)
    cost = np.zeros((steps, world))
    real = 0
    for k, rows in enumerate(ranks):
        for j, (ids, pos, labels) in enumerate(rows):
            valid = labels != ignore
            for d in np.unique(ids[valid]):
                rows_of_doc[int(d) - 1].add((k, j))
            if j >= steps * batch:
                continue
            real += int(valid.sum())
            starts = np.flatnonzero(pos == 0)
            seg = np.diff(np.append(starts, len(pos)))
            seg_valid = np.add.reduceat(valid.astype(np.int64), starts)
            seg = seg[seg_valid > 0]  # the padding run is no document
            cost[j // batch, k] += float((a * seg + b * seg.astype(np.float64) ** 2).sum())
    fits = np.flatnonzero(lengths - 1 <= seq_len)
    cut = int(sum(len(rows_of_doc[i]) > 1 for i in fits))
    lost = sum(len(r) - steps * batch for r in ranks)
    return {"steps": steps, "cut": cut, "cut_pct": 100.0 * cut / len(fits), "lost_rows": lost,
            "balance": float(cost.max(1).sum() / cost.mean(1).sum()) if steps else 1.0,
            "fill": real / max(1, steps * world * batch * seq_len)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    n = 2000 if args.quick else args.docs
    lengths = lengths_of(n)
    rows = []
    print(f"{n} documents, median {int(np.median(lengths))}, {int(lengths.sum())} tokens")
    print(f"{'system':<11}{'dp':>4}{'B':>3}{'seq_len':>9}{'steps':>7}{'cut':>7}{'cut%':>7}{'lost':>6}"
          f"{'balance':>9}{'fill':>7}{'s/rank':>8}")
    for world, batch, seq_len in ((8, 1, 8192), (8, 2, 8192), (32, 1, 8192), (8, 1, 32768)):
        for system in ("torchtitan", "packkit"):
            t = time.perf_counter()
            ranks = (torchtitan_rows(lengths, world, seq_len) if system == "torchtitan"
                     else packkit_rows(lengths, world, batch, seq_len))
            secs = time.perf_counter() - t
            m = measure(ranks, lengths, world, batch, seq_len)
            rows.append({"system": system, "dp": world, "batch": batch, "seq_len": seq_len, "seconds": secs,
                         "seconds_per_rank": secs / world, **m})
            print(f"{system:<11}{world:>4}{batch:>3}{seq_len:>9}{m['steps']:>7}{m['cut']:>7}{m['cut_pct']:>7.1f}"
                  f"{m['lost_rows']:>6}{m['balance']:>9.4f}{m['fill']:>7.3f}{secs / world:>8.2f}")
    import torchtitan

    write_results({"machine": machine_info(torchtitan=getattr(torchtitan, "__version__", "0.3.0")),
                   "documents": n, "cost": list(LLAMA3_8B), "rows": rows}, "torchtitan_cpu.json", args.out,
                  args.quick)


if __name__ == "__main__":
    main()
