"""The one registry of formats: CLI commands and test parametrisation derive from it.

Writer modules are imported on first use, so a process packing LMDB never loads h5py (and
numpy): about 30 MB less in every shard worker.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from .base import Sample, ShardWriter, sidecar_path


class WriterRegistry(Mapping[str, type[ShardWriter]]):
    """Format name (or alias) -> writer class, importing the class's module when first asked."""

    def __init__(self, classes: dict[str, str], aliases: dict[str, str]) -> None:
        self._classes = classes
        self.aliases = aliases

    def __getitem__(self, name: str) -> type[ShardWriter]:
        module, _, cls = self._classes[self.aliases.get(name, name)].partition(":")
        return getattr(importlib.import_module(module), cls)

    def __iter__(self) -> Iterator[str]:
        return iter(self._classes)

    def __len__(self) -> int:
        return len(self._classes)


WRITERS = WriterRegistry(
    {
        "lmdb": "packer.writers.lmdb:LMDBWriter",
        "hdf5": "packer.writers.hdf5:HDF5Writer",
        "wds": "packer.writers.webdataset:WebDatasetWriter",
    },
    aliases={"webdataset": "wds"},
)


def get_writer(name: str) -> type[ShardWriter]:
    """The writer of a format name or alias; KeyError if there is none."""
    return WRITERS[name]


__all__ = ["WRITERS", "Sample", "ShardWriter", "WriterRegistry", "get_writer", "sidecar_path"]
