"""Format name (or alias) -> shard writer, from the one table of formats in `readers.formats`.

Writer modules are imported on first use, so a process packing LMDB never loads h5py (and
numpy): about 30 MB less in every shard worker.
"""

from __future__ import annotations

from readers.formats import ALIASES, FORMATS, Registry

from .base import Sample, ShardWriter, sidecar_path

WRITERS: Registry[type[ShardWriter]] = Registry({name: spec.writer for name, spec in FORMATS.items()}, ALIASES)


def get_writer(name: str) -> type[ShardWriter]:
    """The writer of a format name or alias; KeyError if there is none."""
    return WRITERS[name]


__all__ = ["WRITERS", "Sample", "ShardWriter", "get_writer", "sidecar_path"]
