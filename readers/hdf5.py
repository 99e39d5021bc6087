"""HDF5 shards: one standalone file per shard, opened read-only and without file locking.

Each DataLoader worker opens the files it reads on first use (h5py objects cannot cross a fork
or be pickled). Files are opened with `locking=False`, so they work on cluster filesystems
without POSIX locks; setting `HDF5_USE_FILE_LOCKING=FALSE` in the environment does the same for
other HDF5 tools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import h5py
import numpy as np

from .base import PackedDataset, Record
from .fields import FieldSpec, from_json
from .layouts.hdf5 import (
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


@dataclass
class HDF5Shard:
    """An open shard: the file, its payload dataset and the small per-sample columns in memory.

    `offsets` is None in the fixed layout (`images` is then (N, H, W, C)); `shapes` and `mode`
    are set for decoded stores (`shapes` only in the flat layout).
    """

    file: h5py.File
    images: h5py.Dataset
    offsets: np.ndarray | None
    labels: np.ndarray
    codecs: np.ndarray  # the `formats` column
    crcs: np.ndarray
    paths: Any  # the `paths` dataset through `.asstr()`: indexing decodes UTF-8
    raw_paths: dict[int, str]
    shapes: np.ndarray | None
    mode: str | None
    fields: dict[str, FieldReader]


def read_raw_paths(file: h5py.File) -> dict[int, str]:
    """Position -> exact `os.fsdecode` path for the samples whose path is not UTF-8."""
    if RAW_PATHS_ATTRIBUTE in file.attrs:
        return parse_raw_names(file.attrs[RAW_PATHS_ATTRIBUTE])
    positions = file["paths" + V1_RAW_INDEX_SUFFIX][:]  # format version 1: two datasets
    raw = file["paths" + V1_RAW_SUFFIX][:]
    return {int(i): parse_raw_name(value.tobytes()) for i, value in zip(positions, raw)}


def open_shard(path: str, num_samples: int, fields: Sequence[FieldSpec] = ()) -> HDF5Shard:
    """Open one shard file, its small per-sample columns and the `fields` asked for read into memory."""
    try:
        file = h5py.File(path, "r", locking=False)
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: cannot open HDF5 shard ({exc})") from None
    try:
        layout = file.attrs.get("layout")
        if layout not in (LAYOUT_FLAT, LAYOUT_FIXED):
            raise DatasetError(f"{path}: unknown HDF5 payload layout {layout!r}")
        mode = file.attrs.get("mode")
        shard = HDF5Shard(
            file=file,
            images=file["images"],
            offsets=file["offsets"][:] if layout == LAYOUT_FLAT else None,
            labels=file["labels"][:],
            codecs=file["formats"][:],
            crcs=file["crc32"][:],
            paths=file["paths"].asstr(),
            raw_paths=read_raw_paths(file),
            shapes=file["shapes"][:] if "shapes" in file else None,
            mode=None if mode is None else str(mode),
            fields={spec.name: FieldReader(file, spec) for spec in fields},
        )
    except KeyError as exc:
        file.close()
        raise DatasetError(f"{path}: damaged HDF5 shard (missing {exc})") from None
    except BaseException:  # DatasetError, or an OSError reading a column: never leave the file open
        file.close()
        raise
    counts = {"labels": len(shard.labels), "formats": len(shard.codecs), "crc32": len(shard.crcs),
              "paths": len(shard.paths)}
    if shard.offsets is not None:
        counts["offsets"] = len(shard.offsets) - 1
    else:
        counts["images"] = len(shard.images)
    if shard.shapes is not None:
        counts["shapes"] = len(shard.shapes)
    for name, reader in shard.fields.items():
        counts[field_dataset(name)] = len(reader)
    for name, count in counts.items():
        if count != num_samples:
            file.close()
            raise DatasetError(f"{path}: {name} holds {count} samples, index.json says {num_samples}")
    return shard


class HDF5Dataset(PackedDataset):
    """Map-style dataset over HDF5 shards (`locking=False`, opened lazily in each process)."""

    format = "hdf5"

    def _open(self, shard: int) -> HDF5Shard:
        return open_shard(str(self.shard_path(shard)), self.manifest.shards[shard].num_samples, self.wanted)

    def _close(self, handle: Any) -> None:
        handle.file.close()

    def _read(self, shard: int, local: int) -> Record:
        handle: HDF5Shard = self.handle(shard)
        meta: dict[str, Any] = {"label": int(handle.labels[local]), "format": handle.codecs[local].decode("ascii"),
                                "crc32": int(handle.crcs[local])}
        if handle.offsets is None:  # fixed layout: one (H, W, C) row, read as one chunk
            payload = handle.images[local]
            meta["shape"] = list(payload.shape)
        else:
            start, end = int(handle.offsets[local]), int(handle.offsets[local + 1])
            payload = handle.images[start:end]
            if len(payload) != end - start:
                raise DatasetError(f"{self.shard_path(shard)}: sample {local} runs past the image data")
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
        return int(self.handle(shard).file.attrs["num_samples"])
