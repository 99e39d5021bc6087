"""A node-local cache of whole shard files, shared by every rank and DataLoader worker on the node.

Imports no torch and no fsspec: what to download is someone else's business (a `Fetcher`).
Layout under the cache directory:

    objects/<sha256><suffix>                  verified files, named by the manifest's sha256
    tmp/<sha256>.<bytes>.<pid>.<token>.part   downloads in progress; `bytes` counts against the limit
    locks/<sha256>.use                        flock'd shared by every user: the reference count
    locks/<sha256>.get                        flock'd exclusively by the one process downloading it
    locks/cache.lock                          flock'd while room is made

A file is published only by renaming a download whose sha256 matched, so an interrupted run,
another dataset or an earlier run never leaves anything that is read without its hash checked.
References are taken before a file is looked at (eagerly), are flocks the kernel drops when a
process dies, and eviction only removes files nobody holds a reference to.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Iterator, Protocol

from .manifest import DatasetError, plain_name, sha256_name

log = logging.getLogger(__name__)

MIN_CACHE_SHARDS = 3
"""A cache limit must hold this many of a dataset's largest shards: one being read, the next ones
downloading, on a node shared by several readers."""
FREE_SHARE_KEPT = 0.05
FREE_BYTES_KEPT = 1 << 30
"""With no `cache_limit`, the cache still leaves the larger of these free on its disk (a share of
the disk, bytes): it evicts for room as under a limit, rather than fill the disk a job writes its
checkpoints and logs to (a dataset on a mount is copied there by default)."""
ROOM_POLL_S = 0.05
LANDING_POLL_S = 0.002
LANDING_WAIT_S = 2.0
"""A reader waiting for another process's (or thread's) download under way looks whether it has
landed every LANDING_POLL_S for its first LANDING_WAIT_S, then every ROOM_POLL_S: at 50 ms, readers
took copies of a mount's shards 3-28 ms after they landed, on a first batch's path."""
ROOM_TIMEOUT_S = 600.0
"""How long a download waits for other readers to release enough of a full cache, or for another
process's download of the same file to start or grow, before failing."""

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", re.IGNORECASE)
_PART = re.compile(r"([0-9a-f]{64})\.([0-9]+)\.[0-9]+\.[0-9a-f]+\.part")
"""A download in progress: tmp/<sha256>.<bytes>.<pid>.<token>.part"""


class CachedFile(Protocol):
    """What the cache needs to know of a file: the manifest's ShardInfo and FileInfo both qualify."""

    @property
    def name(self) -> str: ...
    @property
    def bytes(self) -> int: ...
    @property
    def sha256(self) -> str: ...


class Fetcher(Protocol):
    """Downloads a dataset's files by name (retrying what is transient) and names their URLs."""

    def fetch(self, name: str, dest: Path, size: int) -> str | None:
        """Write the file to `dest` (synced to disk where it returns a digest); its sha256 where
        it hashed the bytes on the way, else None (the cache reads the file back to hash it)."""
    def url_of(self, name: str) -> str: ...


class NoRoom(Exception):
    """A download fetched ahead of its turn found no room: it is left for its turn."""


@dataclass(frozen=True)
class Ahead:
    """A download fetched ahead of its turn, which must not cost a reader that needs a file now:
    it starts only where `headroom` bytes stay free after it, evicts only files last used before
    `since` (never the files fetched ahead since, its own or another reader's), and never waits
    for room (`NoRoom`), so it never holds a file's download lock while another reader needs it."""

    headroom: int
    since: float


def parse_size(value: int | str | None) -> int | None:
    """Bytes from an int or a string like "200GB", "1.5 GiB", "512MB", "4G"; None stays None (no
    limit). The one size syntax of pack: `--shard-bytes` on the command line uses it too."""
    if value is None or isinstance(value, int):
        if value is not None and value < 0:
            raise ValueError(f"{value} is negative; a size is a number of bytes")
        return value
    match = _SIZE.fullmatch(value)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ValueError(f"{value!r} is not a size (examples: 200GB, 512MiB, 1000000)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def disk_space(path: Path) -> tuple[int, int]:
    """The size of the filesystem holding `path`, and the bytes free there for this user."""
    disk = os.statvfs(path)
    return disk.f_blocks * disk.f_frsize, disk.f_bavail * disk.f_frsize


def format_size(size: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit} ({size} bytes)"
    return f"{size} bytes"


# Every lock descriptor this process holds: a forked child closes its copies, or they would keep
# the parent's references (flocks belong to the open file, which fork shares) alive in the child.
_HELD: set[int] = set()
_HELD_GUARD = threading.Lock()
_LEASED_BYTES: dict[Path, int] = {}
"""Cache folder -> bytes of the files this process holds leases on there (`leased_here`)."""


def _close_inherited() -> None:
    global _HELD_GUARD
    _HELD_GUARD = threading.Lock()  # another thread of the parent may have held it at the fork
    for fd in _HELD:
        os.close(fd)
    _HELD.clear()
    _LEASED_BYTES.clear()


os.register_at_fork(after_in_child=_close_inherited)


def _lock(path: Path, *, exclusive: bool, wait: bool = True) -> int | None:
    """A flock on `path` (created if missing): the descriptor, or None if `wait` is False and it is held.

    The lock is taken on the file the path names when the lock is granted: if the file vanished or
    was replaced while we waited (an eviction or a finished download removes its lock files), we
    lock the new one instead, so two processes never both believe they hold it.
    """
    operation = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, operation)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            with _HELD_GUARD:
                _HELD.add(fd)
            return fd
        os.close(fd)


def _in_use(path: Path) -> bool:
    """Whether some reader (this process included) holds the shared lock at `path` now."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing the probe's own descriptor drops its lock, never another's
    return False


_END_WITH_PARENT = False
"""Whether this process's waits end when its parent process does (`end_waits_with_parent`)."""


def end_waits_with_parent() -> None:
    """Make this process's waits for room or for another's download end once its parent process
    ends: for DataLoader workers, which no one reads from after their main process is gone."""
    global _END_WITH_PARENT
    _END_WITH_PARENT = True


def _unlock(fd: int) -> bool:
    """Close a lock descriptor (closing, never LOCK_UN: a forked copy must not unlock the parent's);
    False where it was closed already, or closed for us after a fork."""
    with _HELD_GUARD:
        if fd not in _HELD:
            return False
        _HELD.discard(fd)
    os.close(fd)
    return True


def _remove_lock(path: Path, fd: int) -> None:
    """Delete a lock file we hold, then release it: waiters on it notice and lock the new one."""
    path.unlink(missing_ok=True)
    _unlock(fd)


class Lease:
    """A reference to one cached file: while it is held, no process on the node evicts the file.
    A file read in place (on a mount) holds nothing."""

    provisional: ClassVar[bool] = False
    """Whether `superseded` can ever say True. Readers ask only such leases at each sample: asking
    every lease was 4% of a warm local LMDB read."""

    def __init__(self, path: Path, fd: int | None = None, room: tuple[Path, int] | None = None) -> None:
        self.path = path
        self._fd = fd
        self._room = room  # (cache folder, bytes) counted in `leased_here` while held
        if fd is not None and room is not None:
            with _HELD_GUARD:
                _LEASED_BYTES[room[0]] = _LEASED_BYTES.get(room[0], 0) + room[1]

    def release(self) -> None:
        if self._fd is not None:
            if _unlock(self._fd) and self._room is not None:
                with _HELD_GUARD:
                    _LEASED_BYTES[self._room[0]] -= self._room[1]
            self._fd = None

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: object) -> None:
        self.release()

    def superseded(self) -> bool:
        """Whether a better place to read the file from is there now (a copy of a file leased in
        place while it was copied): its reader then closes it and leases it again."""
        return False


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
        os.fsync(handle.fileno())  # the bytes we hashed are on disk before the rename publishes them
    return digest.hexdigest()


class ShardCache:
    """Whole files in `root`, at most `limit` bytes (None: as much as leaves FREE_SHARE_KEPT of its
    disk free), least recently used evicted first."""

    def __init__(self, root: str | os.PathLike[str], limit: int | str | None = None) -> None:
        self.root = Path(root).expanduser()
        self.limit = parse_size(limit)
        self.room_timeout = ROOM_TIMEOUT_S
        for sub in ("objects", "tmp", "locks"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        limit = "none" if self.limit is None else format_size(self.limit)
        return f"ShardCache({str(self.root)!r}, limit={limit})"

    def check_limit(self, largest: int) -> None:
        """Refuse a limit that cannot hold a few of the largest files: it could only stall."""
        if self.limit is not None and self.limit < MIN_CACHE_SHARDS * largest:
            raise ValueError(
                f"cache_limit {format_size(self.limit)} is too small: it must hold at least {MIN_CACHE_SHARDS} "
                f"of this dataset's largest shard ({format_size(largest)}), "
                f"{format_size(MIN_CACHE_SHARDS * largest)}"
            )

    def object_path(self, file: CachedFile) -> Path:
        return self.root / "objects" / (sha256_name(file.sha256) + Path(plain_name(file.name)).suffix)

    def _lock_path(self, file: CachedFile, kind: str) -> Path:
        return self.root / "locks" / f"{sha256_name(file.sha256)}.{kind}"

    def disk_bytes(self) -> int:
        """Bytes on disk now: published files plus partial downloads."""
        total = 0
        for sub in ("objects", "tmp"):
            for entry in os.scandir(self.root / sub):
                try:
                    total += entry.stat().st_size
                except FileNotFoundError:
                    continue
        return total

    def lease(self, file: CachedFile, fetcher: Fetcher, *, make_room: Callable[[], bool] | None = None,
              ahead: Ahead | None = None) -> Lease:
        """The local copy of `file`, downloaded and checked first if needed, held until released.

        `make_room()` is called when the cache is full of files others hold: it may release
        references of the caller's own and returns True if it did. `ahead`: see `Ahead`.
        """
        use = _lock(self._lock_path(file, "use"), exclusive=False)  # the reference, before anything else
        assert use is not None
        try:
            path = self.object_path(file)
            if not self._present(path, file):
                self._download(file, path, fetcher, make_room, ahead)
            os.utime(path)  # most recently used
        except BaseException:
            _unlock(use)
            raise
        return Lease(path, use, (self.root, file.bytes))

    def leased_here(self) -> int:
        """Bytes of this cache's files that this process holds leases on now."""
        return _LEASED_BYTES.get(self.root, 0)

    def has(self, file: CachedFile) -> bool:
        """Whether `file` is in the cache now (another reader may evict it unless a lease holds it)."""
        return self._present(self.object_path(file), file)

    def downloading(self, file: CachedFile) -> bool:
        """Whether a process of the node (this one included) downloads `file` into the cache now: holds
        its download lock. A part file a dead downloader left does not count; the next download removes it."""
        return _in_use(self._lock_path(file, "get"))

    @staticmethod
    def _present(path: Path, file: CachedFile) -> bool:
        try:
            return path.stat().st_size == file.bytes
        except FileNotFoundError:
            return False

    def _download(self, file: CachedFile, path: Path, fetcher: Fetcher, make_room: Callable[[], bool] | None,
                  ahead: Ahead | None) -> None:
        get_path = self._lock_path(file, "get")
        get = self._download_lock(file, get_path, make_room)  # one download per file per node; others wait here
        try:
            if self._present(path, file):
                return  # downloaded while we waited
            for stale in (self.root / "tmp").glob(f"{file.sha256}.*.part"):
                stale.unlink(missing_ok=True)  # a dead downloader's: we hold its lock now
            part = self._reserve(file, make_room, ahead)
            try:
                url = fetcher.url_of(file.name)
                for attempt in (1, 2):
                    digest = fetcher.fetch(file.name, part, file.bytes) or file_sha256(part)
                    if digest == file.sha256:
                        break
                    log.warning("%s: downloaded sha256 %s, index.json says %s (attempt %d of 2)", url, digest,
                                file.sha256, attempt)
                else:
                    raise DatasetError(f"{url}: sha256 {digest} on two downloads, index.json says {file.sha256}")
                os.replace(part, path)
                log.debug("%s: cached as %s", url, path)
            finally:
                part.unlink(missing_ok=True)
        finally:
            _remove_lock(get_path, get)

    def _download_lock(self, file: CachedFile, get_path: Path, make_room: Callable[[], bool] | None) -> int:
        """The file's download lock, once no other process downloads it. While another's download of
        it waits for room (no part file yet), `make_room` gives back the caller's own leases, one per
        poll: that download may be waiting for exactly those (two map-style workers, one holding the
        cache full, the other downloading the file the first wants, waited on each other for good).
        Fails in one line once the download neither starts nor grows for `room_timeout`."""
        deadline = time.monotonic() + self.room_timeout
        landing_until = time.monotonic() + LANDING_WAIT_S
        parent = os.getppid()
        progress = -1
        while True:
            get = _lock(get_path, exclusive=True, wait=False)
            if get is not None:
                return get
            parts = self._part_sizes(file)
            landed = not parts and self._present(self.object_path(file), file)  # its lock not dropped yet
            if not parts and not landed and make_room is not None:
                make_room()
            if parts and max(parts) != progress:
                progress = max(parts)
                deadline = time.monotonic() + self.room_timeout
            self._check_wait(parent, deadline, f"another process's download of {file.name}"
                             + ("" if parts or landed else ", which waits for room"))
            time.sleep(LANDING_POLL_S if (parts or landed) and time.monotonic() < landing_until else ROOM_POLL_S)

    def _part_sizes(self, file: CachedFile) -> list[int]:
        """The bytes so far of each download of `file` under way (one, or a dead one's until removed)."""
        sizes = []
        for part in (self.root / "tmp").glob(f"{file.sha256}.*.part"):
            try:
                sizes.append(part.stat().st_size)
            except FileNotFoundError:
                continue
        return sizes

    def _check_wait(self, parent: int, deadline: float, waiting_for: str) -> None:
        """End a wait in one line: past its deadline, or in a DataLoader worker whose main process
        has ended (`end_waits_with_parent`), which would otherwise wait on after it, orphaned."""
        if _END_WITH_PARENT and os.getppid() != parent:
            raise DatasetError(f"{self.root}: stopped waiting for {waiting_for}: the main process has ended")
        if time.monotonic() > deadline:
            raise DatasetError(f"{self.root}: waited {self.room_timeout:.0f} s for {waiting_for}; "
                               f"{self._limit_words()}, {self.held()}")

    def _limit_words(self) -> str:
        if self.limit is not None:
            return f"cache_limit {format_size(self.limit)}"
        return f"no cache_limit: the disk kept {FREE_SHARE_KEPT:.0%} free (at least {format_size(FREE_BYTES_KEPT)})"

    def held(self) -> str:
        """What the cache holds now, in words: files leased by readers (any process), unleased
        files, downloads under way."""
        leased, leased_bytes, idle, idle_bytes = 0, 0, 0, 0
        for path, size, _ in self._objects():
            if _in_use(self.root / "locks" / f"{path.name.split('.', 1)[0]}.use"):
                leased, leased_bytes = leased + 1, leased_bytes + size
            else:
                idle, idle_bytes = idle + 1, idle_bytes + size
        downloads = sum(1 for entry in os.scandir(self.root / "tmp") if _PART.fullmatch(entry.name))
        return (f"files held by readers: {leased} ({format_size(leased_bytes)}), not held: {idle} "
                f"({format_size(idle_bytes)}), downloads under way: {downloads}")

    def room(self) -> int:
        """Bytes the cache may hold or promise (downloads under way count at their full size):
        `limit`, or with none, what leaves FREE_SHARE_KEPT (at least FREE_BYTES_KEPT) of its disk
        free once they are all written."""
        if self.limit is not None:
            return self.limit
        total, free = disk_space(self.root)
        return self.disk_bytes() + free - max(FREE_BYTES_KEPT, int(FREE_SHARE_KEPT * total))

    def _reserve(self, file: CachedFile, make_room: Callable[[], bool] | None, ahead: Ahead | None) -> Path:
        """Create the download's part file once the cache has room for the whole file."""
        if self.limit is not None and file.bytes > self.limit:
            raise DatasetError(f"{file.name}: {format_size(file.bytes)} does not fit in cache_limit "
                               f"{format_size(self.limit)} of {self.root}")
        deadline = time.monotonic() + self.room_timeout
        parent = os.getppid()
        waiting = False
        wanted = file.bytes + (ahead.headroom if ahead is not None else 0)
        while True:
            with self._cache_lock():
                used = self._used()
                room = self.room()
                if used + wanted <= room or \
                        self._evict(used + wanted - room, before=ahead.since if ahead is not None else None):
                    part = self.root / "tmp" / f"{file.sha256}.{file.bytes}.{os.getpid()}.{secrets.token_hex(4)}.part"
                    part.touch()
                    if waiting:
                        log.info("%s: room for %s after waiting", self.root, file.name)
                    return part
            if ahead is not None:
                raise NoRoom(file.name)
            if make_room is not None and make_room():
                continue
            self._check_wait(parent, deadline, f"room for {file.name} ({format_size(file.bytes)})")
            if not waiting:
                log.info("%s: cache full (%s), waiting for readers to release shards", self.root, self._limit_words())
                waiting = True
            time.sleep(ROOM_POLL_S)

    def _cache_lock(self) -> _Held:
        return _Held(self.root / "locks" / "cache.lock")

    def _used(self) -> int:
        """Bytes the cache holds or has promised: published files plus the full size of each live
        download. Downloads whose process died (their lock is free) are deleted here."""
        used = 0
        for entry in os.scandir(self.root / "tmp"):
            match = _PART.fullmatch(entry.name)
            if match is None:
                continue  # not a download of ours
            sha, size = match.group(1), int(match.group(2))
            get_path = self.root / "locks" / f"{sha}.get"
            get = _lock(get_path, exclusive=True, wait=False)
            if get is None:
                used += size
                continue
            Path(entry.path).unlink(missing_ok=True)  # its downloader is gone: never trusted, never counted
            _remove_lock(get_path, get)
        for path, size, _ in self._objects():
            used += size
        return used

    def _objects(self) -> Iterator[tuple[Path, int, float]]:
        for entry in os.scandir(self.root / "objects"):
            try:
                stat = entry.stat()
            except FileNotFoundError:
                continue
            yield Path(entry.path), stat.st_size, stat.st_mtime

    def _evict(self, excess: int, before: float | None = None) -> bool:
        """Delete unused files, least recently used first (only those last used before `before`,
        where given), until `excess` bytes are gone; True if they are."""
        for path, size, used in sorted(self._objects(), key=lambda item: item[2]):
            if before is not None and used >= before:
                break
            use_path = self.root / "locks" / f"{path.name.split('.', 1)[0]}.use"
            use = _lock(use_path, exclusive=True, wait=False)
            if use is None:
                continue  # someone holds a reference
            path.unlink(missing_ok=True)
            _remove_lock(use_path, use)
            log.debug("%s: evicted %s (%d bytes)", self.root, path.name, size)
            excess -= size
            if excess <= 0:
                return True
        return False


class _Held:
    """An exclusive flock held for the length of a `with` block."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def __enter__(self) -> None:
        self._fd = _lock(self.path, exclusive=True)

    def __exit__(self, *exc: object) -> None:
        assert self._fd is not None
        _unlock(self._fd)
