"""Packing straight into an object store (moto's S3 on loopback through s3fs): the bucket ends up
holding exactly what a local pack of the same folder holds, and resume, the cluster flow, verify,
info and a remote SRC work there."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import S3_BUCKET

import readers
from packer.cli import main
from packer.pipeline import merge, pack
from packer.plan import PackOptions
from packer.remote_out import RemoteOut
from packer.writers import WRITERS

FIELDS = ("image", "label", "path", "index")


def s3fs_of(options: dict[str, Any]) -> Any:
    import s3fs

    return s3fs.S3FileSystem(**options, skip_instance_cache=True)


def bucket_files(options: dict[str, Any], prefix: str) -> dict[str, bytes]:
    """Every object under `prefix` (relative name -> bytes), the work folder left out."""
    fs = s3fs_of(options)
    keys = [key for key in fs.find(f"{S3_BUCKET}/{prefix}") if "/.pack/" not in key]
    return {key.split(f"{prefix}/", 1)[1]: fs.cat_file(key) for key in keys}


def local_files(out: Path) -> dict[str, bytes]:
    return {path.relative_to(out).as_posix(): path.read_bytes() for path in sorted(out.rglob("*"))
            if path.is_file() and ".pack" not in path.relative_to(out).parts}


def cli_env(options: dict[str, Any]) -> dict[str, str]:
    """The environment a `pack` subprocess finds the loopback S3 in (fsspec's own configuration)."""
    return {**os.environ, "FSSPEC_S3": json.dumps(options)}


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_remote_pack_equals_local_pack(fmt: str, image_folder: tuple[Path, dict[str, bytes]], s3_options: dict,
                                       tmp_path: Path) -> None:
    src, _ = image_folder
    pack(src, tmp_path / "local", PackOptions(format=fmt, shard_size=4), workers=1)
    url = f"s3://{S3_BUCKET}/equal-{fmt}"
    staging = tmp_path / "staging"
    summary = pack(src, url, PackOptions(format=fmt, shard_size=4), workers=2, staging=staging,
                   storage_options=s3_options)
    assert summary.published and summary.num_shards == 5
    assert bucket_files(s3_options, f"equal-{fmt}") == local_files(tmp_path / "local")
    assert not [path for path in staging.rglob("*") if path.is_file() and path.name.startswith("shard-")]
    remote = readers.open_dataset(url, decode="bytes", fields=FIELDS, cache_dir=tmp_path / "cache",
                                  storage_options=s3_options)
    local = readers.open_dataset(tmp_path / "local", decode="bytes", fields=FIELDS)
    assert list(remote) == list(local)
