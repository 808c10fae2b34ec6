"""``report.md``: the tables of every output, in seed 001's order (data, recommendation, dynamics, sweep)."""
from __future__ import annotations


def _int(x) -> str:
    return "-" if x is None else f"{int(round(x)):,}"


def _pct(x, digits: int = 2) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _table(header: list[str], rows: list[list[str]], align: str | None = None) -> list[str]:
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"] + [
        "| " + " | ".join(r) + " |" for r in rows]


def _length_source(src: dict | None) -> str:
    if not src:
        return "lengths given in memory"
    parts = [f"`{f}` (token count)" for f in src.get("count_fields", [])]
    parts += [f"`{f}` (token id list length)" for f in src.get("ids_fields", [])]
    tok = src.get("tokenizer")
    parts += [f"`{f}` (tokenized with `{tok}`)" for f in src.get("text_fields", [])]
    if src.get("extra_tokens"):
        parts.append(f"{src['extra_tokens']} extra tokens per sample")
    return " + ".join(parts) if parts else "one length per line/element"


def render(stats: dict, simulations: dict, recommendations: dict, *, figures: list[str], source: dict | None,
           command: str | None = None) -> str:
    rec = recommendations["recommended"]
    tr = recommendations["training"]
    crit = recommendations["criteria"]
    dp = simulations["dp_size"]
    name = source.get("path") if source else "in-memory lengths"
    out = [f"# Packing analysis: {name}", ""]
    if command:
        out += ["Reproduce with:", "", "```bash", command, "```", ""]

    out += ["## Data", ""]
    rows = []
    if source:
        rows += [["file", f"`{source['path']}`"], ["format", source["format"] + (
            f" (split `{source['split']}`)" if source.get("split") else "")]]
        if source.get("max_samples"):
            rows.append(["read", f"first {source['max_samples']:,} samples only"])
    rows += [["length", _length_source(source.get("length_source") if source else None)],
             ["samples", _int(stats["count"])], ["tokens", _int(stats["total_tokens"])],
             ["zero-length samples", _int(stats["zero_length"])]]
    out += _table(["", ""], rows, "ll") + [""]
    out += _table(["count", "mean", "min", "median", "p90", "p95", "p99", "p99.9", "max"],
                  [[_int(stats["count"]), f"{stats['mean']:,.1f}", _int(stats["min"]), f"{stats['median']:,.1f}",
                    f"{stats['p90']:,.1f}", f"{stats['p95']:,.1f}", f"{stats['p99']:,.1f}", f"{stats['p999']:,.1f}",
                    _int(stats["max"])]]) + [""]

    out += ["## Recommendation", ""]
    flag = "" if rec["meets_target"] else " (target not met)"
    out += [f"**max length {rec['max_length']:,} with `{rec['algorithm']}`**{flag}: {_pct(rec['efficiency'])} "
            f"efficiency, {rec['packs']:,} packs (lower bound {rec['lower_bound']:,}), "
            f"{rec['samples_per_pack']:.2f} samples per pack, {rec['dropped']:,} dropped / "
            f"{rec['truncated']:,} truncated ({_pct(rec['lost_fraction'], 3)} of samples)"
            + ".", ""]
    if rec["padding_efficiency"]:
        out += [f"Padding baseline (no packing: micro-batches of {tr['padding']['per_device_batch_size']} samples, "
                f"each padded to its longest sample): {_pct(rec['padding_efficiency'])} efficiency.", ""]
    out += [ f"Why: {rec['reason']} (target {_pct(crit['target_efficiency'])}, "
            f"loss budget {_pct(crit['max_dropped_fraction'], 3)}, over-long policy `{crit['overlong']}`).", ""]
    cfg = recommendations["config"]
    plan_cfg = cfg["packkit_plan"]
    accumulation = tr["packing"]["gradient_accumulation"]
    out += [f"In axolotl (`axolotl train config.yml`, packkit's plan through its plugin), "
            f"{cfg['effective_batch_size']} rows per optimizer step over {tr['dp_size']} rank(s):", "",
            "```yaml", "plugins:", "  - packkit.integrations.axolotl.PackkitPlugin", "sample_packing: true",
            f"sequence_len: {cfg['global_max_length']}", f"micro_batch_size: {cfg['per_device_train_batch_size']}",
            f"gradient_accumulation_steps: {accumulation}", f"num_epochs: {cfg['num_train_epochs']}", "```", "",
            "In LLaMA-Factory (`python -m packkit.integrations.llamafactory.train config.yaml`):", "",
            "```yaml", "packing: true", f"cutoff_len: {cfg['global_max_length']}",
            f"per_device_train_batch_size: {cfg['per_device_train_batch_size']}",
            f"gradient_accumulation_steps: {accumulation}", f"num_train_epochs: {cfg['num_train_epochs']}", "```", "",
            "With packkit directly:", "", "```python",
            f"plan = packkit.plan(lengths, {plan_cfg['capacity']}, algorithm={plan_cfg['algorithm']!r}, "
            f"overlong={plan_cfg['overlong']!r}, dp_size={plan_cfg['dp_size']}, cost={plan_cfg['cost']!r})",
            "```", ""]
    if recommendations["alternatives"]:
        out += _table(["alternative", "max length", "algorithm", "efficiency", "packs", "steps/epoch", "dropped",
                       "truncated"],
                      [[a["label"], _int(a["max_length"]), a["algorithm"], _pct(a["efficiency"]), _int(a["packs"]),
                        f"{a['steps_per_epoch']:,.1f}", _int(a["dropped"]), _int(a["truncated"])]
                       for a in recommendations["alternatives"]], "lrlrrrrr") + [""]

    pad, pk, ra = tr["padding"], tr["packing"], tr["ratios"]
    out += ["## Training dynamics", "",
            f"Effective batch {tr['batch_size']} rows per optimizer step in both modes, {tr['epochs']} epoch(s), "
            f"dp size {tr['dp_size']}; padded micro-batch {pad['per_device_batch_size']}, packed micro-batch "
            f"{pk['per_device_batch_size']} per device.", ""]
    out += _table(["metric", "padding", "packing", "ratio"], [
        [f"optimizer steps ({tr['epochs']} epochs)", _int(pad["optimizer_steps"]), _int(pk["optimizer_steps"]),
         _ratio(ra["optimizer_steps"]) + " fewer"],
        ["steps per epoch", f"{pad['steps_per_epoch']:,.1f}", f"{pk['steps_per_epoch']:,.1f}", ""],
        ["samples per step", _int(pad["samples_per_step"]), _int(pk["samples_per_step"]),
         _ratio(ra["samples_per_step"]) + " more"],
        ["total samples processed", _int(pad["total_samples"]), _int(pk["total_samples"]), ""],
        ["gradient accumulation steps", _int(pad["gradient_accumulation"]), _int(pk["gradient_accumulation"]), ""],
        ["token slots per epoch (compute proxy)", _int(pad["token_slots_per_epoch"]), _int(pk["token_slots_per_epoch"]),
         _ratio(ra["token_slots_per_epoch"]) + " fewer" if ra["token_slots_per_epoch"] else ""],
        ["real tokens per epoch", _int(pad["tokens_per_epoch"]), _int(pk["tokens_per_epoch"]), ""],
    ], "lrrr") + [""]
    eq = tr["equal_samples_per_step"]
    out += [f"To keep the padded run's samples per step instead: {eq['packs_per_step']} packs per step "
            f"(~{eq['samples_per_step']:,.0f} samples, gradient accumulation {eq['gradient_accumulation']}, "
            f"{eq['optimizer_steps']:,} optimizer steps).", ""]
    out += [f"- note: {n}" for n in tr["notes"]] + ([""] if tr["notes"] else [])

    if simulations.get("context_parallel"):
        cp_rows = simulations["context_parallel"]
        out += ["## Context parallelism", "",
                "Zigzag sharding (ring attention, TE THD) pads every document to a multiple of 2 x cp; a "
                "padding-aware plan (`packkit.plan(..., pad_to_multiple_of=2 * cp)`) keeps padded rows within "
                "the max length (rounded down to a multiple of 2 x cp).", ""]
        out += _table(["cp size", "pad to", "extra tokens", "extra", "max length", "packs (plain)", "packs (padding-aware)",
                       "efficiency (padding-aware)"],
                      [[str(r["cp_size"]), str(r["multiple"]), _int(r["extra_tokens"]), _pct(r["extra_fraction"], 3),
                        _int(r["capacity"]), _int(r["plain_packs"]),
                        _int(r["padding_aware_packs"]) if r["padding_aware_packs"] is not None else "-",
                        _pct(r["padding_aware_efficiency"]) if r["padding_aware_efficiency"] is not None else "-"]
                       for r in cp_rows], "rrrrrrrr") + [""]

    out += ["## Packing simulations", "",
            f"Over-long policy `{simulations['overlong']}`, dp size {dp}"
            + (f", balance under `{simulations['cost']}` cost" if dp > 1 else "") + ".", ""]
    header = ["max length", "algorithm", "packs", "lower bound", "samples/pack", "efficiency", "dropped", "truncated",
              "split"]
    if dp > 1:
        header += ["steps", "step balance", "rank balance"]
    header.append("ms")
    table_rows = []
    for r in simulations["results"]:
        row = [_int(r["max_length"]), r["algorithm"], _int(r["packs"]), _int(r["lower_bound"]),
               f"{r['samples_per_pack']:.2f}", _pct(r["efficiency"]), _int(r["dropped"]), _int(r["truncated"]),
               _int(r["split"])]
        if dp > 1:
            row += [_int(r["steps"]), f"{r['balance']:.4f}", f"{r['rank_balance']:.4f}"]
        row.append(f"{r['seconds'] * 1e3:,.1f}")
        table_rows.append(row)
    out += _table(header, table_rows, "rl" + "r" * (len(header) - 2)) + [""]
    if simulations["padding"]:
        p0 = simulations["padding"][0]
        out += [f"Padding baseline: every sample (truncated to the max length), shuffled (seed "
                f"{simulations['seed']}), micro-batches of {p0['micro_batch_size']} padded to their longest sample.", ""]
        out += _table(["max length", "rows", "efficiency", "truncated"],
                      [[_int(p["max_length"]), _int(p["rows"]), _pct(p["efficiency"]), _int(p["truncated"])]
                       for p in simulations["padding"]]) + [""]

    if figures:
        out += ["## Figures", ""] + [f"![{f.rsplit('/', 1)[-1][:-4]}]({f})" for f in figures] + [""]
    out += ["## Definitions", "",
            "- efficiency: real tokens / (packs x max length); packs include the empty rows that pad the last "
            "data-parallel step.",
            "- samples per pack: samples not dropped / packs. Lower bound: ceil(kept tokens / max length).",
            "- step balance: sum over steps of the slowest rank's cost / sum of the mean rank cost; rank balance: "
            "max / mean of each rank's total cost.",
            "- token slots: rows x padded row length, what the model computes on; padding wastes the difference "
            "to real tokens.", ""]
    return "\n".join(out)
