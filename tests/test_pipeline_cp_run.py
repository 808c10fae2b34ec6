"""Context parallelism inside each pipeline stage, for real (issue 61): 4 gloo processes = pp 2 x cp 2,
Schedule1F1B, one step of plan_pipeline's micro-batches on the tiny fp64 Llama of tests/pipeline_helpers.py (8
layers, 4 a stage), each CP rank fed its shards by pipeline_cp_microbatches and each stage's attention all-gathering
K/V over its CP group (tests/pipeline_cp_worker.py). The step's loss (the last stages' losses over both CP ranks)
and every parameter's gradient (summed over each stage's CP group) equal per-sample training of every document alone
within the derived fp64 tolerance, zigzag and contiguous; the controls (positions restarting per local segment, and
gradients not summed over the CP group) fail by far."""
from __future__ import annotations

import pytest
import torch

from dist_helpers import run_gloo_workers
from pipeline_helpers import LAYERS, LENGTHS, VOCAB, documents, per_sample_reference, rel_err, tiny_llama

pytestmark = pytest.mark.full

pytest.importorskip("transformers")

ROW = 40  # tests/pipeline_cp_worker.py's pre-shard row


def tolerance() -> float:
    """As pipeline_helpers.tolerance: Higham's gamma_n = n u per reduction of length n, n the longest here:
    max(intermediate 64, the attention's keys of a micro-batch (the whole pre-shard row, ROW = 40, gathered over
    the CP group), vocab 97) = 97, over 4 * LAYERS + 2 sub-layers forward and backward, twice for two runs.
    The CP all-reduce of a gradient adds one term per CP rank (2), well inside n."""
    n = max(64, ROW, VOCAB)
    return 2 * (4 * LAYERS + 2) * n * 2.0 ** -53


def test_pipeline_with_cp_inside_each_stage_equals_per_sample(tmp_path):
    codes, logs = run_gloo_workers("pipeline_cp_worker.py", 4, tmp_path / "out", timeout=300)
    assert codes == [0] * 4, "\n".join(f"--- rank {r}\n{log[-3000:]}" for r, log in enumerate(logs))
    results = [torch.load(tmp_path / f"out.rank{r}.pt") for r in range(4)]
    patch = pytest.MonkeyPatch()
    ref_loss, ref_grads = per_sample_reference(tiny_llama("sdpa", patch), documents())
    patch.undo()
    tol = tolerance()
    assert [(r["pp_rank"], r["cp_rank"]) for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # the two stages hold every parameter once; both CP ranks of a stage hold the same ones
    assert sorted(results[0]["params"] + results[2]["params"]) == sorted(ref_grads)
    assert results[0]["params"] == results[1]["params"] and results[2]["params"] == results[3]["params"]
    errors = {}
    for run in ("zigzag-global", "contiguous-global", "zigzag-local"):
        runs = [r["runs"][run] for r in results]
        assert all(x["num_label_tokens"] == sum(n - 1 for n in LENGTHS) for x in runs)  # the step's, on every rank
        lasts = [x for r, x in zip(results, runs) if r["pp_rank"] == 1]
        assert all(len(x["losses"]) == 8 for x in lasts)
        loss = torch.tensor(sum(sum(x["losses"]) for x in lasts), dtype=torch.float64)
        for r, x in zip(results, runs):  # after the all-reduce, both CP ranks of a stage hold the same gradient
            assert sorted(x["grads"]) == sorted(r["params"])
        grads = {n: g for r, x in zip(results, runs) if r["cp_rank"] == 0 for n, g in x["grads"].items()}
        errors[run] = (rel_err(loss, ref_loss), max(rel_err(grads[n], g) for n, g in ref_grads.items()))
        if run == "zigzag-global":  # control: one CP rank's gradient alone (no all-reduce) is a part of it
            local = {n: g for r, x in zip(results, runs) if r["cp_rank"] == 0 for n, g in x["local_grads"].items()}
            assert min(rel_err(local[n], g) for n, g in ref_grads.items()) > 1e6 * tol
    print(f"tolerance {tol:.3g}; (loss, worst gradient) relative errors: {errors}")
    for run in ("zigzag-global", "contiguous-global"):
        assert errors[run][0] <= tol and errors[run][1] <= tol, (run, errors[run], tol)
    # control: positions that restart per local segment (not the global ones) break RoPE and the causal mask
    assert errors["zigzag-local"][0] > 1e6 * tol and errors["zigzag-local"][1] > 1e6 * tol, errors["zigzag-local"]
