"""What every source produces: the sorted listing of files to pack, and what it left out."""

from __future__ import annotations

import os
from array import array
from dataclasses import dataclass, field
from typing import Any

from readers.fields import FieldSpec

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".jpe", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".ppm", ".pgm"}
)
UNLABELLED = -1


class ScanError(Exception):
    """SRC (or a file describing it) cannot be used; the message names it."""


@dataclass
class Listing:
    """Files to pack, in packing order. `paths` are relative POSIX paths in os.fsdecode form.

    `labels` index `classes` (-1: unlabelled). `rejects` are (path, reason) of files found but not
    packable, known before any is read; `fields` the per-sample fields, of which the ones in
    `values` (one dict per file, or None) come with the listing and the rest are read at packing.

    Container inputs (tar shards, record files, packed datasets: `packer.sources.inputs`) list
    samples inside `inputs` rather than files under `root`: `locations` holds three integers per
    sample, (input number, offset, length), the byte range (or position) that `load` reads.
    """

    root: str
    classes: list[str]
    paths: list[str] = field(default_factory=list)
    labels: array = field(default_factory=lambda: array("q"))
    sizes: array = field(default_factory=lambda: array("q"))
    ignored_hidden: int = 0
    ignored_other: int = 0
    rejects: list[tuple[str, str]] = field(default_factory=list)
    fields: list[FieldSpec] = field(default_factory=list)
    values: list[dict[str, Any]] | None = None
    kind: str = "folder"
    inputs: list[str] = field(default_factory=list)
    locations: array | None = None

    def __len__(self) -> int:
        return len(self.paths)

    def keep(self, positions: list[int]) -> None:
        """Keep only the files at these positions (in order), with their labels, sizes and values."""
        self.paths = [self.paths[i] for i in positions]
        self.labels = array("q", (self.labels[i] for i in positions))
        self.sizes = array("q", (self.sizes[i] for i in positions))
        if self.values is not None:
            self.values = [self.values[i] for i in positions]
        if self.locations is not None:
            locations = self.locations
            self.locations = array("q", (locations[3 * i + k] for i in positions for k in range(3)))

    def location(self, position: int) -> list[int] | None:
        """(input number, offset, length) of a container sample; None for a file under `root`."""
        return None if self.locations is None else list(self.locations[3 * position:3 * position + 3])


def is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS
