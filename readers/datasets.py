"""The format -> dataset registry, and `open_dataset`, which dispatches on the manifest."""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from .base import PackedDataset
from .formats import ALIASES, FORMATS, Registry
from .manifest import DatasetError, load_manifest

# Loaded on first use: opening an LMDB dataset never imports h5py.
DATASETS: Registry[type[PackedDataset]] = Registry({name: spec.dataset for name, spec in FORMATS.items()}, ALIASES)


def open_dataset(
    path: str | os.PathLike[str],
    *,
    decode: str = "pil",
    fields: Sequence[str] = ("image", "label"),
    transform: Callable[[Any], Any] | None = None,
    target_transform: Callable[[Any], Any] | None = None,
    on_error: str = "fail",
    decode_size: tuple[int, int] | None = None,
) -> PackedDataset:
    """Open a packed dataset directory; the format is read from its `index.json`.

    `on_error="fail"` raises `DatasetError` on a damaged sample; `"skip"` stands the next readable
    sample in for it and counts it in `dataset.skipped` (per process). The words are those of
    `pack --on-error`; the former `"raise"` still works, with a DeprecationWarning.

    `decode_size=(H, W)` decodes images straight to about that size (JPEG DCT scaling, a
    power-of-two reduction) when the training transform resizes or crops small anyway.
    """
    manifest = load_manifest(path)
    try:
        cls = DATASETS[manifest.format]
    except KeyError:
        raise DatasetError(f"{path}: unknown format {manifest.format!r} in index.json") from None
    return cls(
        path,
        manifest=manifest,
        decode=decode,
        fields=fields,
        transform=transform,
        target_transform=target_transform,
        on_error=on_error,
        decode_size=decode_size,
    )

