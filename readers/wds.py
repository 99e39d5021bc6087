"""wds (WebDataset tar) shards: random access through each shard's offset index, or streaming.

A shard `shard-NNNNNN.tar` holds three ustar members per sample, and one more per present field
(layout in readers/layouts/wds.py). Beside it, `shard-NNNNNN.packidx` gives the byte offset and
size of each sample's image, meta and field data, so `WdsDataset[i]` costs a few `pread`s.
`iter(dataset)` reads the tars front to back and needs no index; `dataset.stream()` and
`make_loader(..., streaming=True)` read each tar front to back too, through its index where the
tar is read in place from a local folder (`WdsDataset.stream_records`), else by walking its headers
(the walk and the samples a stream hands out: `readers.wds_samples`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterator

import numpy as np
from torch.utils.data import IterableDataset

from .base import DeferredRecord, Fields, PackedDataset, Record, read_as_span
from .fields import parse_value
from .formats import FORMATS, resolve
from .layouts.wds import (
    ABSENT,
    INDEX_COLUMNS,
    INDEX_EXTENSION,
    INDEX_HEADER,
    V1_INDEX_EXTENSION,
    field_extension,
    index_row,
    meta_extension,
    parse_index_header,
)
from .manifest import DatasetError, FileInfo
from .remote import LocalFiles
from . import tar as tar_format
from .tar import BLOCK, TarError, padding, parse_header, split_name
from .wds_samples import IndexedSample, StreamedSample, StreamedTar, image_data, numbered, open_tar, sample_span, \
    tar_samples

log = logging.getLogger(__name__)

ROWS_PER_READ = 256
"""Index rows a streamed run reads at a time (~8 MB of a tar of 33 KB samples), the kernel asked
to read ahead the tar bytes they cover (`WdsDataset.stream_records`)."""
SAMPLE_READS_IN_FLIGHT = 8
"""A batch's sample reads a worker keeps in flight on threads once one of a shard's reads waited
(`readers.tar.read_waited`: a mount, a cold disk), rather than one after another (on a mount,
posix_fadvise does not read ahead: each sample was a round trip in turn)."""


class OffsetIndex:
    """A shard's `.packidx`, checked against the manifest when opened, rows read on demand.

    Each row is one `pread` (~1 us) rather than the table in memory: a worker that reads from
    every shard of a 5M-sample dataset would otherwise hold 32 bytes per sample of it (160 MB).
    """

    def __init__(self, path: str, num_samples: int, num_fields: int) -> None:
        self.columns = INDEX_COLUMNS + 2 * num_fields
        self.row = index_row(num_fields)
        try:
            self.fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise DatasetError(f"{path}: cannot read tar index ({exc.strerror or exc})") from None
        try:
            header = os.pread(self.fd, INDEX_HEADER.size, 0)
            entries = max(0, os.fstat(self.fd).st_size - INDEX_HEADER.size) // 8
            count = parse_index_header(header, num_fields)
            if count != num_samples or entries != count * self.columns:
                raise DatasetError(f"{path}: indexes {entries // self.columns} samples, index.json says {num_samples}")
        except TarError as exc:
            self.close()
            raise DatasetError(f"{path}: {exc}") from None
        except BaseException:
            self.close()
            raise

    def __getitem__(self, local: int) -> tuple[int, ...]:
        """Sample `local`'s row: image offset and size, meta offset and size, then per field both."""
        return self.row.unpack(os.pread(self.fd, self.row.size, INDEX_HEADER.size + local * self.row.size))

    def take(self, locals_: list[int]) -> dict[int, tuple[int, ...]]:
        """The rows of `locals_`: one read of the span they cover (`read_as_span`), or a read per row."""
        first, stop = min(locals_), max(locals_) + 1
        size = self.row.size
        if not read_as_span(first, stop, size):
            return {local: self[local] for local in locals_}
        data = os.pread(self.fd, (stop - first) * size, INDEX_HEADER.size + first * size)
        if len(data) != (stop - first) * size:
            raise TarError("tar index is truncated")
        return {local: self.row.unpack_from(data, (local - first) * size) for local in locals_}

    def rows(self, start: int, stop: int) -> list[tuple[int, ...]]:
        """Rows `start`..`stop`-1 in one pread (a streamed run's, at most ROWS_PER_READ of them)."""
        size = self.row.size
        data = os.pread(self.fd, (stop - start) * size, INDEX_HEADER.size + start * size)
        if len(data) != (stop - start) * size:
            raise TarError("tar index is truncated")
        return list(self.row.iter_unpack(data))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class TarShard:
    file: BinaryIO
    index: OffsetIndex
    fd: int = -1  # the tar's
    size: int = 0  # the tar's: no index row may point past it
    ahead: dict[int, tuple[int, ...]] = field(default_factory=dict)  # index rows read by `_will_read`
    reads: dict[int, Future[bytes]] = field(default_factory=dict)  # samples announced, read on threads
    reads_wait: bool = False  # one of its reads waited: announced samples are read on threads
    pool: ThreadPoolExecutor | None = None

    def __post_init__(self) -> None:
        self.fd = self.file.fileno()
        self.size = os.fstat(self.fd).st_size

    def row(self, local: int) -> tuple[int, ...]:
        row = self.ahead.pop(local, None)
        return self.index[local] if row is None else row

    def announced_spans(self) -> list[tuple[int, int, int]]:
        """(offset, length, local) of each announced sample, in file order, its span checked as its
        read checks it: a damaged row is left to its own read, which says why."""
        spans = []
        for local, row in self.ahead.items():
            try:
                spans.append((*sample_span(row, self.size), local))
            except TarError:
                continue
        return sorted(spans)

    def read_ahead(self) -> None:
        """The announced samples not read yet, read on threads."""
        if self.pool is None:
            self.pool = ThreadPoolExecutor(SAMPLE_READS_IN_FLIGHT, thread_name_prefix="pack-tar-sample")
        for offset, length, local in self.announced_spans():
            if local not in self.reads:
                self.reads[local] = self.pool.submit(os.pread, self.fd, length, offset)

    def read_sample(self, local: int, offset: int, length: int) -> bytes:
        """The bytes of sample `local` (`sample_span`): read on a thread if it was announced after a
        read waited, else read now; a read that waits makes the announced ones go to threads."""
        pending = self.reads.pop(local, None)
        if pending is not None:
            return pending.result()
        started = time.perf_counter()
        data = os.pread(self.fd, length, offset)
        if not self.reads_wait and tar_format.read_waited(started, self.fd, offset + length):
            self.reads_wait = True
            self.read_ahead()
        return data

    def close(self) -> None:
        if self.pool is not None:  # reads in flight finish before their descriptor closes
            self.pool.shutdown(wait=True, cancel_futures=True)
        self.reads.clear()
        self.index.close()
        self.file.close()


def member_extension(header: memoryview, prefix: bytes, size: int) -> str | None:
    """The extension of a member whose header is as pack writes it for `prefix` (key + ".") and
    `size`: a regular file, the name in the name field alone, `size` in the size field. None for
    any other header, which the caller then parses in full (slower, with a precise error)."""
    if header[124:136] != b"%011o\0" % size or header[156] not in (0x30, 0) or header[345] != 0:
        return None
    name = bytes(header[:100]).split(b"\0", 1)[0]
    if not name.startswith(prefix) or b"/" in name:
        return None
    try:
        return name[len(prefix):].decode("ascii")
    except UnicodeDecodeError:
        return None


class WdsDataset(PackedDataset):
    """Tar shards read at random through their `.packidx` files, or streamed front to back.

    `ds[i]` serves any sampler, like the LMDB and HDF5 readers. `iter(ds)` streams every shard in
    order. `ds.stream()` is an IterableDataset split over DDP ranks and DataLoader workers like
    `make_loader(..., streaming=True)`.
    """

    format = "wds"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._meta_extension = meta_extension(self.manifest.version)
        # Per wanted field: its index columns (offset, size) and its member extension.
        columns = {spec.name: INDEX_COLUMNS + 2 * k for k, spec in enumerate(self.manifest.fields)}
        self._wanted_columns = [(spec, columns[spec.name], field_extension(spec)) for spec in self.wanted]

    def index_file(self, shard: int) -> FileInfo:
        """The shard's offset index, as listed among its sidecars in index.json."""
        info = self.manifest.shards[shard]
        extension = INDEX_EXTENSION if self.manifest.version >= 2 else V1_INDEX_EXTENSION
        for sidecar in info.sidecars:
            if sidecar.name.endswith(extension):
                return sidecar
        raise DatasetError(f"{self.root}/index.json: no {extension} index listed for {info.name}")

    def read_sidecars(self, shard: int) -> tuple[FileInfo, ...]:
        """Only pack's offset index: the DALI `.idx` beside it is for DALI, never fetched or read here."""
        return (self.index_file(shard),)

    def _open(self, shard: int) -> TarShard:
        index_path = str(self.files.path(self.index_file(shard)))
        index = OffsetIndex(index_path, self.manifest.shards[shard].num_samples, len(self.manifest.fields))
        path = self.shard_path(shard)
        try:
            file = open(path, "rb", buffering=0)
        except OSError as exc:
            index.close()
            raise DatasetError(f"{path}: cannot open tar shard ({exc.strerror or exc})") from None
        return TarShard(file=file, index=index)

    def _close(self, handle: Any) -> None:
        handle.close()

    def _read(self, shard: int, local: int) -> Record:
        try:
            return self._pread_sample(self.handle(shard), local, self.manifest.sample_key(shard, local))
        except TarError as exc:
            raise DatasetError(f"{self.shard_path(shard)}: sample {local}: {exc}") from None

    def _will_read(self, shard: int, locals_: np.ndarray) -> None:
        """posix_fadvise(WILLNEED) on each sample's bytes, in file order: the kernel reads them all
        at once while the samples are taken one by one."""
        handle: TarShard = self.handle(shard)
        for pending in handle.reads.values():  # announced and never read (a sample that failed)
            pending.cancel()
        handle.reads.clear()
        handle.ahead = handle.index.take(locals_.tolist())  # rows kept for the reads
        if handle.reads_wait:
            handle.read_ahead()
            return
        for offset, length, _ in handle.announced_spans():
            os.posix_fadvise(handle.fd, offset, length, os.POSIX_FADV_WILLNEED)

    def _pread_sample(self, handle: TarShard, local: int, key: str) -> Record:
        """One pread from the image's header to the end of the meta (the image, then the label and
        fields; on a network mount each pread is a round trip), the image handed on as a view of it
        without a copy; the headers of the members used are checked against the index, which is
        untrusted: nothing is read outside the tar, so a lying row can never cost more than the
        tar's size."""
        row = handle.row(local)
        return self.sample_record(row, handle.read_sample(local, *sample_span(row, handle.size)), key)

    def sample_record(self, row: tuple[int, ...], span: bytes, key: str) -> Record:
        """The record of the sample of index `row` and key `key` from `span`, the bytes of its
        `sample_span`, each member used checked against the row (`_pread_sample`)."""
        image_offset, image_size, json_offset, json_size = row[:INDEX_COLUMNS]
        start = image_offset + image_size + padding(image_size)  # of the members after the image
        end = json_offset + json_size
        sample = memoryview(span)
        if len(sample) != end - image_offset + BLOCK:
            raise TarError("tar shard is truncated")
        image_header, image = sample[:BLOCK], sample[BLOCK:BLOCK + image_size]
        data = sample[start - image_offset + BLOCK:]
        prefix = key.encode("ascii") + b"."

        def check(header: memoryview, size: int, extension: str | None) -> str:
            found = member_extension(header, prefix, size)
            if found is None:  # not as pack writes it: the full parse says what is wrong
                parsed = parse_header(header, checksum=False)
                member_key, found = split_name(parsed.name) if parsed else ("", "")
                if parsed is None or parsed.size != size or member_key != key:
                    raise TarError("tar index does not match the tar members")
            if extension not in (None, found):
                raise TarError("tar index does not match the tar members")
            return found

        def member(offset: int, size: int, extension: str) -> memoryview:
            if size < 0 or offset - BLOCK < start or offset + size > end:
                raise TarError("damaged tar index")
            check(data[offset - BLOCK - start:offset - start], size, extension)
            return data[offset - start:offset - start + size]

        payload = image_data(check(image_header, image_size, None), image)
        meta = json.loads(bytes(member(json_offset, json_size, self._meta_extension)).decode("utf-8"))
        fields: Fields = {}
        for spec, column, extension in self._wanted_columns:
            offset, size = row[column], row[column + 1]
            if size == ABSENT:
                if not spec.optional:
                    raise TarError(f"no {spec.name!r} field")
                fields[spec.name] = None
            else:
                fields[spec.name] = parse_value(spec, member(offset, size, extension))
        return meta, payload, fields

    def iter_shard(self, shard: int) -> Iterator[tuple[Any, ...]]:
        """The samples of one shard, read sequentially; the offset index is not used."""
        first = int(self._offsets[shard])
        for local, record in self.read_records(shard, 0, self.manifest.shards[shard].num_samples):
            if isinstance(record, DatasetError):
                raise record
            yield self.decode_sample(first + local, *record)

    def read_records(self, shard: int, start: int, stop: int) -> Iterator[tuple[int, Record | DatasetError]]:
        """The tar front to back (no `.idx`), records whole, those before `start` parsed and skipped
        (`iter_shard`); read to its end, the sample count is checked against index.json."""
        info = self.manifest.shards[shard]
        with self.files.lease(info, sequential=True) as path:
            fd = open_tar(path)
            try:
                walk = tar_samples(fd, self._meta_extension, self.manifest.fields, self.wanted, eager=True)
                for count, (meta, _, payload, stored) in numbered(walk, path, info.num_samples, start, stop):
                    try:
                        self.check(shard, count, meta, payload)
                        yield count, (meta, payload, self._parse_fields(shard, count, stored))
                    except DatasetError as exc:
                        yield count, exc
            except TarError as exc:
                raise DatasetError(f"{path}: {exc}") from None
            except OSError as exc:  # read in place (a mount: EIO, ESTALE)
                raise DatasetError(f"{path}: read failed ({exc.strerror or exc})") from None
            finally:
                os.close(fd)

    def stream_records(self, shard: int, start: int, stop: int) -> Iterator[tuple[int, DeferredRecord]]:
        """`read_records` for the streaming loader, each sample read when it is handed out: through
        the shard's index where it has one to read in place (`IndexedSample`: one pread of the
        sample, its members checked against the row as `ds[i]` checks them, no tar header walked),
        else by walking the tar's headers and small members (`StreamedSample`: the image read when
        handed out). Either way a streaming worker's first batch reads ~1,100 index rows or headers
        and 64 samples, not ~1,100 samples whole."""
        info = self.manifest.shards[shard]
        with self.files.lease(info, sequential=True) as path:
            tar = StreamedTar(open_tar(path), path)
            index = None
            try:
                index = self._stream_index(shard, tar.fd)
                if index is not None:
                    yield from self._indexed_records(index, tar, shard, start, stop)
                    return
                walk = tar_samples(tar.fd, self._meta_extension, self.manifest.fields, self.wanted, eager=False)
                for count, (meta, extension, image, stored) in numbered(walk, path, info.num_samples, start, stop):
                    yield count, StreamedSample(self, tar, shard, count, meta, (extension, *image), stored)
            except TarError as exc:
                raise DatasetError(f"{path}: {exc}") from None
            except OSError as exc:  # read in place (a mount: EIO, ESTALE)
                raise DatasetError(f"{path}: read failed ({exc.strerror or exc})") from None
            finally:
                if index is not None:
                    index.close()
                tar.close()

    def _stream_index(self, shard: int, tar_fd: int) -> OffsetIndex | None:
        """The shard's index for streaming, where the tar is read in place from a local folder whose
        reads do not wait, and the index opens as pack wrote it; None where the tar is walked
        instead: a URL's or a mount's (streamed from the tar alone, as downloaded or read in large
        reads), a tar read in place whose first read waited (`storage="local"` on a mount: a read
        per sample there would be a round trip each, where the walk goes to 1 MiB at a time,
        several at once), or an index missing, damaged, or overwritten (a version 1 `.idx` DALI's
        wds2idx wrote over)."""
        if type(self.files) is not LocalFiles:
            return None
        try:
            started = time.perf_counter()
            os.pread(tar_fd, BLOCK, 0)  # its first header: whether this tar's reads wait
            if tar_format.read_waited(started, tar_fd, BLOCK):
                return None
            info = self.index_file(shard)
            with self.files.lease(info) as path:
                return OffsetIndex(str(path), self.manifest.shards[shard].num_samples, len(self.manifest.fields))
        except (DatasetError, OSError) as exc:
            log.debug("%s: streamed by walking its tar (%s)", self.shard_path(shard), exc)
            return None

    def _indexed_records(self, index: OffsetIndex, tar: StreamedTar, shard: int, start: int, stop: int
                         ) -> Iterator[tuple[int, DeferredRecord]]:
        """Samples `start`..`stop`-1 as `IndexedSample`s, their rows read ROWS_PER_READ at a time and
        the kernel asked to read ahead the tar bytes those rows cover (clamped to the tar: the rows
        are untrusted, and each sample's read checks its own)."""
        tar.size = os.fstat(tar.fd).st_size
        for first in range(start, stop, ROWS_PER_READ):
            rows = index.rows(first, min(first + ROWS_PER_READ, stop))
            low, high = max(rows[0][0] - BLOCK, 0), min(rows[-1][2] + rows[-1][3], tar.size)
            if high > low and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(tar.fd, low, high - low, os.POSIX_FADV_WILLNEED)
            for local, row in enumerate(rows, first):
                yield local, IndexedSample(self, tar, shard, local, row)

    def _parse_fields(self, shard: int, local: int, stored: dict[str, bytes | None]) -> Fields:
        """The wanted fields' values from their members' bytes; a damaged one is a DatasetError."""
        try:
            return {spec.name: None if stored[spec.name] is None else parse_value(spec, stored[spec.name])
                    for spec in self.wanted}
        except ValueError as exc:
            raise DatasetError(f"{self.shard_path(shard)}: sample {local}: unreadable ({exc})") from None

    def stored_samples(self, shard: int) -> int:
        """Counted by walking the tar's headers: also proves the tar itself is well formed. Needs
        the tar alone (leased: for a URL, downloaded into the cache), not its index."""
        with self.files.lease(self.manifest.shards[shard], sequential=True) as path:
            fd = open_tar(path)
            try:
                return sum(1 for _ in tar_samples(fd, self._meta_extension, self.manifest.fields, (), eager=True))
            except TarError as exc:
                raise DatasetError(f"{path}: {exc}") from None
            finally:
                os.close(fd)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        for shard in range(len(self.manifest.shards)):
            yield from self.iter_shard(shard)

    def stream(self, *, rank: int | None = None, world_size: int | None = None,
               prefetch_shards: int | None = None) -> IterableDataset:
        """Every sample once, in stored order, as an IterableDataset for DataLoader workers.

        Split like `make_loader(..., streaming=True)`: each DDP rank (torch.distributed's unless
        given) streams an equal contiguous share of ceil(N / world_size) samples, the last share
        filled up with the first samples; each worker streams a contiguous part of its rank's share,
        downloading its next `prefetch_shards` (None: the streaming loader's default) meanwhile.
        A `readers.streaming.WdsStream`, found through the format table: formats stand below streaming.
        """
        stream = resolve(FORMATS[self.format].stream)
        return stream(self, rank=rank, world_size=world_size, prefetch_shards=prefetch_shards)
