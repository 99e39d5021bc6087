"""Whether a dataset's folder is on networked storage, and how such a folder's shards are copied.

On NFS, Lustre, GPFS, SMB or a FUSE mount every open, stat and 128 KiB read is a round trip to a
server: reading samples in place pays one or more per sample. A dataset there is read like one in
a bucket instead: each shard copied whole into the node-local cache (`readers/cache.py`), with
large reads several at a time, and read from the copy. Imports no torch and no fsspec.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path

from .manifest import DatasetChanged, DatasetError, plain_name

STORAGE_CHOICES = ("auto", "local", "network")
"""`open_dataset(storage=...)`: "auto" asks the mount table; the others say so."""
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
COPY_THREADS = 16
"""Reads of one shard in flight at once: at 1 ms per round trip, 16 x 1 MiB keeps ~1 GB/s coming."""

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
            os.pwrite(dest, data, offset + done)
            parts.append(data)
            done += len(data)
        return b"".join(parts)

    digest = hashlib.sha256()
    offsets = iter(range(0, size, COPY_CHUNK))
    try:
        with ThreadPoolExecutor(COPY_THREADS) as pool:
            window = deque(pool.submit(piece, offset) for offset in islice(offsets, 2 * COPY_THREADS))
            while window:
                digest.update(window.popleft().result())  # memory: at most 2 x COPY_THREADS pieces
                for offset in islice(offsets, 1):
                    window.append(pool.submit(piece, offset))
    except OSError as exc:
        raise DatasetError(f"{name}: read failed ({exc.strerror})") from None
    return digest.hexdigest()
