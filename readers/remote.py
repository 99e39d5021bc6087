"""Where a dataset's files are: a local directory read in place, or an fsspec URL read through a cache.

`RemoteStore` talks to the store (fsspec, imported only for URLs): index.json, and whole files
downloaded with retries. `LocalFiles` and `CachedFiles` give the readers a local path for each
file of the manifest and a lease that keeps it there while it is read. Imports no torch.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
import time
from pathlib import Path
from stat import S_ISREG
from typing import Any, Callable, Protocol

from .cache import Ahead, CachedFile, Lease, ShardCache
from .manifest import (
    MANIFEST_NAME,
    DatasetChanged,
    DatasetError,
    Manifest,
    MissingFile,
    parse_manifest,
    plain_name,
)

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "PACK_CACHE_DIR"
DEFAULT_CACHE_HOME = "~/.cache/pack"
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "http"}
"""URL scheme -> the pip extra of pack that installs its fsspec back end."""


def is_url(path: str | os.PathLike[str]) -> bool:
    """True for a URL the readers fetch through the cache; plain paths and file:// are local.
    The one answer to "is this a URL" for readers and the packer (SRC, OUT, a plan's source)."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def location(path: str | os.PathLike[str]) -> Path | str:
    """A URL as the string it is (a Path would fold its `//`); anything else as a local Path."""
    return path if is_url(path) else local_root(path)  # type: ignore[return-value]


def local_root(path: str | os.PathLike[str]) -> Path:
    return Path(path[len("file://"):] if isinstance(path, str) and path.startswith("file://") else path)


def default_cache_dir(url: str) -> Path:
    """$PACK_CACHE_DIR, else one folder per dataset URL under ~/.cache/pack."""
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path(DEFAULT_CACHE_HOME).expanduser() / url_folder_name(url, 80, 12)


def url_folder_name(url: str, readable_chars: int, hash_chars: int) -> str:
    """A folder name for `url`: its tail, readable, plus a hash of the whole, so two URLs never share one."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", url.split("://", 1)[-1]).strip("_")[-readable_chars:]
    return f"{readable}-{hashlib.sha256(url.encode()).hexdigest()[:hash_chars]}"


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an fsspec back end's exception stands for, where it says."""
    if isinstance(exc, FileNotFoundError):
        return 404
    if isinstance(exc, PermissionError):
        return 403
    status = getattr(exc, "status", None)  # aiohttp.ClientResponseError
    return status if isinstance(status, int) else None


def permanent(status: int | None) -> bool:
    """Client errors other than timeouts and throttling will not change on a retry."""
    return status is not None and 400 <= status < 500 and status not in (408, 429)


_REASONS = {403: "access denied", 404: "not found"}
NO_CREDENTIALS = frozenset({"NoCredentialsError", "PartialCredentialsError"})
"""botocore's (and so s3fs's) errors for credentials that are not there: a retry finds none either."""


_KEPT_FILESYSTEMS: dict[int, Any] = {}
"""Every fsspec filesystem this process made, kept alive for good. A forked child (a DataLoader
worker) inherits them with the parent's event-loop poller (epoll) and its pooled connections: if
the child let one be collected, its finalizer would close those connections, and closing them
unregisters them from the poller it shares with the parent, whose next request on a pooled
connection would then wait forever for an answer that has arrived."""


class UrlFilesystem:
    """A URL and its fsspec storage options; the filesystem is made on first use in each process.

    Picklable: the filesystem is never shared across a fork (nor ever closed in a fork, see
    `_KEPT_FILESYSTEMS`), and storage options, which may hold credentials, are never logged.
    """

    purpose = "reading"

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self._fs: Any = None
        self._base = ""
        self._pid = 0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None}

    def filesystem(self) -> tuple[Any, str]:
        """The filesystem and the URL's path in it (no trailing slash); ImportError names the extra."""
        if self._fs is None or self._pid != os.getpid():
            scheme = self.url.split("://", 1)[0]
            try:
                from fsspec.core import url_to_fs

                self._fs, base = url_to_fs(self.url, **self.filesystem_options())
            except ImportError as exc:
                extra = EXTRAS.get(scheme)
                hint = f"pip install 'pack[{extra}]'" if extra else "install the fsspec back end for it"
                raise ImportError(f"{self.url}: {self.purpose} {scheme}:// needs {hint} ({exc})") from None
            _KEPT_FILESYSTEMS.setdefault(id(self._fs), self._fs)
            self._base = base.rstrip("/")
            self._pid = os.getpid()
        return self._fs, self._base

    def filesystem_options(self) -> dict[str, Any]:
        """The storage options the filesystem is made with."""
        return self.storage_options


def without_crc32_pass(storage_options: dict[str, Any]) -> dict[str, Any]:
    """s3 storage options that turn off botocore's CRC32 of each response (a second pass over every
    byte, 12% of a download's CPU on loopback: the cache hashes each file with index.json's
    sha256), merged with fsspec's config for s3; a checksum setting of the caller's or that config's
    is kept, as is a botocore too old to have the setting."""
    from botocore.config import Config
    from fsspec.config import conf

    configured = {**conf.get("s3", {}).get("config_kwargs", {}), **storage_options.get("config_kwargs", {})}
    if "response_checksum_validation" in configured or "response_checksum_validation" not in Config.OPTION_DEFAULTS:
        return storage_options
    return {**storage_options, "config_kwargs": {**configured, "response_checksum_validation": "when_required"}}


def listed_files(listed: list[dict[str, Any]]) -> dict[str, Any]:
    """File name -> size (None where the store gives none) of an fsspec `ls(detail=True)` listing."""
    return {entry["name"].rstrip("/").rsplit("/", 1)[-1]: entry.get("size") for entry in listed
            if entry.get("type") != "directory"}


class RemoteStore(UrlFilesystem):
    """The files of one dataset URL: index.json, and whole files downloaded with retries."""

    retries = 5
    backoff_s = 0.5
    max_backoff_s = 20.0

    def __repr__(self) -> str:
        return f"RemoteStore({self.url!r})"

    def filesystem_options(self) -> dict[str, Any]:
        if self.url.split("://", 1)[0] in ("s3", "s3a"):
            return without_crc32_pass(self.storage_options)
        return self.storage_options

    def url_of(self, name: str) -> str:
        return f"{self.url}/{plain_name(name)}"

    def manifest(self) -> Manifest:
        """index.json, checked; MissingFile where the store has none. Read with the store's own
        options, its back end's checksum included (`without_crc32_pass` drops it for the files
        the cache checks against index.json's sha256: index.json itself has none)."""
        fs, base = UrlFilesystem(self.url, self.storage_options).filesystem()
        text = self._retry(self.url_of(MANIFEST_NAME), lambda: fs.cat_file(f"{base}/{MANIFEST_NAME}"))
        return parse_manifest(text, self.url_of(MANIFEST_NAME))

    def listed_sizes(self) -> dict[str, int]:
        """File name -> size of what an object store lists under the URL (one request per 1,000
        files); nothing for HTTP, whose servers rarely list and never alike."""
        if self.url.split("://", 1)[0] in ("http", "https"):
            return {}
        fs, base = self.filesystem()
        try:
            listed = self._retry(self.url, lambda: fs.ls(base, detail=True))
        except MissingFile:
            return {}
        return {name: size for name, size in listed_files(listed).items() if isinstance(size, int)}

    def fetch(self, name: str, dest: Path, size: int) -> None:
        """The whole file `name` into `dest` (overwritten), retried on transient errors; a
        DatasetError as soon as the store sends more than the `size` index.json gives it (a server
        that lies, or never stops, would fill the disk)."""
        from fsspec.callbacks import Callback

        url = self.url_of(name)

        class AtMost(Callback):
            def set_size(self, total: int | None) -> None:
                if total is not None and total > size:
                    raise DatasetError(f"{url}: the store sends {total} bytes, index.json says {size}")
                super().set_size(total)

            def relative_update(self, inc: int = 1) -> None:
                super().relative_update(inc)
                if self.value > size:
                    raise DatasetError(f"{url}: the store sends more than the {size} bytes index.json says")

        fs, base = self.filesystem()
        self._retry(url, lambda: fs.get_file(f"{base}/{plain_name(name)}", str(dest), callback=AtMost()))

    def _retry(self, url: str, call: Callable[[], Any]) -> Any:
        for attempt in range(self.retries + 1):
            try:
                return call()
            except DatasetError:
                raise  # said by us: no retry changes it
            except Exception as exc:  # noqa: BLE001 - each back end raises its own types; the status decides
                if NO_CREDENTIALS & {kind.__name__ for kind in type(exc).__mro__}:
                    raise DatasetError(f"{url}: no credentials ({exc})") from None
                status = http_status(exc)
                if permanent(status):
                    reason = _REASONS.get(status, "refused")  # type: ignore[arg-type]
                    kind = MissingFile if status == 404 else DatasetError
                    raise kind(f"{url}: {reason} (HTTP {status})") from None
                if attempt == self.retries:
                    raise DatasetError(f"{url}: failed {attempt + 1} times, last: {type(exc).__name__}: {exc}") from None
                delay = min(self.max_backoff_s, self.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)
                log.warning("%s: %s: %s; retry %d of %d in %.1f s", url, type(exc).__name__, exc, attempt + 1,
                            self.retries, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")


class ShardFiles(Protocol):
    """Where the readers find a dataset's files: `path` of each, valid while a `lease` on it is held;
    `present`: whether a lease would find it without fetching it (now). Made by a store of
    `readers.stores.READ_STORES`."""

    root: str | Path
    strategy: str
    """How the files are read, and why, in one line (logged; `pack info` and `pack bench` say it)."""

    @property
    def cache(self) -> ShardCache | None:
        """The node cache the files are copied into; None where they are read in place."""

    def path(self, file: CachedFile) -> Path: ...
    def present(self, file: CachedFile) -> bool: ...
    def lease(self, file: CachedFile, *, make_room: Callable[[], bool] | None = None,
              ahead: Ahead | None = None, sequential: bool = False) -> Lease:
        """`sequential`: the reader reads the file front to back (streaming), in large reads,
        which on a mount are as fast in place as from a copy."""


FileIdentity = tuple[int, int, int, int]
"""What tells a local file from its replacement: device, inode, size and mtime (ns)."""


def file_identity(stat: os.stat_result) -> FileIdentity:
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def identity_or_none(path: Path) -> FileIdentity | None:
    try:
        return file_identity(path.stat())
    except OSError:
        return None


class LocalFiles:
    """A dataset in a local directory: files are read in place, leases hold nothing.

    Each file of the manifest is known by its identity when the dataset was opened (`sizes`);
    a lease on one that is another file since (the dataset packed again in place under a running
    loader) is a DatasetChanged, so a loader never reads the new files with the old manifest. One
    stat per shard opened; the samples read cost nothing more.
    """

    cache: ShardCache | None = None

    def __init__(self, root: str | os.PathLike[str], strategy: str = "read in place") -> None:
        self.root = local_root(root)
        self.strategy = strategy
        self.opened: dict[str, FileIdentity] = {}

    def path(self, file: CachedFile) -> Path:
        return self.root / plain_name(file.name)

    def sizes(self, manifest: Manifest) -> dict[str, int]:
        """The size of each shard file there is, each file's identity noted; DatasetError for one
        that is not a regular file (a FIFO would block the reader that opens it)."""
        sizes = {}
        for shard in manifest.shards:
            for file in (shard, *shard.sidecars):
                path = self.path(file)
                try:
                    stat = path.stat()
                except OSError:
                    continue  # missing: reading it says so, and `pack verify` lists it
                if not S_ISREG(stat.st_mode):
                    raise DatasetError(f"{path}: not a regular file")
                self.opened[file.name] = file_identity(stat)
            if shard.name in self.opened:
                sizes[shard.name] = self.opened[shard.name][2]
        return sizes

    def present(self, file: CachedFile) -> bool:
        return True  # read in place: nothing to fetch

    def lease(self, file: CachedFile, *, make_room: Callable[[], bool] | None = None,
              ahead: Ahead | None = None, sequential: bool = False) -> Lease:
        path = self.path(file)
        self.check_unchanged(file.name, path)
        return Lease(path)

    def check_unchanged(self, name: str, path: Path) -> None:
        """DatasetChanged if the file `name` is not the one found when the dataset was opened."""
        known = self.opened.get(name)
        if known is None:
            return
        try:
            now: FileIdentity | None = file_identity(path.stat())
        except FileNotFoundError:
            now = None
        except OSError:
            return  # unreadable: opening it says why
        if now != known:
            change = ("removed" if now is None else f"size {known[2]} -> {now[2]}" if now[2] != known[2]
                      else "same size, rewritten")
            raise DatasetChanged(f"{path}: changed since the loader opened {MANIFEST_NAME} ({change}); "
                                 "re-open the dataset")


class CachedFiles:
    """A dataset at a URL: each file is downloaded whole into the cache when first leased."""

    def __init__(self, store: RemoteStore, cache: ShardCache, strategy: str) -> None:
        self.store = store
        self.cache = cache
        self.root = store.url
        self.strategy = strategy

    def path(self, file: CachedFile) -> Path:
        return self.cache.object_path(file)

    def present(self, file: CachedFile) -> bool:
        return self.cache.has(file)

    def lease(self, file: CachedFile, *, make_room: Callable[[], bool] | None = None,
              ahead: Ahead | None = None, sequential: bool = False) -> Lease:
        return self.cache.lease(file, self.store, make_room=make_room, ahead=ahead)
