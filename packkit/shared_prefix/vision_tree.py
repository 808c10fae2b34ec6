"""Vision-language conversations in ``pack_tree``: a tree whose shared turns hold the images, each image once.

``build_tree`` shares whatever token prefixes are equal, but every image's placeholder tokens are the same id, so two
conversations with different pictures would look alike. Here each visual token is first replaced by a key of its
image's content (kind, grid, seconds and a hash of the pixels) and its index in the block, so prefixes are shared
only where the pictures are equal too; the real ids are restored in the forest. mRoPE rows are causal (a token's
rows depend only on the tokens and grids before it), so a shared node's rows are those of any sequence through it.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from .radix import build_tree
from .tree import PrefixForest
from .vision import VisionPrompts, _as_tensor, unit_items, unit_rows

KEY_BASE = 1 << 60  # visual-token keys: above any vocabulary
KEY_SPAN = 1 << 24  # tokens one image / video may hold


def _content_key(item) -> tuple:
    pixels = item.pixels.detach().cpu().contiguous()
    digest = hashlib.blake2b(pixels.numpy().tobytes(), digest_size=16).hexdigest()
    seconds = None if item.seconds is None else float(item.seconds[0])
    return item.kind, tuple(item.grid[0].tolist()), seconds, str(pixels.dtype), tuple(pixels.shape), digest


def tree_forest(vp: VisionPrompts, ids: list, group_ids, score_from) -> tuple[PrefixForest, tuple]:
    """``(forest, sources)``: the prefix forest of vision-language sequences (shared only where tokens and pictures
    agree) and ``vision_batch``'s sources ``(rows, types, node_items, seq_items)``."""
    keys, keyed, walks, items_of = {}, [], [], []
    for u, seq in enumerate(ids):
        if vp.types[u] is None:  # not a 1-D integer sequence: build_tree refuses it by name
            keyed.append(seq)
            walks.append(None)
            items_of.append([])
            continue
        arr = _as_tensor(seq).detach().cpu().to(torch.int64).numpy().copy()
        walk = unit_rows(vp, u)  # checks tokens vs grids
        items = unit_items(vp, u) if walk is not None else []
        for item in items:
            key = keys.setdefault(_content_key(item), len(keys))
            at = np.flatnonzero(vp.types[u][item.start:item.end]) + item.start
            arr[at] = KEY_BASE + (2 * key + item.kind - 1) * KEY_SPAN + np.arange(len(at))
        keyed.append(arr)
        walks.append(walk)
        items_of.append(items)
    forest = build_tree(keyed, group_ids, score_from=score_from)
    tokens = forest.tokens.clone()
    visual = tokens >= KEY_BASE
    if bool(visual.any()):
        kind = ((tokens[visual] - KEY_BASE) // KEY_SPAN) % 2
        tokens[visual] = torch.where(kind == 0, torch.tensor(vp.spec.image_token_id),
                                     torch.tensor(vp.spec.video_token_id))
    forest = forest._replace(tokens=tokens)
    return forest, _tree_sources(vp, forest, walks, items_of)


def _tree_sources(vp: VisionPrompts, forest: PrefixForest, walks: list, items_of: list) -> tuple:
    total = len(forest.tokens)
    rows = np.full((total, 3), -1, np.int64)
    types = np.zeros(total, np.int64)
    pos = forest.position()
    node_items, done = {}, np.zeros(forest.num_nodes, bool)
    for s, node in enumerate(forest.seq_node.tolist()):
        if walks[s] is None:
            continue
        k = node
        while k >= 0 and not done[k]:
            done[k] = True
            o, n, src = int(pos[k]), int(forest.length[k]), int(forest.src[k])
            rows[src:src + n] = walks[s][o:o + n]
            types[src:src + n] = vp.types[s][o:o + n]
            inside = [i for i in items_of[s] if o <= i.start < o + n]
            if any(i.end > o + n for i in inside):  # only if equal pictures were followed by differing frames' text
                raise ValueError(f"sequences[{s}]: an image / video block spans two tree nodes (its frames are "
                                 "separated by text that differs between sequences); give those sequences different "
                                 "group_ids")
            if inside and n:
                node_items[src] = inside
            k = int(forest.parent[k])
    return rows, types, node_items, [items_of[s] for s in range(forest.num_sequences)]
