"""The interface every format's shard writer fills in; the pipeline owns the mechanics."""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar


@dataclass(frozen=True)
class Sample:
    """One accepted sample, numbered from 0 inside its shard."""

    local_index: int
    label: int
    path: str
    payload: bytes
    meta: dict[str, Any]
    extension: str

    def record_meta(self) -> dict[str, Any]:
        """Per-sample metadata; the CRC-32 of the payload lets readers and `verify` name a damaged sample."""
        return {"label": self.label, "path": self.path, **self.meta, "crc32": zlib.crc32(self.payload)}


class ShardWriter(ABC):
    """Writes one shard file at `path` (a temporary name; the pipeline renames it when done).

    Subclasses set `format` and `extension`, and implement `add` and `close`. `close` must leave
    the file complete and flushed to disk.
    """

    format: ClassVar[str]
    extension: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    # What the format's library raises when writing fails (a full disk, say), besides OSError.
    write_errors: ClassVar[tuple[type[Exception], ...]] = ()

    def __init__(self, path: Path, expected_bytes: int) -> None:
        self.path = path
        self.expected_bytes = expected_bytes

    @abstractmethod
    def add(self, sample: Sample) -> None: ...

    @abstractmethod
    def close(self) -> None: ...
