"""SRC in an object store (`s3://bucket/raw-images/`, any fsspec URL): the folder walk's listing
from one recursive `find`, and the files of a run fetched with concurrent GETs.

The ImageFolder rules are the walk's (`sources.walk`): top-level folders are the classes, sorted;
a SRC without folders is flat and unlabelled; hidden entries and non-image files are skipped and
counted. Object stores have no empty folders, so a class without images does not exist there.
"""

from __future__ import annotations

import logging
import os
import threading
from array import array
from datetime import datetime
from typing import Any, Sequence

from readers.remote import UrlFilesystem

from ..errors import PackError
from .listing import UNLABELLED, Listing, ScanError, is_image_name

log = logging.getLogger(__name__)

_urls: dict[str, UrlFilesystem] = {}
_lock = threading.Lock()


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of `url` and its path there, made once per process (credentials and
    endpoints from fsspec's configuration and the environment)."""
    with _lock:
        return _urls.setdefault(url, UrlFilesystem(url)).filesystem()


def walk_url(url: str, *, folders_are_classes: bool = True, companions: frozenset[str] = frozenset(),
             times: bool = False) -> Listing:
    """The images under `url`, sorted by relative path, labelled by top-level folder (see `walk`;
    `times`: with the objects' modification times)."""
    url = url.rstrip("/")
    try:
        fs, base = filesystem(url)
        found = fs.find(base, detail=True)
    except ImportError as exc:
        raise ScanError(f"{url}: reading it needs its fsspec back end ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - each back end raises its own types
        raise ScanError(f"{url}: cannot list ({type(exc).__name__}: {exc})") from None
    files = sorted((name[len(base) + 1:], int(info.get("size") or 0), modified_ns(info))
                   for name, info in found.items() if info.get("type") != "directory" and name.startswith(base + "/"))
    if not files:
        raise ScanError(f"{url}: not a packed dataset (no index.json), a folder of images or a tar, .rec or "
                        ".tfrecord file: a URL SRC is one of those")
    hidden: set[str] = set()
    visible = []
    for rel, size, mtime in files:
        parts = rel.split("/")
        hidden_at = next((i for i, part in enumerate(parts) if part.startswith(".")), None)
        if hidden_at is None:
            visible.append((rel, parts, size, mtime))
        else:
            hidden.add("/".join(parts[: hidden_at + 1]))
    folders = sorted({parts[0] for _, parts, _, _ in visible if len(parts) > 1})
    classes = folders if folders_are_classes else []
    listing = Listing(root=url, classes=classes, mtimes=array("q") if times else None)
    listing.ignore(sorted(hidden), hidden=True)
    label_of = {name: label for label, name in enumerate(classes)}
    for rel, parts, size, mtime in visible:
        if classes and len(parts) == 1:  # a file beside the class folders
            if is_image_name(rel):
                listing.leave_out_unclassed([rel])
            else:
                listing.ignore([rel], hidden=False)
        elif not is_image_name(parts[-1]):
            if os.path.splitext(parts[-1])[1] not in companions:
                listing.ignore([rel], hidden=False)
        else:
            listing.paths.append(rel)
            listing.labels.append(label_of[parts[0]] if classes else UNLABELLED)
            listing.sizes.append(size)
            if listing.mtimes is not None:
                listing.mtimes.append(mtime)
            listing.newest_mtime = max(listing.newest_mtime, mtime)
    log.info("scanned %s: %d images in %d classes", url, len(listing), len(listing.classes))
    return listing


def modified_ns(info: dict[str, Any]) -> int:
    """An object's modification time (ns since the epoch) from fsspec's `info`: S3's LastModified
    (a datetime), or the `mtime` (seconds, or a datetime) local and other back ends give; 0 when
    the back end tells none, which then never counts as changed."""
    value = info.get("LastModified", info.get("mtime"))
    if isinstance(value, datetime):
        value = value.timestamp()
    return int(float(value) * 1e9) if isinstance(value, (int, float)) else 0


def fetch_files(url: str, paths: Sequence[str]) -> list[bytes | OSError]:
    """The files at `url/path` for each path, fetched with concurrent GETs (one batch), so a
    shard's inputs stream at the store's bandwidth rather than one latency per file. A file that
    is gone or refused is an OSError in its place; a store that cannot be reached stops the run."""
    fs, base = filesystem(url.rstrip("/"))
    keys = [f"{base}/{path}" for path in paths]
    try:
        found = fs.cat(keys, on_error="return")
    except Exception as exc:  # noqa: BLE001
        raise PackError(f"{url}: cannot read ({type(exc).__name__}: {exc}); finished shards are kept: "
                        "rerun the same command to resume") from None
    results: list[bytes | OSError] = []
    for key in keys:
        data = found.get(key)
        if isinstance(data, bytes):
            results.append(data)
        elif isinstance(data, OSError) and isinstance(data, (FileNotFoundError, PermissionError)):
            results.append(data)
        else:
            raise PackError(f"{url.rstrip('/')}/{key[len(base) + 1:]}: cannot read ({type(data).__name__}: {data}); "
                            "finished shards are kept: rerun the same command to resume")
    return results
