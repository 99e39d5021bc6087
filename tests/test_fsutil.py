"""Durable writes: what the pipeline publishes is synced, and hashed while it syncs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from packer.stores import fsutil


def test_sync_and_hash_syncs_every_file_and_hashes_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = fsutil.fsync_path
    monkeypatch.setattr(fsutil, "fsync_path", lambda path: (synced.append(path.name), real_fsync(path)))
    shard, sidecar = tmp_path / "shard", tmp_path / "shard.idx"
    shard.write_bytes(bytes(range(256)) * 5000)
    sidecar.write_bytes(b"index")
    assert fsutil.sync_and_hash([shard, sidecar], shard) == hashlib.sha256(shard.read_bytes()).hexdigest()
    assert synced == ["shard", "shard.idx"]


def test_sync_and_hash_reports_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        fsutil.sync_and_hash([tmp_path / "gone"], tmp_path / "gone")
