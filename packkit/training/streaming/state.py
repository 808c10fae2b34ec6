"""Resume state of a streaming pass: the live progress of one shard and the checks on a loaded state.

No tokens are stored: a state names pieces by ``(source position, first token)``, and on resume the
pending examples are read again from the source.
"""
from __future__ import annotations

import collections
import copy
import numbers
from collections.abc import Mapping

STATE_FORMAT = "packkit.PackedIterableDataset/1"
STAT_KEYS = ("examples", "dropped", "truncated", "split", "zero_length", "items", "rows", "tokens")


class Progress:
    """The live state of one pass over a shard (serialised on demand by ``state_dict``)."""

    def __init__(self, epoch: int, shard: int, num_shards: int, next_position: int = 0, stats=None):
        self.epoch = epoch
        self.shard = shard
        self.num_shards = num_shards
        self.next_position = next_position
        self.carry: list = []  # pieces to plan again with the next buffer
        self.carry_ages: list = []  # how many times each was carried already (this carry included)
        self.ready: collections.deque = collections.deque()  # planned rows (lists of pieces) not yet yielded
        self.stats = dict.fromkeys(STAT_KEYS, 0) if stats is None else dict(stats)
        self.stats.update((key, 0) for key in STAT_KEYS if key not in self.stats)

    def state(self, capacity: int, overlong: str, pad_to_multiple_of: int = 1) -> dict:
        # Between items carry_ages matches carry; after an error while a buffer was being read, the carry
        # also holds that buffer's new pieces (age 0), so a state taken then still loses nothing.
        ages = self.carry_ages + [0] * (len(self.carry) - len(self.carry_ages))
        return {
            "format": STATE_FORMAT, "epoch": self.epoch, "shard": self.shard, "num_shards": self.num_shards,
            "next_position": self.next_position, "capacity": capacity, "overlong": overlong,
            "pad_to_multiple_of": pad_to_multiple_of,
            "carry": [[p[0], p[1], age] for p, age in zip(self.carry, ages)],
            "ready": [[[p[0], p[1]] for p in row] for row in self.ready],
            "stats": dict(self.stats),
        }


def checked_state(state, capacity: int, overlong: str, pad_to_multiple_of: int = 1) -> dict:
    """A deep copy of ``state`` with its ints normalised, or ValueError naming what is wrong (format,
    missing keys, a capacity, overlong policy or context-parallel padding other than this dataset's,
    malformed pieces, a piece named twice, read after ``next_position`` or of another shard, bad stats)."""
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        raise ValueError(f"not a PackedIterableDataset state (expected format {STATE_FORMAT!r})")
    missing = [k for k in ("epoch", "shard", "num_shards", "next_position", "capacity", "overlong", "carry",
                           "ready") if k not in state]
    if missing:
        raise ValueError(f"state is missing {', '.join(missing)}")
    saved_multiple = state.get("pad_to_multiple_of", 1)  # states saved before it existed had none
    if saved_multiple != pad_to_multiple_of:
        raise ValueError(f"state was saved with documents padded to multiples of {saved_multiple!r} (context_parallel)"
                         f" but this dataset pads to {pad_to_multiple_of}: its planned rows would not fit")
    if state["capacity"] != capacity or state["overlong"] != overlong:
        raise ValueError(f"state was saved with capacity={state['capacity']!r}, overlong={state['overlong']!r} "
                         f"but this dataset has capacity={capacity}, overlong={overlong!r}")

    def piece(p, size=2):
        if not isinstance(p, (list, tuple)) or len(p) != size or any(
                isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 0 for x in p):
            what = "[position, start, times carried]" if size == 3 else "[position, start]"
            raise ValueError(f"state pieces must be {what} lists of non-negative ints, got {p!r}")
        return [int(x) for x in p]

    clean = dict(copy.deepcopy(dict(state)))
    for key in ("epoch", "shard", "num_shards", "next_position"):
        value = clean[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"state[{key!r}] must be a non-negative int, got {value!r}")
        clean[key] = int(value)
    if not clean["shard"] < clean["num_shards"]:
        raise ValueError(f"state shard {clean['shard']} is not below num_shards {clean['num_shards']}")
    for key in ("carry", "ready"):
        if not isinstance(clean[key], (list, tuple)) or (key == "ready" and not all(
                isinstance(row, (list, tuple)) for row in clean[key])):
            raise ValueError(f"state[{key!r}] must be a list of {'pieces' if key == 'carry' else 'rows of pieces'}, "
                             f"got {clean[key]!r:.80}")
    clean["carry"] = [piece(p, 3) for p in clean["carry"]]
    clean["ready"] = [[piece(p) for p in row] for row in clean["ready"]]
    if any(not row for row in clean["ready"]):
        raise ValueError("state has an empty ready row")
    pieces = [tuple(p[:2]) for p in clean["carry"]] + [tuple(p) for row in clean["ready"] for p in row]
    if len(set(pieces)) != len(pieces):
        seen = set()
        twice = next(p for p in pieces if p in seen or seen.add(p))
        raise ValueError(f"state names piece (position {twice[0]}, start {twice[1]}) twice: it would be yielded twice")
    for position, _ in pieces:
        if position >= clean["next_position"]:
            raise ValueError(f"state names a piece of source position {position} but next_position is "
                             f"{clean['next_position']}: only positions already read can be pending")
        if position % clean["num_shards"] != clean["shard"]:
            raise ValueError(f"state names source position {position}, which is not in shard {clean['shard']} of "
                             f"{clean['num_shards']}")
    stats = clean.get("stats", {})
    if not isinstance(stats, Mapping) or any(
            isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0 for v in stats.values()):
        raise ValueError(f"state['stats'] must map counter names to non-negative ints, got {stats!r:.200}")
    return clean
