"""``packkit analyze DATA -o OUT``: the command line over :func:`packkit.analyze.analyze`."""
from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys

EPILOG = """\
length of a sample = sum of every --length-field (token counts) + --ids-field (length of a token id list)
+ --text-field (tokens from --tokenizer, a local folder; chat-message lists use its chat template)
+ --extra-tokens. Without a field, one named length/num_tokens/... or input_ids is used (text with a
tokenizer). Text files hold one integer per line.

outputs in OUT: dataset_stats.json, packing_simulations.json, recommendations.json, report.md,
figures/*.png (written atomically: nothing appears unless everything succeeded).

examples:
  packkit analyze train.jsonl -o analysis --length-field text_tokens --length-field image_tokens \\
      --max-lengths auto,20000 --batch-size 128 --epochs 4 --dp-size 8
  packkit analyze data.parquet -o analysis --ids-field input_ids --overlong split
  packkit analyze chats.jsonl -o analysis --text-field messages --tokenizer ./my-tokenizer --json
"""


_OPTION_NAMES = ("target_efficiency", "max_dropped_fraction", "batch_size", "epochs", "per_device_batch_size",
                 "padded_micro_batch_size", "dp_size", "seed", "max_samples", "extra_tokens")


def _fields(values: list[str] | None) -> list[str]:
    return [f.strip() for v in values or [] for f in v.split(",") if f.strip()]


def _fraction(text: str) -> float:
    try:
        value = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def _int64(text: str) -> int:
    """An int option: what numpy and the planner can hold (2**63 gave numpy's OverflowError, not exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not -2**63 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"{text} is out of range (a 64-bit int)")
    return value


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "analyze", help="length statistics, packing simulations and a recommended max length for a dataset",
        description="Analyze a dataset's sample lengths for sequence packing: statistics, packing simulations "
                    "over a sweep of max lengths, the recommended max length with its training dynamics, a "
                    "markdown report and figures.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="JSONL/JSON, Parquet, Arrow IPC, a datasets save_to_disk folder, or a text/.npy "
                                "file of lengths")
    p.add_argument("-o", "--out", required=True, help="output folder (created; existing outputs are replaced)")
    g = p.add_argument_group("input")
    g.add_argument("--format", default="auto", choices=["auto", "jsonl", "json", "parquet", "arrow", "hf", "text", "npy"],
                   help="input format (default: from the extension, else the first bytes)")
    g.add_argument("--split", help="split of a saved DatasetDict folder (default: train, or the only one)")
    g.add_argument("--max-samples", type=_int64, help="read only the first N samples")
    g = p.add_argument_group("sample length")
    g.add_argument("--length-field", action="append", metavar="NAME",
                   help="field holding a token count (repeat or comma-separate to sum; a.b for nested)")
    g.add_argument("--ids-field", action="append", metavar="NAME", help="field holding a list of token ids")
    g.add_argument("--text-field", action="append", metavar="NAME",
                   help="field holding text or chat messages, tokenized with --tokenizer")
    g.add_argument("--tokenizer", metavar="DIR", help="local tokenizer folder (save_pretrained) or tokenizer.json; "
                                                      "never downloads")
    g.add_argument("--no-special-tokens", action="store_true", help="count text without BOS/EOS special tokens")
    g.add_argument("--extra-tokens", type=_int64, default=0, metavar="N",
                   help="tokens added to every sample (e.g. 1 for an EOS appended when packing)")
    g = p.add_argument_group("image tokens (vision-language data)")
    g.add_argument("--image-size-field", action="append", metavar="NAME",
                   help="field holding image sizes: {\"width\": W, \"height\": H}, [W, H], or a list of them")
    g.add_argument("--image-width-field", metavar="NAME", help="field holding image width(s) in pixels")
    g.add_argument("--image-height-field", metavar="NAME", help="field holding image height(s) in pixels")
    g.add_argument("--vision-model", choices=["qwen2-vl", "qwen2.5-vl", "qwen3-vl"],
                   help="resize rule for image tokens (patch/merge size, min/max pixels of the released models)")
    g.add_argument("--patch-size", type=_int64, metavar="N", help="override the family's patch size")
    g.add_argument("--merge-size", type=_int64, metavar="N", help="override the family's spatial merge size")
    g.add_argument("--min-pixels", type=_int64, metavar="N", help="override the family's min_pixels")
    g.add_argument("--max-pixels", type=_int64, metavar="N", help="override the family's max_pixels")
    g.add_argument("--image-extra-tokens", type=_int64, default=0, metavar="N",
                   help="tokens added per image (e.g. 2 for vision start/end tokens the text lacks; default 0)")
    g = p.add_argument_group("packing simulation")
    g.add_argument("--max-lengths", default="auto", metavar="LIST",
                   help="comma-separated max lengths (tokens per row); 'auto' = powers of two from the median to "
                        "the longest sample plus round numbers at p99 and max; e.g. auto,20000 (default: auto)")
    g.add_argument("--algorithms", metavar="LIST",
                   help="comma-separated from nf, ffd, bfd, obfd, ogbfd, or 'all' (default: nf,obfd, plus ogbfd "
                        "with --dp-size > 1)")
    g.add_argument("--overlong", default="drop", choices=["drop", "truncate", "split"],
                   help="samples longer than the max length (default: drop)")
    g.add_argument("--dp-size", type=_int64, default=1, metavar="N",
                   help="data-parallel ranks: rows are grouped into steps of N and balance is reported (default: 1)")
    g.add_argument("--cp-sizes", metavar="LIST",
                   help="context-parallel sizes (e.g. 2,4,8,16): report the tokens zigzag CP padding costs and the "
                        "packs a padding-aware plan needs")
    g.add_argument("--cost", default="attention", choices=["tokens", "attention"],
                   help="cost model for the rank balance: attention = sum len^2 (default), tokens = sum len")
    g = p.add_argument_group("recommendation and training dynamics")
    g.add_argument("--target-efficiency", type=_fraction, default=0.99, metavar="F",
                   help="efficiency the recommended max length must reach (0.99 or 99%%; default 0.99)")
    g.add_argument("--max-dropped-fraction", type=_fraction, default=0.001, metavar="F",
                   help="most samples it may drop or truncate (0.001 or 0.1%%; default 0.001)")
    g.add_argument("--batch-size", type=_int64, default=128, metavar="N",
                   help="effective batch: rows per optimizer step, in the padded run and the packed run alike "
                        "(seed 001's effective_batch_size; default 128)")
    g.add_argument("--epochs", type=_int64, default=1, metavar="N", help="training epochs (default: 1)")
    g.add_argument("--per-device-batch-size", type=_int64, default=1, metavar="N",
                   help="packed rows per device micro-batch (default: 1)")
    g.add_argument("--padded-micro-batch-size", type=_int64, default=8, metavar="N",
                   help="samples per device micro-batch in the padded baseline (default: 8)")
    g.add_argument("--seed", type=_int64, default=0, help="shuffle seed of the padded baseline (default: 0)")
    g = p.add_argument_group("output")
    g.add_argument("--no-figures", action="store_true", help="skip the PNG figures (no matplotlib needed)")
    g.add_argument("--save-lengths", action="store_true", help="also write lengths.npy (int64, one per sample)")
    g.add_argument("--json", action="store_true", help="print a JSON summary on stdout instead of text")
    prog = g.add_mutually_exclusive_group()
    prog.add_argument("--progress", dest="progress", action="store_true", default=None,
                      help="always show progress bars (default: when stderr is a terminal)")
    prog.add_argument("--no-progress", dest="progress", action="store_false", help="never show progress bars")
    return p


def _print_text(result) -> None:
    s, rec, tr = result.stats, result.recommended, result.recommendations["training"]
    src = result.source or {}
    print(f"packkit analyze: {s['count']:,} samples, {s['total_tokens']:,} tokens (median {s['median']:,.0f}, "
          f"p99 {s['p99']:,.0f}, max {s['max']:,}) from {src.get('path', 'memory')}")
    from .recommend import best_per_max_length

    print(f"{'max length':>10}  {'best':<6} {'efficiency':>10} {'packs':>10} {'samples/pack':>12} {'lost':>8}")
    for r in best_per_max_length(result.simulations["results"]):
        print(f"{r['max_length']:>10,}  {r['algorithm']:<6} {r['efficiency']:>10.2%} {r['packs']:>10,} "
              f"{r['samples_per_pack']:>12.2f} {r['lost_samples']:>8,}")
    flag = "" if rec["meets_target"] else " (target not met)"
    print(f"recommended{flag}: max length {rec['max_length']:,} with {rec['algorithm']}: {rec['efficiency']:.2%} "
          f"efficiency, {rec['packs']:,} packs, {rec['samples_per_pack']:.2f} samples/pack, "
          f"{rec['dropped'] + rec['truncated']:,} samples lost ({rec['lost_fraction']:.3%})")
    pad, pk = tr["padding"], tr["packing"]
    epochs = f"{tr['epochs']} epoch{'s' if tr['epochs'] != 1 else ''}"
    print(f"training ({epochs}, batch {tr['batch_size']}, dp {tr['dp_size']}): optimizer steps "
          f"{pad['optimizer_steps']:,} -> {pk['optimizer_steps']:,}, samples/step {pad['samples_per_step']:,.0f} -> "
          f"{pk['samples_per_step']:,.0f}, gradient accumulation {pad['gradient_accumulation']} -> "
          f"{pk['gradient_accumulation']}")
    print(f"wrote {len(result.files)} files to {result.out_dir} (report.md) in {result.timings['total']:.1f} s")


def run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    from .api import analyze
    from .errors import AnalyzeError

    command = shlex.join(["packkit", *argv]) if argv is not None else None
    try:
        result = analyze(
            args.data, args.out, format=args.format, split=args.split, max_samples=args.max_samples,
            length_fields=_fields(args.length_field), ids_fields=_fields(args.ids_field),
            text_fields=_fields(args.text_field), tokenizer=args.tokenizer,
            add_special_tokens=not args.no_special_tokens, extra_tokens=args.extra_tokens, progress=args.progress,
            image_size_fields=_fields(args.image_size_field), image_width_field=args.image_width_field,
            image_height_field=args.image_height_field, vision_model=args.vision_model, patch_size=args.patch_size,
            merge_size=args.merge_size, min_pixels=args.min_pixels, max_pixels=args.max_pixels,
            image_extra_tokens=args.image_extra_tokens,
            max_lengths=args.max_lengths, algorithms=args.algorithms, overlong=args.overlong, dp_size=args.dp_size,
            cost=args.cost, target_efficiency=args.target_efficiency,
            max_dropped_fraction=args.max_dropped_fraction, batch_size=args.batch_size, epochs=args.epochs,
            per_device_batch_size=args.per_device_batch_size,
            padded_micro_batch_size=args.padded_micro_batch_size, seed=args.seed, figures=not args.no_figures,
            save_lengths=args.save_lengths, command=command, cp_sizes=args.cp_sizes)
    except AnalyzeError as e:
        message = re.sub(r"^(%s)\b" % "|".join(_OPTION_NAMES), lambda m: "--" + m.group(1).replace("_", "-"), str(e))
        print(f"packkit analyze: error: {message}", file=sys.stderr)
        return 2
    except OSError as e:
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"packkit analyze: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("packkit analyze: interrupted; no outputs written", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(result.summary(), indent=2, allow_nan=False))
    else:
        _print_text(result)
    return 0
