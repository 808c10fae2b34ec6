"""How much faster will my training run? One epoch of a tiny random Llama, five ways of feeding it (issue 42).

Run from the repository root::

    python benchmarks/bench_train.py                    # both profiles, full size (tens of minutes on 2 CPU cores)
    python benchmarks/bench_train.py --profile issue    # one profile
    python benchmarks/bench_train.py --quick            # small data, well under a minute; no JSON unless --out

Model: ``LlamaForCausalLM`` (random init, seed 0: every feeding starts from the same weights), 4 layers, hidden 256,
4 heads, intermediate 1024, vocabulary 1024, fp32, on the CPU. One epoch in a plain PyTorch loop (forward,
backward, AdamW step; lr 1e-3), one optimizer step per micro-batch, ``use_cache=False``.

Feedings (the batches HF ``Trainer`` would build for each):
  * ``padded``: batches of 8 samples in a seeded random order, right-padded to the longest (``attention_mask``,
    labels -100 on padding); ``sdpa``.
  * ``group_by_length``: the same, in transformers' ``LengthGroupedSampler`` order (what
    ``TrainingArguments(group_by_length=True)`` uses); this also reorders the data, packing does not.
  * ``hf_flattening``: the ``padded`` batches of 8 through ``transformers.DataCollatorWithFlattening`` (one ``[1, T]``
    row, documents cut by ``position_ids``); ``sdpa``, which runs them as one block-causal mask over ``T x T``.
  * ``packkit_sdpa``: rows of ``capacity`` tokens planned once by ``packkit.plan`` (obfd), one row per micro-batch
    through ``PackingCollator(capacity, layout="padded", planned_rows=True, pad_to_capacity=False)``; ``sdpa`` with
    the block mask transformers builds from ``position_ids`` (the whole row's square).
  * ``packkit_varlen``: the same rows and batches; ``attn_implementation="packkit_varlen"``
    (``packkit.register_varlen_attention()``: per-document attention, cost ``sum(l**2)``).

Measured per feeding: real tokens/s (the dataset's tokens / wall time), tokens forwarded (``input_ids`` elements,
padding included), padding share, steps, wall time. The feedings run interleaved, a chunk of steps of each in turn,
so a change in the machine's load hits all of them alike; with ``--repeats R`` the epoch is run R times and each
rate is the median, every ratio a ratio of medians from this one run.

Losses are checked, not assumed: (1) each feeding's first batch, at the initial weights, against the per-sample loss
(every sample run alone, token losses summed / targets), and (2) the whole epoch's per-step losses of feedings whose
batches hold the same samples (``padded`` = ``hf_flattening``; ``packkit_sdpa`` = ``packkit_varlen``).

Profiles: ``issue`` (800 samples, lognormal median 288, sigma 0.932, max 2,048; capacity 2,048) and ``seed001``
(seed 001's LVIS length profile, lognormal median 864, sigma 0.932 (``shared/REFERENCE.md`` §5), scaled to the CPU:
capacity 4,096, longer samples truncated to it, 240 samples). Results: ``benchmarks/results/train_cpu.json``.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import packkit
from _results import machine_info, results_name, write_results

FEEDINGS = ("padded", "group_by_length", "hf_flattening", "packkit_sdpa", "packkit_varlen")
SAME_SAMPLES = (("padded", "hf_flattening"), ("packkit_sdpa", "packkit_varlen"))
PROFILES = {
    "issue": dict(samples=800, median=288, sigma=0.932, capacity=2048, seed=0),
    "seed001": dict(samples=240, median=864, sigma=0.932, capacity=4096, seed=1),
}
QUICK = dict(samples=40, median=48, sigma=0.932, capacity=256, seed=0)
MODEL = dict(vocab_size=1024, hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=4, max_position_embeddings=8192)
QUICK_MODEL = dict(MODEL, vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
BATCH = 8  # samples per padded / flattened batch
LOSS_RTOL = 1e-4  # fp32; one step's loss
CURVE_RTOL = 2e-3  # fp32; a whole epoch of AdamW steps from the same weights drifts by rounding


def lengths_for(profile: dict) -> np.ndarray:
    rng = np.random.default_rng(profile["seed"])
    raw = np.exp(rng.normal(math.log(profile["median"]), profile["sigma"], profile["samples"]))
    return np.clip(np.round(raw), 2, profile["capacity"]).astype(np.int64)


def make_dataset(lengths, vocab: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed + 1)
    return [{"input_ids": rng.integers(1, vocab, int(n)).tolist()} for n in lengths]


def tiny_llama(config: dict, attn: str):
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config, use_cache=False,
                                                                   attn_implementation=attn))
    model.config.use_cache = False
    return model


# -- the feedings: batches of samples, and how each becomes model inputs ------------------------------------------
def sample_batches(name: str, lengths: np.ndarray, capacity: int, seed: int) -> list[list[int]]:
    """Each micro-batch as dataset indices (a packkit batch: one planned row)."""
    n = len(lengths)
    if name in ("padded", "hf_flattening"):
        order = np.random.default_rng(seed + 2).permutation(n).tolist()
        return [order[i:i + BATCH] for i in range(0, n, BATCH)]
    if name == "group_by_length":
        from transformers.trainer_pt_utils import LengthGroupedSampler

        generator = torch.Generator().manual_seed(seed + 2)
        order = list(LengthGroupedSampler(BATCH, lengths=lengths.tolist(), generator=generator))
        return [order[i:i + BATCH] for i in range(0, n, BATCH)]
    rows = [row.tolist() for row in packkit.plan(lengths, capacity).bins]
    order = np.random.default_rng(seed + 2).permutation(len(rows))  # as a Trainer's sampler shuffles rows
    return [rows[i] for i in order]


def pad_batch(features: list[dict]) -> dict:
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), longest, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for r, f in enumerate(features):
        ids[r, :len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[r, :len(f["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def collator(name: str, capacity: int):
    if name in ("padded", "group_by_length"):
        return pad_batch
    if name == "hf_flattening":
        from transformers import DataCollatorWithFlattening

        return DataCollatorWithFlattening()
    rows = packkit.PackingCollator(capacity, layout="padded", planned_rows=True, pad_to_capacity=False)
    return lambda features: rows([features])  # one planned row per micro-batch


def attention(name: str) -> str:
    return packkit.register_varlen_attention() if name == "packkit_varlen" else "sdpa"


# -- the loss checks ------------------------------------------------------------------------------------------------
def per_sample_loss(model, features: list[dict]) -> float:
    """Every sample alone through ``model`` (sdpa, the feedings' initial weights): sum of its token losses / all
    targets (what a per-token batch loss is)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for f in features:
            ids = torch.tensor([f["input_ids"]])
            logits = model(input_ids=ids, use_cache=False).logits[0, :-1].double()
            total += float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))
            count += ids.shape[1] - 1
    return total / count


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


# -- one feeding's run, in chunks so the feedings interleave --------------------------------------------------------
def sampled_steps(count: int, fraction: float, seed: int) -> list[int]:
    """A seeded random ``fraction`` of an epoch's ``count`` steps, in epoch order (all of them at 1.0). Feedings that
    share their batches (padded and hf_flattening; the two packkit ones) get the same steps."""
    if fraction >= 1:
        return list(range(count))
    keep = max(1, round(count * fraction))
    return sorted(np.random.default_rng(seed + 3).choice(count, keep, replace=False).tolist())


class Run:
    def __init__(self, name: str, dataset: list[dict], lengths, capacity: int, model_config: dict, seed: int,
                 reference, fraction: float):
        self.name = name
        self.collate = collator(name, capacity)
        self.dataset = dataset
        epoch = sample_batches(name, lengths, capacity, seed)
        # the whole epoch's shape, exact even when only some of its steps are run
        self.epoch_steps, self.epoch_forwarded = len(epoch), sum(self.collate([dataset[i] for i in b])["input_ids"]
                                                                 .numel() for b in epoch)
        self.batches = [epoch[k] for k in sampled_steps(len(epoch), fraction, seed)]
        self.real = sum(int(lengths[i]) for b in self.batches for i in b)
        self.model = tiny_llama(model_config, attention(name))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.losses, self.forwarded, self.seconds, self.step = [], 0, 0.0, 0
        first = [dataset[i] for i in self.batches[0]]
        self.model.eval()
        with torch.no_grad():
            got = float(self.model(**self.collate(first), use_cache=False).loss)
        self.first_loss_rel_err = rel(got, per_sample_loss(reference, first))
        self.model.train()

    def run(self, steps: int) -> None:
        end = min(self.step + steps, len(self.batches))
        start = time.perf_counter()
        for k in range(self.step, end):
            batch = self.collate([self.dataset[i] for i in self.batches[k]])
            loss = self.model(**batch, use_cache=False).loss
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.losses.append(float(loss.detach()))
            self.forwarded += batch["input_ids"].numel()
        self.seconds += time.perf_counter() - start
        self.step = end

    @property
    def done(self) -> bool:
        return self.step >= len(self.batches)


def run_profile(name: str, profile: dict, model_config: dict, repeats: int, chunks: int, feedings,
                fraction: float = 1.0) -> dict:
    lengths = lengths_for(profile)
    capacity = profile["capacity"]
    dataset = make_dataset(lengths, model_config["vocab_size"], profile["seed"])
    real = int(lengths.sum())
    print(f"\n## {name}: {len(lengths)} samples, {real:,} tokens, median {int(np.median(lengths))}, "
          f"max {int(lengths.max())}, capacity {capacity}", flush=True)
    results = {f: {"wall_s": [], "errors": None} for f in feedings}
    reference = tiny_llama(model_config, "sdpa").eval()
    curves = {}
    for rep in range(repeats):
        runs = {}
        for f in feedings:
            try:
                runs[f] = Run(f, dataset, lengths, capacity, model_config, profile["seed"], reference, fraction)
            except Exception as exc:  # e.g. packkit_varlen where this torch/device cannot run it: reported, not hidden
                results[f]["errors"] = f"{type(exc).__name__}: {exc}"
        sizes = {f: max(1, -(-len(r.batches) // chunks)) for f, r in runs.items()}
        while not all(r.done for r in runs.values()):
            for f, r in runs.items():
                if not r.done:
                    try:
                        r.run(sizes[f])
                    except Exception as exc:
                        results[f]["errors"] = f"{type(exc).__name__}: {exc}"
                        r.step = len(r.batches)
        for f, r in runs.items():
            if results[f]["errors"]:
                continue
            results[f]["wall_s"].append(r.seconds)
            results[f]["rate"] = results[f].get("rate", []) + [r.real / r.seconds]
            results[f].update(steps=r.epoch_steps, forwarded=r.epoch_forwarded, steps_run=len(r.batches),
                              first_loss_rel_err=r.first_loss_rel_err)
            if rep == 0:
                curves[f] = r.losses
        print(f"  repeat {rep + 1}/{repeats}: " + ", ".join(f"{f} {r.seconds:.1f}s" for f, r in runs.items()
                                                            if not results[f]["errors"]), flush=True)
    rows = {}
    for f in feedings:
        res = results[f]
        if res["errors"] or not res["wall_s"]:
            rows[f] = {"error": res["errors"]}
            continue
        rate = statistics.median(res["rate"])
        rows[f] = {"real_tok_s": rate, "wall_s": real / rate, "wall_s_measured": res["wall_s"],
                   "wall_s_is_estimate": fraction < 1, "steps": res["steps"], "steps_run": res["steps_run"],
                   "tokens_forwarded": res["forwarded"], "padding_share": 1 - real / res["forwarded"],
                   "first_loss_rel_err": res["first_loss_rel_err"],
                   "first_loss_ok": res["first_loss_rel_err"] <= LOSS_RTOL}
    base = rows.get("padded", {}).get("real_tok_s")
    for f, row in rows.items():
        if base and "real_tok_s" in row:
            row["vs_padded"] = row["real_tok_s"] / base
    same = {}
    for a, b in SAME_SAMPLES:
        if a in curves and b in curves:
            worst = max(rel(x, y) for x, y in zip(curves[a], curves[b]))
            same[f"{a}={b}"] = {"max_rel_diff": worst, "steps": len(curves[a]), "ok": worst <= CURVE_RTOL}
    return {"profile": dict(profile, real_tokens=real, fraction=fraction, lengths_median=float(np.median(lengths)),
                            lengths_max=int(lengths.max())),
            "feedings": rows, "same_samples_loss_curves": same}


def print_table(name: str, doc: dict) -> None:
    print(f"\n{name}: | feeding | tokens forwarded (padding) | real tok/s | vs padded | wall s | steps | first-step "
          f"loss vs per-sample |")
    for f, row in doc["feedings"].items():
        if "error" in row:
            print(f"| {f} | - | - | - | - | - | {row['error']} |")
            continue
        print(f"| {f} | {row['tokens_forwarded']:,} ({100 * row['padding_share']:.1f}%) | {row['real_tok_s']:,.0f} | "
              f"{row.get('vs_padded', float('nan')):.2f}x | {row['wall_s']:.1f} | {row['steps']} | "
              f"{row['first_loss_rel_err']:.1e} {'ok' if row['first_loss_ok'] else 'MISMATCH'} |")
    for pair, check in doc["same_samples_loss_curves"].items():
        print(f"  loss curve {pair}: max rel diff {check['max_rel_diff']:.1e} over {check['steps']} steps "
              f"{'ok' if check['ok'] else 'MISMATCH'}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 short samples, a 2-layer model: a smoke run")
    parser.add_argument("--profile", choices=[*PROFILES, "all"], default="all")
    parser.add_argument("--samples", type=int, help="override the profile's sample count")
    parser.add_argument("--repeats", type=int, default=None, help="epochs per feeding (median); default 1, quick 2")
    parser.add_argument("--chunks", type=int, default=8, help="interleaving: each epoch in this many chunks")
    parser.add_argument("--fraction", type=float, default=1.0,
                        help="run a seeded random share of each epoch's steps; the rate is measured on them and the "
                             "epoch's wall time estimated from it (tokens forwarded and padding stay exact)")
    parser.add_argument("--feedings", default=",".join(FEEDINGS))
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on the loaded shared 2-core VM two threads ran 8-50x slower)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    feedings = [f for f in args.feedings.split(",") if f]
    unknown = sorted(set(feedings) - set(FEEDINGS))
    if unknown:
        parser.error(f"unknown feedings {unknown}; allowed: {', '.join(FEEDINGS)}")
    repeats = args.repeats or (2 if args.quick else 1)
    profiles = {"quick": dict(QUICK)} if args.quick else (
        PROFILES if args.profile == "all" else {args.profile: PROFILES[args.profile]})
    model_config = QUICK_MODEL if args.quick else MODEL
    load_before = _load()
    if not 0 < args.fraction <= 1:
        parser.error(f"--fraction must be in (0, 1], got {args.fraction}")
    doc = {"machine": machine_info(load_average_before=load_before), "model": model_config, "repeats": repeats,
           "chunks": args.chunks, "batch_samples": BATCH, "profiles": {}}
    ok = True
    for name, profile in profiles.items():
        if args.samples:
            profile = dict(profile, samples=args.samples)
        result = run_profile(name, profile, model_config, repeats, args.chunks, feedings, args.fraction)
        doc["profiles"][name] = result
        print_table(name, result)
        ok &= all(r.get("first_loss_ok", True) for r in result["feedings"].values())
        ok &= all(c["ok"] for c in result["same_samples_loss_curves"].values())
    doc["machine"]["load_average_after"] = _load()
    print(f"\nload average (1, 5, 15 min) before {load_before}, after {doc['machine']['load_average_after']}")
    write_results(doc, results_name("train", gpu=False), args.out, args.quick)
    return 0 if ok else 1


def _load():
    try:
        import os

        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main())
