"""Source files in, encoded samples and their fields' stored bytes out: reader threads with a
bounded read-ahead, in listing order."""

from __future__ import annotations

import functools
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from readers.fields import FieldSpec, encode_value

from .encode import Encoded, encode
from .errors import RejectedFile
from .plan import Entry, PackOptions
from .sources.inputs import Record
from .sources.sidecars import read_sidecars
from .validate import check_image

READ_THREADS = 8
READAHEAD_BYTES = 8 << 20
READAHEAD_FILES = 512
READ_RUN_FILES = 16
READ_RUN_BYTES = 1 << 20


def read_file(path: str, size: int) -> bytes:
    """The whole file, in one read() when it still has the size the scan saw.

    Three system calls where `open().read()` makes seven; with eight reader threads, each call
    is a hand-over of the GIL, and those hand-overs were most of a shard's system time.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.read(fd, size + 1)
        if len(data) != size:  # changed since the scan, or a short read: read on to the end
            parts = [data]
            while chunk := os.read(fd, 1 << 20):
                parts.append(chunk)
            data = b"".join(parts)
        return data
    finally:
        os.close(fd)


Loaded = tuple[Encoded, dict[str, bytes], int, str]  # the encoded image, its fields' stored bytes, label, path
ReadRecord = Callable[[int, int, int], "Record | list[Record]"]  # a container location -> its sample(s)


def listed_fields(entry: Entry, specs: Sequence[FieldSpec]) -> dict[str, bytes]:
    """The stored bytes of the field values that came with the listing; absent values stay absent."""
    values = entry.fields or {}
    stored = {}
    for spec in specs:
        value = values.get(spec.name)
        if value is not None:
            try:
                stored[spec.name] = encode_value(spec, value)
            except ValueError as exc:
                raise RejectedFile(str(exc)) from None
    return stored


def load_sample(root: str, entry: Entry, validate: str, max_pixels: int, encoding: dict[str, Any],
                listed: Sequence[FieldSpec], sidecars: Sequence[str], sidecars_optional: bool,
                records: ReadRecord | None = None) -> Loaded | list[Loaded] | RejectedFile:
    """Read, check and encode one file, and its fields: the `listed` ones from its entry, the
    others from its sidecars; or one sample of a container input, through `records`. Runs in a
    reader thread (Pillow's codecs release the GIL)."""
    try:
        if entry.location is not None and records is not None:
            record = records(*entry.location)
            if isinstance(record, list):  # an input that gives several samples (pack_samples)
                return [load_record(one, entry, validate, max_pixels, encoding) for one in record]
            return load_record(record, entry, validate, max_pixels, encoding)
        data = read_file(os.path.join(root, entry.path), entry.size)
        codec = check_image(data, validate=validate, max_pixels=max_pixels)
        encoded = encode(data, codec=codec, **encoding)
        return (encoded, {**listed_fields(entry, listed), **read_sidecars(root, entry.path, sidecars, sidecars_optional)},
                entry.label, entry.path)
    except RejectedFile as exc:
        return exc
    except OSError as exc:
        return RejectedFile(f"cannot read: {exc.strerror or exc}")


def load_record(record: Record, entry: Entry, validate: str, max_pixels: int, encoding: dict[str, Any]) -> Loaded:
    """A container sample's image checked and encoded like a file's; a reject names its member or record."""
    try:
        codec = check_image(record.image, validate=validate, max_pixels=max_pixels)
        encoded = encode(record.image, codec=codec, **encoding)
    except RejectedFile as exc:
        raise RejectedFile(f"{record.image_name}: {exc}") from None
    return encoded, record.fields, record.label, record.path if record.path is not None else entry.path


def load_samples(root: Path, entries: list[Entry], options: PackOptions, threads: int,
                 fields: Sequence[FieldSpec] = (), records: ReadRecord | None = None,
                 ) -> Iterator[tuple[Entry, Loaded | list[Loaded] | RejectedFile]]:
    """Samples in listing order, loaded by a thread pool with a read-ahead bounded in bytes and files.

    Each task loads a run of consecutive files (up to READ_RUN_FILES or READ_RUN_BYTES), so the
    pool's queue and futures cost once per run instead of once per file.
    """
    load = functools.partial(load_sample, str(root), validate=options.validate, max_pixels=options.max_pixels,
                             encoding=options.encoding,
                             listed=[spec for spec in fields if spec.name not in options.sidecars],
                             sidecars=options.sidecars, sidecars_optional=options.sidecars_optional,
                             records=records)

    def load_run(run: list[Entry]) -> list[Loaded | list[Loaded] | RejectedFile]:
        return [load(entry) for entry in run]

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pack-read") as pool:
        pending: deque[tuple[list[Entry], int, Future[list[Loaded | list[Loaded] | RejectedFile]]]] = deque()
        position = in_flight = 0
        try:
            while position < len(entries) or pending:
                while position < len(entries) and (
                    not pending or (in_flight < READAHEAD_BYTES and len(pending) * READ_RUN_FILES < READAHEAD_FILES)
                ):
                    run, run_bytes = [], 0
                    while position < len(entries) and len(run) < READ_RUN_FILES and run_bytes < READ_RUN_BYTES:
                        run.append(entries[position])
                        run_bytes += entries[position].size
                        position += 1
                    pending.append((run, run_bytes, pool.submit(load_run, run)))
                    in_flight += run_bytes
                run, run_bytes, future = pending.popleft()
                in_flight -= run_bytes
                yield from zip(run, future.result())
        finally:
            for _, _, future in pending:
                future.cancel()
