"""Packed micro-batches through torch.distributed.pipelining for real (issue 61 part 3): 2 and 4 gloo processes,
Schedule1F1B and ScheduleInterleaved1F1B (two stages per rank), one step of plan_pipeline's micro-batches on a
tiny fp64 Llama; the step's loss and every parameter's gradient equal per-sample training (each document alone,
token losses summed over the step's label tokens) within the derived fp64 tolerance
(pipeline_helpers.tolerance). The workers are tests/pipeline_run_worker.py; the same stage modules run one after
another in one process first (with the control that moves a boundary)."""
from __future__ import annotations

import pytest
import torch

import packkit
from dist_helpers import run_gloo_workers
from packkit.pipeline import plan_pipeline
from packkit.training.pipeline import LlamaStage, llama_stages, pipeline_microbatches, split_layers
from pipeline_helpers import CAPACITY, LAYERS, LENGTHS, documents, per_sample_reference, rel_err, tiny_llama, tolerance

pytestmark = pytest.mark.full


@pytest.fixture(scope="module")
def reference():
    patch = pytest.MonkeyPatch()
    model = tiny_llama("sdpa", patch)
    yield per_sample_reference(model, documents())
    patch.undo()


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("schedule", ["1f1b", "interleaved"])
def test_pipelined_step_equals_per_sample(world, schedule, reference, tmp_path, monkeypatch):
    monkeypatch.setenv("PACKKIT_PP_SCHEDULE", schedule)
    codes, logs = run_gloo_workers("pipeline_run_worker.py", world, tmp_path / "out", timeout=240)
    assert codes == [0] * world, "\n".join(f"--- rank {r}\n{log[-3000:]}" for r, log in enumerate(logs))
    results = [torch.load(tmp_path / f"out.rank{r}.pt") for r in range(world)]
    ref_loss, ref_grads = reference
    names = [n for r in results for n in r["params"]]
    assert sorted(names) == sorted(ref_grads)  # every parameter on exactly one stage
    grads = {n: g for r in results for n, g in r["grads"].items()}
    assert sorted(grads) == sorted(ref_grads)  # and every one got a gradient
    last = next(r for r in results if r["loss"] is not None)
    tol = tolerance(documents())
    assert len(last["losses"]) == last["microbatches"]
    assert rel_err(last["loss"], ref_loss) <= tol, (float(last["loss"]), float(ref_loss))
    worst = max(rel_err(grads[n], g) for n, g in ref_grads.items())
    assert worst <= tol, worst
    # control: the mean of per-micro-batch means (a schedule's scale_grads=True over mean losses) is not the
    # per-sample mean: the normalisation is what makes the step exact
    v = 2 if schedule == "interleaved" else 1
    plan = plan_pipeline(LENGTHS, CAPACITY, pp_size=world, num_microbatches=8, schedule=schedule, virtual_stages=v)
    batch = pipeline_microbatches(plan.microbatches[0], documents())
    counts = (batch.labels[:, 1:] != -100).sum(1).double()
    mean_of_means = float((torch.tensor(last["losses"]) * batch.num_label_tokens / counts).mean())
    assert rel_err(torch.tensor(mean_of_means), ref_loss) > 1e6 * tol


def run_stages(model, batch, stages, cu=None):
    loss_fn, total = batch.loss_fn(), torch.zeros((), dtype=torch.float64)
    model.zero_grad(set_to_none=True)
    for i in range(batch.num_microbatches):
        h = batch.input_ids[i:i + 1]
        for stage in stages:
            h = stage(h, batch.position_ids[i:i + 1], batch.cu_seq_lens[i:i + 1] if cu is None else cu[i])
        loss = loss_fn(h, batch.labels[i:i + 1])
        loss.backward()
        total += loss.detach()
    return total, {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_the_schedule_refuses_the_batch_wide_form(tmp_path, monkeypatch):
    """torchtitan PR 4098 through the real schedule: a batch-wide cu_seqlens passed to ``schedule.step`` is chunked
    along dim 0 by torch, and the first stage refuses its chunk by name (its peer sees the connection close)."""
    monkeypatch.setenv("PACKKIT_PP_SCHEDULE", "1f1b")
    monkeypatch.setenv("PACKKIT_PP_FEED", "batch-wide")
    codes, logs = run_gloo_workers("pipeline_run_worker.py", 2, tmp_path / "out", timeout=180)
    assert codes[0] != 0 and codes[1] != 0 and "[timed out]" not in logs[1], logs[1][-2000:]
    refusal = next(line for line in logs[0].splitlines() if "ValueError: cu_seq_lens" in line)
    assert "starts at" in refusal and "pipeline_microbatches" in refusal and "4098" in refusal
    assert not list(tmp_path.glob("out.rank*.pt"))  # no step completed


def test_stages_in_one_process_equal_per_sample():
    """The same stage modules the gloo run wraps, run in order: packed == per-sample within the derived fp64
    tolerance; a control moving one boundary by a token is far outside it (the comparison can fail)."""
    plan = plan_pipeline(LENGTHS, CAPACITY, pp_size=2, num_microbatches=8)
    batch = pipeline_microbatches(plan.microbatches[0], documents())
    patch = pytest.MonkeyPatch()
    model = tiny_llama(packkit.register_varlen_attention(), patch)
    stages = [LlamaStage(model, a, b) for a, b in split_layers(LAYERS, 4)]
    loss, grads = run_stages(model, batch, stages)
    ref_loss, ref_grads = per_sample_reference(model, documents())
    tol = tolerance(documents())
    assert rel_err(loss, ref_loss) <= tol
    assert max(rel_err(grads[n], g) for n, g in ref_grads.items()) <= tol
    moved = batch.cu_seq_lens.clone()
    i = next(i for i, row in enumerate(plan.microbatches[0]) if len(row) > 1)
    moved[i, 1] += 1  # a boundary one token late: the wrong documents (the guard sees the positions disagree)
    cu = [moved[j:j + 1] for j in range(batch.num_microbatches)]
    with pytest.raises(ValueError, match="restart"):
        run_stages(model, batch, stages, cu=cu)
    with pytest.MonkeyPatch.context() as off:  # guard off: it runs, and the comparison fails by far
        off.setattr(llama_stages, "check_microbatch", lambda c, t, p=None: c.reshape(-1).numpy().astype("int64"))
        bad, _ = run_stages(model, batch, stages, cu=cu)
    assert rel_err(bad, ref_loss) > 1e6 * tol
    patch.undo()
