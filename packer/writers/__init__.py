"""The one registry of formats: CLI commands and test parametrisation derive from it."""

from __future__ import annotations

from .base import Sample, ShardWriter
from .lmdb import LMDBWriter

WRITERS: dict[str, type[ShardWriter]] = {cls.format: cls for cls in (LMDBWriter,)}


def get_writer(name: str) -> type[ShardWriter]:
    for cls in WRITERS.values():
        if name == cls.format or name in cls.aliases:
            return cls
    raise KeyError(name)


__all__ = ["WRITERS", "Sample", "ShardWriter", "get_writer"]
