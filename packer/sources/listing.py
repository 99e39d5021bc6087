"""What every source produces: the sorted listing of files to pack, and what it left out."""

from __future__ import annotations

import itertools
import os
import sys
from array import array
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence, overload

from readers.fields import FieldSpec

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".jpe", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".ppm", ".pgm"}
)
UNLABELLED = -1
MAX_LABEL = 2**63 - 1
"""The largest label: every format stores labels as int64."""


class ScanError(Exception):
    """SRC (or a file describing it) cannot be used; the message names it."""


class PathList(Sequence[str]):
    """Relative paths packed into one buffer of their `os.fsencode` bytes, each ended by a NUL.

    A list of str costs ~85 bytes a path (object header, hash, pointer); here it is the path's
    length plus one, which at ten million files is the difference between gigabytes and hundreds of
    megabytes. Paths are decoded a block of BLOCK at a time, the last block kept, so reading in
    order (iteration, slices, ascending indexes) costs one decode per path.
    """

    BLOCK = 256

    def __init__(self, paths: Iterable[str] = ()) -> None:
        self._data = bytearray()
        self._starts = array("q")  # where path k * BLOCK starts in _data
        self._len = 0
        self._cached: tuple[int, list[str]] = (-1, [])
        self.extend(paths)

    def append(self, path: str) -> None:
        self.extend([path])

    def extend(self, paths: Iterable[str]) -> None:
        items = iter(paths)
        while piece := list(itertools.islice(items, self.BLOCK - self._len % self.BLOCK)):
            if self._len % self.BLOCK == 0:
                self._starts.append(len(self._data))
            self._data += os.fsencode("\0".join(piece) + "\0")
            self._len += len(piece)
        self._cached = (-1, [])

    def __len__(self) -> int:
        return self._len

    def _block(self, number: int) -> list[str]:
        if self._cached[0] != number:
            end = self._starts[number + 1] if number + 1 < len(self._starts) else len(self._data)
            text = self._data[self._starts[number]:end - 1].decode(sys.getfilesystemencoding(),
                                                                   sys.getfilesystemencodeerrors())
            self._cached = (number, text.split("\0"))
        return self._cached[1]

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            if step != 1:
                return [self[k] for k in range(start, stop, step)]
            out: list[str] = []
            for number in range(start // self.BLOCK, (stop - 1) // self.BLOCK + 1 if stop > start else 0):
                first = number * self.BLOCK
                out += self._block(number)[max(start - first, 0):stop - first]
            return out
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("PathList index out of range")
        return self._block(index // self.BLOCK)[index % self.BLOCK]

    def __iter__(self) -> Iterator[str]:
        for number in range(len(self._starts)):
            yield from self._block(number)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __repr__(self) -> str:
        return f"PathList({list(self)!r})"


@dataclass
class Listing:
    """Files to pack, in packing order. `paths` are relative POSIX paths in os.fsdecode form.

    `paths` is a `PathList` unless a source sets a list. `labels` index `classes` (-1: unlabelled). `rejects` are (path, reason) of files found but not
    packable, known before any is read; `fields` the per-sample fields, of which the ones in
    `values` (one dict per file, or None) come with the listing and the rest are read at packing.

    Container inputs (tar shards, record files, packed datasets: `packer.sources.inputs`) list
    samples inside `inputs` rather than files under `root`: `locations` holds three integers per
    sample, (input number, offset, length), the byte range (or position) that `load` reads.
    """

    root: str
    classes: list[str]
    paths: PathList | list[str] = field(default_factory=PathList)
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
        self.paths = PathList(self.paths[i] for i in positions)
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
