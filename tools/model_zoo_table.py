"""Regenerate the model-zoo tables in docs/reliability.md from the suite's own cases (tests/model_zoo.py).

    python tools/model_zoo_table.py            # the suite's architectures: the table the suite checks
    python tools/model_zoo_table.py --survey [--store FILE.jsonl]
        # every other model type of transformers' causal-LM mapping (minutes; its table is not checked by the
        # suite); --store keeps each outcome as found, and a rerun resumes from it (--stored-only: render
        # what the store holds, run nothing; --retry-failed: run again the types stored as failed or timed out)
    python tools/model_zoo_table.py --check    # exit 1 if the committed suite table differs
    python tools/model_zoo_table.py --models   # docs/models.md's verdict table (packkit.packing_support, seconds)
"""
from __future__ import annotations

import gc
import json
import pathlib
import resource
import signal
import sys
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import model_zoo as zoo  # noqa: E402
import model_zoo_cases as cases  # noqa: E402

SECONDS = 60  # per surveyed architecture (SIGALRM)
LIMIT_BYTES = 12 << 30  # address space of a survey run
# Surveyed types whose model does not build or run with the common tiny config alone (MLA head sizes, rotary
# dimensions, a layout validator), or whose default expert counts (64-512 experts) take the 60 s: what their tiny
# config needs beyond the common one (as tests/model_zoo.py's ARCHITECTURES).
_MLA = dict(kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, head_dim=8,
            num_key_value_heads=4)
_DEEPSEEK_MOE = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                     first_k_dense_replace=1, n_group=1, topk_group=1)
_QWEN_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
SURVEY_CONFIGS = {
    **{t: {**_MLA, **_DEEPSEEK_MOE} for t in ("axk1", "deepseek_v2", "glm4_moe_lite", "longcat_flash", "sarvam_mla",
                                               "youtu")},
    # DeepSeek Sparse Attention: its indexer keeps 4 keys per query, fewer than a document has (so it selects)
    **{t: {**_MLA, **_DEEPSEEK_MOE, "index_topk": 4} for t in ("axk2", "deepseek_v32", "glm_moe_dsa")},
    "hy_v4": {**_DEEPSEEK_MOE, "index_topk": 4},
    "minicpm3": _MLA,
    "codegen": dict(rotary_dim=8),
    "gptj": dict(rotary_dim=8),
    **{t: _DEEPSEEK_MOE for t in ("glm4_moe", "mimo_v2_flash", "sarvam_moe", "solar_open", "dots1")},
    **{t: _QWEN_MOE for t in ("laguna", "lara_mini", "qwen3_5_moe_text", "qwen4_exp_text")},
    **{t: dict(num_local_experts=4, num_experts_per_tok=2) for t in ("minimax_m2", "mellum")},
    "ernie4_5_moe": dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=32, moe_num_shared_experts=1),
    "exaone_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, num_shared_experts=1),
    "hy_v3": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, num_shared_experts=1),
    "kolibri1": dict(num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                     shared_expert_intermediate_size=32),
    "lfm2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, num_dense_layers=1,
                     layer_types=["conv", "full_attention"]),
}
SURVEY = ("<!-- model-zoo-survey: begin (tools/model_zoo_table.py --survey) -->", "<!-- model-zoo-survey: end -->")


def run(names) -> dict:
    results = {}
    for name in names:
        for path in zoo.PATHS:
            results[(name, path)] = cases.run_case(name, path)
            print(f"{name:24s} {path:16s} {results[(name, path)].cell()[:100]}", file=sys.stderr, flush=True)
    return results


def survey_cases(model_type: str) -> dict:
    """path -> Outcome of one surveyed type. An exception other than a refusal in one path is that cell's "error"
    (the other paths still run: a crash on one path must not hide a silent mismatch on another); running out of
    time or memory ends the type."""
    outcomes = {}
    for path in zoo.PATHS:
        try:
            outcomes[path] = cases.run_case(model_type, path)
        except (TimeoutError, MemoryError):
            raise
        except Exception as exc:  # noqa: BLE001 - a survey records every failure
            outcomes[path] = cases.Outcome("error", f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}")
        print(f"{model_type:24s} {path:16s} {outcomes[path].cell()[:100]}", file=sys.stderr, flush=True)
    return outcomes


# Causal LMs whose configs carry an unused `is_decoder` field, like the encoders' (GPT-NeoX: Pythia, GPT-NeoX-20B);
# the first survey skipped them as encoders.
CAUSAL_WITH_IS_DECODER = frozenset({"gpt_neox", "gpt_neox_japanese"})


def classify(model_type: str):
    """None for a decoder-only text model, else why it is not one."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    if "is_decoder" in config.to_dict() and model_type not in CAUSAL_WITH_IS_DECODER:
        return "encoder (a decoder only with is_decoder=True)"
    if config.get_text_config() is not config:
        return "multimodal wrapper (its text model is listed separately where transformers has one)"
    return None


def _timeout(signum, frame):
    raise TimeoutError


def _record(store, entry: dict) -> None:
    if store is not None:
        with open(store, "a") as f:
            f.write(json.dumps(entry) + "\n")


def survey(store=None, run_new: bool = True, retry: bool = False) -> str:
    """Every model type of the causal-LM mapping not in the suite. ``store``: a JSON Lines file that keeps each
    architecture's outcome as it is found, so a run that dies (a model too big for the machine) resumes."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    signal.signal(signal.SIGALRM, _timeout)
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))  # a MemoryError, not the OOM killer
    suite = {spec.get("model_type", name) for name, spec in zoo.ARCHITECTURES.items()}
    done = {}
    if store is not None and pathlib.Path(store).exists():
        for line in pathlib.Path(store).read_text().splitlines():
            entry = json.loads(line)
            if entry["model_type"] not in suite:  # a type moved into the zoo since: the suite's table has it
                done.setdefault(entry["model_type"], []).append(entry)
        if retry:  # run again the types that timed out, ran out of memory or failed; the store keeps the rest
            done = {t: entries for t, entries in done.items() if not any("failed" in e for e in entries)}
            pathlib.Path(store).write_text("".join(json.dumps(e) + "\n" for es in done.values() for e in es))
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        if model_type in suite or model_type in done:
            continue
        if not run_new:
            done[model_type] = [dict(model_type=model_type, failed="not surveyed yet (the run stopped before it)")]
            continue
        try:
            why = classify(model_type)
        except Exception as exc:  # noqa: BLE001 - a survey records every failure
            why = f"config does not build: {type(exc).__name__}: {str(exc).splitlines()[0][:150]}"
        entries = []
        if why:
            entries.append(dict(model_type=model_type, skipped=why))
        else:
            zoo.ARCHITECTURES[model_type] = dict(SURVEY_CONFIGS.get(model_type, {}))
            signal.alarm(SECONDS)
            try:
                for path, outcome in survey_cases(model_type).items():
                    entries.append(dict(model_type=model_type, path=path, kind=outcome.kind, detail=outcome.detail,
                                        logp_rel=outcome.logp_rel, grad_rel=outcome.grad_rel))
                errors = {e["detail"] for e in entries if e["kind"] == "error"}
                if len(errors) == 1 and all(e["kind"] == "error" for e in entries):
                    entries = [dict(model_type=model_type, failed=errors.pop())]  # the model itself does not run
            except TimeoutError:
                entries = [dict(model_type=model_type, failed=f"not surveyed: its cases took over {SECONDS} s on "
                                "this CPU (2 cores shared with other jobs; --retry-failed runs it again)")]
            except MemoryError:
                entries = [dict(model_type=model_type, failed=f"not surveyed: over {LIMIT_BYTES >> 30} GiB of "
                                "address space with the common tiny config")]
            except Exception as exc:  # noqa: BLE001
                traceback.print_exc()
                entries = [dict(model_type=model_type,
                                failed=f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}")]
            finally:
                signal.alarm(0)
                del zoo.ARCHITECTURES[model_type]
                for cache in zoo.CACHES:  # one architecture's models at a time
                    cache.cache_clear()
                gc.collect()
        done[model_type] = entries
        for entry in entries:
            _record(store, entry)
    return _survey_text(done)


def _survey_text(done: dict) -> str:
    suite = dict(zoo.ARCHITECTURES)
    zoo.ARCHITECTURES.clear()
    results, skipped, failed = {}, [], []
    for model_type, entries in sorted(done.items()):
        for entry in entries:
            if "skipped" in entry:
                skipped.append((model_type, entry["skipped"]))
            elif "failed" in entry:
                failed.append((model_type, entry["failed"]))
            else:
                zoo.ARCHITECTURES[model_type] = {}
                results[(model_type, entry["path"])] = cases.Outcome(entry["kind"], entry["detail"],
                                                                     entry["logp_rel"], entry["grad_rel"])
    table = cases.render_table(results)
    zoo.ARCHITECTURES.clear()
    zoo.ARCHITECTURES.update(suite)
    lines = [table, "", "Not decoder-only text models:", ""]
    lines += [f"- `{m}`: {why.replace('|', '/')}" for m, why in skipped]
    lines += ["", "Decoder-only text models that do not build or run tiny on the CPU with the common config:", ""]
    lines += [f"- `{m}`: {why.replace('|', '/')}" for m, why in failed]
    return "\n".join(lines)


MODELS = ("<!-- packing-support: begin (tools/model_zoo_table.py --models) -->", "<!-- packing-support: end -->")
STATUS = {"exact": "exact", "exact after prepare_model": "exact (stand-ins)", "unverified": "unverified"}


def models_table() -> str:
    """``packkit.packing_support`` of every model type of the zoo (its tiny config), per path; refusals numbered."""
    import packkit
    from packkit.models.verdicts import PATHS

    reasons, lines = [], ["| model type | " + " | ".join(f"`{p}`" for p in PATHS) + " |", "|---" * (len(PATHS) + 1) + "|"]
    for model_type in dict.fromkeys(spec.get("model_type", name) for name, spec in zoo.ARCHITECTURES.items()):
        name = next(n for n, spec in zoo.ARCHITECTURES.items() if spec.get("model_type", n) == model_type)
        table = packkit.packing_support(zoo.tiny_config(name))
        row = []
        for path in PATHS:
            verdict = table[path]
            if verdict.status != "refused":
                row.append(STATUS[verdict.status] + ("*" if path == "flash_attention" else ""))
                continue
            why = verdict.why.replace("|", "/")
            if why not in reasons:
                reasons.append(why)
            row.append(f"refused ({reasons.index(why) + 1})")
        lines.append(f"| {model_type} | " + " | ".join(row) + " |")
    from packkit.models.support import GPU_ONLY

    return "\n".join(lines + ["", f"\\* {GPU_ONLY}.", ""] + [f"{i}. {why}" for i, why in enumerate(reasons, 1)])


def replace(text: str, markers, body: str) -> str:
    start, end = text.index(markers[0]) + len(markers[0]), text.index(markers[1])
    return text[:start] + "\n" + body + "\n" + text[end:]


def main(argv) -> int:
    doc = ROOT / "docs" / "reliability.md"
    if "--models" in argv:
        models = ROOT / "docs" / "models.md"
        models.write_text(replace(models.read_text(), MODELS, models_table()))
        return 0
    with zoo.zoo_session():
        if "--survey" in argv:
            store = argv[argv.index("--store") + 1] if "--store" in argv else None
            body = survey(store, run_new="--stored-only" not in argv, retry="--retry-failed" in argv)
            doc.write_text(replace(doc.read_text(), SURVEY, body))
            return 0
        table = cases.render_table(run(list(zoo.ARCHITECTURES)))
    text = doc.read_text()
    if "--check" in argv:
        return 0 if cases.table_in(text) == table else 1
    doc.write_text(replace(text, (cases.BEGIN, cases.END), table))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
