"""Tar headers, the one place they are read and written: the WebDataset writer's fixed ustar
headers (`encode_header`), the reader's strict parse of a shard pack wrote (`canonical_header`,
then `parse_header`) and its walk through such a shard, sample by sample (`walk_samples`), and
the tolerant walk over any tar given as input (`read_members`: PAX and GNU long names, base-256
sizes; damage says where). Also WebDataset's member name rule.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Container, Iterator

BLOCK = 512
MAX_MEMBER_SIZE = 8**11 - 1  # what the 11 octal digits of a ustar size field hold (8 GiB)
ZERO_BLOCK = bytes(BLOCK)


class TarError(ValueError):
    """A tar header (or index) that is damaged or not what pack writes; callers add the file name."""


class TarDamage(TarError):
    """A tar input cannot be read on from here; the message says where and why."""


@dataclass(frozen=True, slots=True)
class Member:
    """One tar member: its name and size; from `read_members` also where its headers start (PAX and
    GNU long-name headers included), where its data starts, and whether it is a regular file."""

    name: str
    size: int
    start: int = 0
    data: int = 0
    is_file: bool = True

    @property
    def end(self) -> int:
        """Where the member ends, with its padding."""
        return self.data + padded(self.size)


def padding(size: int) -> int:
    """Zero bytes after a member's data up to the next 512-byte block."""
    return -size % BLOCK


def _octal(value: int, width: int) -> bytes:
    """A ustar numeric field: zero-padded octal digits and a NUL."""
    return b"%0*o\0" % (width - 1, value)


_MODE_UID_GID = _octal(0o644, 8) + _octal(0, 8) + _octal(0, 8)
_MTIME = _octal(0, 12)
# typeflag '0' (regular file), no link name, POSIX ustar magic and version, then empty user and
# group names, device numbers (unused for regular files; empty as tarfile writes them), prefix
# and padding to 512 bytes.
_TAIL = b"0" + bytes(100) + b"ustar\x0000" + bytes(32 + 32 + 8 + 8 + 155 + 12)
_FIXED_SUM = sum(_MODE_UID_GID) + sum(_MTIME) + 8 * ord(" ") + sum(_TAIL)
_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()  # os.fsdecode's


def encode_header(name: bytes, size: int) -> bytes:
    """The 512-byte ustar header of a regular file with fixed metadata; `parse_header` reads it."""
    if len(name) > 100:
        raise ValueError(f"tar member name longer than 100 bytes: {name!r}")
    if size > MAX_MEMBER_SIZE:
        raise ValueError(f"tar member {name!r} is larger than a ustar header can describe")
    size_field = _octal(size, 12)
    checksum = _FIXED_SUM + sum(name) + sum(size_field)
    return b"".join(
        (name.ljust(100, b"\0"), _MODE_UID_GID, size_field, _MTIME, b"%06o\0 " % checksum, _TAIL)
    )


def encode_member(name: bytes, data: bytes) -> bytes:
    """A whole member in one piece: header, data, zero padding to the next block."""
    return encode_header(name, len(data)) + data + ZERO_BLOCK[: padding(len(data))]


def canonical_header(block: bytes) -> tuple[bytes, int] | None:
    """(name, size) of a header exactly as `encode_header` writes it, checksum included, else None
    (then `parse_header` says what it is). The fixed fields are compared whole and the checksum
    summed over the name and size alone: a fifth of `parse_header`'s time, which a streaming read
    pays three times per sample."""
    if not (block.endswith(_TAIL) and block.startswith(_MODE_UID_GID, 100) and block.startswith(_MTIME, 136)):
        return None
    name = block[:100].rstrip(b"\0")
    size_field = block[124:136]
    if b"\0" in name or not block.startswith(b"%06o\0 " % (_FIXED_SUM + sum(name) + sum(size_field)), 148):
        return None
    digits = size_field[:11]
    if size_field[11] != 0 or not digits.isdigit():  # exactly 11 digits, as `_octal` writes them (int() also takes " +_")
        return None
    try:
        return name, int(digits, 8)
    except ValueError:  # an 8 or a 9
        return None


def parse_header(block: bytes | memoryview, *, checksum: bool = True) -> Member | None:
    """One 512-byte ustar header -> its member, or None for the all-zero end-of-archive block.

    Random access skips the checksum (summing 512 bytes costs more than the rest of a read):
    there the caller compares the name and size with what the index says instead.
    """
    block = bytes(block)
    if block == ZERO_BLOCK:
        return None
    try:
        size = int(block[124:136].rstrip(b"\0 ") or b"0", 8)
        valid = not checksum or int(block[148:156].rstrip(b"\0 ") or b"-1", 8) == header_checksum(block)
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


def strict_member(block: bytes) -> tuple[str, int] | None:
    """(name, size) of the member whose header is `block`, checked in full (pack's own headers by
    `canonical_header`, any other by `parse_header`), or None at the end-of-archive block."""
    canonical = canonical_header(block)
    if canonical is not None:
        return check_member_name(canonical[0].decode(_FS_ENCODING, _FS_ERRORS)), canonical[1]
    member = parse_header(block)
    return None if member is None else (member.name, member.size)


def check_member_name(name: str) -> str:
    """Refuse member names that could escape an extraction directory."""
    if not name or name.startswith("/") or (".." in name and ".." in name.split("/")):
        raise TarError(f"unsafe tar member name {name!r}")
    return name


def padded(size: int) -> int:
    """A member's data size with its padding to the next block."""
    return size + padding(size)


def header_checksum(header: bytes) -> int:
    """The ustar checksum: the header's bytes summed with the checksum field read as spaces."""
    return sum(header[:148]) + 8 * 32 + sum(header[156:])


def split_name(name: str) -> tuple[str, str]:
    """WebDataset's rule: the key ends at the first dot of the last path component."""
    directory, _, base = name.rpartition("/")
    stem, dot, extension = base.partition(".")
    return (directory + "/" if directory else "") + stem, extension if dot else ""


WALK_READ = 4096
"""What a walk that leaves the images unread reads at a time past an image, while reads do not
wait: a sample's small members (label, fields, meta, a block or two each) and the next image's
header, in one pread."""
WALK_READ_WAITED = 1 << 20
"""What it reads at a time once a read has waited WALK_WAITED_S or more: the next ~30 samples'
headers, small members and images in one pread. On a network mount (read in place) the kernel
reads ahead little or not at all, and a pread per header and another per image cost two round
trips a sample; read here, the images are in the page cache when the samples are handed out.
Where reads do not wait (the page cache), copying the images twice would only cost CPU."""
WINDOWS_AHEAD = 4
"""How many of those reads are in flight at once, each on a thread of its own (`WindowsAhead`): a
1 MiB pread on a mount is ~8 requests of 128 KB, answered nearly one after another, and one such
read at a time was most of a streamed epoch at 1 ms (docs/benchmarks.md, "Network storage")."""
WALK_WAITED_S = 100e-6
EAGER_READ = 1 << 20
"""The buffer of a walk that reads every member: many samples per system call."""
WALK_AHEAD = 8 << 20
"""How far ahead of the walk the kernel is asked to read the tar (POSIX_FADV_WILLNEED): 4 KB reads
that skip the images are not sequential to its readahead, and from a cold disk they waited on
the disk one by one (the images, read later, are then in the page cache too)."""


def walk_samples(fd: int, small: Container[str], *, eager: bool
                 ) -> Iterator[tuple[str, dict[str, bytes | tuple[int, int]]]]:
    """A tar of WebDataset samples (as pack writes them) front to back: per sample, its key and its
    members by extension. Members whose extension is in `small` come as bytes, and so do the
    others (a sample's image) when `eager`; otherwise each of those is (data offset, size), to be
    read when it is wanted, so the walk reads headers and small members only.

    Every header is checked in full (`strict_member`) and every size against what the file holds
    from there; anything pack would not write is a TarError. Holds one sample at a time."""
    end = os.fstat(fd).st_size
    reads = None if eager else SkippingReads(fd, end)
    read = sequential_reads(fd) if reads is None else reads.read
    key: str | None = None
    parts: dict[str, bytes | tuple[int, int]] = {}
    offset = 0
    try:
        while True:
            block = read(offset, BLOCK)
            if len(block) < BLOCK:
                raise TarError("tar shard is truncated (no end-of-archive block)")
            member = strict_member(block)
            if member is None:
                if key is not None:
                    yield key, parts
                return
            name, size = member
            member_key, extension = split_name(name)
            if key is not None and member_key != key:
                yield key, parts
                parts = {}
            key = member_key
            start = offset + BLOCK
            if size > end - start:
                raise TarError(f"tar shard is truncated in {name!r} ({size} bytes, {max(end - start, 0)} left)")
            if eager or extension in small:
                data = read(start, size)
                if len(data) < size:  # the file shrank while read
                    raise TarError(f"tar shard is truncated in {name!r}")
                parts[extension] = data
            else:
                parts[extension] = (start, size)
            offset = start + size + (-size % BLOCK)
    finally:
        if reads is not None:
            reads.close()


def sequential_reads(fd: int) -> Callable[[int, int], bytes]:
    """`read(offset, size)` for a walk that reads every member in turn: through a buffer of
    EAGER_READ bytes, each read a copy out of it (the kernel's readahead sees a sequential read)."""
    file = open(fd, "rb", buffering=EAGER_READ, closefd=False)

    def read(offset: int, size: int) -> bytes:
        file.seek(offset)  # a padding ahead at most: within the buffer, no system call
        return file.read(size)

    return read


def read_waited(started: float, fd: int, after: int) -> bool:
    """Whether a read begun at `started` (time.perf_counter) waited on storage: it took WALK_WAITED_S
    or more, and the bytes at `after` are not in the page cache, or the filesystem cannot say (FUSE,
    NFS: no RWF_NOWAIT). Timed alone, a read of cached bytes in a busy DataLoader worker often
    waited that long for the GIL, and a warm epoch's walks went to large reads for nothing."""
    if time.perf_counter() - started < WALK_WAITED_S:
        return False
    if not hasattr(os, "RWF_NOWAIT"):
        return True
    try:
        os.preadv(fd, [bytearray(1)], after, os.RWF_NOWAIT)
    except OSError:  # EAGAIN: not in the page cache; EOPNOTSUPP: a filesystem that cannot say
        return True
    return False


class SkippingReads:
    """`read(offset, size)` for a walk that skips the images: one pread of WALK_READ bytes serves a
    sample's small members and the next header, and the kernel is asked to read ahead of it. Once
    a read waits WALK_WAITED_S (a mount, a cold disk), the rest of the tar is read in consecutive
    windows, several in flight at once (`WindowsAhead`)."""

    def __init__(self, fd: int, end: int) -> None:
        self._fd, self._end = fd, end
        self._window, self._window_start = b"", 0
        self._advised = 0  # the kernel was asked to read the tar up to here
        self._ahead: WindowsAhead | None = None

    def read(self, offset: int, size: int) -> bytes:
        if self._ahead is not None:
            return self._ahead.read(offset, size)
        at = offset - self._window_start
        if 0 <= at and at + size <= len(self._window):
            return self._window[at:at + size]
        if offset + size > self._advised - WALK_AHEAD // 2 and self._advised < self._end \
                and hasattr(os, "posix_fadvise"):
            start = max(self._advised, offset)
            self._advised = offset + size + WALK_AHEAD
            os.posix_fadvise(self._fd, start, self._advised - start, os.POSIX_FADV_WILLNEED)
        started = time.perf_counter()
        self._window, self._window_start = os.pread(self._fd, max(size, WALK_READ), offset), offset
        if read_waited(started, self._fd, offset + len(self._window)):  # a round trip per read: many, large, at once
            self._ahead = WindowsAhead(self._fd, offset + size, self._end)
        return self._window[:size]

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.close()


class WindowsAhead:
    """The tar from `start` to `end` in consecutive windows of WALK_READ_WAITED bytes, read on
    WINDOWS_AHEAD threads, as many windows ahead of the one the walk is in; read from a duplicate
    of the descriptor, so one still in flight when the walk ends never reads a file that took the
    walk's number. Reads must come in file order (a walk's do)."""

    def __init__(self, fd: int, start: int, end: int) -> None:
        self._fd = os.dup(fd)
        self._start, self._end = start, end
        self._windows: dict[int, Future[bytes]] = {}  # window number -> its bytes
        self._next = 0  # the first window not yet asked for
        self._pool = ThreadPoolExecutor(WINDOWS_AHEAD, thread_name_prefix="pack-tar-ahead")

    def read(self, offset: int, size: int) -> bytes:
        """Bytes `offset`..`offset + size` (fewer at the end of the tar), from one window or more."""
        pieces = []
        while size > 0 and offset < self._end:
            number, at = divmod(offset - self._start, WALK_READ_WAITED)
            piece = self._take(number)[at:at + size]
            if not piece:  # the file shrank while read
                break
            pieces.append(piece)
            offset, size = offset + len(piece), size - len(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _take(self, number: int) -> bytes:
        """Window `number`, waited for; those before it dropped, those after asked for."""
        for old in [window for window in self._windows if window < number]:
            del self._windows[old]
        self._next = max(self._next, number)
        while self._next <= number + WINDOWS_AHEAD and self._start + self._next * WALK_READ_WAITED < self._end:
            self._windows[self._next] = self._pool.submit(
                os.pread, self._fd, WALK_READ_WAITED, self._start + self._next * WALK_READ_WAITED)
            self._next += 1
        return self._windows[number].result()

    def close(self) -> None:
        """Drop the windows not yet read, wait for those in flight, close the duplicate."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._windows.clear()
        os.close(self._fd)


def read_members(read: Callable[[int, int], bytes | memoryview], start: int, end: int, *,
                 archive: bool = False) -> Iterator[Member]:
    """The members of the tar bytes `start`..`end` (`read(offset, length)` gives them), from their
    headers alone: ustar, PAX ('x', its path and size) and GNU long names ('L'). The tar module
    takes ~100 us a member, several times the cost of packing the sample; this takes a few.
    `archive`: the bytes are a whole tar, which ends with its end-of-archive marker (none: it was cut)."""
    offset = first = start
    name: str | None = None
    size_override: int | None = None
    while offset < end:
        header = bytes(read(offset, BLOCK))
        if len(header) < BLOCK:
            raise TarDamage(f"truncated at byte {offset}, inside a header")
        if header == ZERO_BLOCK:
            return  # the end-of-archive marker
        if header_checksum(header) != octal(header[148:156], offset):
            raise TarDamage(f"damaged at byte {offset}: a header's checksum does not match")
        size, kind = octal(header[124:136], offset), header[156:157]
        data = offset + BLOCK
        offset = data + padded(size)
        if kind == b"L":  # a GNU long name for the next header
            name = bytes(read(data, size)).rstrip(b"\0").decode("utf-8", "surrogateescape")
            continue
        if kind == b"x":  # PAX attributes of the next header
            attributes = pax_attributes(bytes(read(data, size)), data)
            name = attributes.get("path", name)
            if "size" in attributes:
                size_override = int(attributes["size"]) if attributes["size"].isdigit() else -1
                if size_override < 0:
                    raise TarDamage(f"damaged at byte {offset}: a PAX size that is not a number")
            continue
        if kind == b"g":  # PAX global attributes: nothing a sample needs
            first = offset
            continue
        if size_override is not None:
            size, offset = size_override, data + padded(size_override)
        if name is None:
            name = header[0:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            if header[257:262] == b"ustar" and header[345] != 0:
                name = header[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape") + "/" + name
        yield Member(name, size, first, data, kind in (b"0", b"\0", b"7"))
        first, name, size_override = offset, None, None
    if archive and offset == end:
        raise TarDamage(f"truncated at byte {end}: no end-of-archive marker after the last member")


def octal(field: bytes, offset: int) -> int:
    """A numeric header field: octal text, or GNU base-256 for large sizes."""
    if field[0] & 0x80:
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise TarDamage(f"damaged at byte {offset}: a header field is not a number ({text[:12]!r})") from None


def pax_attributes(data: bytes, offset: int) -> dict[str, str]:
    """`length key=value\\n` records; only path and size matter here."""
    attributes = {}
    position = 0
    while position < len(data) and data[position:position + 1] != b"\0":
        space = data.find(b" ", position)
        try:
            length = int(data[position:space])
        except ValueError:
            length = 0
        if space < 0 or length <= space - position or position + length > len(data):  # also: no progress
            raise TarDamage(f"damaged at byte {offset}: unreadable PAX attributes")
        record = data[space + 1:position + length - 1]
        key, _, value = record.partition(b"=")
        attributes[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        position += length
    return attributes


