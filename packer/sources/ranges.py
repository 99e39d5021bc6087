"""Input files read by byte range: the containers a plan points into (tar, RecordIO, TFRecord
files), local or at a URL, from many reader threads at once.

A local file is read with `pread` while its reads answer fast. A URL, where every read is a
request, and a local file whose reads wait on storage (a network mount, `WAITED_SHARE`) are read
in aligned BLOCK_BYTES blocks, BLOCKS_AHEAD of them ahead on threads, so a shard of thousands of
samples costs a few dozen large reads, several in flight, instead of a round trip per sample.
The blocks are kept for all the files of a shard together (`Blocks`), KEPT_BLOCKS at most, so
the memory they take is bounded however many inputs a shard reads from.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, BinaryIO, Iterator

from readers.remote import is_url
from readers.tar import WALK_WAITED_S

from ..errors import PackError, RejectedFile
from .inflight import PROBE_CALLS, InFlight
from .inputs import fsspec_errors

log = logging.getLogger(__name__)

READ_AHEAD_BYTES = 8 << 20
"""A local input's reads announce this block of the file and the next to the kernel (`InputFiles`)."""
BLOCK_BYTES = 1 << 20
"""A URL input, and a local one whose reads wait, is read in aligned blocks of this many bytes."""
BLOCKS_AHEAD = 3
"""Blocks read ahead of the last one read, in flight at once."""
KEPT_BLOCKS = 128
"""Blocks kept for the inputs of a shard together (at most 128 MiB however many inputs it has): a
shuffled pack reads up to `packer.plan.pack_order`'s WINDOW_RUNS (64) places of them in turn, each
front to back, so each place keeps the block it is in, and a read across two blocks keeps both:
with no more blocks than places, each such read evicted another place's block, which evicted
another when it was read again."""
WALK_KEPT_BLOCKS = BLOCKS_AHEAD + 2
"""Blocks kept for a walk front to back (a scan): the one or two a read is in, those ahead."""
WAITED_SHARE = 16
"""A local input's reads go through blocks once PROBE_CALLS have been made and one in WAITED_SHARE
of them waited WALK_WAITED_S (`readers.tar`'s): not the median, as the kernel's readahead answers
most small reads on a mount from memory and only the read past each ~128 KB waits (one in 4-14
reads of 8-33 KB samples), a round trip each; from the page cache of a busy machine, one read in
a few hundred waits (for the GIL, or preempted)."""

_file_numbers = itertools.count()


class Blocks:
    """Blocks of input files read on `calls`' threads, at most `kept` for all the files together.
    Readers go front to back (a walk; each place of a shuffled pack, `packer.plan.pack_order`):
    - a read that continues where another ended moves its place on: the blocks behind it are let
      go, unless another place is in one, and never read ahead again (the reads ahead at the end
      of a run would fetch back the start of the next, already read);
    - the room left is shared among the places for reading ahead: up to BLOCKS_AHEAD for one
      walk, one block each for 64 places in 128;
    - over `kept`, the blocks read ahead and not read yet go first, then the least recently read.
    64 places read in turn fetch almost every block once (tests/test_ranges.py), where keeping
    the blocks left behind and reading 3 ahead of every place fetched each 1.2-3 times."""

    def __init__(self, calls: InFlight, kept: int) -> None:
        self.calls = calls
        self.kept = kept
        self._lock = threading.Lock()
        self._read: OrderedDict[tuple[int, int], Future[bytes]] = OrderedDict()  # least recently read first
        self._ahead: OrderedDict[tuple[int, int], Future[bytes]] = OrderedDict()  # not read yet, oldest first
        self._ends: OrderedDict[tuple[int, int], int] = OrderedDict()  # where recent reads ended: their first block
        self._passed: set[tuple[int, int]] = set()  # blocks a place moved on from: never read ahead again

    def read(self, file: RangeFile, offset: int, length: int) -> bytes:
        """`length` bytes of `file` at `offset`; fewer where it ends first."""
        end = min(offset + length, file.size)
        if end <= offset:
            return b""
        first, last = offset // BLOCK_BYTES, (end - 1) // BLOCK_BYTES
        with self._lock:
            wanted = [(number, self._wanted(file, number)) for number in range(first, last + 1)]
            self._moved_on(file.number, offset, end, first)
            depth = min(BLOCKS_AHEAD, (self.kept - len(self._read)) // max(1, len(self._read)))
            for number in range(last + 1, min(last + 1 + depth, -(-file.size // BLOCK_BYTES))):
                key = (file.number, number)
                if len(self) >= self.kept:
                    break
                if key not in self._read and key not in self._ahead and key not in self._passed:
                    self._ahead[key] = self.calls.submit(file.fetch, number)
            while len(self) > self.kept:
                (self._ahead or self._read).popitem(last=False)
        parts = []
        for number, block in wanted:
            try:
                parts.append(block.result())
            except BaseException:
                with self._lock:  # the next read asks again
                    if self._read.get((file.number, number)) is block:
                        del self._read[file.number, number]
                raise
        start = offset - first * BLOCK_BYTES
        if len(parts) == 1:  # most reads: a slice of one block
            return parts[0][start:start + end - offset]
        parts[0], parts[-1] = parts[0][start:], parts[-1][:end - last * BLOCK_BYTES]
        return b"".join(parts)

    def _wanted(self, file: RangeFile, number: int) -> Future[bytes]:
        """Block `number` of `file`, now the most recently read; its read started if it is not
        kept (the caller holds the lock)."""
        key = (file.number, number)
        block = self._read.pop(key, None) or self._ahead.pop(key, None) or self.calls.submit(file.fetch, number)
        self._read[key] = block
        return block

    def _moved_on(self, file: int, offset: int, end: int, first: int) -> None:
        """A read of `file` from `offset` to `end`, starting in block `first`: if it continues
        a read before, the blocks that one started in, up to `first`, are behind its place."""
        behind = self._ends.pop((file, offset), first)
        self._ends[file, end] = first
        if len(self._ends) > 2 * self.kept:  # places long finished
            self._ends.popitem(last=False)
        if behind < first:
            others = {(ended - 1) // BLOCK_BYTES for number, ended in self._ends if number == file}
            for number in range(behind, first):
                if number not in others:
                    self._read.pop((file, number), None)
                    self._passed.add((file, number))

    def forget(self, file: RangeFile) -> None:
        """Drop `file`'s blocks (it is closed)."""
        with self._lock:
            for blocks in (self._read, self._ahead, self._ends):
                for key in [key for key in blocks if key[0] == file.number]:
                    del blocks[key]
            self._passed = {key for key in self._passed if key[0] != file.number}

    def __len__(self) -> int:
        return len(self._read) + len(self._ahead)


class RangeFile:
    """One input file, read by byte range from any thread: a local file with pread (no shared
    position) while its reads answer fast; a URL through fsspec, and a local file once its reads
    wait on storage, through `blocks` (its own for a walk, when none is given). fsspec's own
    errors arrive as OSError, which the callers name the file in."""

    def __init__(self, path: str, blocks: Blocks | None = None) -> None:
        self.path = path
        self.number = next(_file_numbers)
        self.owns_blocks = blocks is None
        self.blocks = blocks if blocks is not None else Blocks(InFlight(what=f"reads of {path}"), WALK_KEPT_BLOCKS)
        self.fd: int | None = None
        self._url: tuple[Any, str] | None = None
        if is_url(path):
            from .remote import filesystem  # here: fsspec loads only for a URL input

            with fsspec_errors():
                fs, key = filesystem(path)
                size = fs.size(key)
            if not isinstance(size, int) or size < 0:
                raise OSError(f"the server gives no size for it ({size!r})")
            self._url, self.size = (fs, key), size
        else:
            self.fd = os.open(path, os.O_RDONLY)
            self.size = os.fstat(self.fd).st_size
        self._reads = self._waited = 0  # preads made, and those that waited on storage
        self._warned = False  # that the server ignores range requests

    def read(self, offset: int, length: int) -> bytes:
        """`length` bytes at `offset`; fewer where the file ends first."""
        if self.fd is None:
            with fsspec_errors():
                return self.blocks.read(self, offset, length)
        if self.blocks.calls.concurrent:
            return self.blocks.read(self, offset, length)
        started = time.perf_counter()
        data = os.pread(self.fd, length, offset)
        self._reads += 1
        if time.perf_counter() - started >= WALK_WAITED_S:
            self._waited += 1
            if self._reads >= PROBE_CALLS and self._waited * WAITED_SHARE >= self._reads:
                log.info("%s: reads wait on storage: %d KiB at a time, %d in flight", self.path,
                         BLOCK_BYTES >> 10, BLOCKS_AHEAD + 1)
                self.blocks.calls.concurrent = True
        return data

    def fetch(self, number: int) -> bytes:
        """Block `number`, from storage (on a thread of `blocks`)."""
        start = number * BLOCK_BYTES
        if self._url is None:
            assert self.fd is not None
            return os.pread(self.fd, BLOCK_BYTES, start)
        fs, key = self._url
        end = min(self.size, start + BLOCK_BYTES)
        data = fs.cat_file(key, start=start, end=end)
        if len(data) == self.size != end - start:  # a server that ignores Range sends the whole file
            if not self._warned:
                self._warned = True
                log.warning("%s: the server ignores range requests: each %d MiB block fetches the whole file",
                            self.path, BLOCK_BYTES >> 20)
            data = data[start:end]
        if len(data) != end - start:
            raise OSError(f"asked for bytes {start}-{end} of {self.size} and got {len(data)}")
        return data

    def stream(self) -> BinaryIO:
        """A file object for a walk front to back, reading through `read`."""
        return io.BufferedReader(_RangeStream(self))

    def close(self) -> None:
        self.blocks.forget(self)
        if self.owns_blocks:
            self.blocks.calls.close()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> RangeFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _RangeStream(io.RawIOBase):
    """A RangeFile as a raw file: `readinto` from its `read`."""

    def __init__(self, file: RangeFile) -> None:
        self.file = file
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.file.size}[whence]
        self.position = base + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer: Any) -> int:
        data = self.file.read(self.position, len(buffer))
        buffer[:len(data)] = data
        self.position += len(data)
        return len(data)


class InputFiles:
    """The input files of a shard, each opened once on first use and read with `pread`, which
    reader threads may call at once on one descriptor (no shared file position).

    Eight threads reading neighbouring ranges of one file look random to the kernel, which then
    stops reading ahead: each read would wait for the disk; so do a shuffled pack's interleaved
    runs (`packer.plan.pack_order`), several places of one file read in turn. So a read announces its
    READ_AHEAD_BYTES block of the file and the next (posix_fadvise WILLNEED), once each, and the
    kernel fetches them in large requests while the threads work, whatever the order of the runs.
    URL inputs, and local ones once their reads wait on storage, share one `Blocks` instead.
    """

    def __init__(self, inputs: list[str]) -> None:
        self.inputs = inputs
        self._files: dict[int, RangeFile] = {}
        self._announced: set[tuple[int, int]] = set()  # (input, block) announced so far
        self._lock = threading.Lock()
        self._calls = InFlight(what="reads of the inputs")  # one decision for all of them
        self._blocks = Blocks(self._calls, KEPT_BLOCKS)

    def read(self, input: int, offset: int, length: int) -> bytes:
        """`length` bytes at `offset`; fewer where the file ends first (the caller names the damage)."""
        file = self._files.get(input)
        if file is None:
            with self._lock:
                file = self._files.get(input)
                if file is None:
                    try:
                        file = self._files[input] = RangeFile(self.inputs[input], self._blocks)
                    except OSError as exc:
                        raise self._error(input, "open", exc) from None
        if file.fd is not None and not self._calls.concurrent:
            last = (offset + length) // READ_AHEAD_BYTES + 1
            for block in range(offset // READ_AHEAD_BYTES, last + 1):
                if (input, block) not in self._announced:
                    self._announced.add((input, block))
                    os.posix_fadvise(file.fd, block * READ_AHEAD_BYTES, READ_AHEAD_BYTES, os.POSIX_FADV_WILLNEED)
        try:
            return file.read(offset, length)
        except OSError as exc:
            raise self._error(input, "read", exc) from None

    def _error(self, input: int, what: str, exc: OSError) -> Exception:
        """A local file that cannot be read rejects its sample; a URL's stops the run (the store is
        unreachable or the object gone: every sample after it would be rejected too)."""
        message = f"{self.inputs[input]}: cannot {what} ({exc.strerror or exc})"
        if is_url(self.inputs[input]):
            return PackError(f"{message}; finished shards are kept: rerun the same command to resume")
        return RejectedFile(message)

    def close(self) -> None:
        with self._lock:
            for file in self._files.values():
                file.close()
            self._files.clear()
        self._calls.close()


def index_lines(path: str) -> Iterator[tuple[int, tuple[int, int] | None, str]]:
    """The non-blank lines of a text index beside an input (RecordIO's `.idx`, a `.tfindex`):
    (line number, its two integers or None where the line is not two integers, the line)."""
    with RangeFile(path) as file, fsspec_errors():
        lines = io.TextIOWrapper(file.stream(), encoding="ascii", errors="replace")
        for number, line in enumerate(lines, 1):
            fields = line.split()
            if not fields:
                continue
            try:
                first, second = (int(value) for value in fields)
            except ValueError:
                yield number, None, line
                continue
            yield number, (first, second), line
