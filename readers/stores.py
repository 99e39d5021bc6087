"""Where a dataset is read from: the read side's table of stores, as `packer/stores` is the write side's.

Each store takes a dataset path it can read and opens its files (`remote.ShardFiles`) with the
manifest, read first: an fsspec URL through the cache, a folder on networked storage read in
place while each shard is copied into the cache (`mounts.MountFiles`), any other folder in place.
`open_files` asks them in order; the files say which was chosen and why (`ShardFiles.strategy`),
as `read_strategy` does without opening anything. `read_manifest` is how both packages read
index.json.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .cache import ShardCache
from .formats import FORMATS
from .manifest import MANIFEST_NAME, DatasetChanged, Manifest, check_shard_sizes, load_manifest
from .mounts import DEFAULT_STORAGE, MountFiles, check_storage, reads_as_network
from .remote import CachedFiles, LocalFiles, RemoteStore, ShardFiles, default_cache_dir, identity_or_none, is_url, \
    local_root

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadOptions:
    """`open_dataset`'s say in where and how a dataset is read."""

    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | str | None = None
    storage_options: dict[str, Any] | None = None
    storage: str = DEFAULT_STORAGE


def read_manifest(path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> Manifest:
    """index.json of a dataset folder or URL, checked: the one way both packages read it."""
    return RemoteStore(str(path), storage_options).manifest() if is_url(path) else load_manifest(local_root(path))


def open_url(path: str | os.PathLike[str], options: ReadOptions, strategy: str) -> tuple[ShardFiles, Manifest]:
    url = str(path)
    store = RemoteStore(url, options.storage_options)
    manifest = store.manifest()
    check_shard_sizes(manifest, store.listed_sizes(), store.url_of)
    cache = ShardCache(default_cache_dir(url) if options.cache_dir is None else options.cache_dir,
                       options.cache_limit)
    return CachedFiles(store, cache, strategy), manifest


def open_folder(path: str | os.PathLike[str], options: ReadOptions, strategy: str) -> tuple[ShardFiles, Manifest]:
    """In place; every file's identity noted, so a dataset packed again under the reader is refused."""
    local = LocalFiles(path, strategy)
    index = local.root / MANIFEST_NAME
    before = identity_or_none(index)
    manifest = load_manifest(local.root)
    check_shard_sizes(manifest, local.sizes(manifest), lambda name: str(local.root / name))
    if identity_or_none(index) != before:  # the shards' identities may be the new dataset's
        raise DatasetChanged(f"{index}: replaced while the dataset was opened; open it again")
    return local, manifest


def open_mount(path: str | os.PathLike[str], options: ReadOptions, strategy: str) -> tuple[ShardFiles, Manifest]:
    """As a folder, then each shard copied into the node cache, and read there map-style."""
    local, manifest = open_folder(path, options, strategy)
    cache = ShardCache(mount_cache(path, options), options.cache_limit)
    spec = FORMATS[manifest.format]
    return MountFiles(local, cache, strategy, manifest.shards, copy_streamed=spec.mapped,
                      in_place_until_copied=spec.sample_in_one_read), manifest


def mount_cache(path: str | os.PathLike[str], options: ReadOptions) -> Path:
    """The node cache a dataset folder on networked storage is copied into: `cache_dir`, else
    `default_cache_dir`'s folder for the folder's real path."""
    if options.cache_dir is not None:
        return Path(options.cache_dir).expanduser()
    return default_cache_dir(str(local_root(path).resolve()))


def takes_url(path: str | os.PathLike[str], options: ReadOptions) -> str | None:
    return "a URL" if is_url(path) else None


def networked_cache(path: str | os.PathLike[str], options: ReadOptions) -> Path | None:
    """The cache a networked folder would be copied into, where storage="auto" finds it on
    networked storage too (a home directory on NFS): a copy there would gain nothing."""
    if options.storage != "auto":
        return None
    cache = mount_cache(path, options)
    return cache if reads_as_network(cache, "auto")[0] else None


def takes_mount(path: str | os.PathLike[str], options: ReadOptions) -> str | None:
    network, why = reads_as_network(local_root(path), options.storage)
    return f"networked storage: {why}" if network and networked_cache(path, options) is None else None


def takes_folder(path: str | os.PathLike[str], options: ReadOptions) -> str | None:
    network, why = reads_as_network(local_root(path), options.storage)
    cache = networked_cache(path, options) if network else None
    return why if cache is None else f"networked storage: {why}, but so is the cache {cache}"


@dataclass(frozen=True)
class ReadStore:
    does: str
    """How it reads a dataset, in words."""
    takes: Callable[[str | os.PathLike[str], ReadOptions], str | None]
    """Why it reads the dataset at a path (in words), or None where it does not."""
    opens: Callable[[str | os.PathLike[str], ReadOptions, str], tuple[ShardFiles, Manifest]]
    """The files there, which say the strategy line they are given, and the manifest."""


READ_STORES: dict[str, ReadStore] = {
    "url": ReadStore("each shard downloaded whole into the node cache, then read there", takes_url, open_url),
    "mount": ReadStore("each shard copied whole into the node cache when first read map-style (the others "
                       "copied ahead), then read from the copy (wds read in place until its copy lands); streamed "
                       "in place (LMDB from copies)", takes_mount, open_mount),
    "folder": ReadStore("read in place", takes_folder, open_folder),  # takes every folder: last
}
"""Where a dataset can be read from, asked in order."""


def chosen_store(path: str | os.PathLike[str], options: ReadOptions) -> tuple[ReadStore, str]:
    """The store of READ_STORES that reads the dataset at `path`, and the line that says how and why."""
    check_storage(options.storage)
    for store in READ_STORES.values():
        why = store.takes(path, options)
        if why is not None:
            return store, f"{store.does} ({why})"
    raise AssertionError("the folder store takes every path")


def read_strategy(path: str | os.PathLike[str], options: ReadOptions = ReadOptions()) -> str:
    """How `open_dataset` with these options would read the dataset at `path`, and why, in one
    line (for `pack info`), without opening it."""
    return chosen_store(path, options)[1]


def open_files(path: str | os.PathLike[str], options: ReadOptions) -> tuple[ShardFiles, Manifest]:
    """The files of the dataset at `path` (a folder or URL) and its manifest, through the store of
    READ_STORES that takes it; the choice is logged (at INFO where a cache is involved)."""
    store, strategy = chosen_store(path, options)
    files, manifest = store.opens(path, options, strategy)
    if files.cache is None:
        log.debug("%s: %s", files.root, strategy)
    else:
        log.info("%s: %s; %d shards, %r", files.root, strategy, len(manifest.shards), files.cache)
    return files, manifest
