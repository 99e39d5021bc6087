"""wds (WebDataset tar) shards: random access through each shard's offset index, or streaming.

A shard `shard-NNNNNN.tar` holds three ustar members per sample (layout in readers/layouts/wds.py).
Beside it, `shard-NNNNNN.packidx` gives the byte offset and size of each sample's image and JSON
data, so `WdsDataset[i]` costs one `pread`. `iter(dataset)`, `dataset.stream()` and
`make_loader(..., streaming=True)` read the tars front to back instead and need no index.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator

import numpy as np

from .base import PackedDataset, Record
from .layouts.wds import (
    BLOCK,
    INDEX_COLUMNS,
    INDEX_EXTENSION,
    INDEX_HEADER,
    V1_INDEX_EXTENSION,
    LABEL_EXTENSION,
    META_EXTENSION,
    PIXELS_EXTENSION,
    TarError,
    npy_data,
    padding,
    parse_header,
    parse_index_header,
    split_name,
)
from .manifest import DatasetError, FileInfo, sample_key
from .streaming import DEFAULT_PREFETCH_SHARDS, ShardStream


def read_index(path: str, num_samples: int) -> np.ndarray:
    """The (num_samples, 4) int64 offset table of one shard, checked against the manifest."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(INDEX_HEADER.size)
            table = np.fromfile(handle, dtype="<i8")
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read tar index ({exc.strerror or exc})") from None
    try:
        count = parse_index_header(header)
    except TarError as exc:
        raise DatasetError(f"{path}: {exc}") from None
    if count != num_samples or table.size != count * INDEX_COLUMNS:
        raise DatasetError(f"{path}: indexes {table.size // INDEX_COLUMNS} samples, index.json says {num_samples}")
    return table.reshape(count, INDEX_COLUMNS)


@dataclass
class TarShard:
    file: BinaryIO
    index: np.ndarray


class WdsDataset(PackedDataset):
    """Tar shards read at random through their `.packidx` files, or streamed front to back.

    `ds[i]` serves any sampler, like the LMDB and HDF5 readers. `iter(ds)` streams every shard in
    order. `ds.stream()` is an IterableDataset split over DDP ranks and DataLoader workers like
    `make_loader(..., streaming=True)`.
    """

    format = "wds"

    def index_file(self, shard: int) -> FileInfo:
        """The shard's offset index, as listed among its sidecars in index.json."""
        info = self.manifest.shards[shard]
        extension = INDEX_EXTENSION if self.manifest.version >= 2 else V1_INDEX_EXTENSION
        for sidecar in info.sidecars:
            if sidecar.name.endswith(extension):
                return sidecar
        raise DatasetError(f"{self.root / 'index.json'}: no {extension} index listed for {info.name}")

    def _open(self, shard: int) -> TarShard:
        index_path = str(self.files.path(self.index_file(shard)))
        index = read_index(index_path, self.manifest.shards[shard].num_samples)
        path = self.shard_path(shard)
        try:
            file = open(path, "rb", buffering=0)
        except OSError as exc:
            raise DatasetError(f"{path}: cannot open tar shard ({exc.strerror or exc})") from None
        return TarShard(file=file, index=index)

    def _close(self, handle: Any) -> None:
        handle.file.close()

    def _read(self, shard: int, local: int) -> tuple[dict[str, Any], memoryview]:
        try:
            return self._pread_sample(self.handle(shard), local, sample_key(shard, local, self.manifest.version))
        except TarError as exc:
            raise DatasetError(f"{self.shard_path(shard)}: sample {local}: {exc}") from None

    @staticmethod
    def _pread_sample(handle: TarShard, local: int, key: str) -> tuple[dict[str, Any], memoryview]:
        """One pread from the image's header to the end of the JSON; both headers are checked."""
        image_offset, image_size, json_offset, json_size = handle.index[local].tolist()
        start = image_offset - BLOCK
        if start < 0 or json_offset < image_offset + image_size + BLOCK:
            raise TarError("damaged tar index")
        data = memoryview(os.pread(handle.file.fileno(), json_offset + json_size - start, start))
        if len(data) != json_offset + json_size - start:
            raise TarError("tar shard is truncated")
        extensions = []
        for offset, size, expected in ((image_offset, image_size, None), (json_offset, json_size, META_EXTENSION)):
            member = parse_header(data[offset - BLOCK - start:offset - start], checksum=False)
            member_key, extension = split_name(member.name) if member else ("", "")
            if member is None or member.size != size or member_key != key or expected not in (None, extension):
                raise TarError("tar index does not match the tar members")
            extensions.append(extension)
        meta = json.loads(bytes(data[json_offset - start:]).decode("utf-8"))
        return meta, image_data(extensions[0], data[BLOCK:BLOCK + image_size])

    def iter_shard(self, shard: int) -> Iterator[tuple[Any, ...]]:
        """The samples of one shard, read sequentially; the offset index is not used."""
        first = int(self._offsets[shard])
        for local, record in self.read_records(shard, 0, self.manifest.shards[shard].num_samples):
            if isinstance(record, DatasetError):
                raise record
            yield self.decode_sample(first + local, *record)

    def read_records(self, shard: int, start: int, stop: int) -> Iterator[tuple[int, Record | DatasetError]]:
        """The tar front to back (no `.idx`), records before `start` parsed and skipped; read to its
        end, the sample count is checked against index.json."""
        info = self.manifest.shards[shard]
        expected = info.num_samples
        count = 0
        with self.files.lease(info) as path:
            try:
                handle = open(path, "rb", buffering=1 << 20)
            except OSError as exc:
                raise DatasetError(f"{path}: cannot open tar shard ({exc.strerror or exc})") from None
            with handle:
                try:
                    for meta, payload in read_tar_samples(handle):
                        if count == expected:
                            raise TarError(f"holds more samples than index.json says ({expected})")
                        if count >= start:
                            try:
                                self.check(shard, count, meta, payload)
                                yield count, (meta, payload)
                            except DatasetError as exc:
                                yield count, exc
                        count += 1
                        if count == stop < expected:
                            return
                except TarError as exc:
                    raise DatasetError(f"{path}: {exc}") from None
        if count != expected:
            raise DatasetError(f"{path}: holds {count} samples, index.json says {expected}")

    def stored_samples(self, shard: int) -> int:
        """Counted by walking the tar's headers: also proves the tar itself is well formed."""
        path = self.shard_path(shard)
        try:
            with open(path, "rb", buffering=1 << 20) as handle:
                return sum(1 for _ in read_tar_samples(handle))
        except TarError as exc:
            raise DatasetError(f"{path}: {exc}") from None

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        for shard in range(len(self.manifest.shards)):
            yield from self.iter_shard(shard)

    def stream(self, *, rank: int | None = None, world_size: int | None = None,
               prefetch_shards: int = DEFAULT_PREFETCH_SHARDS) -> WdsStream:
        """Every sample once, in stored order, as an IterableDataset for DataLoader workers.

        Split like `make_loader(..., streaming=True)`: each DDP rank (torch.distributed's unless
        given) streams an equal contiguous share of ceil(N / world_size) samples, the last share
        filled up with the first samples; each worker streams a contiguous part of its rank's share.
        """
        return WdsStream(self, rank=rank, world_size=world_size, prefetch_shards=prefetch_shards)


def read_tar_samples(handle: BinaryIO) -> Iterator[tuple[dict[str, Any], memoryview]]:
    """Group a tar's members by key, front to back, and yield (meta, image bytes) per sample.

    Holds one sample in memory at a time; raises TarError on anything pack would not write.
    """
    key: str | None = None
    parts: dict[str, bytes] = {}
    while True:
        block = handle.read(BLOCK)
        if len(block) < BLOCK:
            raise TarError("tar shard is truncated (no end-of-archive block)")
        member = parse_header(block)
        member_key, extension = split_name(member.name) if member else (None, "")
        if key is not None and member_key != key:
            yield assemble(key, parts)
            parts = {}
        if member is None:
            return
        key = member_key
        data = handle.read(member.size)
        handle.read(padding(member.size))
        if len(data) < member.size:
            raise TarError(f"tar shard is truncated in {member.name!r}")
        parts[extension] = data


def assemble(key: str, parts: dict[str, bytes]) -> tuple[dict[str, Any], memoryview]:
    images = [extension for extension in parts if extension not in (LABEL_EXTENSION, META_EXTENSION)]
    if META_EXTENSION not in parts or len(images) != 1:
        raise TarError(f"sample {key!r} has members {sorted(parts)}; expected one image and .json")
    return json.loads(parts[META_EXTENSION].decode("utf-8")), image_data(images[0], memoryview(parts[images[0]]))


def image_data(extension: str, member: memoryview) -> memoryview:
    """The payload a member holds: a `.npy` member's pixels without its header, other members whole."""
    return npy_data(member) if extension == PIXELS_EXTENSION else member


class WdsStream(ShardStream):
    """`WdsDataset.stream()`: samples one at a time, in stored order, split over ranks and workers."""

    def __init__(self, reader: WdsDataset, *, rank: int | None = None, world_size: int | None = None,
                 prefetch_shards: int = DEFAULT_PREFETCH_SHARDS) -> None:
        super().__init__(reader, batch_size=1, collate_fn=None, shuffle=False, rank=rank, world_size=world_size,
                         prefetch_shards=prefetch_shards)
        self.reader = reader
