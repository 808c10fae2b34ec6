"""Image tokens of Qwen2-VL / Qwen2.5-VL / Qwen3-VL samples, from image sizes, by the processors' resize rule.

The Qwen-VL image processors resize every image with ``smart_resize``: both sides are rounded to a
multiple of ``factor = patch_size * merge_size``; if the area is then above ``max_pixels`` the image is
scaled down (sides floored to the factor), below ``min_pixels`` scaled up (sides ceiled). The model then
sees ``(h / factor) * (w / factor)`` image tokens (patches merged ``merge_size x merge_size``). This module
reproduces that arithmetic exactly (same float64 operations, round half to even like Python's ``round``),
vectorised over all images of a chunk.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from .errors import AnalyzeError

# Released checkpoints' preprocessor_config.json: patch size, merge size, min_pixels, max_pixels.
FAMILIES = {
    "qwen2-vl": (14, 2, 56 * 56, 28 * 28 * 16384),  # min 3136, max 12,845,056
    "qwen2.5-vl": (14, 2, 56 * 56, 28 * 28 * 16384),
    "qwen3-vl": (16, 2, 256 * 256, 4096 * 4096),  # min 65,536, max 16,777,216
}
MAX_ASPECT = 200  # the processors refuse more extreme images


@dataclass(frozen=True)
class VisionTokenRule:
    """How many tokens an image of a given size becomes (``for_family`` gives a model family's numbers)."""

    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    extra_tokens_per_image: int = 0  # e.g. 2 for <|vision_start|> and <|vision_end|> if the text lacks them

    def __post_init__(self):
        for name in ("patch_size", "merge_size", "min_pixels", "max_pixels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise AnalyzeError(f"{name} must be a positive integer, got {value!r}")
        extra = self.extra_tokens_per_image
        if isinstance(extra, bool) or not isinstance(extra, numbers.Integral) or extra < 0:
            raise AnalyzeError(f"extra tokens per image must be a non-negative integer, got {extra!r}")
        if self.min_pixels > self.max_pixels:
            raise AnalyzeError(f"min_pixels ({self.min_pixels}) is above max_pixels ({self.max_pixels})")

    @classmethod
    def for_family(cls, family: str, *, patch_size=None, merge_size=None, min_pixels=None, max_pixels=None,
                   extra_tokens_per_image: int = 0) -> "VisionTokenRule":
        if family not in FAMILIES:
            raise AnalyzeError(f"unknown vision model family {family!r}; allowed: {', '.join(FAMILIES)}")
        p, m, lo, hi = FAMILIES[family]
        pick = lambda given, default: default if given is None else given  # noqa: E731
        return cls(pick(patch_size, p), pick(merge_size, m), pick(min_pixels, lo), pick(max_pixels, hi),
                   extra_tokens_per_image)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def resize(self, height, width) -> tuple[np.ndarray, np.ndarray]:
        """``smart_resize`` of arrays of heights and widths (pixels) -> resized (height, width)."""
        h = np.asarray(height, np.float64)
        w = np.asarray(width, np.float64)
        f = self.factor
        h_bar = np.round(h / f) * f
        w_bar = np.round(w / f) * f
        area = h_bar * w_bar
        down = area > self.max_pixels
        up = ~down & (area < self.min_pixels)
        with np.errstate(divide="ignore", invalid="ignore"):
            beta = np.sqrt((h * w) / self.max_pixels)
            h_bar = np.where(down, np.maximum(f, np.floor(h / beta / f) * f), h_bar)
            w_bar = np.where(down, np.maximum(f, np.floor(w / beta / f) * f), w_bar)
            beta = np.sqrt(self.min_pixels / (h * w))
            h_bar = np.where(up, np.ceil(h * beta / f) * f, h_bar)
            w_bar = np.where(up, np.ceil(w * beta / f) * f, w_bar)
        return h_bar.astype(np.int64), w_bar.astype(np.int64)

    def tokens(self, width, height) -> np.ndarray:
        """Tokens per image (int64 array), extra tokens per image included."""
        h, w = self.resize(height, width)
        return (h // self.factor) * (w // self.factor) + self.extra_tokens_per_image

    def describe(self) -> dict:
        return {"patch_size": self.patch_size, "merge_size": self.merge_size, "min_pixels": self.min_pixels,
                "max_pixels": self.max_pixels, "extra_tokens_per_image": self.extra_tokens_per_image}


_WIDTH_KEYS = ("width", "w", "image_width")
_HEIGHT_KEYS = ("height", "h", "image_height")


def _size_of(value, name, where):
    """(width, height) of one image: a {width, height} dict or a [width, height] pair."""
    if isinstance(value, dict):
        w = next((value[k] for k in _WIDTH_KEYS if k in value), None)
        h = next((value[k] for k in _HEIGHT_KEYS if k in value), None)
        if w is None or h is None:
            raise AnalyzeError(f"field {name!r}: an image size dict needs width and height keys, got "
                               f"{sorted(value)}", *where)
        return w, h
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(_is_number(x) for x in value):
        return value[0], value[1]
    raise AnalyzeError(f"field {name!r} holds {type(value).__name__} {str(value)[:40]!r}; an image size is a "
                       f"{{\"width\": W, \"height\": H}} dict or a [W, H] pair (or a list of them, one per image)",
                       *where)


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _images(value, name, where) -> list:
    """The (width, height) pairs of one sample's size field (none for null / [])."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)) and not (len(value) == 2 and all(_is_number(x) for x in value)):
        return [_size_of(v, name, where) for v in value]
    return [_size_of(value, name, where)]


def _per_image(value, name, where) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def image_tokens(rule: VisionTokenRule, n: int, where, *, sizes=None, widths=None, heights=None,
                 names=("image size", "width", "height")) -> np.ndarray:
    """Image tokens per sample (int64 [n]): from per-sample size values, or from width and height values.

    ``where(i)`` gives the error location of sample ``i``.
    """
    owner, ws, hs = [], [], []
    for i in range(n):
        if sizes is not None:
            pairs = _images(sizes[i], names[0], where(i))
        else:
            w, h = _per_image(widths[i], names[1], where(i)), _per_image(heights[i], names[2], where(i))
            if len(w) != len(h):
                raise AnalyzeError(f"fields {names[1]!r} and {names[2]!r} list {len(w)} and {len(h)} images", *where(i))
            pairs = list(zip(w, h))
        for w, h in pairs:
            if not (_is_number(w) and _is_number(h)) or not (w > 0 and h > 0):
                raise AnalyzeError(f"image size must be positive numbers, got width {w!r}, height {h!r}", *where(i))
            if max(w, h) / min(w, h) > MAX_ASPECT:
                raise AnalyzeError(f"image {w}x{h} has an aspect ratio above {MAX_ASPECT}, which the Qwen-VL "
                                   f"processors refuse", *where(i))
            owner.append(i)
            ws.append(w)
            hs.append(h)
    if not owner:
        return np.zeros(n, np.int64)
    per_image = rule.tokens(np.asarray(ws, np.float64), np.asarray(hs, np.float64))
    return np.bincount(np.asarray(owner, np.int64), weights=per_image, minlength=n).astype(np.int64)
