"""Functions for packer.pack_samples tests: module-level, so the spawned workers can import them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def from_file(item: tuple[str, str, int]) -> dict[str, Any]:
    """(root, path, label) -> the file's bytes as the image, the path as a caption field."""
    root, path, label = item
    return {"image": (Path(root) / path).read_bytes(), "label": label, "caption": f"a picture of {path}"}


def flaky(item: int) -> dict[str, Any]:
    if item % 3 == 1:
        raise ValueError(f"no frame {item}")
    if item == 5:
        return {"image": None, "label": 0, "score": 0.5}
    if item == 6:
        return {"image": pixels(item), "label": 0, "score": "high"}
    return {"image": pixels(item), "label": item, "score": item / 2}


def pixels(item: int) -> np.ndarray:
    array = np.zeros((4, 6, 3), dtype=np.uint8)
    array[..., 0] = item
    array[1, 2] = (9, 8, 7)
    return array


def frames(item: int) -> list[dict[str, Any]]:
    """Several samples per input, as frames decoded from one video."""
    return [{"image": pixels(item * 10 + frame), "label": item, "frame": np.array([item, frame])} for frame in range(item)]


def always_fails(item: int) -> dict[str, Any]:
    raise RuntimeError(f"cannot make {item}")
