"""Durable file operations: what is renamed into place is complete and on disk."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def fsync_path(path: Path) -> None:
    """fsync a file, or a directory so that renames inside it are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary sibling, fsync, then rename over `path`."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def publish(tmp: Path, final: Path) -> None:
    """Move a finished, synced file into place atomically."""
    fsync_path(tmp)
    os.replace(tmp, final)
    fsync_path(final.parent)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
