"""Whether a folder is on networked storage, and how a dataset's shards there are read.

On NFS, Lustre, GPFS, SMB or a FUSE mount every open, stat and 128 KiB read is a round trip to a
server: reading samples in place pays one or more per sample, and a mapped file (LMDB) whose
server stops answering is a SIGBUS. A dataset there is read map-style as one in a bucket is: each
shard copied whole into the node-local cache (`readers/cache.py`) with large reads several at a
time, and read there (`MountFiles`; a wds shard, whose sample is one read, in place until its copy
lands). It is the default (`storage="auto"`). Imports no torch and no
fsspec; the packer asks `is_networked` about its SRC.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Callable, Iterator, Sequence

from .cache import Ahead, CachedFile, Lease, NoRoom, ShardCache
from .manifest import DatasetChanged, DatasetError, ShardInfo, plain_name
from .remote import LocalFiles

log = logging.getLogger(__name__)

STORAGE_CHOICES = ("auto", "local", "network")
"""`open_dataset(storage=...)`: "auto" asks the mount table; the others say so."""
DEFAULT_STORAGE = "auto"
"""On the local disk exactly "local"; on a mount, map-style reads from copies were as fast as in
place or faster at 0.2 and 1 ms (docs/netfs.md), and never map a file from the mount."""
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "beegfs", "afs",
    "pvfs2", "orangefs", "fuse", "davfs", "ncpfs", "panfs", "wekafs",
})
"""Filesystem types (as /proc/self/mountinfo names them) whose files live behind a network."""
LOCAL_FUSE = frozenset({"fuseblk", "fuse.lxcfs", "fuse.portal", "fuse.gvfsd-fuse"})
"""FUSE types backed by a local disk or the local machine; every other `fuse.*` counts as networked
(sshfs, s3fs, gcsfuse, rclone, juicefs, glusterfs...)."""
MOUNTINFO = Path("/proc/self/mountinfo")
COPY_CHUNK = 1 << 20
"""Bytes per read of a shard copied off a mount: a FUSE mount splits each into 128 KiB requests
sent together, NFS into rsize ones."""
COPIERS = 2
"""Files a process copies at once: two copies in flight kept a mount's link as busy as a reader
copying its own shard beside one copy ahead did, before reads went in place meanwhile."""
COPY_THREADS = 4
"""Reads of one shard in flight at once while it is copied: at 1 ms per round trip, 4 x 1 MiB
bring ~100-300 MB/s; through latencyfs, 8 shards of 16 MiB copied two at a time took as long as
one at a time (the server's CPU is the limit), so more in flight would only take the link."""

_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape(field: str) -> str:
    """A mountinfo path field: spaces, tabs, newlines and backslashes come octal-escaped (\\040)."""
    return _OCTAL.sub(lambda match: chr(int(match.group(1), 8)), field)


def parse_mountinfo(text: str) -> dict[str, str]:
    """Mount point -> filesystem type of a /proc/self/mountinfo text; a later mount on the same
    point hides an earlier one, as it does in the kernel."""
    mounts = {}
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            separator = fields.index("-", 6)  # after the optional fields
        except ValueError:
            continue
        mounts[unescape(fields[4])] = fields[separator + 1]
    return mounts


def filesystem_type(path: str | os.PathLike[str], mounts: dict[str, str] | None = None) -> str:
    """The type of the filesystem holding `path` (symlinks resolved): that of the longest mount
    point above it; "" where the mount table cannot be read."""
    if mounts is None:
        try:
            mounts = parse_mountinfo(MOUNTINFO.read_text())
        except OSError:
            return ""
    resolved = os.path.realpath(path)
    best = ""
    for point in mounts:
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best = point
    return mounts.get(best, "")


def is_network_type(fstype: str) -> bool:
    if fstype in LOCAL_FUSE:
        return False
    return fstype in NETWORK_FILESYSTEMS or fstype.split(".", 1)[0] in NETWORK_FILESYSTEMS


def check_storage(storage: str) -> None:
    if storage not in STORAGE_CHOICES:
        raise ValueError(f"storage={storage!r}: expected one of {', '.join(STORAGE_CHOICES)}")


def is_networked(path: str | os.PathLike[str]) -> tuple[bool, str]:
    """Whether the folder `path` is on networked storage, by the mount table, and its filesystem
    type in words ("filesystem nfs4"): what the packer says of a SRC there."""
    return reads_as_network(path, "auto")


def reads_as_network(path: str | os.PathLike[str], storage: str) -> tuple[bool, str]:
    """Whether the dataset folder `path` is read as networked storage (shards copied into the cache)
    and why, in words for the log: the `storage` asked for, or the mount's type for "auto"."""
    if storage != "auto":
        return storage == "network", f"storage={storage!r}"
    fstype = filesystem_type(path)
    return is_network_type(fstype), f"filesystem {fstype or 'unknown'}"


class MountedStore:
    """The files of a dataset folder on a network mount, copied whole into the cache (a `Fetcher`):
    large reads, several in flight, so a shard costs a few round trips per megabyte, not per sample."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = str(root)

    def __repr__(self) -> str:
        return f"MountedStore({self.url!r})"

    def url_of(self, name: str) -> str:
        return str(self.root / plain_name(name))

    def fetch(self, name: str, dest: Path, size: int) -> str:
        """The whole file `name` into `dest` (overwritten), and its sha256; DatasetChanged when it is
        no longer the `size` bytes index.json gives it (packed again in place)."""
        source = self.url_of(name)
        try:
            fd = os.open(source, os.O_RDONLY)
        except OSError as exc:
            raise DatasetError(f"{source}: cannot open ({exc.strerror})") from None
        try:
            found = os.fstat(fd).st_size
            if found != size:
                raise DatasetChanged(f"{source}: {found} bytes, index.json says {size}; re-open the dataset")
            with open(dest, "wb") as out:
                out.truncate(size)
                digest = copy_ranges(fd, out.fileno(), size, source)
                os.fsync(out.fileno())  # on disk before the cache publishes it
        finally:
            os.close(fd)
        return digest


def copy_ranges(source: int, dest: int, size: int, name: str) -> str:
    """Copy `size` bytes between two descriptors in COPY_CHUNK pieces, COPY_THREADS at a time, and
    return their sha256, hashed in order as the pieces arrive (on another core than the reads')."""
    def piece(offset: int) -> bytes:
        want = min(COPY_CHUNK, size - offset)
        parts = []
        done = 0
        while done < want:
            data = os.pread(source, want - done, offset + done)
            if not data:
                raise DatasetChanged(f"{name}: ends at {offset + done} bytes, index.json says {size}")
            written = 0
            while written < len(data):  # a write may come up short: the digest is of the bytes read
                written += os.pwrite(dest, data[written:], offset + done + written)
            parts.append(data)
            done += len(data)
        return b"".join(parts)

    digest = hashlib.sha256()
    offsets = iter(range(0, size, COPY_CHUNK))
    try:
        with ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="pack-mount-copy-piece") as pool:
            window = deque(pool.submit(piece, offset) for offset in islice(offsets, 2 * COPY_THREADS))
            while window:
                digest.update(window.popleft().result())  # memory: at most 2 x COPY_THREADS pieces
                for offset in islice(offsets, 1):
                    window.append(pool.submit(piece, offset))
    except OSError as exc:
        raise DatasetError(f"{name}: read failed ({exc.strerror})") from None
    return digest.hexdigest()


class MountFiles:
    """A dataset folder on networked storage (a `remote.ShardFiles`). A file a reader opens to read
    samples here and there (map-style) is read from its copy in the node cache: in place, each
    sample is a round trip or more (an LMDB page fault, an HDF5 chunk), and an LMDB shard mapped
    from a mount whose server stops answering is a SIGBUS that kills the worker. The first lease
    of such a file copies it whole (`MountedStore`: large reads, several in flight) and waits for
    the copy; COPIERS threads per process then copy the dataset's other shards ahead, so that the
    next ones are there when a reader wants them (a shuffled epoch soon wants them all). Where a
    sample is one read (`in_place_until_copied`: wds), the reader does not wait: it reads in place
    (`InPlaceLease`) while those threads copy its file first, and moves to the copy once it lands;
    a shuffled batch touches a window of shards (32 by default), and waiting for their copies
    made the first batch wait for all of them. A file read front to back (`sequential`:
    streaming, iterating) is read in place, in large reads, and not copied: in place is as fast as
    a copy there; except where the format maps its files (`copy_streamed`: LMDB), whose shards
    streaming fetches ahead (`ahead`) are copied, and read from the copy."""

    def __init__(self, local: LocalFiles, cache: ShardCache, strategy: str, shards: Sequence[ShardInfo],
                 *, copy_streamed: bool = False, in_place_until_copied: bool = False) -> None:
        self.local = local
        self.root = local.root
        self.cache = cache
        self.store = MountedStore(local.root.resolve())
        self.strategy = strategy
        self.shards = list(shards)
        self._shard_names = {shard.name for shard in shards}
        self.copy_streamed = copy_streamed
        self.in_place_until_copied = in_place_until_copied
        self._since = time.time()
        self._reset()

    def _reset(self) -> None:
        """Copies ahead are this process's: a forked or unpickled reader starts its own."""
        self._pid = os.getpid()
        self._guard = threading.Lock()
        self._copiers = 0  # copy threads running
        self._copies_stopped = False  # a copy ahead found no room: from then on readers copy their own files
        self._copy_failed: set[str] = set()  # files whose copy ahead failed: their readers copy them, and hear why
        self._turn: Iterator[CachedFile] | None = None  # what they copy when no reader wants a file
        self._wanted: deque[CachedFile] = deque()  # files read in place here, to be copied first
        self._where: dict[str, Path] = {}  # file name -> where its latest lease here reads it
        self._sidecars: set[str] = set()  # the suffixes of the sidecars read map-style here: copied ahead too

    def __getstate__(self) -> dict[str, object]:
        return {key: value for key, value in self.__dict__.items()
                if key not in ("_pid", "_guard", "_copiers", "_copies_stopped", "_copy_failed", "_turn", "_wanted",
                               "_where", "_sidecars")}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._reset()

    def path(self, file: CachedFile) -> Path:
        """Where the latest lease taken here reads `file`: the copy, or the mount."""
        return self._where.get(file.name) or self.local.path(file)

    def present(self, file: CachedFile) -> bool:
        return not self.copy_streamed or self.cache.has(file)  # streaming reads in place, or copies

    def lease(self, file: CachedFile, *, make_room: Callable[[], bool] | None = None,
              ahead: Ahead | None = None, sequential: bool = False) -> Lease:
        if os.getpid() != self._pid:
            self._reset()
        map_style = ahead is None and not sequential  # samples here and there, not front to back
        cached = self.cache.has(file)
        if not map_style and not self.copy_streamed and not cached:
            lease: Lease = Lease(self.local.path(file))  # front to back in large reads: as fast as a copy
        else:
            if map_style and file.name not in self._shard_names:  # its reader reads the sidecars of this kind
                self._sidecars.add(Path(file.name).suffix)
            if not cached:
                self.local.check_unchanged(file.name, self.local.path(file))
            if map_style and not cached and self.in_place_until_copied and not self._reader_copies(file.name):
                lease = InPlaceLease(self.local.path(file), self.cache, file, self._reader_copies)
                self._copy_ahead(first=file)
            else:
                if map_style:
                    self._copy_ahead()  # beside this copy, not after it
                lease = self.cache.lease(file, self.store, make_room=make_room, ahead=ahead)
        self._where[file.name] = lease.path
        return lease

    def _reader_copies(self, name: str) -> bool:
        """Whether the reader of file `name` copies it itself (and waits), not reading it in place:
        once copies ahead stopped for room (the reader's own copy may evict what one ahead may not),
        or where the copy ahead of that file failed (the reader's copy then says why, in one line)."""
        return self._copies_stopped or name in self._copy_failed

    def _copy_ahead(self, first: CachedFile | None = None) -> None:
        """Start this process's COPIERS threads that copy the shards not in the cache yet, unless
        they run or copies ahead stopped; `first`: a file read in place now, which they copy next."""
        with self._guard:
            if self._copies_stopped:
                return
            if first is not None:
                self._wanted.append(first)
            if self._turn is None:
                self._turn = self._rotation()
            while self._copiers < COPIERS:
                self._copiers += 1
                threading.Thread(target=self._copy_shards, name="pack-mount-copy", daemon=True).start()

    def _rotation(self) -> Iterator[CachedFile]:
        """Each shard and the sidecars of the kinds its reader reads, in turn from the process's pid
        (two workers start apart)."""
        first = self._pid % max(1, len(self.shards))
        for shard in self.shards[first:] + self.shards[:first]:
            yield shard
            # asked after the shard's copy: by then its reader has read one
            yield from (sidecar for sidecar in shard.sidecars if Path(sidecar.name).suffix in self._sidecars)

    def _copy_shards(self) -> None:
        """The files read in place first, then the rotation's files not in the cache, copied as a
        file fetched ahead is: never taking room a reader waits for, and skipped while another
        process copies it. Copies ahead stop for good at the first without room, and readers then
        copy their own files; a failed copy is named in the log, and its reader copies it. Once
        every shard was tried the copiers end, and a file read in place later starts them again."""
        try:
            while True:
                with self._guard:
                    file = self._wanted.popleft() if self._wanted else next(self._turn, None) if self._turn else None
                if file is None:
                    return
                if not self._copy_one(file):
                    with self._guard:
                        self._copies_stopped = True
                        self._wanted.clear()  # their readers see `_reader_copies` at their next read
                    return
        finally:
            with self._guard:
                self._copiers -= 1
                if not self._copiers:
                    self._turn = None

    def _copy_one(self, file: CachedFile) -> bool:
        """Copy `file` ahead unless it is there or under way; False where the cache has no room, or
        the process is exiting (and the copies with it)."""
        if not threading.main_thread().is_alive():
            return False
        try:
            if self.cache.has(file) or self.cache.downloading(file):
                return True
            self.cache.lease(file, self.store, ahead=Ahead(headroom=file.bytes, since=self._since)).release()
        except NoRoom:
            return False
        except Exception as exc:  # noqa: BLE001 - in a thread of its own: the reader that needs it says why
            self._copy_failed.add(file.name)
            if threading.main_thread().is_alive():
                log.warning("%s: not copied ahead into the cache (%s)", self.local.path(file), exc)
        return True


LANDED_LOOK_S = 0.02
"""How often a reader reading a file in place looks whether its copy has landed: a stat."""


class InPlaceLease(Lease):
    """A file of a mount read in place while its copy into the cache is made: superseded once the
    copy is there, or once its reader is to copy it itself (`reader_copies`: the copy ahead failed,
    or copies ahead stopped), looked at most every LANDED_LOOK_S; its reader then reopens it."""

    provisional = True

    def __init__(self, path: Path, cache: ShardCache, file: CachedFile, reader_copies: Callable[[str], bool]) -> None:
        super().__init__(path)
        self._cache, self._file, self._reader_copies = cache, file, reader_copies
        self._next_look = time.monotonic() + LANDED_LOOK_S

    def superseded(self) -> bool:
        now = time.monotonic()
        if now < self._next_look:
            return False
        self._next_look = now + LANDED_LOOK_S
        return self._reader_copies(self._file.name) or self._cache.has(self._file)
