"""Turning arrays into the benchmark's images: percentile normalisation, square padding, resizing."""

from __future__ import annotations

import numpy as np
from PIL import Image

IMAGE_SIZE = 128
"""Side of every stored image, in pixels."""


def normalise(values: np.ndarray, low: float = 1.0, high: float = 99.0) -> np.ndarray:
    """Map the ``low``..``high`` percentile range of ``values`` to 0..255 (clipped), as uint8.

    A constant array maps to zeros, except that a constant array already in 0..255 keeps its value
    (so a blank control stays the grey level it was drawn with).
    """
    values = np.asarray(values, dtype=np.float64)
    lo, hi = np.percentile(values, [low, high])
    if hi <= lo:
        if values.min() == values.max() and 0 <= lo <= 255:
            return np.full(values.shape, int(round(lo)), dtype=np.uint8)
        return np.zeros(values.shape, dtype=np.uint8)
    scaled = np.clip((values - lo) / (hi - lo), 0.0, 1.0) * 255.0
    return np.floor(scaled + 0.5).astype(np.uint8)


def pad_square(pixels: np.ndarray, side: int | None = None, fill: int = 0) -> np.ndarray:
    """Centre ``pixels`` on a square canvas of ``side`` (default: its longer side)."""
    h, w = pixels.shape
    side = max(h, w) if side is None else side
    if h > side or w > side:
        raise ValueError(f"cannot pad a {h}x{w} image to {side}x{side}")
    out = np.full((side, side), fill, dtype=pixels.dtype)
    top, left = (side - h) // 2, (side - w) // 2
    out[top : top + h, left : left + w] = pixels
    return out


def resize(pixels: np.ndarray, size: int = IMAGE_SIZE) -> np.ndarray:
    """Resize a square uint8 image to ``size`` x ``size`` (bilinear, antialiased when shrinking)."""
    image = Image.fromarray(np.ascontiguousarray(pixels))
    return np.asarray(image.resize((size, size), Image.Resampling.BILINEAR), dtype=np.uint8)


def to_image(values: np.ndarray, canvas: int | None = None, size: int = IMAGE_SIZE) -> np.ndarray:
    """Normalise (1st-99th percentile), pad to a square of ``canvas`` and resize: the stored form."""
    return resize(pad_square(normalise(values), canvas), size)
