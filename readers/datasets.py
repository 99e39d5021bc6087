"""The format -> dataset registry, and `open_dataset`, which dispatches on the manifest."""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from .base import PackedDataset
from .formats import ALIASES, FORMATS, Registry
from .manifest import DatasetError
from .mounts import DEFAULT_STORAGE
from .stores import ReadOptions, open_files

# Loaded on first use: opening an LMDB dataset never imports h5py.
DATASETS: Registry[type[PackedDataset]] = Registry({name: spec.dataset for name, spec in FORMATS.items()}, ALIASES)


def open_dataset(
    path: str | os.PathLike[str],
    *,
    decode: str = "pil",
    fields: Sequence[str] = ("image", "label"),
    transform: Callable[[Any], Any] | None = None,
    target_transform: Callable[[Any], Any] | None = None,
    on_error: str = "fail",
    decode_size: tuple[int, int] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    storage_options: dict[str, Any] | None = None,
    storage: str = DEFAULT_STORAGE,
) -> PackedDataset:
    """Open a packed dataset, a directory or any fsspec URL; the format is read from its `index.json`.

    A URL (`s3://`, `gs://`, `https://`, ...; `file://` and plain paths are read in place) is
    read through a local cache: `index.json` first, then each shard downloaded whole when first
    needed and checked against the manifest's sha256. `cache_dir` defaults to $PACK_CACHE_DIR,
    else a folder per dataset under ~/.cache/pack; `cache_limit` (bytes or "200GB"; None: what
    leaves 5% of its disk free) caps it, evicting the least recently used shards no reader holds. `storage_options`
    go to fsspec (endpoint, credentials, anon=True), as do fsspec's config and the environment.

    `storage` says where a directory is: "auto" (the default) asks the mount table: NFS, Lustre,
    GPFS, SMB, 9p, FUSE and the like are read as "network", any other folder as "local". "local"
    reads it in place; "network" copies each shard whole into the cache when a map-style reader
    first needs it (and the other shards ahead, two at a time per process) and reads the copy (a
    wds shard, whose sample is one read, is read in place until its copy lands; LMDB and HDF5
    wait for it). Streaming reads in place, front to back in large reads, but an LMDB shard,
    which is read through mmap, from its copy. docs/netfs.md has the figures.

    `on_error="fail"` raises `DatasetError` on a damaged sample; `"skip"` stands the next readable
    sample in for it and counts it in `dataset.skipped` (per process). The words are those of
    `pack --on-error`; the former `"raise"` still works, with a DeprecationWarning.

    `decode_size=(H, W)` decodes images straight to about that size (JPEG DCT scaling, a
    power-of-two reduction) when the training transform resizes or crops small anyway.
    """
    files, manifest = open_files(path, ReadOptions(cache_dir, cache_limit, storage_options, storage))
    try:
        cls = DATASETS[manifest.format]
    except KeyError:
        raise DatasetError(f"{path}: unknown format {manifest.format!r} in index.json") from None
    dataset = cls(
        path,
        manifest=manifest,
        files=files,
        decode=decode,
        fields=fields,
        transform=transform,
        target_transform=target_transform,
        on_error=on_error,
        decode_size=decode_size,
    )
    if files.cache is not None:  # before anything is copied: the limit must hold a few shards
        files.cache.check_limit(dataset.largest_lease())
    return dataset

