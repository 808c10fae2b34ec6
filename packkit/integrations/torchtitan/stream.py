"""The document stream behind packkit's torchtitan dataloader: whole documents, planned by best fit into rows of
``seq_len`` tokens, with every data-parallel step balanced across the dp ranks, resumable exactly.

torchtitan's own dataset concatenates tokens and cuts every ``seq_len``: documents are split at row ends and
nothing balances the ranks. Here every dp rank reads the same source in the same order and plans the same
buffer (``packkit.plan(..., algorithm="ogbfd", dp_size=dp_world_size * local_batch_size, cost=cost)``), so the
ranks agree on every step with no communication; rank r keeps bins ``r*B .. r*B+B-1`` of each step. A document
of ``n`` tokens is torchtitan's ``n - 1`` input/label pairs (inputs ``t[:-1]``, labels ``t[1:]``, positions
restarting at 0), so its last token never predicts the next document's first.

Step order: each buffer's steps are yielded in a random order drawn from ``(seed, epoch, buffer start)``
(``shuffle=True``, the default) or in the source order of each step's longest document (``shuffle=False``),
never in the planner's order, which runs from the longest documents to the shortest (a length curriculum that
would repeat every buffer). Whole steps move, so every rank still gets its row of the same balanced step.

Resume: the state is where the current buffer began (source position), the pieces carried into it (source
positions, not tokens) and how many of its steps were yielded; the buffer is rebuilt and replanned (the
planner is deterministic, the step order drawn again from the same seed) and the yielded steps skipped, so the
stream after a resume is the stream without one.
"""
from __future__ import annotations

import logging
import numbers
import numpy as np
import torch
import torch.utils.data

from ...packing.checks import check_bool, check_fill, check_int, check_static_shape
from ...packing.static_shapes import check_max_sequences, documents_per_row
from ...planning import step_order
from ...planning.cost_model import transformer_cost
from ...planning.planner import plan as make_plan
from ...training.sampler.args import cost_tag
from ..start_line import stream_start_line
from .cp_balance import check_cp_degree, headtail_order, token_work
from .documents import fetch_documents, is_one_shot, iterable_of, read_documents, tokens_of

OVERLONG = ("split", "drop", "error")
STATE_VERSION = 2  # 2: steps in a seeded order (1: the planner's, longest documents first)
MIN_BUFFER_STEPS = 4  # a buffer holds at least this many steps of tokens (part of the state's plan key)
_STAT_KEYS = ("documents", "pieces", "split", "dropped", "zero_length", "steps", "rows", "tokens")
LOG = logging.getLogger(__name__)  # torchtitan's init_logger() puts a handler on the root logger: its log shows this


class BalancedDocumentStream(torch.utils.data.IterableDataset):
    """Yields torchtitan batches ``({"input": [B, L], "positions": [B, L]}, labels [B, L])`` for one dp rank.

    Args:
        source: the documents: a re-iterable (list, ``datasets.Dataset``/``IterableDataset``) or a zero-argument
            callable returning a fresh iterable, of token sequences, dicts with ``input_key`` ids, or text
            (str / dicts with ``text_key``; needs ``tokenizer``). Indexable sources are read by index on resume.
        seq_len, local_batch_size: tokens per row (L) and rows per rank per step (B).
        dp_rank, dp_world_size: this rank and the number of data-parallel ranks (all read the whole source).
        buffer_size: documents (pieces) planned together; a buffer also holds at least 4 steps of tokens
            (``4 * dp_world_size * local_batch_size * seq_len``), so many ranks still get full rows.
        cost: the balance cost, as ``packkit.plan(cost=)``: ``"tokens"``, ``"attention"`` or ``(a, b)`` for
            ``a*l + b*l**2`` (:func:`packkit.integrations.torchtitan.torchtitan_cost` of the model's config).
        overlong: a document with more than ``seq_len`` input tokens is ``"split"`` into ``seq_len`` pieces
            (positions restart per piece, as torchtitan wraps them), ``"drop"``-ped, or an ``"error"``.
        infinite: loop over the source (torchtitan's default); each pass ends with its partial last step. A pass
            that yields no step (an empty source, only 1-token documents, a one-shot iterator already read)
            raises ValueError instead of looping forever.
        shuffle, seed: each buffer's steps in a ``seed``-ed random order (default), or with ``shuffle=False``
            in the source order of each step's longest document; both resume exactly (part of the state).
        carry_threshold, max_carries: a buffer's last step filled below ``carry_threshold`` of its rows is carried
            into the next buffer (re-planned with its documents) while the source goes on, at most
            ``max_carries`` times per piece (0: never).
        pad_token_id, ignore_index: row padding (its own position run from 0, labels ``ignore_index``).
        cp_degree: torchtitan's ``context_parallel_degree``; above 1 each row's documents are ordered so its
            head-tail CP shards get even work (``cp_balance.py``); ``seq_len`` must be a multiple of ``2*cp``.
        max_sequences: at most N sequences per row, its padding run included (the static-shape contract's slots;
            torchtitan's ``max_packed_sequences_per_sample``): rows are planned with at most ``N - 1`` documents
            (pieces), by the same balanced ogbfd plan. Part of the state's plan key.

    The first buffer it plans, dp rank 0 logs (INFO, this module's logger) ``packkit: first buffer N steps on R
    ranks, balance B, efficiency E; streaming, steps per epoch unknown up front``; the figures are also
    ``first_buffer`` (None until then).
    """

    def __init__(self, source, *, seq_len: int, local_batch_size: int, dp_rank: int = 0, dp_world_size: int = 1,
                 tokenizer=None, input_key: str = "input_ids", text_key: str = "text", buffer_size: int = 1024,
                 cost="tokens", overlong: str = "split", infinite: bool = False, carry_threshold: float = 0.9,
                 max_carries: int = 4, shuffle: bool = True, seed: int = 0,
                 pad_token_id: int = 0, ignore_index: int = -100, cp_degree: int = 1, max_sequences=None):
        super().__init__()
        if isinstance(source, (str, bytes, dict)) or not (callable(source) or hasattr(source, "__iter__")):
            raise TypeError(f"source must be an iterable of documents or a callable returning one, got "
                            f"{type(source).__name__}")
        self.source, self.tokenizer = source, tokenizer
        self.seq_len = check_int(seq_len, "seq_len", 1)
        self.local_batch_size = check_int(local_batch_size, "local_batch_size", 1)
        self.dp_world_size = check_int(dp_world_size, "dp_world_size", 1)
        self.dp_rank = check_int(dp_rank, "dp_rank", 0)
        if self.dp_rank >= self.dp_world_size:
            raise ValueError(f"dp_rank must be in [0, dp_world_size={self.dp_world_size}), got {dp_rank}")
        # Bounded before anything is sized by them (seq_len=2**31 built a 16 GB cost table; 2**31 ranks reached the
        # planner's dp_size check, which named dp_size): the loaders' static-shape and rows-per-step rules.
        check_static_shape(self.local_batch_size, self.seq_len, "local_batch_size x seq_len")
        if self.dp_world_size * self.local_batch_size > 2**16:  # 2**18 rows per step planned for over 20 s
            raise ValueError(f"dp_world_size x local_batch_size = {self.dp_world_size * self.local_batch_size} rows "
                             f"per step; at most 2^16")
        self.buffer_size = check_int(buffer_size, "buffer_size", 1)
        self.cp_degree = check_cp_degree(cp_degree, self.seq_len)
        if overlong not in OVERLONG:
            raise ValueError(f"overlong must be one of {', '.join(OVERLONG)}, got {overlong!r}")
        self.overlong = overlong
        self.infinite = check_bool(infinite, "infinite")
        self.shuffle = check_bool(shuffle, "shuffle")
        self.seed = check_int(seed, "seed", 0)
        self.max_carries = check_int(max_carries, "max_carries", 0)
        if isinstance(carry_threshold, bool) or not isinstance(carry_threshold, numbers.Real) \
                or not 0.0 <= float(carry_threshold) <= 1.0:
            raise ValueError(f"carry_threshold must be a number in [0, 1], got {carry_threshold!r}")
        self.carry_threshold = float(carry_threshold)
        self.pad_token_id = check_int(pad_token_id, "pad_token_id", 0)
        self.ignore_index = check_int(ignore_index, "ignore_index")
        check_fill(self.pad_token_id, torch.int64, "pad_token_id")  # 2**64 reached numpy as an OverflowError
        check_fill(self.ignore_index, torch.int64, "ignore_index")
        if not isinstance(input_key, str) or not isinstance(text_key, str):
            raise TypeError(f"input_key and text_key must be str, got {input_key!r}, {text_key!r}")
        self.input_key, self.text_key = input_key, text_key
        if not (isinstance(cost, (str, tuple, list)) or callable(cost)):
            cost = transformer_cost(cost)  # a transformers config: its (a, b), so the state can name it
        self.cost = cost
        self._token_work = token_work(cost) if self.cp_degree > 1 else None
        self.max_sequences = check_max_sequences(max_sequences)
        self._per_row = documents_per_row(self.max_sequences)  # a row's padding run is a sequence too
        make_plan([1], self.seq_len, algorithm="ogbfd", dp_size=self.dp_world_size * self.local_batch_size,
                  cost=cost)  # a bad cost fails here, named by the planner, not at the first step
        # What the plans depend on besides the geometry: a resume replans its buffer, so these must match.
        self._plan_key = {"buffer_size": self.buffer_size, "min_steps": MIN_BUFFER_STEPS, "overlong": self.overlong,
                          "cost": cost_tag(cost, np.arange(1, self.seq_len + 1)),
                          "carry_threshold": self.carry_threshold, "max_carries": self.max_carries,
                          "shuffle": self.shuffle, "seed": self.seed}
        if self.max_sequences is not None:  # only when set: states saved before the option still resume
            self._plan_key["max_sequences"] = self.max_sequences
        self._state = self._fresh_state(0)
        self.stats = dict.fromkeys(_STAT_KEYS, 0)  # of this process (not restored by a resume)
        self.first_buffer = None  # {"steps", "ranks", "balance", "efficiency"} of the first buffer this process planned

    # ------------------------------------------------------------------------------------------ state
    def _fresh_state(self, epoch: int) -> dict:
        return {"version": STATE_VERSION, "epoch": epoch, "buffer_start": 0, "carry": [], "steps_done": 0,
                "dp_rank": self.dp_rank, "dp_world_size": self.dp_world_size, "seq_len": self.seq_len,
                "local_batch_size": self.local_batch_size, "plan": dict(self._plan_key)}

    def state_dict(self) -> dict:
        """Plain ints and lists: ``epoch``, ``buffer_start`` (source position the current buffer's new documents
        start at), ``carry`` (``[position, piece, times carried]`` of the pieces carried into it),
        ``steps_done`` (its steps already yielded) and the geometry it must be resumed with."""
        return {k: ([list(c) for c in v] if k == "carry" else dict(v) if k == "plan" else v)
                for k, v in self._state.items()}

    def load_state_dict(self, state: dict) -> None:
        """Resume at the next ``iter()`` from :meth:`state_dict` (same source, rank, world size, seq_len, B)."""
        if isinstance(state, dict) and state.get("version") == 1:
            raise ValueError("the state was saved by an older packkit (version 1), which yielded each buffer's steps "
                             "in the planner's order; this one shuffles them (or keeps source order), so the steps "
                             "left in that buffer cannot be reproduced: start from a fresh stream")
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not a BalancedDocumentStream state (version {STATE_VERSION}): {state!r:.200}")
        for key in ("dp_rank", "dp_world_size", "seq_len", "local_batch_size"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"the state was saved with {key}={state.get(key)} but this stream has "
                                 f"{key}={getattr(self, key)}; resume with the same geometry")
        if state.get("plan") != self._plan_key:
            raise ValueError(f"the state was planned with {state.get('plan')} but this stream plans with "
                             f"{self._plan_key}; a resume replans the current buffer, so these must match")
        for key in ("epoch", "buffer_start", "steps_done"):
            v = state.get(key)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
                raise ValueError(f"state[{key!r}] must be a non-negative int, got {v!r}")
        carry = state.get("carry")
        def bad(entry) -> bool:
            return (not isinstance(entry, (list, tuple)) or len(entry) != 3 or entry[0] >= state["buffer_start"]
                    or any(isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 0 for x in entry))

        if not isinstance(carry, list) or any(bad(c) for c in carry):
            raise ValueError("state['carry'] must list [position, piece, times] of positions before buffer_start")
        src = iterable_of(self.source)
        if hasattr(src, "__len__") and hasattr(src, "__getitem__") and state["buffer_start"] > len(src):
            raise ValueError(f"state['buffer_start'] is {state['buffer_start']} but the source has {len(src)} "
                             f"documents; resume with the same source")
        self._state = {**state, "carry": [list(c) for c in carry], "plan": dict(self._plan_key)}

    # ----------------------------------------------------------------------------------------- source
    def _pieces(self, position: int, example, count: bool) -> list:
        """(position, piece, window) of a document: ``window[:-1]`` are the inputs, ``window[1:]`` the labels."""
        t = tokens_of(example, position, self.tokenizer, self.input_key, self.text_key)
        m, L = len(t) - 1, self.seq_len
        stats = self.stats if count else dict.fromkeys(_STAT_KEYS, 0)
        stats["documents"] += 1
        if m < 1:
            stats["zero_length"] += 1
            return []
        if m > L:
            if self.overlong == "error":
                raise ValueError(f"document at source position {position} has {m} input tokens, more than "
                                 f"seq_len={L}; use overlong='split' or 'drop'")
            if self.overlong == "drop":
                stats["dropped"] += 1
                return []
            stats["split"] += 1
        pieces = [(position, k, t[a:min(a + L, m) + 1]) for k, a in enumerate(range(0, m, L))]
        stats["pieces"] += len(pieces)
        return pieces

    # -------------------------------------------------------------------------------------- iteration
    def _row(self, pieces) -> tuple:
        L = self.seq_len
        ids = np.full(L, self.pad_token_id, np.int64)
        labels = np.full(L, self.ignore_index, np.int64)
        pos = np.empty(L, np.int64)
        at = 0
        if self.cp_degree > 1:  # the same documents, in the order that balances the row's CP shards
            order = headtail_order([len(w) - 1 for _, _, w in pieces], L, self.cp_degree, *self._token_work)
            pieces = [pieces[i] for i in order]
        for _, _, w in pieces:
            n = len(w) - 1
            ids[at:at + n], labels[at:at + n], pos[at:at + n] = w[:-1], w[1:], np.arange(n)
            at += n
        pos[at:] = np.arange(L - at)  # padding: one more "document" from position 0
        if self.max_sequences is not None and len(pieces) + (at < L) > self.max_sequences:  # N=1: a short document
            raise ValueError(f"a row holds {len(pieces)} documents{' and a padding run' if at < L else ''} but "
                             f"max_sequences={self.max_sequences} (a row's padding is a sequence): raise max_sequences")
        self.stats["tokens"] += at
        return ids, labels, pos

    def _batch(self, rows) -> tuple:
        built = [self._row(r) for r in rows]
        ids, labels, pos = (torch.from_numpy(np.stack([b[i] for b in built])) for i in range(3))
        return {"input": ids, "positions": pos}, labels

    def __iter__(self):
        while True:
            fresh = self._state["buffer_start"] == 0 and not self._state["carry"] and self._state["steps_done"] == 0
            done = self.stats["steps"]
            yield from self._epoch_pass()
            if fresh and self.stats["steps"] == done and self.infinite:
                # A whole pass gave nothing: the next one would too, forever. (A resumed pass may end empty.)
                hint = (" (a one-shot iterator, e.g. a generator, is empty after its first pass: pass a list or a "
                        "callable returning a fresh iterable)") if is_one_shot(self.source) else ""
                raise ValueError(f"a whole pass over the source yielded no step (epoch {self._state['epoch']}): it has "
                                 f"no document of 2 or more tokens{hint}; infinite=True would loop forever")
            self._state = self._fresh_state(self._state["epoch"] + 1)  # a new iter() starts the next pass
            if hasattr(self.source, "set_epoch"):
                self.source.set_epoch(self._state["epoch"])
            if not self.infinite:
                return

    def _carried(self, carry) -> list:
        """``(piece, times carried)`` of a state's carry, re-read from the source."""
        examples = fetch_documents(self.source, (c[0] for c in carry))
        out = []
        for position, piece, age in carry:
            found = [p for p in self._pieces(position, examples[position], False) if p[1] == piece]
            if not found:
                raise ValueError(f"the state carries piece {piece} of the document at position {position}, "
                                 f"which it does not have; resume with the same source and seq_len")
            out.append((found[0], age))
        return out

    def _ordered(self, steps: list, lengths: np.ndarray, pool: list, st: dict) -> list:
        """A buffer's steps in the order they are yielded (see ``shuffle``); a step with an empty row (the pass's
        partial last one) stays last."""
        partial = [s for s in steps if not all(s)]
        whole = [s for s in steps if all(s)]
        keys = None
        if not self.shuffle:
            keys = step_order.bins_keys([b for s in whole for b in s], lengths.__getitem__, lambda i: pool[i][0],
                                        self.dp_world_size * self.local_batch_size)
        rng = np.random.default_rng((self.seed, st["epoch"], st["buffer_start"]))
        order = step_order.order_steps(len(whole), shuffle=self.shuffle, rng=rng, keys=keys)
        return [whole[k] for k in order.tolist()] + partial

    def _announce(self, planned, steps: list, lengths: np.ndarray) -> None:
        """The start line's figures for a buffer's steps (the carried last step excluded): balance across the dp
        ranks (each rank's cost is the sum of its ``local_batch_size`` rows) and real tokens per row slot."""
        n, B = len(steps), self.local_batch_size
        costs = planned.rank_costs[:n].reshape(n, self.dp_world_size, B).sum(axis=2)
        mean = float(costs.mean(axis=1).sum())
        tokens = sum(int(lengths[i]) for s in steps for b in s for i in b)
        self.first_buffer = {"steps": n, "ranks": self.dp_world_size,
                             "balance": float(costs.max(axis=1).sum()) / mean if mean > 0 else 1.0,
                             "efficiency": tokens / (n * self.dp_world_size * B * self.seq_len)}
        if self.dp_rank == 0:  # one line, not one per rank (every rank plans the same buffer)
            LOG.info(stream_start_line(**self.first_buffer))

    def _epoch_pass(self):
        st = self._state
        carried = self._carried(st["carry"])
        per_step = self.dp_world_size * self.local_batch_size
        lo = self.dp_rank * self.local_batch_size
        fresh = read_documents(self.source, st["buffer_start"])  # one reader per pass: an iterable source is scanned once
        while True:
            pool, ages = [p for p, _ in carried], [a for _, a in carried]
            next_start, exhausted = st["buffer_start"], False
            tokens = sum(len(p[2]) - 1 for p in pool)
            # At least buffer_size pieces and MIN_BUFFER_STEPS steps' worth of tokens: with many ranks a buffer of
            # few documents would leave most rows of its one step empty.
            while len(pool) < self.buffer_size or tokens < MIN_BUFFER_STEPS * per_step * self.seq_len:
                nxt = next(fresh, None)
                if nxt is None:
                    exhausted = True
                    break
                pieces = self._pieces(*nxt, True)
                pool += pieces
                tokens += sum(len(p[2]) - 1 for p in pieces)
                ages += [0] * len(pieces)
                next_start = nxt[0] + 1
            if not pool:
                return
            lengths = np.fromiter((len(p[2]) - 1 for p in pool), np.int64, len(pool))
            planned = make_plan(lengths, self.seq_len, algorithm="ogbfd", dp_size=per_step, cost=self.cost,
                                max_sequences=self._per_row)
            bins = [sorted(b.tolist(), key=lambda i: (pool[i][0], pool[i][1])) for b in planned.bins]
            steps = [bins[s:s + per_step] for s in range(0, len(bins), per_step)]
            last = steps[-1]
            carry = []
            # An under-filled last step (the planner's leftovers) waits for the next buffer's documents, at most
            # max_carries times per piece.
            fill = sum(lengths[i] for b in last for i in b) / (per_step * self.seq_len)
            if (not exhausted and len(steps) > 1 and fill < self.carry_threshold
                    and all(ages[i] < self.max_carries for b in last for i in b)):
                carry = [i for b in steps.pop() for i in b]
            if self.first_buffer is None:
                self._announce(planned, steps, lengths)
            steps = self._ordered(steps, lengths, pool, st)
            for s in range(st["steps_done"], len(steps)):
                st["steps_done"] = s + 1  # set before the yield: a state taken now resumes after this step
                self.stats["steps"] += 1
                self.stats["rows"] += self.local_batch_size
                yield self._batch([[pool[i] for i in b] for b in steps[s][lo:lo + self.local_batch_size]])
            if exhausted:
                return
            carried = [(pool[i], ages[i] + 1) for i in carry]
            st.update(buffer_start=next_start, carry=[[pool[i][0], pool[i][1], ages[i] + 1] for i in carry],
                      steps_done=0)
