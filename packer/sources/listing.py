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
    """Relative paths packed into one buffer of their `os.fsencode` bytes, front-coded by block.

    A list of str costs ~85 bytes a path (object header, hash, pointer); a buffer of the paths'
    bytes costs their length plus one, which at ten million files is still ~300 MB of mostly
    repeated folder names. Here the paths are cut into blocks of BLOCK; each path keeps only what
    follows the bytes it shares with its block's first path (at most 255, one byte in `_shared`),
    ended by a NUL. In sorted order a block's paths share their folder and most of their name:
    "n00000001/img_00001234.JPEG" stores "234.JPEG" and two bytes. Any path is its block's first
    path's prefix plus its own bytes, so random access decodes one path, not its block's chain.

    `take` returns a view: the positions it picked, over the same buffer (a permutation of ten
    million paths is 4 bytes each, not a second buffer). Paths are decoded a block of BLOCK at a
    time, the last block kept, so reading in order (iteration, slices, ascending indexes) costs
    one decode per path.
    """

    BLOCK = 256
    MAX_SHARED = 255

    def __init__(self, paths: Iterable[str] = ()) -> None:
        self._data = bytearray()
        self._shared = bytearray()  # bytes path k shares with its block's first path
        self._starts = array("q")  # where path k * BLOCK starts in _data
        self._len = 0
        self._base = b""  # the last block's first path
        self._cached: tuple[int, list[str]] = (-1, [])
        self._ends: Any = None  # numpy: one past each path's NUL in _data, made when paths are picked
        self._source: PathList | None = None  # a view's: the PathList whose paths it picks
        self._positions: Any = None  # a view's numpy positions in `_source`
        self.extend(paths)

    def append(self, path: str) -> None:
        self.extend([path])

    def extend(self, paths: Iterable[str]) -> None:
        if self._source is not None:  # a view that grows holds its own paths from then on
            picked = list(self)
            self._source = self._positions = None
            self._len = 0
            self.extend(picked)
        items = iter(paths)
        while piece := list(itertools.islice(items, self.BLOCK - self._len % self.BLOCK)):
            encoded = os.fsencode("\0".join(piece)).split(b"\0")
            whole = self._len % self.BLOCK == 0  # a block's first path is stored whole
            if whole:
                self._starts.append(len(self._data))
                self._base = encoded[0]
            shared = [0] * whole + shared_counts(self._base, encoded[whole:], self.MAX_SHARED)
            self._shared += bytes(shared)
            self._data += b"\0".join([path[count:] for path, count in zip(encoded, shared)]) + b"\0"
            self._len += len(piece)
        self._cached = (-1, [])
        self._ends = None

    def __len__(self) -> int:
        return self._len

    def take(self, positions: Sequence[int]) -> PathList:
        """A view of the paths at `positions`, in that order: no path is copied or decoded.
        Positions are kept as int32 where they fit (a shuffled order's are already)."""
        import numpy as np  # here: shard workers, which only read paths, never load numpy

        picked = np.asarray(positions)
        if picked.dtype.kind not in "iu":
            picked = picked.astype(np.int64)
        source = self if self._source is None else self._source
        if self._source is not None:
            picked = self._positions[picked]
        view = PathList()
        view._source = source
        view._positions = picked.astype(np.int32, copy=False) if len(source) < 2**31 else picked
        view._len = len(picked)
        return view

    def _path_ends(self) -> Any:
        """One past each path's NUL in `_data` (uint32 while the buffer is under 4 GiB), found a
        chunk at a time: a comparison of the whole buffer would cost a byte per byte of paths."""
        import numpy as np

        if self._ends is None:
            data = np.frombuffer(self._data, dtype=np.uint8)  # a view: _data is not resized meanwhile
            ends = np.empty(self._len, dtype=np.uint32 if len(data) < 2**32 else np.int64)
            found = 0
            for first in range(0, len(data), 1 << 20):
                chunk = np.flatnonzero(data[first:first + (1 << 20)] == 0) + (first + 1)
                ends[found:found + len(chunk)] = chunk
                found += len(chunk)
            self._ends = ends
        return self._ends

    def _picked_bytes(self, positions: Any) -> bytes:
        """The NUL-ended bytes of the paths at numpy `positions`, in that order: each path is its
        block's first path's shared prefix, then its own bytes."""
        import numpy as np

        data = np.frombuffer(self._data, dtype=np.uint8)
        ends = self._path_ends()
        picked = np.asarray(positions, dtype=np.int64)
        own_starts = np.where(picked > 0, ends[picked - 1], 0).astype(np.int64)
        first = picked - picked % self.BLOCK
        base_starts = np.where(first > 0, ends[first - 1], 0).astype(np.int64)
        shared = np.frombuffer(self._shared, dtype=np.uint8)[picked].astype(np.int64)
        starts = np.stack([base_starts, own_starts], axis=1).ravel()
        lengths = np.stack([shared, ends[picked].astype(np.int64) - own_starts], axis=1).ravel()
        offsets = np.cumsum(lengths) - lengths
        gather = np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()))
        return data[gather].tobytes()

    VIEW_BLOCKS = 16
    """A view decodes this many blocks at once: one gather of ~4,000 paths, not 16 of 256."""

    def _block(self, number: int) -> list[str]:
        first = number * self.BLOCK
        cached_first, cached = self._cached
        if not cached_first <= first < cached_first + len(cached):
            if self._source is not None:
                positions = self._positions[first:first + self.VIEW_BLOCKS * self.BLOCK]
                joined = self._source._picked_bytes(positions)[:-1]
            else:
                end = self._starts[number + 1] if number + 1 < len(self._starts) else len(self._data)
                pieces = bytes(self._data[self._starts[number]:end - 1]).split(b"\0")
                base = pieces[0]
                shared = self._shared[first + 1:first + len(pieces)]
                if shared and shared.count(shared[0]) == len(shared):  # the usual block: one join
                    prefix = base[:shared[0]]
                    joined = base + b"\0" + prefix + (b"\0" + prefix).join(pieces[1:])
                else:
                    joined = b"\0".join([base, *(base[:count] + piece for count, piece in zip(shared, pieces[1:]))])
            text = joined.decode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())
            cached_first, cached = self._cached = (first, text.split("\0"))
        if len(cached) <= self.BLOCK:
            return cached
        return cached[first - cached_first:first - cached_first + self.BLOCK]

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
        for number in range(-(-self._len // self.BLOCK)):
            yield from self._block(number)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __repr__(self) -> str:
        return f"PathList({list(self)!r})"


def shared_counts(base: bytes, paths: list[bytes], most: int) -> list[int]:
    """Leading bytes (up to `most`) each of `paths` may leave to `base`: at most what it shares
    with it. What the base shares with all of them is one C pass (`commonprefix`: min and max);
    in sorted order, where all are in the base's folder, each then stores the last few characters
    of its name. Where a new folder begins among them (they share less than the first's folder),
    the run is halved until each half's paths are in one folder or share as much as the first."""
    count = min(len(os.path.commonprefix([base, *paths])), most) if paths else 0
    if len(paths) <= 8 or count >= paths[0].rfind(b"/") + 1 or \
            count == min(len(os.path.commonprefix([base, paths[0]])), most):
        return [count] * len(paths)
    half = len(paths) // 2
    return shared_counts(base, paths[:half], most) + shared_counts(base, paths[half:], most)


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

        picked = np.asarray(positions)
        if picked.dtype.kind not in "iu":  # an empty list
            picked = picked.astype(np.int64)
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

    def labels_to_set(self) -> array:
        """`labels` as int64, for code that sets them one by one (any label fits): the walk keeps
        them in the narrowest type that holds its class indexes."""
        if self.labels.typecode != "q":
            self.labels = array("q", self.labels)
        return self.labels

    def location(self, position: int) -> list[int] | None:
        """(input number, offset, length) of a container sample; None for a file under `root`."""
        return None if self.locations is None else list(self.locations[3 * position:3 * position + 3])


def taken_rows(table: array, positions: Any, width: int) -> array:
    """The rows (of `width` integers) of a flat array at numpy `positions`, in that order, in its type."""
    import numpy as np

    dtype = np.dtype(table.typecode)
    rows = np.frombuffer(table, dtype=dtype).reshape(-1, width) if len(table) else np.zeros((0, width), dtype)
    taken = array(table.typecode)
    taken.frombytes(memoryview(np.ascontiguousarray(rows[positions])).cast("B"))  # no bytes copy between
    return taken


INT_TYPES = "bhiq"
"""array typecodes of signed integers, narrowest first."""


def int_type(low: int, high: int) -> str:
    """The narrowest typecode of INT_TYPES that holds every integer from `low` to `high`."""
    for code in INT_TYPES:
        bits = array(code).itemsize * 8 - 1
        if -(1 << bits) <= low and high < 1 << bits:
            return code
    raise OverflowError(f"{low}..{high} do not fit in 64 bits")


def extended(table: array, values: Sequence[int]) -> array:
    """`table` with `values` appended: `table` itself, or a copy in a wider type when a value does
    not fit its own. The walk keeps labels and sizes so: at ten million files, 8 bytes a file each
    is 160 MB, where class indexes take 2 bytes and the sizes of images 4."""
    length = len(table)
    try:
        table.extend(values)  # an array of another type: TypeError, nothing appended
        return table
    except (OverflowError, TypeError):
        del table[length:]  # a list appends up to the value that overflowed
    items = list(values)
    code = max(table.typecode, int_type(min(items), max(items)), key=lambda code: array(code).itemsize)
    if code == table.typecode:  # an array of another type whose values fit this one
        table.extend(items)
        return table
    wide = array(code, table)
    wide.extend(items)
    return wide


def is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS
