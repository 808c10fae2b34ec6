"""packkit's dynamic-CP scheduler in megatron-core 0.16.1's hybrid-CP data path, run by Megatron's own code on the
CPU: ``HybridCPDataLoaderWrapper.__next__`` (gather lengths, schedule, unpack, reroute by all-to-all) and
``hybrid_context_parallel_forward_backward`` (per-rank groups, ``local_cp_size``, one forward per sample), one
thread per rank with in-process collectives. A fake forward joins the sample's CP group as Megatron picks it
(``create_hybrid_dp_cp_groups``) and checks every member brings the same sample: a wrong layout or order fails
or deadlocks (barrier timeout). Megatron's own scheduler runs through the same harness as the control."""
from __future__ import annotations

import contextlib
import math
import threading
import types

import numpy as np
import pytest
import torch

from packkit.integrations import megatron as pk_megatron
from packkit.integrations import megatron_cp
from packkit.planning.cp_simulate import megatron_passes, simulate_passes

pytestmark = pytest.mark.full

data_schedule = pytest.importorskip("megatron.core.datasets.data_schedule")
hybrid_cp = pytest.importorskip("megatron.core.pipeline_parallel.hybrid_cp_schedule")
from megatron.core import parallel_state  # noqa: E402
from megatron.core.pipeline_parallel import schedules  # noqa: E402
from megatron.core.rerun_state_machine import get_rerun_state_machine  # noqa: E402

MARK = 10 ** 7  # tokens = sample number * MARK + position: a received sample names itself and its slice
TIMEOUT = 30.0


class Group:  # a ProcessGroup as Megatron's data path reads it: .size(), .rank(), and its global ranks
    def __init__(self, ranks, me):
        self.ranks, self.me = tuple(ranks), me

    def size(self):
        return len(self.ranks)

    def rank(self):
        return self.ranks.index(self.me)


class Collectives:
    """all_gather / all_to_all_single / barrier among threads, one mailbox and barrier per rank set."""

    def __init__(self, world):
        self.world, self.lock, self.sets = world, threading.Lock(), {}

    def _set(self, ranks):
        with self.lock:
            if ranks not in self.sets:
                self.sets[ranks] = (threading.Barrier(len(ranks), timeout=TIMEOUT), {})
            return self.sets[ranks]

    def exchange(self, group, value):
        """Every member's ``value``, in group rank order."""
        barrier, box = self._set(group.ranks)
        box[group.me] = value
        barrier.wait()
        out = [box[r] for r in group.ranks]
        barrier.wait()
        return out

    def namespace(self, me):
        def all_gather(tensor_list, tensor, group=None):
            for dst, src in zip(tensor_list, self.exchange(group, tensor.clone())):
                dst.copy_(src)

        def all_to_all_single(output, input, output_split_sizes, input_split_sizes, group=None):
            parts = self.exchange(group, list(torch.split(input, input_split_sizes)))
            output.copy_(torch.cat([p[group.rank()] for p in parts]))

        def barrier(group=None, **_):
            self.exchange(Group(range(self.world), me.rank), None)

        return types.SimpleNamespace(all_gather=all_gather, all_to_all_single=all_to_all_single, barrier=barrier,
                                     broadcast=lambda *a, **k: None, get_process_group_ranks=lambda g: list(g.ranks))


class TorchProxy:  # the `torch` of Megatron's two modules: CPU tensors, the threads' collectives
    def __init__(self, collectives):
        self._collectives = collectives
        self.cuda = types.SimpleNamespace(current_device=lambda: "cpu")

    @property
    def distributed(self):
        return self._collectives.namespace(LOCAL)

    def __getattr__(self, name):
        return getattr(torch, name)

    def tensor(self, *args, device=None, **kwargs):
        return torch.tensor(*args, **kwargs)

    def empty(self, *args, device=None, **kwargs):
        return torch.empty(*args, **kwargs)


LOCAL = threading.local()


def dp_batches(dp, rng, max_len, per_rank=(2, 5)):
    """Per DP rank a list of packed samples (Megatron's THD dicts); the sample numbers they hold, with lengths."""
    batches, lengths, u = [], {}, 0
    for _ in range(dp):
        batch = []
        for _ in range(int(rng.integers(*per_rank))):
            subs = [int(x) for x in rng.integers(1, max_len + 1, int(rng.integers(1, 4)))]
            tokens = torch.cat([torch.arange(n) + (u + k) * MARK for k, n in enumerate(subs)])
            lengths.update({u + k: n for k, n in enumerate(subs)})
            u += len(subs)
            cu = torch.tensor([0, *np.cumsum(subs)], dtype=torch.int32)
            batch.append({"tokens": tokens, "labels": tokens + 1, "cu_seqlens": cu})
        batches.append(batch)
    return batches, lengths


def run_megatron(monkeypatch, world, cp, batches, cap):
    """Megatron's wrapper and schedule on every rank (static CP ``cp``, DP the rest, TP 1); per rank the samples
    its forwards saw: ``(sample number, length, local_cp_size, CP group ranks)``, and rank 0's sample_id_groups."""
    collectives = Collectives(world)
    proxy = TorchProxy(collectives)
    monkeypatch.setattr(data_schedule, "torch", proxy)
    monkeypatch.setattr(hybrid_cp, "torch", proxy)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(parallel_state, "create_group", lambda ranks, **_: tuple(ranks))
    monkeypatch.setattr(parallel_state, "get_data_parallel_rank", lambda with_context_parallel=False: LOCAL.rank)
    monkeypatch.setattr(parallel_state, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(parallel_state, "get_tensor_model_parallel_src_rank", lambda: 0)
    monkeypatch.setattr(parallel_state, "get_tensor_model_parallel_group", lambda: None)
    monkeypatch.setattr(parallel_state, "get_data_parallel_group", lambda with_context_parallel=False: None)
    seen = {r: [] for r in range(world)}
    groups_of = {r: parallel_state.create_hybrid_dp_cp_groups(r, list(range(world)), None) for r in range(world)}

    def forward_step(forward_step_func, data_iterator, *args, **kwargs):
        sample = next(data_iterator)
        k = int(sample["local_cp_size"])
        ranks = (LOCAL.rank,) if k == 1 else tuple(range(world)) if k == world else groups_of[LOCAL.rank][k]
        tokens = sample["tokens"]
        u = int(tokens[0]) // MARK
        assert torch.equal(tokens, torch.arange(len(tokens)) + u * MARK) and torch.equal(sample["labels"], tokens + 1)
        # Megatron's CP attention is a collective over this group: every member must bring this sample now.
        assert set(collectives.exchange(Group(ranks, LOCAL.rank), u)) == {u}
        seen[LOCAL.rank].append((u, len(tokens), k, ranks))
        return None, torch.tensor(len(tokens))

    monkeypatch.setattr(schedules, "forward_step", forward_step)
    config = types.SimpleNamespace(max_seqlen_per_dp_cp_rank=cap)
    out, errors = {}, []

    def rank_main(rank):
        LOCAL.rank = rank
        try:
            cp_idx, dp_idx = rank % cp, rank // cp
            pg = types.SimpleNamespace(dp_cp=Group(range(world), rank), tp=Group([rank], rank),
                                       dp=Group(range(cp_idx, world, cp), rank))
            wrapper = data_schedule.HybridCPDataLoaderWrapper(iter([batches[dp_idx]]), config, pg)
            out[rank] = type(wrapper.cp_balancing_scheduler)
            hybrid_cp.hybrid_context_parallel_forward_backward(
                None, wrapper, None, 1, None, None, [], config, False, True, True, contextlib.nullcontext, 0,
                lambda first, only, cond: cond, None)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append((rank, exc))

    get_rerun_state_machine()  # RerunDataIterator's state, made once here (threads would race to make it)
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(4 * TIMEOUT)
    causes = [e for _, e in errors if not isinstance(e, threading.BrokenBarrierError)] or [e for _, e in errors]
    if causes:
        raise causes[0]  # the first rank's own error; the others then wait at a broken barrier
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return seen, set(out.values())


def check_layout(seen, lengths, world, cap):
    """Every sample ran exactly once on each rank of one CP set: the aligned block Megatron has a group for,
    of its local_cp_size; its local tokens within the cap."""
    ranks_of = {}
    for rank, runs in seen.items():
        for u, n, k, ranks in runs:
            assert n == lengths[u] and rank in ranks and len(ranks) == k
            assert (n if k == 1 else 2 * math.ceil(n / (2 * k))) <= cap, (u, n, k)
            ranks_of.setdefault(u, []).append((rank, ranks))
    assert sorted(ranks_of) == sorted(lengths), "every sample exactly once"
    for u, runs in ranks_of.items():
        block = runs[0][1]
        assert sorted(r for r, _ in runs) == list(block) and all(b == block for _, b in runs), (u, runs)
        k = len(block)
        assert k == world or block[0] % k == 0 and block == tuple(range(block[0], block[0] + k))


@pytest.fixture
def packkit_scheduler():
    original = data_schedule.BalancedCPScheduler
    megatron_cp.install()
    yield
    megatron_cp.uninstall()
    assert data_schedule.BalancedCPScheduler is original is hybrid_cp.BalancedCPScheduler


@pytest.mark.parametrize("world, cp, cap, seed", [(8, 1, 4096, 0), (8, 2, 2048, 1), (4, 1, 8192, 2),
                                                   (8, 1, 1024, 3), (6, 1, 4096, 4)])
@pytest.mark.parametrize("scheduler", ["megatron", "packkit"])
def test_megatron_runs_the_schedule(monkeypatch, request, world, cp, cap, seed, scheduler):
    if scheduler == "packkit":
        request.getfixturevalue("packkit_scheduler")
    rng = np.random.default_rng(seed)
    batches, lengths = dp_batches(world // cp, rng, max_len=min(4 * cap, 12000))
    try:
        seen, kinds = run_megatron(monkeypatch, world, cp, batches, cap)
    except AssertionError as exc:
        if scheduler == "megatron" and "cannot reditribute" in str(exc):
            pytest.skip("Megatron's own scheduler refuses this batch")
        raise
    except KeyError as exc:  # 6 ranks: groups of 2 and 6 only, yet BalancedCPScheduler may pick 4
        if scheduler == "megatron" and world & (world - 1):
            pytest.skip(f"Megatron's own scheduler picked CP {exc} on {world} ranks: it has no group that size")
        raise
    expected = "PackkitCPScheduler" if scheduler == "packkit" else "BalancedCPScheduler"
    assert {k.__name__ for k in kinds} == {expected}
    check_layout(seen, lengths, world, cap)


def test_few_samples_fill_every_rank(monkeypatch, packkit_scheduler):
    """Fewer samples than ranks: Megatron's last group needs a sample on every rank (else IndexError)."""
    samples = [{"tokens": torch.arange(n) + u * MARK, "labels": torch.arange(n) + u * MARK + 1,
                "cu_seqlens": torch.tensor([0, n], dtype=torch.int32)} for u, n in enumerate([300, 5000, 40])]
    seen, _ = run_megatron(monkeypatch, 8, 4, [samples[:2], samples[2:]], 4096)   # DP 2 x static CP 4
    assert all(seen[r] for r in range(8))
    check_layout(seen, {0: 300, 1: 5000, 2: 40}, 8, 4096)


def test_install_is_restored_exactly():
    original = data_schedule.BalancedCPScheduler
    megatron_cp.install(cost="attention", cp_comm=0.0)
    megatron_cp.install(pass_overhead=0.02)          # twice: settings replaced, the original still saved once
    assert data_schedule.BalancedCPScheduler.__name__ == "PackkitCPScheduler" and megatron_cp.installed()
    assert data_schedule.BalancedCPScheduler(4096, Group(range(8), 0)).model["pass_overhead"] == 0.02
    megatron_cp.uninstall()
    assert data_schedule.BalancedCPScheduler is original and not megatron_cp.installed()
    megatron_cp.uninstall()                          # a no-op now
    assert data_schedule.BalancedCPScheduler is original
    assert pk_megatron.install_cp_scheduler is megatron_cp.install
    with pytest.raises(TypeError, match="unknown arguments"):
        megatron_cp.install(cp_size=2)
    with pytest.raises(ValueError, match="cp_comm"):
        megatron_cp.install(cp_comm=-1.0)
    assert data_schedule.BalancedCPScheduler is original


def test_errors_name_the_parameter():
    with pytest.raises(TypeError, match="dp_cp_group"):
        megatron_cp.PackkitCPScheduler(4096, 8)
    with pytest.raises(ValueError, match="max_seq_len_per_rank"):
        megatron_cp.PackkitCPScheduler(0, Group(range(8), 0))
    s = megatron_cp.PackkitCPScheduler(4096, Group(range(8), 0))
    with pytest.raises(ValueError, match="sample_id"):
        s.get_groups_and_subsamples([(1, 10), (1, 20)], None)
    with pytest.raises(TypeError, match="sample_id_seqlens"):
        s.get_groups_and_subsamples([(1, "x")], None)
    with pytest.raises(ValueError, match="sample_id_seqlens: sample 7 "):   # needs 64 ranks at this cap
        s.get_groups_and_subsamples([(3, 10), (7, 200_000)], None)
    with pytest.raises(ValueError, match="max_seq_len_per_rank"):
        megatron_cp.PackkitCPScheduler(2**64, Group(range(8), 0))
    with pytest.raises(ValueError, match="cp_comm"):  # pass times that overflow: refused when built
        megatron_cp.PackkitCPScheduler(4096, Group(range(8), 0), cp_comm=1e308)
    assert s.get_groups_and_subsamples([], None) == ([], [])


A, B, K, O = 1.97e-9, 1.05e-4, 3.15e-5, 0.01
MODEL = dict(cost=(B, A), cp_comm=K, pass_overhead=O)


def workload(kind, n, rng):
    if kind == "long-tail":
        return np.clip(rng.lognormal(math.log(2048), 1.2, n), 64, 65536).astype(np.int64)
    return np.clip(rng.lognormal(math.log(1200), 0.8, n), 16, 32768).astype(np.int64)


def as_megatron_runs_it(lengths, sample_id_groups, world):
    """Makespan with a barrier at each group's end (Megatron's schedule), each id its own pass."""
    return sum(simulate_passes(lengths, megatron_cp.schedule_passes(g), world, **MODEL)["makespan"]
               for g in sample_id_groups)


@pytest.mark.parametrize("kind", ["long-tail", "short"])
@pytest.mark.parametrize("n, world, cap, seed", [(64, 8, 8192, 0), (16, 8, 8192, 1), (256, 32, 8192, 2),
                                                 (40, 32, 16384, 3), (128, 12, 16384, 4), (3, 16, 16384, 5)])
def test_no_slower_than_megatrons_scheduler(kind, n, world, cap, seed):
    lengths = workload(kind, n, np.random.default_rng([seed, n, world]))
    pairs = [(i, int(x)) for i, x in enumerate(lengths)]
    try:
        _, theirs = hybrid_cp.BalancedCPScheduler(cap, Group(range(world), 0)).get_groups_and_subsamples(pairs, None)
    except AssertionError:
        pytest.skip("Megatron's own scheduler refuses this batch")
    _, ours = megatron_cp.PackkitCPScheduler(cap, Group(range(world), 0), **MODEL).get_groups_and_subsamples(pairs)
    assert len(ours) == 1 and all(ours[0])
    mine = as_megatron_runs_it(lengths, ours, world)
    # Megatron's at its best (no barrier between its groups) and as it runs (a barrier at each group's end)
    best = simulate_passes(lengths, megatron_passes(theirs), world, **MODEL)["makespan"]
    assert mine <= best * (1 + 1e-9) <= as_megatron_runs_it(lengths, theirs, world) * (1 + 1e-9), (mine, best)


def test_schedule_passes_finds_a_deadlock():
    with pytest.raises(ValueError, match="deadlock"):
        megatron_cp.schedule_passes([[0, 1], [1, 0]])
    assert megatron_cp.schedule_passes([[0, 1], [0], [1]]) == [([0, 1], [0]), ([0, 2], [1])]
