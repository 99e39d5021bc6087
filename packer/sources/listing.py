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

    TAKE_CHUNK = 64 * BLOCK

    def take(self, positions: Sequence[int]) -> PathList:
        """The paths at `positions`, in that order, copied as bytes and never decoded, so a
        permutation costs what a slice does (indexing out of order decodes a block per path)."""
        import numpy as np  # here: shard workers, which only read paths, never load numpy

        data = np.frombuffer(self._data, dtype=np.uint8)  # a view: self._data is not resized meanwhile
        ends = np.flatnonzero(data == 0) + 1  # one past each path's NUL
        picked = np.asarray(positions, dtype=np.int64)
        taken = PathList()
        for first in range(0, len(picked), self.TAKE_CHUNK):  # a multiple of BLOCK: block starts line up
            chosen = picked[first:first + self.TAKE_CHUNK]
            starts = np.where(chosen > 0, ends[chosen - 1], 0)
            lengths = ends[chosen] - starts
            offsets = np.cumsum(lengths) - lengths
            gather = np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()))
            taken._starts.extend((len(taken._data) + offsets[::self.BLOCK]).tolist())
            taken._data += data[gather].tobytes()
        taken._len = len(picked)
        return taken

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


IGNORED_NAMES_KEPT = 1000
"""Ignored entries named in the plan (the summary shows the first few, `-v` logs them)."""


@dataclass
class Listing:
    """Files to pack, in packing order. `paths` are relative POSIX paths in os.fsdecode form.

    `paths` is a `PathList` unless a source sets a list. `labels` index `classes` (-1: unlabelled). `rejects` are (path, reason) of files found but not
    packable, known before any is read; `fields` the per-sample fields, of which the ones in
    `values` (one dict per file, or None) come with the listing and the rest are read at packing.

    Container inputs (tar shards, record files, packed datasets: `packer.sources.inputs`) list
    samples inside `inputs` rather than files under `root`: `locations` holds three integers per
    sample, (input number, offset, length), the byte range (or position) that `load` reads.

    `mtimes`, `listed_at` and `newest_mtime` are not planned: they date the plan, and a rerun
    compares SRC's times with that date (`packer.plan.changes`).
    """

    root: str
    classes: list[str]
    paths: PathList | list[str] = field(default_factory=PathList)
    labels: array = field(default_factory=lambda: array("q"))
    sizes: array = field(default_factory=lambda: array("q"))
    ignored_hidden: int = 0
    ignored_other: int = 0
    ignored_names: list[str] = field(default_factory=list)  # the first IGNORED_NAMES_KEPT, relative to root
    unclassed: int = 0  # images beside the class folders: in no class, so not packed
    unclassed_names: list[str] = field(default_factory=list)  # the first IGNORED_NAMES_KEPT of them
    aliases: list[str] = field(default_factory=list)  # "cat/see_also -> dog: ...": folders packed once, elsewhere
    rejects: list[tuple[str, str]] = field(default_factory=list)
    fields: list[FieldSpec] = field(default_factory=list)
    values: list[dict[str, Any]] | None = None
    kind: str = "folder"
    inputs: list[str] = field(default_factory=list)
    locations: array | None = None
    mtimes: array | None = None  # each file's modification time (ns), where the source tells it
    listed_at: int | None = None  # when the scan began (time.time_ns()): a file modified later changed since
    newest_mtime: int = 0  # the latest modification time (ns) among the files (or container inputs) listed

    def ignore(self, names: Iterable[str], *, hidden: bool) -> None:
        """Count entries left out (hidden ones, or not images), keeping the first names to show."""
        names = list(names)
        if hidden:
            self.ignored_hidden += len(names)
        else:
            self.ignored_other += len(names)
        self.ignored_names += names[: max(0, IGNORED_NAMES_KEPT - len(self.ignored_names))]

    def leave_out_unclassed(self, names: Iterable[str]) -> None:
        """Count images beside the class folders, which belong to no class, keeping the first names."""
        names = list(names)
        self.unclassed += len(names)
        self.unclassed_names += names[: max(0, IGNORED_NAMES_KEPT - len(self.unclassed_names))]

    def note_alias(self, folder: str, class_name: str) -> None:
        """A folder inside a class that is class folder `class_name` (a symlink): not listed there."""
        self.aliases.append(f"{folder} -> {class_name}: alias of class folder {class_name}, packed once under "
                            f"{class_name}")

    def __len__(self) -> int:
        return len(self.paths)

    def keep(self, positions: Sequence[int]) -> None:
        """Keep only the files at these positions, in this order (a filter, or a permutation), with
        their labels, sizes, values and locations."""
        import numpy as np  # here: shard workers, which only read listings, never load numpy

        picked = np.asarray(positions, dtype=np.int64)
        paths = self.paths
        self.paths = paths.take(picked) if isinstance(paths, PathList) else [paths[i] for i in picked]
        self.labels = taken_rows(self.labels, picked, 1)
        self.sizes = taken_rows(self.sizes, picked, 1)
        if self.values is not None:
            values = self.values
            self.values = [values[i] for i in picked]
        if self.locations is not None:
            self.locations = taken_rows(self.locations, picked, 3)
        if self.mtimes is not None:
            self.mtimes = taken_rows(self.mtimes, picked, 1)

    def location(self, position: int) -> list[int] | None:
        """(input number, offset, length) of a container sample; None for a file under `root`."""
        return None if self.locations is None else list(self.locations[3 * position:3 * position + 3])


def taken_rows(table: array, positions: Any, width: int) -> array:
    """The rows (of `width` int64s) of a flat array('q') at numpy `positions`, in that order."""
    import numpy as np

    rows = np.frombuffer(table, dtype=np.int64).reshape(-1, width) if len(table) else np.zeros((0, width), np.int64)
    taken = array("q")
    taken.frombytes(rows[positions].tobytes())
    return taken


def is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS
