"""Checks shared by the PackedIterableDataset tests: decode packed items back into pieces of examples.

Source tokens are drawn from [1, 1000), so a segment whose ids are all ``PAD`` (0) is padding.
"""
from __future__ import annotations

import collections

import numpy as np
import torch

from pack_reference import reference_pack_batch

PAD, IGNORE = 0, -100
MODEL_KEYS = {"input_ids", "labels", "position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
              "max_length_k"}


def make_examples(seed: int, n: int, max_len: int, *, min_len: int = 1, labels: bool = False,
                  form: str = "list") -> list:
    """``n`` example dicts; ``form`` is how token ids are held: list, numpy or tensor."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = rng.integers(1, 1000, int(rng.integers(min_len, max_len + 1)))
        ex = {"input_ids": ids}
        if labels:
            ex["labels"] = rng.integers(-100, 1000, len(ids))
        if form == "list":
            ex = {k: v.tolist() for k, v in ex.items()}
        elif form == "tensor":
            ex = {k: torch.from_numpy(v) for k, v in ex.items()}
        out.append(ex)
    return out


def as_array(x) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.int64)


def expected_pieces(examples, capacity: int, overlong: str, input_key: str = "input_ids") -> dict:
    """{(position, start): (ids, labels or None)} of every piece the stream must deliver once."""
    out = {}
    for pos, ex in enumerate(examples):
        if isinstance(ex, dict):
            ids = as_array(ex[input_key])
            labels = as_array(ex["labels"]) if ex.get("labels") is not None else None
        else:
            ids, labels = as_array(ex), None
        n = len(ids)
        if n == 0 or (n > capacity and overlong == "drop"):
            continue
        if n > capacity and overlong == "truncate":
            n = capacity
        step = capacity if overlong == "split" else max(n, 1)
        for s in range(0, n, step):
            e = min(s + step, n)
            out[(pos, s)] = (ids[s:e], None if labels is None else labels[s:e])
    return out


def decode(item: dict, capacity: int, layout: str) -> list:
    """The item's rows, each a list of real segments ``(ids, labels, position_ids)`` (numpy arrays).

    Checks the packed format on the way: ``cu_seq_lens`` tile the tokens, segments never cross a row,
    ``seq_idx``/``position_ids`` follow the segments, ``max_length`` is the longest segment, padding is
    one all-pad tail per row with ``ignore_index`` labels.
    """
    ids = item["input_ids"]
    assert ids.dim() == 2 and ids.dtype == torch.int64
    if layout == "padded":
        assert ids.shape[1] == capacity
    cu = item["cu_seq_lens_q"]
    assert item["cu_seq_lens_k"] is cu and cu.dtype == torch.int32
    assert item["max_length_q"] == item["max_length_k"]
    flat = {k: item[k].reshape(-1).numpy() for k in ("input_ids", "labels", "position_ids", "seq_idx")}
    cu = cu.tolist()
    assert cu[0] == 0 and cu[-1] == len(flat["input_ids"]) and all(a < b for a, b in zip(cu, cu[1:]))
    assert max(b - a for a, b in zip(cu, cu[1:])) == item["max_length_q"]
    row_len = capacity if layout == "padded" else len(flat["input_ids"])
    rows = [[] for _ in range(ids.shape[0])]
    for k, (a, b) in enumerate(zip(cu, cu[1:])):
        row = a // row_len
        assert (b - 1) // row_len == row, "a segment crosses a row boundary"
        assert (flat["seq_idx"][a:b] == k).all()
        assert (flat["position_ids"][a:b] == np.arange(b - a)).all()
        seg = tuple(flat[key][a:b] for key in ("input_ids", "labels", "position_ids"))
        if (seg[0] == PAD).all():
            assert layout == "padded" and b == (row + 1) * row_len, "padding is one tail per row"
            assert (seg[1] == IGNORE).all()
            continue
        assert (seg[0] != PAD).all()
        rows[row].append(seg)
    return rows


def check_items(items, examples, capacity, *, overlong="error", layout="padded", rows_per_item=None,
                with_ids=True, mask_first_label=True) -> collections.Counter:
    """Decodes every item and checks it against the source; returns the Counter of delivered pieces.

    With ``with_ids`` (items carry ``example_ids``) each segment is matched to its piece, its labels are
    checked and the item must equal ``pack_sequences`` of its rows; either way the multiset of delivered
    token sequences must be the source's pieces exactly once.
    """
    expected = expected_pieces(examples, capacity, overlong)
    starts = collections.defaultdict(list)
    for pos, start in expected:
        starts[pos].append(start)
    delivered = collections.Counter()
    contents = collections.Counter()
    for item in items:
        assert set(item) == MODEL_KEYS | ({"example_ids"} if with_ids else set())
        rows = decode(item, capacity, layout)
        segments = [seg for row in rows for seg in row]
        contents.update(tuple(seg[0].tolist()) for seg in segments)
        if rows_per_item is not None and layout == "padded":
            assert len(rows) == rows_per_item
        if not with_ids:
            continue
        id_rows = [item["example_ids"]] if rows_per_item is None else item["example_ids"]
        if layout == "padded":
            assert [len(r) for r in rows] == [len(r) for r in id_rows]
        else:
            assert len(rows) == 1 and len(segments) == sum(len(r) for r in id_rows)
        pieces_rows, k = [], 0
        for id_row in id_rows:
            pieces = []
            for pos in id_row:
                seg = segments[k]
                k += 1
                match = [s for s in starts[pos] if np.array_equal(expected[(pos, s)][0], seg[0])]
                assert match, f"segment of example {pos} matches none of its pieces"
                start = match[0]
                delivered[(pos, start)] += 1
                ids, labels = expected[(pos, start)]
                want = (ids if labels is None else labels).copy()
                if mask_first_label:
                    want[0] = IGNORE
                assert np.array_equal(seg[1], want)
                pieces.append((pos, start, ids, labels))
            assert [(p[0], p[1]) for p in pieces] == sorted((p[0], p[1]) for p in pieces), "row order"
            assert sum(len(p[2]) for p in pieces) <= capacity, "a row holds more than capacity tokens"
            if pieces:
                pieces_rows.append(pieces)
        # The item is exactly the plain-PyTorch reference pack of its rows (tests/pack_reference.py: no packkit
        # code, so a bug shared by the stream and pack_sequences still shows); padded rows up to rows_per_item.
        flat_pieces = [p for row in pieces_rows for p in row]
        lengths = np.array([len(p[2]) for p in flat_pieces], np.int64)
        offsets = np.concatenate(([0], np.cumsum([len(r) for r in pieces_rows]))).astype(np.int64)
        flat_ids = torch.from_numpy(np.concatenate([p[2] for p in flat_pieces]).astype(np.int64))
        labels = None
        if any(p[3] is not None for p in flat_pieces):
            labels = torch.from_numpy(np.concatenate([p[2] if p[3] is None else p[3] for p in flat_pieces])
                                      .astype(np.int64))
        n = len(lengths)
        plan = (torch.arange(n), torch.zeros(n, dtype=torch.int64), torch.from_numpy(lengths), torch.from_numpy(offsets))
        src_offsets = torch.from_numpy(np.concatenate(([0], np.cumsum(lengths))).astype(np.int64))
        padded = layout == "padded"
        num_rows = (rows_per_item or len(pieces_rows)) if padded else 1
        row_len = capacity if padded else int(lengths.sum())
        ids, lab, pos, seq_idx, cu = reference_pack_batch(flat_ids, labels, src_offsets, *plan, num_rows, row_len,
                                                          not padded, PAD, IGNORE, mask_first_label, 0)
        if not padded:
            ids, lab, pos, seq_idx = (t.unsqueeze(0) for t in (ids, lab, pos, seq_idx))
        ref = {"input_ids": ids, "labels": lab, "position_ids": pos, "seq_idx": seq_idx, "cu_seq_lens_q": cu,
               "cu_seq_lens_k": cu, "max_length_q": int((cu[1:] - cu[:-1]).max()),
               "max_length_k": int((cu[1:] - cu[:-1]).max())}
        for key, value in ref.items():
            if isinstance(value, torch.Tensor):
                assert value.dtype == item[key].dtype and torch.equal(value, item[key]), key
            else:
                assert value == item[key], key
    assert contents == collections.Counter(tuple(ids.tolist()) for ids, _ in expected.values())
    if with_ids:
        assert delivered == collections.Counter(expected.keys())
    return delivered
