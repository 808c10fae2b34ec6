"""Megatron-Core 0.16.1 hybrid-CP drop-in: :class:`PackkitCPScheduler` has ``BalancedCPScheduler``'s constructor
and ``get_groups_and_subsamples``, planned by :func:`packkit.plan_context_parallel`; :func:`install` makes
``HybridCPDataLoaderWrapper`` build it (``megatron.core.datasets.data_schedule`` looks the name up there).

What Megatron's consumers need from ``(groups, sample_id_groups)`` (``data_schedule.py``,
``hybrid_cp_schedule.hybrid_context_parallel_forward_backward``, ``utils.get_batch_on_this_hybrid_cp_rank``):

* a sample's CP set is the ranks listing it in one group, and must be the aligned block of that size Megatron
  built a communicator for (``parallel_state.create_hybrid_dp_cp_groups``: powers of two up to half the DPxCP
  ranks, plus all of them): packkit plans with ``cp_sizes="pow2"`` and at most the largest such size;
* every rank needs at least one sample in the last group (it runs ``sample_ids_this_group[-1]``): ranks the
  plan leaves idle get work (:func:`fill_idle_ranks`: a pass widened, as Megatron widens, or moved there);
* each sample is its own forward/backward (no packing in 0.16.1): a plan's pass becomes its samples back to
  back on the same ranks, each paying the per-pass overhead. One group, so no barrier: every rank runs its ids
  in one global order, which cannot deadlock.
"""
from __future__ import annotations

import numpy as np

from ..packing.checks import check_int
from ..planning.arg_rules import MAX_INT, Int, check_args
from ..planning.context_parallel import plan_context_parallel
from ..planning.planner import _cost_model

# A 7B dense model on H100 (benchmarks/bench_long_context.py's defaults): seconds per token and per token^2, CP
# ring seconds per token at 50 GB/s, seconds per forward/backward. Only their ratios change a plan.
DEFAULT_MODEL = {"cost": (1.05e-4, 1.97e-9), "cp_comm": 3.15e-5, "pass_overhead": 0.01}
_DATA_SCHEDULE = "megatron.core.datasets.data_schedule"
MAX_CAP = 1 << 62  # the planner's per-rank caps are int64


def megatron_max_cp(world_size: int) -> int:
    """The largest CP size packkit may give a sample on ``world_size`` DPxCP ranks: the whole world when it is a
    power of two, else the largest power of two Megatron builds groups for (``2 ** (floor(log2 N) - 1)``) that
    divides it (its blocks ``ranks[i:i+c]`` are then all whole)."""
    world = check_int(world_size, "world_size", 1)
    if world & (world - 1) == 0:
        return world
    c = 1 << (world.bit_length() - 2)
    while world % c:
        c //= 2
    return c


def _parent(start: int, size: int, world: int, max_cp: int):
    """The next larger block Megatron has a group for that holds ``[start, start + size)``; None at the world."""
    if size >= world:
        return None
    if 2 * size <= max_cp:
        return start - start % (2 * size), 2 * size
    return 0, world


def schedule_passes(sample_id_group) -> list:
    """One group of ``sample_id_groups`` as ``[(ranks, [id]), ...]`` in an order Megatron's ranks can run it: an
    id's CP set is the ranks listing it, each rank runs its ids in list order, and an id starts once it is next on
    all of them. ValueError if the lists deadlock (two ranks wait for each other)."""
    members: dict = {}
    for rank, ids in enumerate(sample_id_group):
        for i in ids:
            members.setdefault(i, []).append(rank)
    heads = [0] * len(sample_id_group)
    ready = [i for i, ranks in members.items() if all(sample_id_group[r][heads[r]] == i for r in ranks)]
    out = []
    while ready:
        i = ready.pop()
        out.append((members[i], [i]))
        for r in members[i]:
            heads[r] += 1
            if heads[r] < len(sample_id_group[r]):
                nxt = sample_id_group[r][heads[r]]
                if all(heads[q] < len(sample_id_group[q]) and sample_id_group[q][heads[q]] == nxt
                       for q in members[nxt]) and nxt not in ready:
                    ready.append(nxt)
    if len(out) != len(members):
        raise ValueError(f"sample_id_groups deadlock: {len(members) - len(out)} ids never reach the head of "
                         "every rank listing them")
    return out


def megatron_makespan(passes, lengths, costs, world: int, cp_comm: float, overhead: float) -> float:
    """Makespan of ``passes`` (``[(start, size, seqs)]``) run as Megatron runs them, each sample its own pass of
    ``overhead + t(s, c)`` (``packkit.planning.cp_simulate``'s model; a pass's samples are back to back on the same
    ranks, so their sum is its time), each rank in list order, a pass starting when all its ranks are free."""
    if not passes:
        return 0.0
    sizes = np.array([c for _, c, _ in passes], dtype=np.int64)
    counts = np.array([len(q) for _, _, q in passes], dtype=np.int64)
    seqs = np.concatenate([np.asarray(q, dtype=np.int64) for _, _, q in passes])
    cs = np.repeat(sizes, counts).astype(np.float64)  # each sequence's CP size
    t = np.where(cs == 1, costs[seqs], (costs[seqs] + cp_comm * (cs - 1) * lengths[seqs]) / cs) + overhead
    offsets = np.minimum(np.concatenate([[0], np.cumsum(counts)[:-1]]), max(t.size - 1, 0))  # an empty pass: 0
    durations = np.where(counts > 0, np.add.reduceat(t, offsets) if t.size else 0.0, 0.0).tolist()
    free = np.zeros(world)
    for (s, c, _), d in zip(passes, durations):
        if c == 1:
            free[s] += d
        else:
            free[s:s + c] = free[s:s + c].max() + d
    return float(free.max())


def _fits(lengths, seqs, c: int, cap: int) -> bool:
    local = lengths[seqs] if c == 1 else 2 * -(-lengths[seqs] // (2 * c))
    return int(np.max(local, initial=0)) <= cap  # Megatron runs each sample alone: the cap is per sample


def _idle_blocks(busy: np.ndarray, world: int, max_cp: int) -> list:
    """Aligned idle blocks ``(start, size)`` of every size Megatron has groups for, none inside a larger one."""
    out = []
    sizes = [c for c in (world, *(1 << k for k in range(max_cp.bit_length() - 1, -1, -1))) if c <= world]
    for c in dict.fromkeys(sizes):
        for s in range(0, world - c + 1, c):
            if not busy[s:s + c].any() and not any(t <= s and s + c <= t + k for t, k in out):
                out.append((s, c))
    return out


def fill_idle_ranks(passes, lengths, world: int, max_cp: int, cap: int, timer) -> list:
    """``passes`` (``[(start, size, seqs)]``) with every rank in at least one (Megatron's consumer needs it). Each
    step takes, among the moves that leave fewer ranks idle, the one with the shortest ``timer(passes)`` (each
    sample its own pass, as Megatron runs them): widen a pass to the next block Megatron has a group for, move a
    pass to a wider idle block, or move one sequence of a pass of several to one. Without such a move the widest
    pass widens one step."""
    passes = [(int(s), int(c), list(q)) for s, c, q in passes]
    lengths = np.asarray(lengths, dtype=np.int64)
    while passes:
        busy = np.zeros(world, dtype=bool)
        for s, c, _ in passes:
            busy[s:s + c] = True
        idle = int((~busy).sum())
        if not idle:
            break
        blocks = _idle_blocks(busy, world, max_cp)
        trials = []
        for p, (s, c, seqs) in enumerate(passes):
            rest = passes[:p] + passes[p + 1:]
            parent = _parent(s, c, world, max_cp)
            if parent is not None and (~busy[parent[0]:parent[0] + parent[1]]).any():
                trials.append(passes[:p] + [(*parent, seqs)] + passes[p + 1:])
            for bs, bc in blocks:
                if bc > c and _fits(lengths, seqs, bc, cap):
                    trials.append(passes[:p] + [(bs, bc, seqs)] + passes[p + 1:])
                if len(seqs) > 1:
                    i = max(seqs, key=lambda q: lengths[q])  # the longest: the most time moved off this pass
                    if _fits(lengths, [i], bc, cap):
                        kept = [q for q in seqs if q != i]
                        trials.append(rest[:p] + [(s, c, kept)] + rest[p:] + [(bs, bc, [i])])
        best, best_key = None, None
        for trial in trials:
            covered = np.zeros(world, dtype=bool)
            for s, c, _ in trial:
                covered[s:s + c] = True
            left = int((~covered).sum())
            if left >= idle:
                continue
            key = (timer(trial), left)
            if best_key is None or key < best_key:
                best, best_key = trial, key
        if best is None:
            p = max(range(len(passes)), key=lambda q: passes[q][1])
            s, c, seqs = passes[p]
            best = passes[:p] + [(*_parent(s, c, world, max_cp), seqs)] + passes[p + 1:]
        passes = best
    return passes


class PackkitCPScheduler:
    """``BalancedCPScheduler(max_seq_len_per_rank, dp_cp_group)`` planned by packkit: ``dp_cp_group`` is read
    only for ``.size()`` (as Megatron's); ``cost`` / ``cp_comm`` / ``pass_overhead`` are
    :func:`packkit.plan_context_parallel`'s (default: a 7B dense model on H100, ``DEFAULT_MODEL``). The last plan
    is kept as ``self.plan`` (its sequence indices count the samples it planned, in the order given: all of them
    but, on a world that is not a power of two, those wider than ``max_cp``)."""

    def __init__(self, max_seq_len_per_rank: int, dp_cp_group, *, cost=DEFAULT_MODEL["cost"],
                 cp_comm=DEFAULT_MODEL["cp_comm"], pass_overhead=DEFAULT_MODEL["pass_overhead"]):
        self.max_seq_len_per_rank = check_int(max_seq_len_per_rank, "max_seq_len_per_rank", 1)
        if self.max_seq_len_per_rank > MAX_CAP:
            raise ValueError(f"max_seq_len_per_rank must be in [1, 2**62], got {max_seq_len_per_rank}")
        if not callable(getattr(dp_cp_group, "size", None)):
            raise TypeError(f"dp_cp_group must have .size() (a ProcessGroup), got {type(dp_cp_group).__name__}")
        self.total_hdp_gpus = check_int(dp_cp_group.size(), "dp_cp_group.size()", 1)
        self.model = {"cost": cost, "cp_comm": cp_comm, "pass_overhead": pass_overhead}
        self.max_cp = megatron_max_cp(self.total_hdp_gpus)
        self.plan = None
        # The flags checked now, on two full-cap samples (pass times that overflow are refused by name), not at
        # Megatron's first batch.
        plan_context_parallel([self.max_seq_len_per_rank] * 2, self.total_hdp_gpus, self.max_seq_len_per_rank,
                              **self.model)

    def _plan(self, lengths: np.ndarray, ids: list) -> list:
        """The better, run as Megatron runs it (one pass per sample), of two plans: packkit's model as given, and
        with the per-pass overhead folded into every sequence's cost (Megatron pays it per sample, not per pass).
        On a world that is not a power of two, samples wider than ``max_cp`` run first on all ranks (Megatron's
        one group of that size)."""
        world, cap, o = self.total_hdp_gpus, self.max_seq_len_per_rank, float(self.model["pass_overhead"])
        a, b, item_costs = _cost_model(self.model["cost"])
        costs = item_costs(lengths) if item_costs is not None else a * lengths + b * lengths.astype(np.float64) ** 2
        order = np.argsort(lengths, kind="stable")

        def by_length(x):  # each length's cost looked up among the given lengths (a callable cost is called once)
            return costs[order][np.searchsorted(lengths[order], np.asarray(x))] + o

        def local(c):  # each sample's local tokens at CP size c (zigzag padded)
            return 2 * -(-lengths // (2 * c)) if c > 1 else lengths

        too_long = np.flatnonzero(local(world) > cap)  # Megatron always has the whole DPxCP group
        if too_long.size:
            i = int(too_long[0])
            raise ValueError(f"sample_id_seqlens: sample {ids[i]} (length {int(lengths[i])}) needs more than the "
                             f"{world} DPxCP ranks at max_seq_len_per_rank {cap}")
        wide = local(self.max_cp) > cap if self.max_cp < world else np.zeros(len(lengths), dtype=bool)
        first = [(0, world, [i]) for i in np.flatnonzero(wide).tolist()]
        rest = np.flatnonzero(~wide)
        self.plan, best = None, (None, first)
        if not rest.size:
            return first
        folded = dict(self.model, cost=by_length, pass_overhead=0.0)
        cp_comm = float(self.model["cp_comm"])

        def timer(passes):
            return megatron_makespan(passes, lengths, costs, world, cp_comm, o)

        for model in (self.model, folded) if o > 0 else (self.model,):
            plan = plan_context_parallel(lengths[rest], world, cap, cp_sizes="pow2", max_cp_size=self.max_cp,
                                         **model)
            passes = first + [(r.start, len(r), rest[q].tolist()) for r, q in plan.passes]
            passes = fill_idle_ranks(passes, lengths, world, self.max_cp, cap, timer)
            t = timer(passes)
            if best[0] is None or t < best[0]:
                best, self.plan = (t, passes), plan
        return best[1]

    def get_groups_and_subsamples(self, sample_id_seqlens, config=None):
        """``[(sample_id, seq_len), ...]`` -> ``(groups, sample_id_groups)``: one group, per rank the lengths / ids
        it runs in order (``config`` is unused, as in Megatron)."""
        pairs = _sample_pairs(sample_id_seqlens)
        ids = [i for i, _ in pairs]
        if len(set(ids)) != len(ids):
            raise ValueError("sample_id_seqlens: every sample_id must appear once")
        if not pairs:
            return [], []
        lengths = np.array([n for _, n in pairs], dtype=np.int64)
        world = self.total_hdp_gpus
        passes = self._plan(lengths, ids)
        sample_ids = [[] for _ in range(world)]
        for s, c, seqs in passes:
            for r in range(s, s + c):
                sample_ids[r].extend(ids[i] for i in seqs)
        length_of = dict(pairs)
        return [[[length_of[i] for i in rank] for rank in sample_ids]], [sample_ids]


def _sample_pairs(sample_id_seqlens) -> list:
    """``[(sample_id, seq_len), ...]`` under the declared rules (``planning.arg_rules.Int``): ints only (Python,
    numpy or 0-d host tensors), never a bool, a float (3.7 is not 3) or a string ("7" is not 7); ids and lengths
    in [0, 2**63 - 1]; a meta tensor named."""
    try:
        items = list(sample_id_seqlens)
    except TypeError:
        raise TypeError("sample_id_seqlens must be a list of (sample_id, seq_len) pairs of ints, got "
                        f"{type(sample_id_seqlens).__name__}") from None
    pairs = []
    for k, pair in enumerate(items):
        if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise TypeError(f"sample_id_seqlens[{k}] must be a (sample_id, seq_len) pair of ints, got {pair!r:.60}")
        pairs.append(check_args(Int(f"sample_id_seqlens[{k}] sample_id", 0, MAX_INT),
                                Int(f"sample_id_seqlens[{k}] seq_len", 0, MAX_INT), values=tuple(pair)))
    return pairs


_saved: list = []


def install(**planner_kwargs) -> None:
    """Make Megatron's ``HybridCPDataLoaderWrapper`` plan with packkit (``planner_kwargs``:
    :class:`PackkitCPScheduler`'s ``cost`` / ``cp_comm`` / ``pass_overhead``). :func:`uninstall` restores
    Megatron's scheduler; installing twice replaces the settings."""
    import importlib

    unknown = set(planner_kwargs) - set(DEFAULT_MODEL)
    if unknown:
        raise TypeError(f"install() got unknown arguments {sorted(unknown)}; allowed: {sorted(DEFAULT_MODEL)}")
    try:
        module = importlib.import_module(_DATA_SCHEDULE)
    except ModuleNotFoundError as exc:  # pragma: no cover - exercised only without Megatron-Core
        raise ModuleNotFoundError("install() patches Megatron-Core's hybrid-CP data path: pip install "
                                  "'packkit[megatron]'", name=exc.name) from exc
    PackkitCPScheduler(1, _Size(1), **planner_kwargs)  # refuse bad flags now, not at Megatron's first batch

    class _Installed(PackkitCPScheduler):
        def __init__(self, max_seq_len_per_rank, dp_cp_group):
            super().__init__(max_seq_len_per_rank, dp_cp_group, **planner_kwargs)

    _Installed.__name__ = _Installed.__qualname__ = "PackkitCPScheduler"
    if not _saved:
        _saved.append(module.BalancedCPScheduler)
    module.BalancedCPScheduler = _Installed


def uninstall() -> None:
    """Restore the ``BalancedCPScheduler`` Megatron's data path had before :func:`install` (no-op if none)."""
    if _saved:
        import importlib

        importlib.import_module(_DATA_SCHEDULE).BalancedCPScheduler = _saved.pop()


def installed() -> bool:
    return bool(_saved)


class _Size:
    def __init__(self, n):
        self.n = n

    def size(self):
        return self.n
