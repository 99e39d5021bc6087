"""HDF5 shards: one standalone file per shard, opened read-only and without file locking.

Each DataLoader worker opens the files it reads on first use (h5py objects cannot cross a fork
or be pickled). Files are opened with `locking=False`, so they work on cluster filesystems
without POSIX locks; setting `HDF5_USE_FILE_LOCKING=FALSE` in the environment does the same for
other HDF5 tools.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import h5py
import numpy as np

from .base import PackedDataset, Record, read_as_span
from .fields import FieldSpec, from_json
from .layouts.hdf5 import (
    CLASSES_ATTRIBUTE,
    LAYOUT_FIXED,
    LAYOUT_FLAT,
    RAW_PATHS_ATTRIBUTE,
    STORAGE_NUMERIC,
    STORAGE_TEXT,
    V1_RAW_INDEX_SUFFIX,
    V1_RAW_SUFFIX,
    field_dataset,
    field_storage,
    parse_raw_name,
    parse_raw_names,
)
from .manifest import DatasetError


class FieldReader:
    """One field of an open shard, read whole when the shard is opened: row i -> the reader's value.

    Reading a variable-length string from HDF5 one row at a time costs ~35 us, more than a small
    image's bytes; the whole column is one read, kept as one bytes blob plus offsets (text) or an
    array (numbers), so a field costs memory in proportion to its stored size per open shard.
    """

    def __init__(self, file: h5py.File, spec: FieldSpec) -> None:
        self.spec = spec
        self.storage = field_storage(spec)
        column = file[field_dataset(spec.name)][:]
        if self.storage == STORAGE_NUMERIC:
            self.values = column
        else:
            self.offsets = np.cumsum([0, *map(len, column)])
            self.blob = b"".join(column)

    def __len__(self) -> int:
        return len(self.values) if self.storage == STORAGE_NUMERIC else len(self.offsets) - 1

    def __getitem__(self, local: int) -> Any:
        if self.storage == STORAGE_NUMERIC:
            value = self.values[local]
            return value.copy() if self.spec.type == "array" else value.item()
        text = self.blob[self.offsets[local]:self.offsets[local + 1]].decode("utf-8")
        if self.storage == STORAGE_TEXT:
            return text
        try:
            return from_json(self.spec, json.loads(text))
        except ValueError as exc:
            raise ValueError(f"field {self.spec.name!r}: {exc}") from None


class DirectBytes:
    """Where a dataset's bytes lie in its file, so that rows are read with one `pread` instead of
    through h5py, whose every read costs tens of microseconds (more than a small image's bytes) and
    goes through a chunk cache that reads whole 64 KiB chunks. Only for data HDF5 stores as is: no
    filters, every chunk allocated, each chunk whole rows (`locate` says None otherwise)."""

    def __init__(self, shape: tuple[int, ...], chunk_offsets: np.ndarray, chunk_bytes: int, row_bytes: int) -> None:
        self.shape = shape  # the dataset's
        self.chunk_offsets = chunk_offsets  # file offset of chunk k, which holds bytes k*chunk_bytes..
        self.chunk_bytes = chunk_bytes
        self.row_bytes = row_bytes

    @classmethod
    def locate(cls, dataset: h5py.Dataset) -> DirectBytes | None:
        dtype = dataset.dtype
        if dtype.kind not in "uifbS" or dataset.id.get_create_plist().get_nfilters() or not dataset.shape:
            return None
        row_bytes = dtype.itemsize * math.prod(dataset.shape[1:])
        if dataset.chunks is None:  # contiguous: one block, or nothing allocated yet
            offset = dataset.id.get_offset()
            return None if offset is None else cls(dataset.shape, np.array([offset], dtype=np.int64),
                                                   max(1, dataset.shape[0] * row_bytes), row_bytes)
        if tuple(dataset.chunks[1:]) != dataset.shape[1:]:
            return None
        rows = dataset.chunks[0]
        chunk_bytes = rows * row_bytes
        offsets = np.full(math.ceil(dataset.shape[0] / rows), -1, dtype=np.int64)

        def visit(info: Any) -> None:
            if info.filter_mask == 0 and info.size == chunk_bytes:
                offsets[info.chunk_offset[0] // rows] = info.byte_offset

        try:
            dataset.id.chunk_iter(visit)
        except (AttributeError, RuntimeError, ValueError):  # an HDF5 without chunk iteration
            return None
        return cls(dataset.shape, offsets, chunk_bytes, row_bytes) if (offsets >= 0).all() else None

    def spans(self, start: int, end: int) -> list[tuple[int, int]]:
        """(file offset, length) of the dataset's bytes start..end-1, as few as the file allows."""
        if end <= start:
            return []
        size = self.chunk_bytes
        first, last = start // size, (end - 1) // size
        offsets = self.chunk_offsets
        begin = int(offsets[first]) + start - first * size
        if first == last or int(offsets[last]) - int(offsets[first]) == (last - first) * size:
            return [(begin, end - start)]
        spans = [(begin, (first + 1) * size - start)]
        spans += [(int(offsets[k]), size) for k in range(first + 1, last)]
        spans.append((int(offsets[last]), end - last * size))
        return spans

    def read_rows(self, fd: int, first: int, stop: int) -> bytes:
        """Rows first..stop-1 as bytes; short when the file ends too early."""
        spans = self.spans(first * self.row_bytes, stop * self.row_bytes)
        if len(spans) == 1:
            return os.pread(fd, spans[0][1], spans[0][0])
        return b"".join(os.pread(fd, length, offset) for offset, length in spans)


class Column:
    """A per-sample dataset of an open shard. Rows are read with pread where the file holds them
    as they are (`DirectBytes`), so an open shard costs no memory per sample: a worker reading from
    every shard of a 5M-sample dataset would otherwise hold ~28 bytes per sample of columns.
    Anything else (filters, a contiguous dataset h5py has not allocated) is read whole, once."""

    def __init__(self, dataset: h5py.Dataset, fd: int) -> None:
        self.shape: tuple[int, ...] = dataset.shape
        self.dtype = dataset.dtype
        self.fd = fd
        self.direct = DirectBytes.locate(dataset)
        self.values = dataset[:] if self.direct is None else None

    def __len__(self) -> int:
        return self.shape[0]

    def rows(self, first: int, stop: int) -> np.ndarray:
        """Rows first..stop-1 (0 <= first <= stop <= len)."""
        if self.values is not None:
            return self.values[first:stop]
        if not 0 <= first <= stop <= self.shape[0]:
            raise IndexError(f"rows {first}..{stop} of a column of {self.shape[0]}")
        assert self.direct is not None
        data = self.direct.read_rows(self.fd, first, stop)
        if len(data) != (stop - first) * self.direct.row_bytes:
            raise ValueError("a column runs past the end of the file")
        return np.frombuffer(data, self.dtype).reshape(stop - first, *self.shape[1:])

    def __getitem__(self, row: int) -> Any:
        return self.rows(row, row + 1)[0]

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The values at `rows`, in that order: one read of the span they cover (`read_as_span`),
        or a read per row. One read instead of one per sample and column is most of what a batch
        of small samples saves."""
        first, stop = int(rows.min()), int(rows.max()) + 1
        if self.direct is None or read_as_span(first, stop, self.direct.row_bytes):
            return self.rows(first, stop)[rows - first]
        return np.concatenate([self.rows(row, row + 1) for row in rows.tolist()])


@dataclass
class HDF5Shard:
    """An open shard: the file (h5py, and a descriptor for pread), its payloads and per-sample columns.

    `offsets` is None in the fixed layout (`images` is then (N, H, W, C)); `shapes` and `mode`
    are set for decoded stores (`shapes` only in the flat layout).
    """

    file: h5py.File | None  # closed after opening where nothing more is read through h5py
    fd: int  # the same file, for pread
    size: int  # the file's bytes: no payload is larger (offsets are untrusted)
    images: h5py.Dataset | None
    direct: DirectBytes | None  # the payload bytes' place in the file, read with pread on `fd`
    offsets: Column | None
    labels: Column
    codecs: Column  # the `formats` column
    crcs: Column
    paths: Any  # the `paths` dataset through `.asstr()` (indexing decodes UTF-8); None if not wanted
    raw_paths: dict[int, str]
    shapes: Column | None
    mode: str | None
    fields: dict[str, FieldReader]
    # label, format, CRC-32 and payload start and end of the samples `_will_read` announced
    ahead: dict[int, tuple[int, bytes, int, int, int]] = field(default_factory=dict)

    def close(self) -> None:
        self.close_both(self.file, self.fd)
        self.fd = -1

    @staticmethod
    def close_both(file: h5py.File | None, fd: int) -> None:
        if fd >= 0:
            os.close(fd)
        if file is not None:
            file.close()


def read_raw_paths(file: h5py.File) -> dict[int, str]:
    """Position -> exact `os.fsdecode` path for the samples whose path is not UTF-8."""
    if RAW_PATHS_ATTRIBUTE in file.attrs:
        return parse_raw_names(file.attrs[RAW_PATHS_ATTRIBUTE])
    positions = file["paths" + V1_RAW_INDEX_SUFFIX][:]  # format version 1: two datasets
    raw = file["paths" + V1_RAW_SUFFIX][:]
    return {int(i): parse_raw_name(value.tobytes()) for i, value in zip(positions, raw)}


def open_shard(path: str, num_samples: int, fields: Sequence[FieldSpec] = (), *, paths: bool = True) -> HDF5Shard:
    """Open one shard file: its per-sample columns (`Column`), the `fields` asked for read into
    memory, the `paths` column if asked for. Where all the rest is read with pread, the h5py file
    is closed again: an open HDF5 file holds ~100 KB, 50 MB per worker for 500 shards. Every
    per-sample dataset's length is checked against index.json before any is read."""
    try:
        file = h5py.File(path, "r", locking=False)
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: cannot open HDF5 shard ({exc})") from None
    fd = -1
    try:
        fd = os.open(path, os.O_RDONLY)
        size = os.fstat(fd).st_size
        layout = file.attrs.get("layout")
        if layout not in (LAYOUT_FLAT, LAYOUT_FIXED):
            raise DatasetError(f"{path}: unknown HDF5 payload layout {layout!r}")
        check_datasets(path, file, layout, num_samples, fields, size,
                       v1_paths=paths and RAW_PATHS_ATTRIBUTE not in file.attrs)
        mode = file.attrs.get("mode")
        shard = HDF5Shard(
            file=file,
            fd=fd,
            size=size,
            images=file["images"],
            direct=DirectBytes.locate(file["images"]),
            offsets=Column(file["offsets"], fd) if layout == LAYOUT_FLAT else None,
            labels=Column(file["labels"], fd),
            codecs=Column(file["formats"], fd),
            crcs=Column(file["crc32"], fd),
            paths=file["paths"].asstr() if paths else None,
            raw_paths=read_raw_paths(file) if paths else {},
            shapes=Column(file["shapes"], fd) if "shapes" in file else None,
            mode=None if mode is None else str(mode),
            fields={spec.name: FieldReader(file, spec) for spec in fields},
        )
    except BaseException as exc:  # never leave the file open; libhdf5 raises many types on a damaged file
        HDF5Shard.close_both(file, fd)
        if isinstance(exc, DatasetError) or not isinstance(exc, Exception):
            raise
        what = f"missing {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise DatasetError(f"{path}: damaged HDF5 shard ({what})") from None
    if not paths and shard.direct is not None:
        shard.file = shard.images = None
        file.close()
    return shard


def own_dataset(path: str, file: h5py.File, name: str) -> h5py.Dataset:
    """`file[name]`, refused unless every link on the way is a hard link within the file and the
    dataset keeps its data in the file: an external link, external storage or a virtual dataset
    would make libhdf5 read another file of the reader's machine as if it were this shard's."""
    group: Any = file
    for part in name.split("/"):
        link = group.get(part, getlink=True)
        if link is None:
            raise DatasetError(f"{path}: damaged HDF5 shard (missing '{name}')")
        if not isinstance(link, h5py.HardLink):
            raise DatasetError(f"{path}: '{name}' links outside the shard ({type(link).__name__})")
        group = group[part]
    if not isinstance(group, h5py.Dataset):
        raise DatasetError(f"{path}: '{name}' is not a dataset")
    plist = group.id.get_create_plist()
    if plist.get_external_count() or plist.get_layout() == h5py.h5d.VIRTUAL:
        raise DatasetError(f"{path}: '{name}' keeps its data outside the shard")
    return group


def check_datasets(path: str, file: h5py.File, layout: str, num_samples: int, fields: Sequence[FieldSpec],
                   size: int, v1_paths: bool) -> None:
    """Every dataset a reader may read is the shard's own (`own_dataset`) and has the shape and
    type FORMAT.md gives, with one row per sample index.json counts, before anything is read: a
    lying shard can make a reader neither read another file nor allocate more than the shard's
    own size allows (a column of never written chunks reads as zeros of any size)."""
    n = num_samples
    expected: dict[str, tuple[tuple[int, ...], str]] = {
        "labels": ((n,), "i"), "formats": ((n,), "S"), "crc32": ((n,), "u"), "paths": ((n,), "O")}
    if "shapes" in file:
        expected["shapes"] = ((n, 3), "i")
    if layout == LAYOUT_FLAT:
        expected["offsets"] = ((n + 1,), "i")
    for spec in fields:
        numeric = field_storage(spec) == STORAGE_NUMERIC
        expected[field_dataset(spec.name)] = ((n, *(spec.shape or ())) if numeric else (n,), "iufb" if numeric else "O")
    for name, (shape, kinds) in expected.items():
        dataset = own_dataset(path, file, name)
        if dataset.shape != shape or dataset.dtype.kind not in kinds:
            rows = dataset.shape[0] if dataset.shape else 0
            if rows != shape[0] and len(dataset.shape) == len(shape):
                what = f"holds {rows - (name == 'offsets')} samples, index.json says {n}"
            else:
                what = f"is {dataset.dtype} {dataset.shape}, not of the shape {shape} a shard of {n} samples has"
            raise DatasetError(f"{path}: {name} {what}")
    images = own_dataset(path, file, "images")
    if images.dtype != np.uint8 or (layout == LAYOUT_FLAT and len(images.shape) != 1):
        raise DatasetError(f"{path}: images is {images.dtype} {images.shape}, not uint8 bytes")
    if layout == LAYOUT_FLAT and images.shape[0] > size:
        raise DatasetError(f"{path}: images holds {images.shape[0]} bytes, more than the file's {size}")
    if layout == LAYOUT_FIXED:
        if len(images.shape) != 4 or images.shape[0] != n:
            raise DatasetError(f"{path}: images is {images.shape}, not the (N, H, W, C) of {n} samples")
        if math.prod(images.shape[1:]) > size:
            raise DatasetError(f"{path}: images of shape {images.shape[1:]} cannot fit in {size} bytes")
    if v1_paths:
        for name in ("paths" + V1_RAW_INDEX_SUFFIX, "paths" + V1_RAW_SUFFIX):
            dataset = own_dataset(path, file, name)
            if len(dataset.shape) != 1 or dataset.shape[0] > n:
                raise DatasetError(f"{path}: {name} is {dataset.shape}, more rows than the {n} samples")


class HDF5Dataset(PackedDataset):
    """Map-style dataset over HDF5 shards (`locking=False`, opened lazily in each process)."""

    format = "hdf5"

    def _open(self, shard: int) -> HDF5Shard:
        return open_shard(str(self.shard_path(shard)), self.manifest.shards[shard].num_samples, self.wanted,
                          paths="path" in self.fields)

    def _close(self, handle: Any) -> None:
        handle.close()

    def _will_read(self, shard: int, locals_: np.ndarray) -> None:
        """The batch's rows of the per-sample columns, read at once and kept for `_read`, and
        posix_fadvise(WILLNEED) on each sample's payload, in file order (see `__getitems__`)."""
        handle: HDF5Shard = self.handle(shard)
        count = len(locals_)
        if handle.offsets is not None:
            bounds = handle.offsets.take(np.concatenate([locals_, locals_ + 1])).tolist()
            starts, ends = bounds[:count], bounds[count:]
        else:
            starts = ends = [0] * count
        handle.ahead = dict(zip(locals_.tolist(), zip(handle.labels.take(locals_).tolist(),
                                                      handle.codecs.take(locals_).tolist(),
                                                      handle.crcs.take(locals_).tolist(), starts, ends)))
        if handle.direct is None:
            return
        spans = []
        for local, start, end in zip(locals_.tolist(), starts, ends):
            if handle.offsets is None:
                start, end = local * handle.direct.row_bytes, (local + 1) * handle.direct.row_bytes
            spans += handle.direct.spans(start, end)
        for offset, length in sorted(spans):
            os.posix_fadvise(handle.fd, offset, length, os.POSIX_FADV_WILLNEED)

    def _read(self, shard: int, local: int) -> Record:
        handle: HDF5Shard = self.handle(shard)
        ahead = handle.ahead.pop(local, None)
        if ahead is None:
            label, codec, crc = int(handle.labels[local]), handle.codecs[local], int(handle.crcs[local])
        else:
            label, codec, crc, start, end = ahead
        meta: dict[str, Any] = {"label": label, "format": codec.decode("ascii"), "crc32": crc}
        if handle.offsets is None:  # fixed layout: one (H, W, C) row, read as one chunk
            if handle.direct is not None:
                payload = handle.direct.read_rows(handle.fd, local, local + 1)
                if len(payload) != handle.direct.row_bytes:
                    raise DatasetError(f"{self.shard_path(shard)}: sample {local}: runs past the end of the file")
                meta["shape"] = list(handle.direct.shape[1:])
            else:
                array = handle.images[local]
                payload, meta["shape"] = array, list(array.shape)
        else:
            if ahead is None:
                start, end = handle.offsets.rows(local, local + 2).tolist()
            if not 0 <= end - start <= handle.size:  # offsets are untrusted: never a read larger than the file
                raise DatasetError(f"{self.shard_path(shard)}: sample {local}: damaged offsets ({start}..{end}, "
                                   f"the file holds {handle.size} bytes)")
            if handle.direct is None:
                payload = handle.images[start:end]
            else:  # bounds outside the image data read nothing, and fail the length check below
                inside = 0 <= start and end <= handle.direct.shape[0]
                payload = handle.direct.read_rows(handle.fd, start, end) if inside else b""
            if len(payload) != end - start:
                raise DatasetError(f"{self.shard_path(shard)}: sample {local}: damaged offsets ({start}..{end}, "
                                   f"outside the image data)")
            if handle.shapes is not None:
                meta["shape"] = handle.shapes[local].tolist()
        if handle.mode is not None:
            meta["mode"] = handle.mode
            if meta["format"] == "raw":
                meta["dtype"] = "uint8"
        if "path" in self.fields:
            raw = handle.raw_paths.get(local)
            meta["path"] = raw if raw is not None else handle.paths[local]
        fields = {name: reader[local] for name, reader in handle.fields.items()}
        return meta, memoryview(payload).cast("B"), fields

    def stored_samples(self, shard: int) -> int:
        file = self.handle(shard).file
        if file is not None:
            return int(file.attrs["num_samples"])
        with h5py.File(self.shard_path(shard), "r", locking=False) as file:
            return int(file.attrs["num_samples"])

    def stored_classes(self, shard: int) -> list[str] | None:
        file = self.handle(shard).file
        if file is not None:
            return self._classes_attribute(shard, file)
        with h5py.File(self.shard_path(shard), "r", locking=False) as file:
            return self._classes_attribute(shard, file)

    def _classes_attribute(self, shard: int, file: h5py.File) -> list[str] | None:
        text = file.attrs.get(CLASSES_ATTRIBUTE)
        if text is None:  # format version 1 kept them in a dataset
            return None
        try:
            names = json.loads(text)
        except (TypeError, ValueError):
            names = None
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise DatasetError(f"{self.shard_path(shard)}: damaged {CLASSES_ATTRIBUTE} attribute")
        return names
