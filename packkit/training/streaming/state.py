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

    def state(self, capacity: int, overlong: str) -> dict:
        # Between items carry_ages matches carry; after an error while a buffer was being read, the carry
        # also holds that buffer's new pieces (age 0), so a state taken then still loses nothing.
        ages = self.carry_ages + [0] * (len(self.carry) - len(self.carry_ages))
        return {
            "format": STATE_FORMAT, "epoch": self.epoch, "shard": self.shard, "num_shards": self.num_shards,
            "next_position": self.next_position, "capacity": capacity, "overlong": overlong,
            "carry": [[p[0], p[1], age] for p, age in zip(self.carry, ages)],
            "ready": [[[p[0], p[1]] for p in row] for row in self.ready],
            "stats": dict(self.stats),
        }


def checked_state(state, capacity: int, overlong: str) -> dict:
    """A deep copy of ``state`` with its ints normalised, or ValueError naming what is wrong (format,
    missing keys, a capacity or overlong policy other than this dataset's, malformed pieces)."""
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        raise ValueError(f"not a PackedIterableDataset state (expected format {STATE_FORMAT!r})")
    missing = [k for k in ("epoch", "shard", "num_shards", "next_position", "capacity", "overlong", "carry",
                           "ready") if k not in state]
    if missing:
        raise ValueError(f"state is missing {', '.join(missing)}")
    if int(state["capacity"]) != capacity or state["overlong"] != overlong:
        raise ValueError(f"state was saved with capacity={state['capacity']}, overlong={state['overlong']!r} "
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
    clean["carry"] = [piece(p, 3) for p in clean["carry"]]
    clean["ready"] = [[piece(p) for p in row] for row in clean["ready"]]
    if any(not row for row in clean["ready"]):
        raise ValueError("state has an empty ready row")
    return clean
