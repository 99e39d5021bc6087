"""HDF5 shard writer: one standalone file per shard, written in bounded batches.

Layout (docs/FORMAT.md): image bytes back to back in one chunked uint8 dataset `images`, sample
i at `images[offsets[i]:offsets[i + 1]]` (scripts/bench_hdf5_layout.py measured this 2-5x faster
for random reads than a vlen uint8 dataset); per-sample `labels`, `formats` (codecs) and `paths` columns;
the `classes` attribute. The payload layout is named by the file's `layout` attribute: `FlatPayloads`, or
`FixedPixels` (one (N, H, W, C) uint8 array) when every sample is raw pixels of one shape.
Decoded stores add a `shapes` column (flat layout) and a `mode` attribute. Fields are datasets
`fields/<name>` (readers/layouts/hdf5.py says which are numeric, text or JSON strings).
"""

from __future__ import annotations

import errno
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import h5py
import numpy as np

from readers.fields import FieldSpec
from readers.layouts.hdf5 import (
    CLASSES_ATTRIBUTE,
    CODEC_WIDTH,
    LAYOUT_FIXED,
    LAYOUT_FLAT,
    RAW_PATHS_ATTRIBUTE,
    STORAGE_NUMERIC,
    STORAGE_TEXT,
    encode_name,
    encode_raw_names,
    field_dataset,
    field_storage,
    numeric_layout,
)
from readers.manifest import FORMAT_VERSION

from ...stores.fsutil import free_bytes
from .base import Sample, ShardWriter

IMAGE_CHUNK = 64 << 10  # one chunk per random read of a typical JPEG; see scripts/bench_hdf5_layout.py
FLUSH_BYTES = 8 << 20  # image bytes buffered in memory before they are written
COLUMN_BATCH = 4096  # per-sample values buffered before they are written
COLUMN_CHUNK = 1024  # entries per chunk of a column: small shards stay small
METADATA_MARGIN = 1 << 20  # free space kept for HDF5's own headers and chunk indexes


def check_space(directory: Path, needed: int) -> None:
    """Refuse a write the filesystem has no room for, before HDF5 attempts it.

    With h5py 3.16 / HDF5 2.0, a file whose write failed (a full disk) crashes the process when it
    is closed or collected, so a full disk has to be noticed here; this is best effort (another
    process may fill the disk in between). Filesystems that report no size are not checked.
    """
    free = free_bytes(directory)
    if free is not None and free < needed:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({needed} bytes needed, {free} free)")


@contextmanager
def h5py_errors_as_oserror() -> Iterator[None]:
    """h5py reports a failed write (a full disk, say) as RuntimeError or OSError carrying HDF5's
    multi-line message; re-raise it as an OSError with just the errno, which the pipeline reports
    in one line."""
    try:
        yield
    except (RuntimeError, OSError) as exc:
        match = re.search(r"errno = (\d+)", str(exc))
        code = match and int(match.group(1))
        if code:
            raise OSError(code, os.strerror(code)) from None
        raise OSError(f"HDF5: {str(exc).splitlines()[0]}") from None


class Column:
    """A dataset of one value (or one fixed-size `row`) per sample that grows by whole batches:
    memory stays bounded, resizes stay rare."""

    def __init__(self, file: h5py.File, name: str, dtype: Any, chunk: int = COLUMN_CHUNK,
                 row: tuple[int, ...] = ()) -> None:
        self.dataset = file.create_dataset(name, shape=(0, *row), maxshape=(None, *row), dtype=dtype,
                                           chunks=(chunk, *row))
        self._row = row
        self._pending: list[Any] = []

    def append(self, value: Any) -> None:
        self._pending.append(value)
        if len(self._pending) >= COLUMN_BATCH:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        start = self.dataset.shape[0]
        values = np.empty((len(self._pending), *self._row), dtype=self.dataset.dtype)
        if values.dtype == object:  # strings or arrays: one element each, no broadcasting
            for position, value in enumerate(self._pending):
                values[position] = value
        else:
            values[:] = self._pending
        self.dataset.resize((start + len(values), *self._row))
        # write_direct: `dataset[a:b] = values` would try to broadcast equal-length vlen arrays.
        self.dataset.write_direct(values, dest_sel=np.s_[start:])
        self._pending = []


class StringColumn:
    """UTF-8 strings; the exact form of any that are not valid UTF-8 (`encode_name`) is kept in
    `raw` for an attribute."""

    def __init__(self, file: h5py.File, name: str, chunk: int = COLUMN_CHUNK) -> None:
        self._text = Column(file, name, h5py.string_dtype("utf-8"), chunk)
        self.raw: dict[int, str] = {}
        self._count = 0

    def append(self, value: str) -> None:
        text, raw = encode_name(value)
        if raw is not None:
            self.raw[self._count] = value
        self._text.append(text)
        self._count += 1

    def flush(self) -> None:
        self._text.flush()


class FieldColumn:
    """One field's dataset, made with `create_dataset`: stored bytes in, the layout's value out."""

    def __init__(self, file: h5py.File, spec: FieldSpec) -> None:
        self.spec = spec
        self.storage = field_storage(spec)
        if self.storage == STORAGE_NUMERIC:
            dtype, row = numeric_layout(spec)
            self._column = Column(file, field_dataset(spec.name), np.dtype(dtype), row=row)
        else:
            self._column = Column(file, field_dataset(spec.name), h5py.string_dtype("utf-8"))

    def append(self, data: bytes | None) -> None:
        if self.storage == STORAGE_NUMERIC:
            value: Any = json.loads(data)  # type: ignore[arg-type]  # numeric fields are never absent
        elif self.storage == STORAGE_TEXT:
            value = data  # UTF-8 bytes go in as they are
        elif data is None:
            value = b"null"
        elif self.spec.type == "str":  # an optional text field: its text as a JSON string
            value = json.dumps(data.decode("utf-8"), ensure_ascii=False).encode("utf-8")
        else:
            value = data
        self._column.append(value)

    def flush(self) -> None:
        self._column.flush()


class FlatPayloads:
    """Payloads back to back in `images` (uint8), bounds in `offsets` (int64, one more than samples).

    The extent is set to the expected size up front (HDF5 allocates only chunks that are written)
    and trimmed at the end; bytes go to disk in whole chunks once FLUSH_BYTES are buffered.
    """

    layout = LAYOUT_FLAT

    def __init__(self, file: h5py.File, expected_bytes: int, directory: Path) -> None:
        extent = max(expected_bytes, IMAGE_CHUNK)
        self._directory = directory
        self._images = file.create_dataset(
            "images", shape=(extent,), maxshape=(None,), dtype=np.uint8, chunks=(IMAGE_CHUNK,)
        )
        self._offsets = Column(file, "offsets", np.int64)
        self._offsets.append(0)
        self._buffer = bytearray()
        self._written = 0  # bytes already in `images`
        self._end = 0  # end offset of the last payload

    def append(self, payload: bytes) -> None:
        self._buffer += payload
        self._end += len(payload)
        self._offsets.append(self._end)
        if len(self._buffer) >= FLUSH_BYTES:
            self._write(len(self._buffer) // IMAGE_CHUNK * IMAGE_CHUNK)

    def _write(self, size: int) -> None:
        """Write the first `size` buffered bytes, growing the extent by doubling if needed."""
        check_space(self._directory, size + METADATA_MARGIN)
        end = self._written + size
        if end > self._images.shape[0]:
            self._images.resize((max(end, 2 * self._images.shape[0]),))
        with memoryview(self._buffer) as view:
            self._images[self._written:end] = np.frombuffer(view[:size], dtype=np.uint8)
        del self._buffer[:size]
        self._written = end

    def finish(self) -> None:
        if self._buffer:
            self._write(len(self._buffer))
        self._images.resize((self._end,))
        self._offsets.flush()


class FixedPixels:
    """Raw pixels of one shape in `images`, uint8 (N, H, W, C), one image per chunk: a random read
    touches exactly one chunk. Rows are buffered and written FLUSH_BYTES at a time; the extent
    doubles when full and is trimmed at the end."""

    layout = LAYOUT_FIXED

    def __init__(self, file: h5py.File, shape: tuple[int, int, int], directory: Path) -> None:
        self._shape = shape
        self._row_bytes = int(np.prod(shape))
        self._directory = directory
        rows = max(1, FLUSH_BYTES // self._row_bytes)
        self._images = file.create_dataset(
            "images", shape=(rows, *shape), maxshape=(None, *shape), dtype=np.uint8, chunks=(1, *shape)
        )
        self._buffer = bytearray()
        self._count = 0  # rows appended
        self._written = 0  # rows already in `images`

    def append(self, payload: bytes) -> None:
        if len(payload) != self._row_bytes:
            raise ValueError(f"raw payload of {len(payload)} bytes, expected {self._row_bytes} for shape {self._shape}")
        self._buffer += payload
        self._count += 1
        if len(self._buffer) >= FLUSH_BYTES:
            self._write()

    def _write(self) -> None:
        rows = len(self._buffer) // self._row_bytes
        check_space(self._directory, len(self._buffer) + METADATA_MARGIN)
        end = self._written + rows
        if end > self._images.shape[0]:
            self._images.resize((max(end, 2 * self._images.shape[0]), *self._shape))
        self._images[self._written:end] = np.frombuffer(self._buffer, dtype=np.uint8).reshape(rows, *self._shape)
        self._buffer = bytearray()
        self._written = end

    def finish(self) -> None:
        if self._buffer:
            self._write()
        self._images.resize((self._count, *self._shape))


class HDF5Writer(ShardWriter):
    format = "hdf5"

    def __init__(self, path: Path, expected_bytes: int, classes: Sequence[str],
                 sample_shape: tuple[int, int, int] | None = None, fields: Sequence[FieldSpec] = ()) -> None:
        super().__init__(path, expected_bytes, classes, sample_shape, fields)
        check_space(path.parent, expected_bytes + METADATA_MARGIN)
        self._payloads: FlatPayloads | FixedPixels
        self._shapes: Column | None = None  # decoded stores in the flat layout: (H, W, C) per sample
        self._mode: str | None = None
        with h5py_errors_as_oserror():
            self._file = h5py.File(path, "w")
            try:
                if sample_shape is None:
                    self._payloads = FlatPayloads(self._file, expected_bytes, path.parent)
                else:
                    self._payloads = FixedPixels(self._file, sample_shape, path.parent)
                self._labels = Column(self._file, "labels", np.int64)
                self._codecs = Column(self._file, "formats", h5py.string_dtype("ascii", CODEC_WIDTH))
                self._crcs = Column(self._file, "crc32", np.uint32)
                self._paths = StringColumn(self._file, "paths")
                self._fields = [FieldColumn(self._file, spec) for spec in self.fields]
            except BaseException:  # not yet inside `with`, so abort() will not run: close it here
                self._file.close()
                raise
        self._count = 0

    def add(self, sample: Sample) -> None:
        extra = sorted(set(sample.meta) - {"format", "shape", "mode", "dtype"})
        if extra:
            raise ValueError(f"{self.path}: the HDF5 layout has no column for meta keys {extra}")
        self._check_pixels(sample.meta)
        codec = sample.meta["format"].encode("ascii")
        if len(codec) > CODEC_WIDTH:
            raise ValueError(f"{self.path}: codec name {codec!r} longer than {CODEC_WIDTH} bytes")
        with h5py_errors_as_oserror():
            self._payloads.append(sample.payload)
            self._labels.append(sample.label)
            self._codecs.append(codec)
            self._crcs.append(sample.crc32)
            self._paths.append(sample.path)
            if self._shapes is not None:
                self._shapes.append(sample.meta["shape"])
            for column in self._fields:
                column.append(sample.fields.get(column.spec.name))
        self._count += 1

    def _check_pixels(self, meta: dict[str, Any]) -> None:
        """Decoded samples: one mode per file (an attribute), shapes in a column or the layout."""
        mode = meta.get("mode")
        if self._count == 0:
            self._mode = mode
            if mode is not None and self.sample_shape is None:
                with h5py_errors_as_oserror():
                    self._shapes = Column(self._file, "shapes", np.int32, row=(3,))
        elif mode != self._mode:
            raise ValueError(f"{self.path}: sample mode {mode!r} differs from the shard's {self._mode!r}")
        if meta.get("dtype", "uint8") != "uint8":
            raise ValueError(f"{self.path}: only uint8 pixels are supported, not {meta['dtype']!r}")
        if self.sample_shape is not None and (meta.get("format") != "raw" or
                                              tuple(meta.get("shape", ())) != self.sample_shape):
            raise ValueError(f"{self.path}: a {meta.get('format')} sample of shape {meta.get('shape')} "
                             f"in a fixed {self.sample_shape} raw layout")

    def close(self) -> None:
        check_space(self.path.parent, METADATA_MARGIN)
        with h5py_errors_as_oserror():
            self._finish()

    def abort(self) -> None:
        with h5py_errors_as_oserror():
            self._file.close()

    def _finish(self) -> None:
        self._payloads.finish()
        for column in (self._labels, self._codecs, self._crcs, self._paths, self._shapes, *self._fields):
            if column is not None:
                column.flush()
        attrs = self._file.attrs
        attrs[CLASSES_ATTRIBUTE] = json.dumps(self.classes)
        attrs[RAW_PATHS_ATTRIBUTE] = encode_raw_names(self._paths.raw)
        attrs["pack_format_version"] = FORMAT_VERSION
        attrs["layout"] = self._payloads.layout
        if self._mode is not None:
            attrs["mode"] = self._mode
        attrs["num_samples"] = self._count
        self._file.close()
