"""A wds shard read front to back, as streaming and `iter(dataset)` read it: the walk of its tar
headers (`tar_samples`, every header checked in full, `numbered` against index.json's count) and
the samples a stream hands out, each read when it is handed out: a walked one's image
(`StreamedSample`), or a whole sample at its index row (`IndexedSample`, where the tar is read
through its `.packidx`), which falls back on the walk where the row does not match the tar.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator, Protocol, Sequence, TypeVar

from .base import DeferredRecord, Fields, Record
from .fields import FieldSpec
from .layouts.wds import INDEX_COLUMNS, LABEL_EXTENSION, PIXELS_EXTENSION, field_extension, field_extensions, npy_data
from .manifest import DatasetError, Manifest
from .tar import BLOCK, TarError, padding, walk_samples

T = TypeVar("T")


class WdsReader(Protocol):
    """What the samples here ask of the dataset that streams them (`readers.wds.WdsDataset`, which
    imports this module: named by its parts, so the two import no cycle)."""

    manifest: Manifest
    wanted: list[FieldSpec]
    _meta_extension: str

    def check(self, shard: int, local: int, meta: dict[str, Any], payload: memoryview) -> None: ...
    def sample_record(self, row: tuple[int, ...], span: bytes, key: str) -> Record: ...
    def _parse_fields(self, shard: int, local: int, stored: dict[str, bytes | None]) -> Fields: ...


def sample_span(row: tuple[int, ...], tar_size: int) -> tuple[int, int]:
    """(offset, length) of the one read of a sample of the index `row` (untrusted): from its image's
    header to the end of its meta, checked to lie in order inside the tar of `tar_size` bytes."""
    image_offset, image_size, json_offset, json_size = row[:INDEX_COLUMNS]
    start = image_offset + image_size + padding(image_size)  # of the members after the image
    end = json_offset + json_size
    if image_size < 0 or json_size < 0 or image_offset < BLOCK or json_offset < start + BLOCK:
        raise TarError("damaged tar index")
    if end > tar_size:
        raise TarError(f"tar shard is truncated (the sample ends at byte {end}, the tar has {tar_size})")
    return image_offset - BLOCK, end - image_offset + BLOCK


def open_tar(path: Path) -> int:
    """A descriptor of the tar shard at `path`; one it cannot open is a DatasetError."""
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise DatasetError(f"{path}: cannot open tar shard ({exc.strerror or exc})") from None


def numbered(walk: Iterator[T], path: Path, expected: int, start: int, stop: int) -> Iterator[tuple[int, T]]:
    """(number, sample) for the samples `start`..`stop`-1 of a tar walked front to back: a sample
    past index.json's count is a TarError; read to its end, fewer samples are a DatasetError."""
    count = 0
    for sample in walk:
        if count == expected:
            raise TarError(f"holds more samples than index.json says ({expected})")
        if count >= start:
            yield count, sample
        count += 1
        if count == stop < expected:
            return
    if count != expected:
        raise DatasetError(f"{path}: holds {count} samples, index.json says {expected}")


class StreamedTar:
    """A tar open for `WdsDataset.stream_records`; its descriptor is -1 once closed, so a sample read
    after that fails instead of reading whatever file took the number."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path
        self.size = 0  # read through the index: no row may point past it
        self._walked: list[StreamedSample] | None = None  # `walked`'s samples, once walked,
        self._walk_error: DatasetError | None = None  # and what stopped the walk before the end

    def walked(self, dataset: WdsReader, shard: int, local: int) -> Record | DatasetError:
        """Sample `local` as a walk of the tar's headers gives it, or the damage that stops the walk
        before it (the error a front-to-back read gives): asked when a sample read through the index
        does not match its tar, so the tar, not its index, says what a sample holds. Walked once
        per tar, its samples' small members kept (the error path only)."""
        if self._walked is None:
            self._walked = []
            expected = dataset.manifest.shards[shard].num_samples
            try:
                walk = tar_samples(self.fd, dataset._meta_extension, dataset.manifest.fields, dataset.wanted,
                                   eager=False)
                for count, (meta, extension, image, stored) in numbered(walk, self.path, expected, 0, expected):
                    self._walked.append(StreamedSample(dataset, self, shard, count, meta, (extension, *image), stored))
            except TarError as exc:
                self._walk_error = DatasetError(f"{self.path}: {exc}")
            except DatasetError as exc:
                self._walk_error = exc
            except OSError as exc:  # read in place
                self._walk_error = DatasetError(f"{self.path}: read failed ({exc.strerror or exc})")
        if local < len(self._walked):
            return self._walked[local]._read_once()
        assert self._walk_error is not None  # a walk to the end holds every sample index.json counts
        return self._walk_error

    def close(self) -> None:
        self._walked = None  # a walk's samples refer to their tar
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class TarSample(DeferredRecord):
    """A sample of a tar open for `WdsDataset.stream_records`, read once: when it is handed out
    (`load`), or before its tar is closed (`settle`); the subclass's `_read` says how."""

    __slots__ = ("_dataset", "_tar", "_shard", "_local", "_unread", "_record")

    def __init__(self, dataset: WdsReader, tar: StreamedTar, shard: int, local: int) -> None:
        self._dataset, self._tar, self._shard, self._local = dataset, tar, shard, local
        self._unread = True
        self._record: Record | DatasetError | None = None

    def load(self) -> Record:
        record = self._record if self._record is not None else self._read_once()
        self._record = None
        if isinstance(record, DatasetError):
            raise record
        return record

    def settle(self) -> None:
        if self._record is None and self._unread:
            self._record = self._read_once()

    def _read_once(self) -> Record | DatasetError:
        tar, unread, self._unread = self._tar, self._unread, False  # `settle` after `load` has nothing left to do
        if not unread or tar.fd < 0:
            return DatasetError(f"{tar.path}: sample {self._local}: read twice, or after its shard was closed")
        return self._read()

    def _read(self) -> Record | DatasetError:
        raise NotImplementedError


class StreamedSample(TarSample):
    """A streamed sample whose meta and fields are read and whose image is not yet: one pread when
    it is handed out, then the same checks as `read_records` (meta, CRC-32, fields)."""

    __slots__ = ("_meta", "_image", "_stored")

    def __init__(self, dataset: WdsReader, tar: StreamedTar, shard: int, local: int, meta: dict[str, Any],
                 image: tuple[str, int, int], stored: dict[str, bytes | None]) -> None:
        super().__init__(dataset, tar, shard, local)
        self._meta, self._image, self._stored = meta, image, stored

    def _read(self) -> Record | DatasetError:
        meta, (extension, offset, size), stored = self._meta, self._image, self._stored
        self._stored = {}
        tar, shard, local = self._tar, self._shard, self._local
        try:
            data = os.pread(tar.fd, size, offset)
            if len(data) != size:  # the file shrank while read
                raise TarError("tar shard is truncated")
            payload = image_data(extension, memoryview(data))
            self._dataset.check(shard, local, meta, payload)
            return meta, payload, self._dataset._parse_fields(shard, local, stored)
        except TarError as exc:
            return DatasetError(f"{tar.path}: sample {local}: {exc}")
        except DatasetError as exc:
            return exc
        except OSError as exc:  # read in place (a mount: EIO, ESTALE): the file named, as on_error decides
            return DatasetError(f"{tar.path}: sample {local}: unreadable ({exc.strerror or exc})")


class IndexedSample(TarSample):
    """A streamed sample of a tar read through its index: its row only, until it is handed out; then
    one pread of the sample (`sample_span`: checked against the tar's size first), its members
    checked against the row as `ds[i]` checks them, then the same checks as a walked sample's (meta,
    CRC-32). Where the row does not match the tar, the sample is what a walk of the tar gives
    (`StreamedTar.walked`): the same sample, or the same error, as streaming without the index."""

    __slots__ = ("_row",)

    def __init__(self, dataset: WdsReader, tar: StreamedTar, shard: int, local: int, row: tuple[int, ...]) -> None:
        super().__init__(dataset, tar, shard, local)
        self._row = row

    def _read(self) -> Record | DatasetError:
        dataset, tar, shard, local, row = self._dataset, self._tar, self._shard, self._local, self._row
        try:
            offset, length = sample_span(row, tar.size)
            meta, payload, fields = dataset.sample_record(row, os.pread(tar.fd, length, offset),
                                                          dataset.manifest.sample_key(shard, local))
        except (TarError, ValueError, RecursionError):  # the row, the meta's JSON or a field's value
            return tar.walked(dataset, shard, local)
        except OSError as exc:  # read in place: the file named, as on_error decides
            return DatasetError(f"{tar.path}: sample {local}: unreadable ({exc.strerror or exc})")
        try:
            dataset.check(shard, local, meta, payload)
        except DatasetError as exc:
            return exc
        return meta, payload, fields


def tar_samples(fd: int, meta_extension: str, fields: Sequence[FieldSpec], wanted: Sequence[FieldSpec], *,
                eager: bool) -> Iterator[tuple[dict[str, Any], str, Any, dict[str, bytes | None]]]:
    """A shard's samples front to back (`readers.tar.walk_samples`): per sample its meta, its
    image's extension, the image (if `eager` its payload, `image_data`, else its (data offset,
    size) in the tar) and the `wanted` fields' member bytes (None for an absent optional one).

    `fields` are all the dataset's fields (their members are not the image). A TarError on
    anything pack would not write (a required field missing included); parsing the field bytes
    is the caller's, so one damaged value stays one sample's."""
    known = {LABEL_EXTENSION, meta_extension, *field_extensions(fields)}
    for key, parts in walk_samples(fd, known, eager=eager):
        meta, image, values = sample_parts(key, parts, known, meta_extension, wanted)
        yield meta, image, image_data(image, memoryview(parts[image])) if eager else parts[image], values


def sample_parts(key: str, parts: dict[str, Any], known: set[str], meta_extension: str,
                 wanted: Sequence[FieldSpec]) -> tuple[dict[str, Any], str, dict[str, bytes | None]]:
    """One sample's parsed meta, the extension of its image and its wanted fields' bytes, from its
    members by extension (the image's entry is whatever the caller keeps of it)."""
    images = [extension for extension in parts if extension not in known]
    if meta_extension not in parts or len(images) != 1:
        raise TarError(f"sample {key!r} has members {sorted(parts)}; expected one image and .{meta_extension}")
    values: dict[str, bytes | None] = {}
    for spec in wanted:
        data = parts.get(field_extension(spec))
        if data is None and not spec.optional:
            raise TarError(f"sample {key!r} has no {spec.name!r} field")
        values[spec.name] = data
    try:
        meta = json.loads(parts[meta_extension].decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, or nested deeper than Python's stack
        raise TarError(f"sample {key!r}: unreadable .{meta_extension} ({exc})") from None
    return meta, images[0], values


def image_data(extension: str, member: memoryview) -> memoryview:
    """The payload a member holds: a `.npy` member's pixels without its header, other members whole."""
    return npy_data(member) if extension == PIXELS_EXTENSION else member

