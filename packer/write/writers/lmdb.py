"""LMDB shard writer: one `subdir=False` environment per shard, keys appended in order."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import lmdb

from readers.fields import FieldSpec
from readers.layouts.lmdb import encode_record, field_key

from .base import Sample, ShardWriter

log = logging.getLogger(__name__)

# Dirty pages of a write transaction live in memory until commit: commit in bounded batches.
COMMIT_BYTES = 16 << 20
MIN_MAP_SIZE = 64 << 20


class LMDBWriter(ShardWriter):
    format = "lmdb"
    write_errors = (lmdb.Error,)

    def __init__(self, path: Path, expected_bytes: int, classes: Sequence[str],
                 sample_shape: tuple[int, int, int] | None = None, fields: Sequence[FieldSpec] = ()) -> None:
        super().__init__(path, expected_bytes, classes, sample_shape, fields)
        self._field_names = sorted(spec.name for spec in self.fields)  # key order, for append
        self._map_size = max(MIN_MAP_SIZE, int(expected_bytes * 1.5))
        self._env = lmdb.open(
            str(path), subdir=False, map_size=self._map_size, lock=False, sync=False,
            metasync=False, readahead=False,
        )
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0

    def add(self, sample: Sample) -> None:
        value = encode_record(sample.record_meta(), sample.payload)
        self._pending.append((sample.key.encode("ascii"), value))
        self._pending_bytes += len(value)
        for name in self._field_names:
            data = sample.fields.get(name)
            if data is not None:
                self._pending.append((field_key(sample.key, name), data))
                self._pending_bytes += len(data)
        if self._pending_bytes >= COMMIT_BYTES:
            self._commit()

    def _commit(self) -> None:
        """Write the pending batch in one transaction, growing the map if it is full."""
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    cursor = txn.cursor()
                    for key, value in self._pending:
                        cursor.put(key, value, append=True)
                break
            except lmdb.MapFullError:
                self._map_size *= 2
                log.debug("%s: growing LMDB map to %d bytes", self.path, self._map_size)
                self._env.set_mapsize(self._map_size)
        self._pending = []
        self._pending_bytes = 0

    def close(self) -> None:
        if self._pending:
            self._commit()
        self._env.close()

    def abort(self) -> None:
        self._pending = []
        self._env.close()
