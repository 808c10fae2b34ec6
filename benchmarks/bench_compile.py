"""Compiles of a ``torch.compile(fullgraph=True)`` training step fed by each collator (issue 62, CPU).

A tiny random-init Llama (sdpa: transformers finds the documents from ``position_ids``) trains ``--steps`` SGD
steps on flat packed batches of at most ``--capacity`` tokens whose lengths follow seed 001's profile (lognormal,
sigma 0.932) scaled to the CPU (median 108 tokens, capped at the capacity). Each feeding compiles its own copy of
the same initial model and is counted by torch._dynamo's counters (``unique_graphs``: compiles, warm-up included;
``after_warmup``: compiles after the first 50 steps). Feedings:

- ``packkit contract``: ``PackingCollator(capacity, max_sequences=N, max_length_buckets="pow2")``: one
  ``[1, capacity]`` row, ``cu_seq_lens`` always ``N + 1`` long.
- ``packkit exact``: ``PackingCollator()`` (the flat row as long as the batch, exact metadata).
- ``HF DataCollatorWithFlattening``: transformers' padding-free collator.
- ``pad-to-max``: each sample padded to the batch's longest (``[B, max_len]`` + attention_mask).

Each runs under ``dynamic=False`` (what a CUDA graph needs: one static shape per graph) and the default
``dynamic=None`` (automatic dynamic shapes after a second shape). ``backend="aot_eager"``: dynamo's compile count
does not depend on the backend, and inductor's C++ codegen would cost minutes per compile here. The contract run's
losses are compared step by step with the exact feeding run eagerly (the same weights, the same SGD steps): the
packed documents are the same, so the losses must be equal. Padded tokens added by the contract (the row padded to
capacity) are reported per bucket set. Writes benchmarks/results/compile_cpu.json.

``--family mamba2`` / ``bamba``: a hybrid family instead (a tiny random-init Mamba-2, or Bamba: a Mamba-2 mixer
layer and an sdpa attention layer; the same batches). Its per-document
mixer (``prepare_model(model)``) reads boundaries on the host, so it is compiled whole only with
``prepare_model(model, mixer="masked")`` (device-side masks). Feedings: the contract on the masked mixer (compiled,
``dynamic=False``), the contract on the per-document mixer (compiled: fullgraph fails at the first host read), and
the exact-metadata feeding run eagerly on each mixer for the losses. Writes benchmarks/results/compile_<family>_cpu.json.
"""
from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch

import packkit

import _results
from bench_train import pad_batch

VOCAB = 97


def model_and_config():
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                      use_cache=False, attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(config)


def hybrid_model(family: str):
    """A tiny random-init hybrid: Mamba-2 (2 mixer layers) or Bamba (a mixer layer, then an sdpa attention layer)."""
    import transformers

    torch.manual_seed(0)
    if family == "mamba2":
        config = transformers.Mamba2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_heads=4,
                                           head_dim=16, expand=2, state_size=8, n_groups=1, chunk_size=64,
                                           use_cache=False)
        return transformers.Mamba2ForCausalLM(config)
    config = transformers.BambaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, attn_layer_indices=[1],
                                      mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1,
                                      mamba_chunk_size=64, mamba_expand=2, use_cache=False,
                                      attn_implementation="sdpa")
    return transformers.BambaForCausalLM(config)


def batches(steps: int, capacity: int, max_docs: int, seed: int = 1) -> list[list[list[int]]]:
    """Token-budget batches: samples drawn in order, a batch closed before it would pass ``capacity`` tokens or
    ``max_docs`` samples (the sampler side of the contract)."""
    rng = np.random.default_rng(seed)
    out = []
    pending = None
    while len(out) < steps:
        batch, tokens = [], 0
        while True:
            n = pending if pending is not None else int(min(capacity, max(2, rng.lognormal(np.log(108), 0.932))))
            pending = None
            if tokens + n > capacity or len(batch) == max_docs:
                pending = n
                break
            batch.append(rng.integers(1, VOCAB, n).tolist())
            tokens += n
        out.append(batch)
    return out


def feedings(capacity: int, slots: int, buckets):
    from transformers import DataCollatorWithFlattening

    hf = DataCollatorWithFlattening(return_position_ids=True)
    contract = packkit.PackingCollator(capacity, max_sequences=slots, max_length_buckets=buckets)
    exact = packkit.PackingCollator()

    return {"packkit contract": contract, "packkit exact": exact,
            "HF DataCollatorWithFlattening": lambda fs: {k: torch.as_tensor(v) for k, v in hf(fs).items()},
            "pad-to-max": pad_batch}  # bench_train's [B, longest] + attention_mask


def run(model, collate, data, *, compiled: bool, dynamic, lr: float = 0.05):
    import torch._dynamo as dynamo

    model = copy.deepcopy(model)
    step_fn = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=dynamic) if compiled else model
    dynamo.reset()
    dynamo.utils.counters.clear()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses, graphs, padded, real = [], [], 0, 0
    start = time.perf_counter()
    for step, features in enumerate(data):
        batch = collate([{"input_ids": s} for s in features])
        real += sum(len(s) for s in features)
        padded += int(batch["input_ids"].numel())
        try:
            loss = step_fn(**batch, use_cache=False).loss
        except (dynamo.exc.FailOnRecompileLimitHit, dynamo.exc.TorchDynamoException) as error:
            # fullgraph=True: past the recompile limit, or at a graph break (a host read), dynamo fails
            graphs = graphs or [0]
            failure = (f"recompile_limit ({dynamo.config.recompile_limit}) hit"
                       if isinstance(error, dynamo.exc.FailOnRecompileLimitHit)
                       else f"{type(error).__name__}: {str(error).splitlines()[0][:120]}")
            return dict(seconds=time.perf_counter() - start, losses=losses, compiles=graphs[-1],
                        after_warmup=graphs[-1] - graphs[min(49, len(graphs) - 1)], padding_fraction=1 - real / padded,
                        failed_at_step=step, failure=failure)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        graphs.append(int(dynamo.utils.counters["stats"]["unique_graphs"]))
    return dict(seconds=time.perf_counter() - start, losses=losses, compiles=graphs[-1] if compiled else 0,
                after_warmup=(graphs[-1] - graphs[min(49, len(graphs) - 1)]) if compiled else 0,
                padding_fraction=1 - real / padded)


def contract_padding(slot_counts=(16, 32, 48, 64, 96), capacities=(20_000, 32_768)) -> list[dict]:
    """Tokens the contract adds on seed 001's full profile (the demo's 99,388 lengths): rows planned by obfd with at
    most N - 1 documents (a row's padding takes a slot) against obfd unconstrained, as a share of the real tokens."""
    from packkit.tools.demo import demo_lengths

    lengths = demo_lengths()
    tokens = int(lengths.sum())
    out = []
    for cap in capacities:
        free = packkit.plan(lengths, cap, overlong="split").num_bins
        for n in slot_counts:
            rows = packkit.plan(lengths, cap, overlong="split", max_sequences=n - 1).num_bins
            out.append({"capacity": cap, "max_sequences": n, "rows": rows, "obfd_rows": free,
                        "added_padding": (rows - free) * cap / tokens})
    return out


def main() -> None:
    import torch._dynamo as dynamo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--capacity", type=int, default=512)
    parser.add_argument("--slots", type=int, default=16, help="max_sequences of the contract")
    parser.add_argument("--family", choices=("llama", "mamba2", "bamba"), default="llama")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dynamo.config.capture_scalar_outputs = False  # a host read inside the step is a graph break: fullgraph fails
    dynamo.config.recompile_limit = 64  # a baseline past it fails (fullgraph=True): reported, not raised
    torch.set_num_threads(1)
    data = batches(args.steps, args.capacity, args.slots - 1)  # a flat row's padding takes a slot
    if args.family != "llama":
        return main_hybrid(args, data)
    base = model_and_config()
    rows = []
    bucket_sets = {"pow2": "pow2", "[64, 128, 256, capacity]": [64, 128, 256, args.capacity]}
    for label, buckets in bucket_sets.items():
        feeds = feedings(args.capacity, args.slots, buckets)
        names = list(feeds) if label == "pow2" else ["packkit contract"]
        for name in names:
            for dynamic in (False, None):
                r = run(base, feeds[name], data, compiled=True, dynamic=dynamic)
                r.update(feeding=name, buckets=label if name == "packkit contract" else "-", dynamic=str(dynamic))
                rows.append(r)
                print(f"{name:32s} buckets={r['buckets']:26s} dynamic={dynamic!s:5s} compiles={r['compiles']:4d} "
                      f"after step 50={r['after_warmup']:3d} padding={r['padding_fraction']:.3f} "
                      f"{r['seconds']:.1f} s {r.get('failure', '')}", flush=True)
    eager = run(base, packkit.PackingCollator(args.capacity, pad_to_multiple_of=args.capacity), data, compiled=False,
                dynamic=None)  # exact metadata, the same [1, capacity] tokens, no compile
    contract = next(r for r in rows if r["feeding"] == "packkit contract" and r["dynamic"] == "False")
    loss_diff = max(abs(a - b) for a, b in zip(contract["losses"], eager["losses"]))
    print(f"\nloss: contract (compiled) vs exact metadata (eager), max |diff| over {args.steps} steps = {loss_diff:.3g}")
    print("\n| feeding | buckets | dynamic | compiles | compiles after step 50 | padded tokens | s |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in rows:
        failed = f" (fullgraph failed at step {r['failed_at_step']}: {r['failure']})" if "failure" in r else ""
        print(f"| {r['feeding']} | {r['buckets']} | {r['dynamic']} | {r['compiles']}{failed} | {r['after_warmup']} | "
              f"{100 * r['padding_fraction']:.1f}% | {r['seconds']:.1f} |")
    padding = contract_padding()
    print("\npadding the contract adds on seed 001's profile (99,388 lengths, obfd with N - 1 documents per row):")
    print("| capacity | max_sequences | rows | obfd rows | added padding |\n|---:|---:|---:|---:|---:|")
    for r in padding:
        print(f"| {r['capacity']:,} | {r['max_sequences']} | {r['rows']:,} | {r['obfd_rows']:,} | "
              f"{100 * r['added_padding']:.2f}% |")
    for r in rows:
        r.pop("losses")
    doc = {"machine": _results.machine_info(), "steps": args.steps, "capacity": args.capacity, "slots": args.slots,
           "backend": "aot_eager", "loss_max_abs_diff_vs_exact_eager": loss_diff, "rows": rows,
           "contract_padding": padding}
    _results.write_results(doc, "compile_cpu.json", Path(args.out) if args.out else None, quick=args.steps < 1000)


def main_hybrid(args, data) -> None:
    base = hybrid_model(args.family)
    masked = packkit.prepare_model(copy.deepcopy(base), mixer="masked")
    per_doc = packkit.prepare_model(copy.deepcopy(base))
    contract = packkit.PackingCollator(args.capacity, max_sequences=args.slots, max_length_buckets="pow2")
    exact = packkit.PackingCollator(args.capacity, pad_to_multiple_of=args.capacity)  # same tokens, exact metadata
    runs = {"contract, masked mixer": (masked, contract, True), "contract, per-document mixer": (per_doc, contract, True),
            "exact metadata, masked mixer (eager)": (masked, exact, False),
            "exact metadata, per-document mixer (eager)": (per_doc, exact, False)}
    rows = {}
    for name, (model, collate, compiled) in runs.items():
        r = run(model, collate, data, compiled=compiled, dynamic=False)
        r.update(feeding=name, compiled=compiled, dynamic="False" if compiled else "-")
        rows[name] = r
        print(f"{name:44s} compiles={r['compiles']:3d} after step 50={r['after_warmup']:3d} "
              f"steps={len(r['losses'])} {r['seconds']:.1f} s {r.get('failure', '')}", flush=True)
    got = rows["contract, masked mixer"]["losses"]
    diffs = {f"vs {name}": max(abs(a - b) for a, b in zip(got, rows[name]["losses"]))
             for name in ("exact metadata, masked mixer (eager)", "exact metadata, per-document mixer (eager)")}
    for name, d in diffs.items():
        print(f"loss: contract on the masked mixer (compiled) {name}, max |diff| over {args.steps} steps = {d:.3g}")
    for r in rows.values():
        r.pop("losses")
    doc = {"machine": _results.machine_info(), "family": args.family, "steps": args.steps, "capacity": args.capacity,
           "slots": args.slots, "backend": "aot_eager", "dtype": "float32", "loss_max_abs_diff": diffs,
           "rows": list(rows.values())}
    _results.write_results(doc, f"compile_{args.family}_cpu.json", Path(args.out) if args.out else None,
                           quick=args.steps < 1000)


if __name__ == "__main__":
    main()
