"""WebDataset tar shards: random access through each shard's offset index, or sequential streaming.

A shard `shard-NNNNNN.tar` holds three ustar members per sample, in sample order:
`<key>.<ext>` (the image), `<key>.cls` (the label as decimal text) and `<key>.json` (the
record meta), where key is the sample's index inside the shard, ten zero-padded digits. Beside it,
`shard-NNNNNN.idx` gives the byte offset and size of each sample's image and JSON data (layout
below), so `WebDatasetReader[i]` costs one `pread`. `iter(reader)`, `reader.stream()` and
`make_loader(..., streaming=True)` read the tars front to back instead and need no index.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator

import numpy as np

from .base import PackedDataset, Record
from .manifest import (
    TAR_BLOCK,
    TAR_INDEX_COLUMNS,
    TAR_INDEX_EXTENSION,
    TAR_INDEX_HEADER,
    TAR_INDEX_MAGIC,
    DatasetError,
    FileInfo,
    tar_key,
    tar_padding,
)
from .streaming import DEFAULT_PREFETCH_SHARDS, ShardStream

META_EXTENSIONS = ("cls", "json")
_ZERO_BLOCK = bytes(TAR_BLOCK)


class TarError(ValueError):
    """A tar header that is damaged or not what pack writes; callers add the file name."""


@dataclass(frozen=True)
class Member:
    name: str
    size: int


def parse_header(block: bytes | memoryview, *, checksum: bool = True) -> Member | None:
    """One 512-byte ustar header -> its member, or None for the all-zero end-of-archive block.

    Random access skips the checksum (summing 512 bytes costs more than the rest of a read):
    there the caller compares the name and size with what the index says instead.
    """
    block = bytes(block)
    if block == _ZERO_BLOCK:
        return None
    try:
        size = int(block[124:136].rstrip(b"\0 ") or b"0", 8)
        valid = not checksum or int(block[148:156].rstrip(b"\0 ") or b"-1", 8) == (
            sum(block) - sum(block[148:156]) + 8 * ord(" ")
        )
    except ValueError:
        valid = False
    if not valid:
        raise TarError("bad tar header")
    if block[156:157] not in (b"0", b"\0"):
        raise TarError(f"tar member of type {block[156:157]!r}; only regular files are expected")
    name = block[:100].split(b"\0", 1)[0]
    prefix = block[345:500].split(b"\0", 1)[0] if block[257:262] == b"ustar" else b""
    if prefix:
        name = prefix + b"/" + name
    return Member(name=check_member_name(os.fsdecode(name)), size=size)


def check_member_name(name: str) -> str:
    """Refuse member names that could escape an extraction directory."""
    if not name or name.startswith("/") or ".." in name.split("/"):
        raise TarError(f"unsafe tar member name {name!r}")
    return name


def split_name(name: str) -> tuple[str, str]:
    """WebDataset's rule: the key ends at the first dot of the last path component."""
    directory, _, base = name.rpartition("/")
    stem, dot, extension = base.partition(".")
    return (directory + "/" if directory else "") + stem, extension if dot else ""


def read_index(path: str, num_samples: int) -> np.ndarray:
    """The (num_samples, 4) int64 offset table of one shard, checked against the manifest."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(TAR_INDEX_HEADER.size)
            table = np.fromfile(handle, dtype="<i8")
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read tar index ({exc.strerror or exc})") from None
    if len(header) < TAR_INDEX_HEADER.size:
        raise DatasetError(f"{path}: truncated tar index")
    magic, columns, count = TAR_INDEX_HEADER.unpack(header)
    if magic != TAR_INDEX_MAGIC or columns != TAR_INDEX_COLUMNS:
        raise DatasetError(f"{path}: not a pack tar index")
    if count != num_samples or table.size != count * columns:
        raise DatasetError(f"{path}: indexes {table.size // columns} samples, index.json says {num_samples}")
    return table.reshape(count, columns)


@dataclass
class TarShard:
    file: BinaryIO
    index: np.ndarray


class WebDatasetReader(PackedDataset):
    """Tar shards read at random through their `.idx` files, or streamed front to back.

    `ds[i]` serves any sampler, like the LMDB and HDF5 readers. `iter(ds)` streams every shard in
    order. `ds.stream()` is an IterableDataset split over DDP ranks and DataLoader workers like
    `make_loader(..., streaming=True)`.
    """

    format = "wds"

    def index_file(self, shard: int) -> FileInfo:
        """The shard's offset index, as listed among its sidecars in index.json."""
        info = self.manifest.shards[shard]
        for sidecar in info.sidecars:
            if sidecar.name.endswith(TAR_INDEX_EXTENSION):
                return sidecar
        raise DatasetError(f"{self.root}/index.json: no {TAR_INDEX_EXTENSION} index listed for {info.name}")

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
            return self._pread_sample(self.handle(shard), local)
        except TarError as exc:
            raise DatasetError(f"{self.shard_path(shard)}: sample {local}: {exc}") from None

    @staticmethod
    def _pread_sample(handle: TarShard, local: int) -> tuple[dict[str, Any], memoryview]:
        """One pread from the image's header to the end of the JSON; both headers are checked."""
        image_offset, image_size, json_offset, json_size = handle.index[local].tolist()
        start = image_offset - TAR_BLOCK
        if start < 0 or json_offset < image_offset + image_size + TAR_BLOCK:
            raise TarError("damaged tar index")
        data = memoryview(os.pread(handle.file.fileno(), json_offset + json_size - start, start))
        if len(data) != json_offset + json_size - start:
            raise TarError("tar shard is truncated")
        key = tar_key(local)
        for offset, size, extension in ((image_offset, image_size, None), (json_offset, json_size, "json")):
            member = parse_header(data[offset - TAR_BLOCK - start:offset - start], checksum=False)
            if member is None or member.size != size or split_name(member.name)[0] != key or (
                extension is not None and split_name(member.name)[1] != extension
            ):
                raise TarError("tar index does not match the tar members")
        meta = json.loads(bytes(data[json_offset - start:]).decode("utf-8"))
        return meta, data[TAR_BLOCK:TAR_BLOCK + image_size]

    def iter_shard(self, shard: int) -> Iterator[tuple[Any, ...]]:
        """The samples of one shard, read sequentially; the `.idx` file is not used."""
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
               prefetch_shards: int = DEFAULT_PREFETCH_SHARDS) -> WebDatasetStream:
        """Every sample once, in stored order, as an IterableDataset for DataLoader workers.

        Split like `make_loader(..., streaming=True)`: each DDP rank (torch.distributed's unless
        given) streams an equal contiguous share of ceil(N / world_size) samples, the last share
        filled up with the first samples; each worker streams a contiguous part of its rank's share.
        """
        return WebDatasetStream(self, rank=rank, world_size=world_size, prefetch_shards=prefetch_shards)


def read_tar_samples(handle: BinaryIO) -> Iterator[tuple[dict[str, Any], memoryview]]:
    """Group a tar's members by key, front to back, and yield (meta, image bytes) per sample.

    Holds one sample in memory at a time; raises TarError on anything pack would not write.
    """
    key: str | None = None
    parts: dict[str, bytes] = {}
    while True:
        block = handle.read(TAR_BLOCK)
        if len(block) < TAR_BLOCK:
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
        handle.read(tar_padding(member.size))
        if len(data) < member.size:
            raise TarError(f"tar shard is truncated in {member.name!r}")
        parts[extension] = data


def assemble(key: str, parts: dict[str, bytes]) -> tuple[dict[str, Any], memoryview]:
    images = [extension for extension in parts if extension not in META_EXTENSIONS]
    if "json" not in parts or len(images) != 1:
        raise TarError(f"sample {key!r} has members {sorted(parts)}; expected one image and .json")
    return json.loads(parts["json"].decode("utf-8")), memoryview(parts[images[0]])


class WebDatasetStream(ShardStream):
    """`WebDatasetReader.stream()`: samples one at a time, in stored order, split over ranks and workers."""

    def __init__(self, reader: WebDatasetReader, *, rank: int | None = None, world_size: int | None = None,
                 prefetch_shards: int = DEFAULT_PREFETCH_SHARDS) -> None:
        super().__init__(reader, batch_size=1, collate_fn=None, shuffle=False, rank=rank, world_size=world_size,
                         prefetch_shards=prefetch_shards)
        self.reader = reader
