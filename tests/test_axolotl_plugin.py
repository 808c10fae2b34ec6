"""PackkitPlugin inside axolotl 0.19 (runs where axolotl is installed: .ci/trainers/axolotl.sh; skipped elsewhere).

The proof: axolotl's trainer with the plugin trains a tiny random fp64 Llama 3 steps on 2 gloo ranks
(tests/axolotl_train_worker.py); every step's loss and all-reduced gradient equal the same samples run one at a
time (rel <= 1e-9), each rank trained the row packkit planned for it, and the LR schedule's step count is the
trainer's."""
from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("axolotl.integrations.base")
torch = pytest.importorskip("torch")

from dist_helpers import run_gloo_workers  # noqa: E402
from shared_prefix_models import fp64_norms  # noqa: E402

import axolotl_train_worker as worker  # noqa: E402

pytestmark = pytest.mark.full

WORLD = 2


@pytest.fixture(scope="module", params=["axolotl", "packkit"])
def trained(request, tmp_path_factory):
    """Both ranks' records, with axolotl's collator or the one the plugin offers (``packkit_collator: true``)."""
    out = tmp_path_factory.mktemp(f"axolotl_gloo_{request.param}")
    old = os.environ.get("AXOLOTL_COLLATOR")
    os.environ["AXOLOTL_COLLATOR"] = request.param
    try:
        codes, logs = run_gloo_workers("axolotl_train_worker.py", WORLD, out, timeout=400)
    finally:
        os.environ.pop("AXOLOTL_COLLATOR") if old is None else os.environ.__setitem__("AXOLOTL_COLLATOR", old)
    assert codes == [0] * WORLD, "\n\n".join(log[-4000:] for log in logs)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def per_sample_step(params: torch.Tensor, sample_ids: list[int]):
    """(mean token loss, its gradient) of the samples run one at a time at ``params`` (fp64)."""
    data = worker.samples()
    net = worker.model()
    torch.nn.utils.vector_to_parameters(params, net.parameters())
    net.zero_grad()
    total, tokens = 0.0, 0
    for i in sample_ids:
        labels = torch.tensor([data[i]["labels"]])
        logits = net(input_ids=torch.tensor([data[i]["input_ids"]])).logits[0, :-1]
        loss = torch.nn.functional.cross_entropy(logits, labels[0, 1:], ignore_index=-100, reduction="sum")
        loss.backward()
        total += float(loss.detach())
        tokens += int((labels[0, 1:] != -100).sum())
    return total / tokens, torch.cat([p.grad.reshape(-1) for p in net.parameters()]) / tokens


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_three_steps_equal_per_sample_runs(trained, monkeypatch):
    fp64_norms(monkeypatch)  # as the workers ran (axolotl_train_worker.model)
    r0, r1 = trained
    items = r0["items"]
    assert items == r1["items"] and r0["dp_size"] == WORLD and r0["epoch"] == 0
    lengths = {i: s["length"] for i, s in enumerate(worker.samples())}
    for step in range(3):
        params = r0["record"]["params"][step]
        assert torch.equal(params, r1["record"]["params"][step])
        # accelerate dealt item step*W + r to rank r: the row each rank trained on is the one packkit planned
        for r, rec in enumerate((r0, r1)):
            tokens = sum(lengths[i] for row in items[step * WORLD + r] for i in row)
            assert rec["record"]["rows"][step] in (tokens, -(-tokens // 64) * 64)  # packkit's collator: to 64s
        # axolotl's trainer: each rank's loss is the mean over its own label tokens (AxolotlTrainer turns the
        # global token count off for a model whose forward does not name num_items_in_batch), and DDP averages
        # the ranks' gradients
        refs = [per_sample_step(params, [i for row in items[step * WORLD + r] for i in row]) for r in range(WORLD)]
        grad = sum(g for _, g in refs) / WORLD
        for r, rec in enumerate((r0, r1)):
            assert abs(rec["record"]["loss"][step] - refs[r][0]) <= 1e-9 * refs[r][0]
            assert rel(rec["record"]["grads"][step], grad) <= 1e-9  # the all-reduced gradient, on both ranks
        # control: one sample of rank 1's row left out is seen by the check
        ids = [i for row in items[step * WORLD + 1] for i in row]
        short = (refs[0][1] + per_sample_step(params, ids[:-1])[1]) / WORLD
        assert rel(r0["record"]["grads"][step], short) > 1e-4


def test_schedule_step_count_is_the_trainers(trained):
    r0 = trained[0]
    assert r0["len"] % WORLD == 0 and r0["dataloader_len"] == r0["len"] // WORLD
    assert r0["schedule_steps"] == r0["dataloader_len"]  # one epoch, one micro-batch per step


def test_plugin_loads_by_name_and_swaps_only_the_schedule_sampler():
    from axolotl.integrations.base import load_plugin
    from axolotl.utils.dict import DictDefault
    import axolotl.utils.data.streaming as streaming
    import axolotl.utils.samplers.multipack as multipack
    import axolotl.utils.trainer as schedule

    plugin = load_plugin("packkit.integrations.axolotl.PackkitPlugin")
    original = schedule.MultipackBatchSampler
    try:
        plugin.register(DictDefault({"sample_packing": True, "base_model": "x"}))
        assert schedule.MultipackBatchSampler == plugin.schedule_sampler
        assert streaming.MultipackBatchSampler is multipack.MultipackBatchSampler  # streaming keeps axolotl's
    finally:
        schedule.MultipackBatchSampler = original


def test_schedule_sampler_counts_what_the_trainer_sampler_yields(monkeypatch):
    """In one process: the schedule's sampler (fresh RandomSampler, cfg seed) and the trainer's (args.seed, a
    different epoch) have the same length, and axolotl's own count is a different number here."""
    from axolotl.utils.dict import DictDefault
    from axolotl.utils.samplers.multipack import MultipackBatchSampler as AxolotlSampler
    from torch.utils.data import RandomSampler

    from packkit.integrations.axolotl import PackkitPlugin

    monkeypatch.setenv("WORLD_SIZE", "4")
    rng = np.random.default_rng(5)
    lengths = np.clip(np.round(np.exp(rng.normal(np.log(300), 0.9, 3000))), 8, 2048).astype(np.int64)
    plugin = PackkitPlugin()
    plugin.register(DictDefault({"sample_packing": True, "base_model": "x", "seed": 3}))
    plugin.cost = (6.0 * 4096, 1.0)
    kwargs = dict(lengths=lengths, batch_size=1, batch_max_len=2048, group_size=100_000, bin_size=200,
                  sequential=False, drop_last=True, num_processes=1, mp_start_method="fork")
    schedule = plugin.schedule_sampler(RandomSampler(range(3000)), **kwargs)
    assert schedule.dp_size == 4 and schedule.seed == 3
    trainer_side = type(schedule)(RandomSampler(range(3000)), dp_size=4, cost=plugin.cost, seed=11, **kwargs)
    trainer_side.set_epoch(2)
    assert len(schedule) == len(trainer_side) == len(list(trainer_side))
    theirs = AxolotlSampler(RandomSampler(range(3000)), **kwargs)
    assert len(theirs) != len(schedule)  # so a schedule left on axolotl's sampler would miscount


@pytest.mark.parametrize("cfg, match", [
    ({"sample_packing": False}, "sample_packing: true"),
    ({"sample_packing": True, "rl": "dpo"}, "rl="),
    ({"sample_packing": True, "reward_model": True}, "reward_model"),
    ({"sample_packing": True, "model_config_type": "mamba"}, "mamba"),
])
def test_unsupported_configs_are_refused_by_name(cfg, match):
    from axolotl.utils.dict import DictDefault

    from packkit.integrations.axolotl import PackkitPlugin

    with pytest.raises(ValueError, match=match):
        PackkitPlugin().register(DictDefault(cfg))
    with pytest.raises(ValueError, match=match):
        PackkitPlugin().get_trainer_cls(DictDefault(cfg))



def test_packkit_collator_key_joins_axolotls_schema_and_selects_the_collator():
    from axolotl.integrations.base import PluginManager
    from axolotl.integrations.config import merge_input_args
    from axolotl.utils.dict import DictDefault

    from packkit.integrations.axolotl import PackkitPlugin
    from packkit.integrations.axolotl.collator import AxolotlPackingCollator

    manager = PluginManager.get_instance()
    name = "packkit.integrations.axolotl.PackkitPlugin"
    manager.register(name)
    try:
        _, schema = merge_input_args()
        assert "packkit_collator" in schema.model_fields
    finally:
        manager.plugins.pop(name, None)
    plugin = PackkitPlugin()
    assert plugin.get_collator_cls_and_kwargs(DictDefault({"sample_packing": True})) is None  # axolotl's own
    assert plugin.get_collator_cls_and_kwargs(DictDefault({"packkit_collator": True})) == (AxolotlPackingCollator, {})
