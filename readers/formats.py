"""The one table of formats: for each, its layout module, writer, dataset class, aliases and stream.

A fourth format is a layout (`readers/layouts/`), a writer (`packer/write/writers/`), a dataset
(`readers/`) and one row here. Everything is named by import path and loaded on first use:
this module imports no torch and never imports `packer` (only the packer resolves `writer`).
The packer's CLI commands and the tests' parametrisation derive from this table.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Format:
    name: str
    layout: str  # module: the format's constants and paired encode/parse functions (torch-free)
    writer: str  # "module:Class" of its packer.write.writers.ShardWriter
    dataset: str  # "module:Class" of its readers.base.PackedDataset
    extension: str  # of its shard files: `shard-NNNNNN<extension>`
    sidecars: tuple[str, ...] = ()  # extensions of the files beside each shard: `shard-NNNNNN<ext>`
    min_sample_bytes: int = 1
    """The fewest bytes a sample takes in a shard file: index.json's counts and sizes must agree
    with it (a wds sample is three members, each behind a 512-byte header)."""
    aliases: tuple[str, ...] = ()
    mapped: bool = False
    """Its dataset reads a shard file through mmap: on a network mount, only ever from a copy in
    the node cache (a server that stops answering would be a SIGBUS in the reader)."""
    sample_in_one_read: bool = False
    """A map-style sample is one read at an offset its shard's index gives: on a network mount it
    is then read in place until the shard's copy lands (HDF5 in place pays round trips for its
    metadata and columns, and waits for the copy)."""
    stream: str = ""
    """"module:Class" of what its dataset's `stream()` gives, where it has one (an IterableDataset
    in stored order, above the format in readers.streaming); named here so the format's module
    never imports the streaming loader."""


FORMATS: dict[str, Format] = {
    spec.name: spec
    for spec in (
        Format("lmdb", "readers.layouts.lmdb", "packer.write.writers.lmdb:LMDBWriter", "readers.lmdb:LMDBDataset",
               extension=".lmdb", min_sample_bytes=24,  # an LMDB node: 8 bytes, a key of 10+, a record of 8+
               mapped=True),
        Format("hdf5", "readers.layouts.hdf5", "packer.write.writers.hdf5:HDF5Writer", "readers.hdf5:HDF5Dataset",
               extension=".h5", min_sample_bytes=20),  # a label, a CRC-32 and a codec name per sample
        Format("wds", "readers.layouts.wds", "packer.write.writers.wds:WdsWriter", "readers.wds:WdsDataset",
               extension=".tar", sidecars=(".packidx", ".idx"), min_sample_bytes=3 * 512,
               aliases=("webdataset",), stream="readers.streaming:WdsStream", sample_in_one_read=True),
    )
}
ALIASES: dict[str, str] = {alias: spec.name for spec in FORMATS.values() for alias in spec.aliases}


def resolve(reference: str) -> Any:
    """Import "package.module:attribute" and return the attribute."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


class Registry(Mapping[str, T], Generic[T]):
    """Name (or alias) -> object, each named by "module:attribute" and imported when first asked.

    Iterating gives the names only, never the aliases.
    """

    def __init__(self, references: dict[str, str], aliases: Mapping[str, str] | None = None) -> None:
        self._references = references
        self.aliases = dict(aliases or {})

    def __getitem__(self, name: str) -> T:
        return resolve(self._references[self.aliases.get(name, name)])

    def __iter__(self) -> Iterator[str]:
        return iter(self._references)

    def __len__(self) -> int:
        return len(self._references)
