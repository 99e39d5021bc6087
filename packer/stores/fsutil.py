"""Durable file operations: what is renamed into place is complete and on disk."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


def fsync_path(path: Path) -> None:
    """fsync a file, or a directory so that renames inside it are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary sibling, fsync, then rename over `path`; no leftover if that fails."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def sync_and_hash(paths: list[Path], to_hash: Path) -> str:
    """fsync `paths` and, meanwhile, compute the sha256 of `to_hash` in a thread.

    Hashing a finished 1 GB shard is ~0.5 s of CPU and its fsync ~0.4 s of waiting on the disk:
    side by side, a shard that cannot be hashed while it is written costs one of them, not both.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pack-hash") as pool:
        digest = pool.submit(sha256_file, to_hash)
        for path in paths:
            fsync_path(path)
        return digest.result()


def publish(tmp: Path, final: Path) -> None:
    """Move a finished, synced file into place atomically."""
    fsync_path(tmp)
    os.replace(tmp, final)
    fsync_path(final.parent)


def sha256_file(path: Path) -> str:
    return hash_file(path, hashlib.sha256()).hexdigest()


def hash_file(path: Path, digest: Any) -> Any:
    """`digest` (a hashlib object) updated with the file's bytes, read 1 MiB at a time."""
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged process may still write on `path`'s filesystem; None where it reports no size."""
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize if stats.f_blocks else None


def glibc() -> ctypes.CDLL | None:
    """The C library where it is glibc (malloc_trim and mallopt are glibc's); None elsewhere."""
    name = ctypes.util.find_library("c")
    library = ctypes.CDLL(name) if name else None
    return library if library is not None and hasattr(library, "malloc_trim") else None


def release_freed_memory() -> None:
    """Hand the heap that planning used and freed back to the OS (glibc keeps it otherwise), so the
    parent holds only the plan while its shard workers run: their peaks add up with its RSS."""
    gc.collect()
    library = glibc()
    if library is not None:
        library.malloc_trim(0)


M_ARENA_MAX = -8  # glibc's malloc.h


def limit_malloc_arenas(count: int = 2) -> None:
    """Threads this process starts from now on share `count` malloc arenas, as the shard workers'
    do (MALLOC_ARENA_MAX): the scan's and the uploads' threads would otherwise each keep an arena
    of freed blocks (the parent of a pack of 20 tar shards held 2 MB more). Left alone where the
    user set MALLOC_ARENA_MAX."""
    library = glibc()
    if library is not None and "MALLOC_ARENA_MAX" not in os.environ:
        library.mallopt(M_ARENA_MAX, count)
