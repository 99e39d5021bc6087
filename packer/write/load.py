"""Source files in, encoded samples and their fields' stored bytes out, in listing order.

Passthrough (`--store original`) loads in the calling thread, with the next files opened ahead
by a few threads and the kernel asked to read them (`ReadAhead`): the kernel supplies the I/O
depth, and the data never passes through another thread. Where opening a file is measured to
take a round trip (a network mount), files are read whole on threads instead, as many in flight
as keep the caller from waiting. Stores that decode use reader threads with a bounded read-ahead,
since Pillow's codecs release the GIL.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from readers.fields import FieldSpec, encode_value

from .encode import Encoded, encode
from ..errors import RejectedFile
from ..plan.options import PackOptions
from ..plan.plan import Entry
from ..sources.inflight import MOST_IN_FLIGHT, InFlight
from ..sources.inputs import ReadMode, Record, Source, read_mode
from ..sources.remote import fetch_files
from ..sources.sidecars import read_sidecars
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
OPEN_THREADS = 4
"""`ReadAhead`'s opener threads: cold inodes are read while a file is opened, one at a time per thread."""
NET_RUN_FILES = 2
"""Files one task reads whole, one after another, once opening them takes a round trip: small
runs, so that many are in flight."""

log = logging.getLogger(__name__)


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


def open_advised(path: str, advice: int, length: int) -> int | OSError:
    """Open a file and tell the kernel how it will be read (`posix_fadvise`: only a hint), or
    the error, to be raised at that file's turn."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return exc
    try:
        os.posix_fadvise(fd, 0, length, advice)
    except OSError:  # only a hint
        pass
    return fd


def open_run(paths: list[tuple[str, int]]) -> list[int | OSError]:
    """Open each file and ask the kernel to start reading it (POSIX_FADV_WILLNEED)."""
    return [open_advised(path, os.POSIX_FADV_WILLNEED, size) for path, size in paths]


def read_run(paths: list[tuple[str, int]]) -> list[bytes | OSError]:
    """Each file's whole content (or its error, raised at that file's turn): on a network mount,
    where the open, the read and the close each wait a round trip, all of them in this thread.

    The kernel is told not to read ahead (POSIX_FADV_RANDOM): the one read() asks for the whole
    file, and with many files read at once a FUSE mount otherwise cut each into 3-4 reads, each a
    round trip (measured through scripts/latencyfs.py: 4.4 reads a file, 1.0 with the hint)."""
    contents: list[bytes | OSError] = []
    for path, size in paths:
        fd = open_advised(path, os.POSIX_FADV_RANDOM, 0)
        if isinstance(fd, OSError):
            contents.append(fd)
            continue
        try:
            contents.append(read_fd(fd, size))
        except OSError as exc:
            contents.append(exc)
        finally:
            os.close(fd)
    return contents


def timed(call: Callable[[list[tuple[str, int]]], list[Opened]], paths: list[tuple[str, int]]
          ) -> tuple[list[Opened], float]:
    """`call(paths)` and the seconds it took, measured in the thread that waited."""
    started = time.perf_counter()
    result = call(paths)
    return result, time.perf_counter() - started


Opened = int | bytes | OSError  # a file opened ahead, already read (network), or why not


class ReadAhead:
    """Hands out `entries` in order (iterate it), each file opened ahead of its turn by `threads`
    opener threads that announce it to the kernel (`open_run`): the kernel reads up to
    OPEN_AHEAD_FILES files (READAHEAD_BYTES) in the background, the openers wait on cold inodes in
    parallel, and the caller's `read` finds the bytes there. The openers do two system calls a
    file and no Python work on the data, so they seldom hold the GIL. Only the entries opened
    ahead are held, not the shard's. `close` closes what is still open.

    The openers are timed (`InFlight`): when opening takes a round trip (a network mount, where
    the read and the close would each take another, one after another in this thread), files are
    read whole on many threads instead (`read_run`, NET_RUN_FILES a task), as many runs in flight
    as it takes for the caller not to wait: each time it would, the depth grows by half, up to
    `MOST_IN_FLIGHT` runs and still within READAHEAD_BYTES. `close` logs what was chosen."""

    def __init__(self, root: str, entries: Iterable[Entry], threads: int) -> None:
        self._root = root
        self._entries = iter(entries)
        self._listed_all = False
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="pack-open")
        self._calls = InFlight(what=f"opens under {root}")
        self._depth = 2 * max(1, threads)  # runs in flight once files are read on `_calls`
        self._waits = 0
        self._runs: deque[tuple[list[Entry], Future[tuple[list[Opened], float]]]] = deque()
        self._current: deque[tuple[Entry, str, Opened]] = deque()  # the run being read: entry, path, fd or bytes
        self._bytes = 0

    def _room(self) -> bool:
        if not self._runs:
            return True
        if self._bytes >= READAHEAD_BYTES:
            return False
        if self._calls.concurrent:
            return len(self._runs) < self._depth
        return len(self._runs) * READ_RUN_FILES < OPEN_AHEAD_FILES

    def _open_ahead(self) -> None:
        while not self._listed_all and self._room():
            run, run_bytes = take_run(self._entries, NET_RUN_FILES if self._calls.concurrent else READ_RUN_FILES)
            if not run:
                self._listed_all = True
                break
            self._bytes += run_bytes
            paths = [(os.path.join(self._root, entry.path), entry.size) for entry in run]
            if self._calls.concurrent:
                self._runs.append((run, self._calls.submit(timed, read_run, paths)))
            else:
                self._runs.append((run, self._pool.submit(timed, open_run, paths)))

    def __iter__(self) -> Iterator[Entry]:
        while True:
            if not self._current:
                self._open_ahead()
                if not self._runs:
                    return
                if self._calls.concurrent and not self._runs[0][1].done():  # the caller would wait: more in flight
                    self._waits += 1
                    self._depth = min(MOST_IN_FLIGHT, self._depth + max(1, self._depth // 2))
                    self._open_ahead()
                run, future = self._runs.popleft()
                opened, seconds = future.result()
                self._calls.timed(len(run), seconds)
                self._current.extend((entry, os.path.join(self._root, entry.path), fd)
                                     for entry, fd in zip(run, opened))
            entry = self._current[0][0]
            yield entry
            if self._current and self._current[0][0] is entry:  # its file was not read (rejected before)
                fd = self._take()
                if isinstance(fd, int):
                    os.close(fd)

    def _take(self) -> Opened:
        entry, _, fd = self._current.popleft()
        self._bytes -= entry.size
        return fd

    def read(self, path: str, size: int) -> bytes:
        """The file at `path`: the current entry's, opened ahead (any other is read the plain way)."""
        if not self._current or self._current[0][1] != path:
            return read_file(path, size)
        fd = self._take()
        if isinstance(fd, OSError):
            raise fd
        if isinstance(fd, bytes):
            return fd
        try:
            return read_fd(fd, size)
        finally:
            os.close(fd)

    def close(self) -> None:
        for _, future in self._runs:
            future.cancel()
        self._pool.shutdown(wait=True)
        self._calls.close()
        opened = [fd for _, _, fd in self._current]
        for _, future in self._runs:
            if not future.cancelled():
                opened += future.result()[0]
        for fd in opened:
            if isinstance(fd, int):
                os.close(fd)
        self._current.clear()
        self._runs.clear()
        if self._calls.concurrent:
            log.info("read files under %s whole on threads (opening one took a round trip): %d runs of %d in "
                     "flight at most, grown %d times", self._root, self._depth, NET_RUN_FILES, self._waits)


def take_run(entries: Iterator[Entry], max_files: int, max_bytes: int = 1 << 62) -> tuple[list[Entry], int]:
    """The next consecutive entries, up to `max_files` or until they reach `max_bytes` of source;
    an empty run when none are left."""
    run: list[Entry] = []
    run_bytes = 0
    while len(run) < max_files and run_bytes < max_bytes:
        entry = next(entries, None)
        if entry is None:
            break
        run.append(entry)
        run_bytes += entry.size
    return run, run_bytes


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
                read: Callable[[str, int], bytes] = read_file,
                records: ReadRecord | None = None) -> Loaded | list[Loaded] | RejectedFile:
    """Read (with `read`), check and encode one file, and its fields: the `listed` ones from its
    entry, the others from its sidecars; or one sample of a container input, through `records`.
    Runs in a reader thread (Pillow's codecs release the GIL), or in line for passthrough."""
    try:
        if entry.location is not None and records is not None:
            record = records(*entry.location)
            if isinstance(record, list):  # an input that gives several samples (pack_samples)
                return [load_record(one, entry, validate, max_pixels, encoding) for one in record]
            return load_record(record, entry, validate, max_pixels, encoding)
        data = read(os.path.join(root, entry.path), entry.size)
        codec = check_image(data, validate=validate, max_pixels=max_pixels)
        encoded = encode(data, codec=codec, **encoding)
        return (encoded, {**listed_fields(entry, listed), **read_sidecars(root, entry.path, sidecars, sidecars_optional)},
                entry.label, entry.path)
    except RejectedFile as exc:
        return exc
    except OSError as exc:
        return RejectedFile(f"cannot read: {exc.strerror or exc}")


def fetched_bytes(data: bytes | OSError, _path: str, _size: int) -> bytes:
    """A `read` for a file of a remote SRC whose bytes (or error) came in its run's batch."""
    if isinstance(data, OSError):
        raise data
    return data


def load_record(record: Record, entry: Entry, validate: str, max_pixels: int, encoding: dict[str, Any]) -> Loaded:
    """A container sample's image checked and encoded like a file's; a reject names its member or record."""
    try:
        codec = check_image(record.image, validate=validate, max_pixels=max_pixels)
        encoded = encode(record.image, codec=codec, **encoding)
    except RejectedFile as exc:
        raise RejectedFile(f"{record.image_name}: {exc}") from None
    return encoded, record.fields, record.label, record.path if record.path is not None else entry.path


def load_samples(root: Path | str, entries: Iterable[Entry], options: PackOptions, threads: int,
                 fields: Sequence[FieldSpec] = (), records: ReadRecord | None = None,
                 mode: ReadMode | None = None) -> Iterator[tuple[Entry, Loaded | list[Loaded] | RejectedFile]]:
    """Samples in listing order, read as SRC's `mode` says (`packer.sources.inputs.read_mode`;
    None: a folder at `root`): passthrough in line (container records as they come, local files
    through `ReadAhead`), the rest (decoding stores, a remote SRC, pack_samples' calls) by a
    thread pool with a read-ahead bounded in bytes and files (`threads` of them).

    Each task loads a run of consecutive files (up to READ_RUN_FILES or READ_RUN_BYTES), so the
    pool's queue and futures cost once per run instead of once per file.
    """
    load = functools.partial(load_sample, str(root), validate=options.validate, max_pixels=options.max_pixels,
                             encoding=options.encoding,
                             listed=[spec for spec in fields if spec.name not in options.sidecars],
                             sidecars=options.sidecars, sidecars_optional=options.sidecars_optional,
                             records=records)

    mode = mode or read_mode(Source("folder", str(root)))
    remote = mode == "fetch"  # a folder of images at a URL
    if options.store in INLINE_STORES and mode == "in-line":
        for entry in entries:
            yield entry, load(entry)
        return
    if options.store in INLINE_STORES and mode == "files":
        ahead = ReadAhead(str(root), entries, OPEN_THREADS)
        try:
            for entry in ahead:
                yield entry, load(entry, read=ahead.read)
        finally:
            ahead.close()
        return

    def load_run(run: list[Entry]) -> list[Loaded | list[Loaded] | RejectedFile]:
        if remote:  # the run's files in one concurrent batch of GETs
            fetched = fetch_files(str(root), [entry.path for entry in run])
            return [load(entry, read=functools.partial(fetched_bytes, data)) for entry, data in zip(run, fetched)]
        return [load(entry) for entry in run]

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pack-read") as pool:
        pending: deque[tuple[list[Entry], int, Future[list[Loaded | list[Loaded] | RejectedFile]]]] = deque()
        remaining, listed_all, in_flight = iter(entries), False, 0
        try:
            while not listed_all or pending:
                while not listed_all and (
                    not pending or (in_flight < READAHEAD_BYTES and len(pending) * READ_RUN_FILES < READAHEAD_FILES)
                ):
                    run, run_bytes = take_run(remaining, READ_RUN_FILES, READ_RUN_BYTES)
                    if not run:
                        listed_all = True
                        break
                    pending.append((run, run_bytes, pool.submit(load_run, run)))
                    in_flight += run_bytes
                if not pending:
                    break
                run, run_bytes, future = pending.popleft()
                in_flight -= run_bytes
                yield from zip(run, future.result())
        finally:
            for _, _, future in pending:
                future.cancel()
