"""LMDB shards: one standalone environment per shard file, opened read-only in each process."""

from __future__ import annotations

import os
import weakref
from typing import Any

import lmdb

from .base import PackedDataset, Record
from .fields import parse_value
from .layouts.lmdb import field_key, is_record_key, parse_record
from .manifest import DatasetError

# A page fault in a mapping with readahead reads ~128 KiB around it. Records that big (JPEG
# photos) then cost one or two reads instead of a fault per 4 KiB page: about 3x faster cold
# random reads of 100 KB records in scripts/bench_read.py. Shards of smaller records keep it
# off, where read-around would mostly fetch neighbours nobody asked for.
READAHEAD_MIN_BYTES = 32 * 1024

# py-lmdb refuses to open one path twice in a process, so environments are shared per process,
# with the datasets that hold each: two datasets of one path (a mix of a dataset with itself, under
# two transforms) each close their own handle, and the environment closes with the last one's.
_ENVIRONMENTS: dict[str, lmdb.Environment] = {}
_HOLDERS: dict[str, weakref.WeakSet[Any]] = {}


def _close_inherited() -> None:
    """After fork the child must not reuse the parent's environments: close them, reopen lazily."""
    for env in _ENVIRONMENTS.values():
        env.close()
    _ENVIRONMENTS.clear()
    _HOLDERS.clear()


os.register_at_fork(after_in_child=_close_inherited)


def open_environment(path: str, holder: object, *, readahead: bool = False) -> lmdb.Environment:
    """The process's environment of the shard at `path`, opened on first use, held by `holder`
    (until it closes it, or is garbage)."""
    env = _ENVIRONMENTS.get(path)
    if env is None:
        try:
            env = lmdb.open(
                path,
                subdir=False,
                readonly=True,
                lock=False,
                readahead=readahead,
                meminit=False,
                max_readers=1024,
            )
        except lmdb.Error as exc:
            raise DatasetError(f"{path}: cannot open LMDB shard ({exc})") from None
        _ENVIRONMENTS[path] = env
    _HOLDERS.setdefault(path, weakref.WeakSet()).add(holder)
    return env


class LMDBDataset(PackedDataset):
    """Map-style dataset over LMDB shards (`readonly`, `lock=False`, readahead for large records)."""

    format = "lmdb"

    def _open(self, shard: int) -> lmdb.Environment:
        info = self.manifest.shards[shard]
        large = info.bytes >= READAHEAD_MIN_BYTES * max(1, info.num_samples)
        return open_environment(str(self.shard_path(shard)), self, readahead=large)

    def _close(self, handle: Any) -> None:
        path = handle.path()
        if _ENVIRONMENTS.get(path) is handle:
            holders = _HOLDERS[path]
            holders.discard(self)
            if holders:  # another dataset of this process reads it
                return
            del _ENVIRONMENTS[path], _HOLDERS[path]
        handle.close()

    def _read(self, shard: int, local: int) -> Record:
        env = self.handle(shard)
        with env.begin() as txn:
            key = self.manifest.sample_key(shard, local)
            value = txn.get(key.encode("ascii"))
            stored = [txn.get(field_key(key, spec.name)) for spec in self.wanted]
        if value is None:
            raise DatasetError(f"{self.shard_path(shard)}: sample {local} is missing")
        try:
            meta, payload = parse_record(value)
        except ValueError as exc:
            raise DatasetError(f"{self.shard_path(shard)}: sample {local} is damaged ({exc})") from None
        fields: dict[str, Any] = {}
        for spec, data in zip(self.wanted, stored):
            if data is None and not spec.optional:
                raise DatasetError(f"{self.shard_path(shard)}: sample {local} is damaged (no {spec.name!r} field)")
            fields[spec.name] = None if data is None else parse_value(spec, data)
        return meta, payload, fields

    def stored_samples(self, shard: int) -> int:
        with self.handle(shard).begin() as txn:
            if not self.manifest.fields:
                return int(txn.stat()["entries"])
            return sum(1 for key in txn.cursor().iternext(keys=True, values=False) if is_record_key(key))
