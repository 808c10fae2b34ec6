"""``packkit.vision_cost``: the training FLOPs of a Qwen2-VL / Qwen2.5-VL / Qwen3-VL vision tower for one sample's
images and videos, to pass as the planners' and samplers' per-sample ``extra_cost=``.

The text model's cost of a VLM sample is :func:`packkit.transformer_cost` of its length (the image placeholder tokens
are in the length). The vision tower runs on the sample's patches, before the text model, and its cost depends on the
image grids, not on the length: a sample with one large image can cost several times a text-only sample of the same
length. Forward + backward = 3 x forward (as ``cost_model``), or forward only with ``train_vision=False`` (a frozen
tower whose input needs no gradient runs no backward).

For grids ``(t, h, w)`` (in patches; ``t`` in temporal patches) the tower sees ``t * h * w`` patches, and the merger
``t * h * w / m**2`` merged tokens (``m`` the spatial merge size). Two parts:

* **Per patch** (``linear``): every matmul weight a patch goes through, counted on the tower itself, built from the
  config on the ``meta`` device: the patch embedding (a ``Conv3d`` whose kernel is its stride: its
  ``weight.numel()`` multiply-adds per patch), each block's attention projections and MLP (Linears), and, per merged
  token, the merger's Linears and Qwen3-VL's deepstack mergers (modules named ``*merger*``). Position-embedding
  lookups (Qwen3-VL's interpolated table), norms and activations are not matmuls (left out, as for text).
* **Per (query, key) pair** of each block: ``12 * d`` FLOPs (``Q K^T`` and ``P V`` over all heads, ``d`` the tower's
  width), times the pairs the block attends. The tower's attention is bidirectional and split by ``cu_seqlens``:
  every frame of every grid is its own segment of ``h * w`` patches, ``t * (h * w)**2`` pairs a grid (Qwen2-VL,
  Qwen3-VL, and Qwen2.5-VL's ``fullatt_block_indexes``). Qwen2.5-VL's other blocks attend within windows of
  ``k = window_size // m // patch_size`` merged tokens a side (transformers' ``get_vision_window_index``): a frame's
  ``h/m x w/m`` merged grid cut into ``k x k`` tiles (the last row / column of tiles smaller), each tile a segment of
  ``m**2 * rows * cols`` patches, so ``t * m**4 * (sum of rows**2) * (sum of cols**2)`` pairs a grid.

Checked against torch's FLOP counter (per patch, within 5%) and against the segments each tiny tower's attention
is called with (pairs, exactly): tests/test_vision_cost.py.
"""
from __future__ import annotations

import json

import numpy as np

from .hf_inputs import as_grids, config_from_mapping

# vision config model_type -> (transformers module, tower class)
_TOWERS = {
    "qwen2_vl_vision": ("qwen2_vl", "Qwen2VisionTransformerPretrainedModel"),
    "qwen2_5_vl_vision": ("qwen2_5_vl", "Qwen2_5_VisionTransformerPretrainedModel"),
    "qwen3_vl_vision": ("qwen3_vl", "Qwen3VLVisionModel"),
    "qwen3_vl_moe_vision": ("qwen3_vl_moe", "Qwen3VLMoeVisionModel"),
}
_WINDOWED = {"qwen2_5_vl_vision"}


def _figure(config, names, what: str) -> int:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    raise ValueError(f"vision_cost needs {what} ({' / '.join(names)}) of a {config.model_type} vision config; "
                     "it has none")


def _vision_config(config):
    config = config_from_mapping(config)
    vision = getattr(config, "vision_config", None)
    vision = config if vision is None else vision
    model_type = str(getattr(vision, "model_type", None))
    if model_type not in _TOWERS:
        top = getattr(config, "model_type", type(config).__name__)
        raise ValueError(f"vision_cost counts the vision towers of {', '.join(sorted(_TOWERS))} (Qwen2-VL, "
                         f"Qwen2.5-VL, Qwen3-VL); {top} has {model_type!r}. Pass your own extra_cost for others")
    return vision


def _per_patch_macs(vision, merge: int) -> tuple[float, float]:
    """(multiply-adds per patch outside the mergers, per merged token in the mergers) of the tower on meta."""
    import importlib

    import torch

    module_name, class_name = _TOWERS[vision.model_type]
    tower_cls = getattr(importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}"),
                        class_name)
    with torch.device("meta"):
        tower = tower_cls(vision)
    patch, merged = 0.0, 0.0
    for name, module in tower.named_modules():
        if isinstance(module, torch.nn.Embedding):  # Qwen3-VL's position table: a lookup, not a matmul
            continue
        weight = getattr(module, "weight", None)
        if isinstance(module, torch.nn.Linear):
            n = float(weight.numel())
        elif isinstance(module, (torch.nn.Conv3d, torch.nn.Conv2d)):  # patch embedding: kernel == stride
            if tuple(module.kernel_size) != tuple(module.stride):
                raise ValueError(f"{name}: a convolution whose kernel {module.kernel_size} is not its stride "
                                 f"{module.stride}; vision_cost counts one application per patch")
            n = float(weight.numel())
        else:
            continue
        if "merger" in name:
            merged += n
        else:
            patch += n
    return patch, merged


def _window_side_sums(size: np.ndarray, k: int) -> np.ndarray:
    """Sum of squared tile sides when ``size`` merged tokens are cut into tiles of ``k`` (the last one smaller)."""
    full, rest = size // k, size % k
    return full * k * k + rest * rest


class VisionCost:
    """Training FLOPs of a VLM's vision tower per sample (module docstring).

    ``cost(image_grid_thw, video_grid_thw=None)`` -> one sample's FLOPs (float); ``cost.per_sample(image_grids,
    video_grids=None)`` -> float64 ``[n]``, one per sample (each entry a sample's grids: ``[k, 3]``, a
    ``(t, h, w)`` triple, ``None`` or empty for none): the ``extra_cost=`` of :func:`packkit.plan` and the
    samplers, in the units of :func:`packkit.transformer_cost`. ``linear(grids)`` and ``pairs(grids)`` (per block)
    give the parts."""

    def __init__(self, model_type: str, patch_macs: float, merged_macs: float, width: int, merge: int,
                 depth: int, window: int | None, full_blocks: tuple, train: bool):
        self.model_type = model_type
        self.merge = merge
        self.factor = 6.0 if train else 2.0  # FLOPs per multiply-add: forward + backward, or forward only
        self.linear_per_patch = self.factor * (patch_macs + merged_macs / merge ** 2)
        self.pair_flops = self.factor * 2 * width  # Q K^T and P V: 2 * d multiply-adds a pair
        self.window = window  # merged tokens a window side (Qwen2.5-VL), None: every block full
        self.blocks = ["full" if window is None or b in full_blocks else "window" for b in range(depth)]

    def _grids(self, grids, name: str = "grids") -> np.ndarray:
        array = as_grids(grids, name)
        odd = np.flatnonzero((array[:, 1] % self.merge) | (array[:, 2] % self.merge))
        if len(odd):
            raise ValueError(f"{name}: grid {array[odd[0]].tolist()} has h or w not a multiple of the spatial merge "
                             f"size {self.merge} (the processor's grids always are)")
        return array

    def linear(self, grids) -> float:
        g = self._grids(grids)
        return self.linear_per_patch * float(g.prod(axis=1).sum())

    def pairs(self, grids) -> list:
        """The (query, key) pairs each block attends, in block order, for one sample's grids."""
        g = self._grids(grids).astype(np.float64)
        t, h, w = g[:, 0], g[:, 1], g[:, 2]
        full = float((t * (h * w) ** 2).sum())
        if self.window is None:
            return [full] * len(self.blocks)
        m = self.merge
        rows = _window_side_sums((g[:, 1] // m).astype(np.int64), self.window)
        cols = _window_side_sums((g[:, 2] // m).astype(np.int64), self.window)
        windowed = float((t * m ** 4 * rows * cols).sum())
        return [full if kind == "full" else windowed for kind in self.blocks]

    def __call__(self, image_grid_thw=None, video_grid_thw=None) -> float:
        grids = np.concatenate([self._grids(image_grid_thw, "image_grid_thw"),
                                self._grids(video_grid_thw, "video_grid_thw")])
        return self.linear(grids) + self.pair_flops * sum(self.pairs(grids))

    def per_sample(self, image_grids, video_grids=None) -> np.ndarray:
        """One sample's cost per entry of ``image_grids`` (and ``video_grids``, aligned): float64 ``[n]``."""
        if image_grids is None and video_grids is None:
            raise TypeError("per_sample needs image_grids or video_grids (one entry per sample)")
        n = len(image_grids) if image_grids is not None else len(video_grids)
        if video_grids is not None and image_grids is not None and len(video_grids) != n:
            raise ValueError(f"video_grids has {len(video_grids)} entries for {n} samples in image_grids")
        out = np.empty(n, np.float64)
        for i in range(n):
            try:
                out[i] = self(None if image_grids is None else image_grids[i],
                              None if video_grids is None else video_grids[i])
            except ValueError as e:
                raise ValueError(f"sample {i}: {e}") from None
        return out

    def __repr__(self):
        kinds = {k: self.blocks.count(k) for k in dict.fromkeys(self.blocks)}
        return (f"VisionCost({self.model_type}: {self.linear_per_patch:.4g} FLOPs/patch, "
                f"{self.pair_flops:.4g} FLOPs/pair; blocks {kinds}"
                + (f", window {self.window} merged tokens" if self.window else "") + ")")


_CACHE: dict = {}


def vision_cost(config, *, train_vision: bool = True) -> VisionCost:
    """The vision tower's cost per sample of a Qwen2-VL / Qwen2.5-VL / Qwen3-VL (MoE) config (the model's config,
    its ``to_dict()``, or its ``vision_config``): a :class:`VisionCost`.

    ``train_vision=False``: the tower is frozen (forward only, a third of the FLOPs). Raises ValueError naming the
    model type for other towers and naming a missing figure."""
    if not isinstance(train_vision, bool):
        raise TypeError(f"train_vision must be a bool, got {type(train_vision).__name__} {train_vision!r}")
    vision = _vision_config(config)
    merge = _figure(vision, ("spatial_merge_size",), "the spatial merge size")
    depth = _figure(vision, ("depth",), "the block count")
    width = _figure(vision, ("embed_dim", "hidden_size") if vision.model_type == "qwen2_vl_vision"
                    else ("hidden_size",), "the tower's width")
    window, full_blocks = None, ()
    if vision.model_type in _WINDOWED:
        patch = _figure(vision, ("patch_size",), "the patch size")
        size = _figure(vision, ("window_size",), "the window size")
        full_blocks = tuple(int(b) for b in (getattr(vision, "fullatt_block_indexes", None) or ()))
        window = size // merge // patch
        if window < 1:
            raise ValueError(f"window_size {size} is under spatial_merge_size * patch_size = {merge * patch}: "
                             "no window holds a merged token")
    key = json.dumps(vision.to_dict(), sort_keys=True, default=str)
    if key not in _CACHE:
        if len(_CACHE) >= 16:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = _per_patch_macs(vision, merge)
    patch_macs, merged_macs = _CACHE[key]
    return VisionCost(vision.model_type, patch_macs, merged_macs, width, merge, depth, window, full_blocks,
                      train_vision)
