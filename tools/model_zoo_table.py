"""Regenerate the model-zoo tables in docs/reliability.md from the suite's own cases (tests/model_zoo.py).

    python tools/model_zoo_table.py            # the suite's architectures: the table the suite checks
    python tools/model_zoo_table.py --survey   # every other model type of transformers' causal-LM mapping too
                                               # (minutes; its table is not checked by the suite)
    python tools/model_zoo_table.py --check    # exit 1 if the committed suite table differs
"""
from __future__ import annotations

import pathlib
import signal
import sys
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import model_zoo as zoo  # noqa: E402
import model_zoo_cases as cases  # noqa: E402

SECONDS = 60  # per surveyed architecture (SIGALRM)
SURVEY = ("<!-- model-zoo-survey: begin (tools/model_zoo_table.py --survey) -->", "<!-- model-zoo-survey: end -->")


def run(names) -> dict:
    results = {}
    for name in names:
        for path in zoo.PATHS:
            results[(name, path)] = cases.run_case(name, path)
            print(f"{name:24s} {path:16s} {results[(name, path)].cell()[:100]}", file=sys.stderr, flush=True)
    return results


def classify(model_type: str):
    """None for a decoder-only text model, else why it is not one."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    if "is_decoder" in config.to_dict():
        return "encoder (a decoder only with is_decoder=True)"
    if config.get_text_config() is not config:
        return "multimodal wrapper (its text model is listed separately where transformers has one)"
    return None


def _timeout(signum, frame):
    raise TimeoutError


def survey() -> str:
    signal.signal(signal.SIGALRM, _timeout)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    suite = {spec.get("model_type", name) for name, spec in zoo.ARCHITECTURES.items()}
    skipped, failed, results, names = [], [], {}, []
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        if model_type in suite:
            continue
        try:
            why = classify(model_type)
        except Exception as exc:  # noqa: BLE001 - a survey records every failure
            why = f"config does not build: {type(exc).__name__}: {str(exc).splitlines()[0][:150]}"
        if why:
            skipped.append((model_type, why))
            continue
        zoo.ARCHITECTURES[model_type] = {}
        signal.alarm(SECONDS)
        try:
            results.update(run([model_type]))
            names.append(model_type)
        except TimeoutError:
            failed.append((model_type, f"not surveyed: its cases take over {SECONDS} s on this CPU (reference "
                                       "PyTorch kernels of its recurrent / conv layers)"))
            del zoo.ARCHITECTURES[model_type]
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            failed.append((model_type, f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"))
            del zoo.ARCHITECTURES[model_type]
        finally:
            signal.alarm(0)
    suite_names = [n for n in zoo.ARCHITECTURES if n not in names]
    for n in suite_names:
        del zoo.ARCHITECTURES[n]
    table = cases.render_table(results)
    lines = [table, "", "Not decoder-only text models:", ""]
    lines += [f"- `{m}`: {why.replace('|', '/')}" for m, why in skipped]
    lines += ["", "Decoder-only text models that do not build or run tiny on the CPU with the common config:", ""]
    lines += [f"- `{m}`: {why.replace('|', '/')}" for m, why in failed]
    return "\n".join(lines)


def replace(text: str, markers, body: str) -> str:
    start, end = text.index(markers[0]) + len(markers[0]), text.index(markers[1])
    return text[:start] + "\n" + body + "\n" + text[end:]


def main(argv) -> int:
    doc = ROOT / "docs" / "reliability.md"
    with zoo.zoo_session():
        if "--survey" in argv:
            body = survey()
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
