"""Source files in, encoded samples and their fields' stored bytes out, in listing order.

Passthrough (`--store original`) loads in the calling thread, with the next files opened ahead
and the kernel asked to read them (`ReadAhead`): the kernel supplies the I/O depth, and no GIL
passes between threads per file. Stores that decode use reader threads with a bounded read-ahead,
since Pillow's codecs release the GIL.
"""

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
from .sources.sidecars import read_sidecars
from .validate import check_image

READ_THREADS = 8
READAHEAD_BYTES = 8 << 20
READAHEAD_FILES = 512
READ_RUN_FILES = 16
READ_RUN_BYTES = 1 << 20
INLINE_STORES = ("original",)
"""Stores loaded in the calling thread: no decoding, so threads would only pass the GIL around."""
OPEN_AHEAD_FILES = 128
"""Files `ReadAhead` keeps open ahead of their turn (within READAHEAD_BYTES): the I/O depth."""


def read_file(path: str, size: int) -> bytes:
    """The whole file, in one read() when it still has the size the scan saw.

    Three system calls where `open().read()` makes seven; with eight reader threads, each call
    is a hand-over of the GIL, and those hand-overs were most of a shard's system time.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_fd(fd, size)
    finally:
        os.close(fd)


def read_fd(fd: int, size: int) -> bytes:
    """An open file's whole content, expected to be `size` bytes."""
    data = os.read(fd, size + 1)
    if len(data) != size:  # changed since the scan, or a short read: read on to the end
        parts = [data]
        while chunk := os.read(fd, 1 << 20):
            parts.append(chunk)
        data = b"".join(parts)
    return data


class ReadAhead:
    """Reads `entries`' files in order, each opened ahead of its turn and announced to the kernel
    with posix_fadvise(WILLNEED), which starts reading it in the background: a cold folder is read
    with up to OPEN_AHEAD_FILES requests in flight from one thread. An open that fails is raised
    at that file's turn. `close` closes what is still open."""

    def __init__(self, root: str, entries: Sequence[Entry]) -> None:
        self._root = root
        self._entries = entries
        self._next = 0  # the next entry to open
        self._ahead: deque[tuple[str, int, int | OSError]] = deque()  # path, size, descriptor or error
        self._bytes = 0

    def _open_ahead(self) -> None:
        while self._next < len(self._entries) and len(self._ahead) < OPEN_AHEAD_FILES and \
                (not self._ahead or self._bytes < READAHEAD_BYTES):
            entry = self._entries[self._next]
            self._next += 1
            path = os.path.join(self._root, entry.path)
            try:
                fd: int | OSError = os.open(path, os.O_RDONLY)
            except OSError as exc:
                fd = exc
            else:
                try:
                    os.posix_fadvise(fd, 0, entry.size, os.POSIX_FADV_WILLNEED)
                except OSError:  # only a hint
                    pass
            self._ahead.append((path, entry.size, fd))
            self._bytes += entry.size

    def read(self, path: str, size: int) -> bytes:
        """The file at `path`: the next one in order (any other is read the plain way)."""
        self._open_ahead()
        if not self._ahead or self._ahead[0][0] != path:
            return read_file(path, size)
        _, planned, fd = self._ahead.popleft()
        self._bytes -= planned
        if isinstance(fd, OSError):
            raise fd
        try:
            return read_fd(fd, size)
        finally:
            os.close(fd)

    def close(self) -> None:
        while self._ahead:
            fd = self._ahead.popleft()[2]
            if isinstance(fd, int):
                os.close(fd)


Loaded = tuple[Encoded, dict[str, bytes]]  # the encoded image, and its fields' stored bytes


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
                read: Callable[[str, int], bytes] = read_file) -> Loaded | RejectedFile:
    """Read (with `read`), check and encode one file, and its fields: the `listed` ones from its
    entry, the others from its sidecars. Runs in a reader thread (Pillow's codecs release the GIL),
    or in line for passthrough."""
    try:
        data = read(os.path.join(root, entry.path), entry.size)
        codec = check_image(data, validate=validate, max_pixels=max_pixels)
        encoded = encode(data, codec=codec, **encoding)
        return encoded, {**listed_fields(entry, listed), **read_sidecars(root, entry.path, sidecars, sidecars_optional)}
    except RejectedFile as exc:
        return exc
    except OSError as exc:
        return RejectedFile(f"cannot read: {exc.strerror or exc}")


def load_samples(root: Path, entries: list[Entry], options: PackOptions, threads: int,
                 fields: Sequence[FieldSpec] = ()) -> Iterator[tuple[Entry, Loaded | RejectedFile]]:
    """Samples in listing order: passthrough in line (`ReadAhead`), others by a thread pool with a
    read-ahead bounded in bytes and files (`threads` of them).

    Each task loads a run of consecutive files (up to READ_RUN_FILES or READ_RUN_BYTES), so the
    pool's queue and futures cost once per run instead of once per file.
    """
    load = functools.partial(load_sample, str(root), validate=options.validate, max_pixels=options.max_pixels,
                             encoding=options.encoding,
                             listed=[spec for spec in fields if spec.name not in options.sidecars],
                             sidecars=options.sidecars, sidecars_optional=options.sidecars_optional)

    if options.store in INLINE_STORES:
        ahead = ReadAhead(str(root), entries)
        try:
            for entry in entries:
                yield entry, load(entry, read=ahead.read)
        finally:
            ahead.close()
        return

    def load_run(run: list[Entry]) -> list[Loaded | RejectedFile]:
        return [load(entry) for entry in run]

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pack-read") as pool:
        pending: deque[tuple[list[Entry], int, Future[list[Loaded | RejectedFile]]]] = deque()
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
