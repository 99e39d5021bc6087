"""The one registry of formats: CLI commands and test parametrisation derive from it."""

from __future__ import annotations

from .base import Sample, ShardWriter, sidecar_path
from .hdf5 import HDF5Writer
from .lmdb import LMDBWriter
from .webdataset import WebDatasetWriter

WRITERS: dict[str, type[ShardWriter]] = {cls.format: cls for cls in (LMDBWriter, HDF5Writer, WebDatasetWriter)}


def get_writer(name: str) -> type[ShardWriter]:
    for cls in WRITERS.values():
        if name == cls.format or name in cls.aliases:
            return cls
    raise KeyError(name)


__all__ = ["WRITERS", "Sample", "ShardWriter", "get_writer", "sidecar_path"]
