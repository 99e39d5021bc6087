"""A packed dataset as the inspection commands open it: a small temporary cache for a URL, and the
size of a stored image, each in one place for `info`, `show` and `verify` (the manifest is
`readers.stores.read_manifest`'s)."""

from __future__ import annotations

import io
import os
import tempfile
from contextlib import contextmanager
from typing import Any, Iterator

from PIL import Image

from readers.manifest import Manifest
from readers.remote import is_url

CACHED_SHARDS = 3


@contextmanager
def small_cache(out: str | os.PathLike[str], manifest: Manifest, command: str,
                **storage: Any) -> Iterator[dict[str, Any]]:
    """`open_dataset`'s remote options for `out`: for a URL, a temporary cache that holds
    CACHED_SHARDS of its largest shards (sidecars included), so a command reads shard by shard and
    never downloads the dataset whole; for a folder, none. `storage` goes with them (a URL's
    `storage_options`)."""
    if not is_url(out):
        yield {}
        return
    largest = max((shard.bytes + sum(s.bytes for s in shard.sidecars) for shard in manifest.shards), default=1)
    with tempfile.TemporaryDirectory(prefix=f"pack-{command}-") as cache_dir:
        yield {"cache_dir": cache_dir, "cache_limit": CACHED_SHARDS * max(largest, 1), **storage}


def stored_size(meta: dict[str, Any], payload: bytes | memoryview) -> tuple[int, int] | None:
    """(width, height) of a stored image from its meta or its header (no decode); None for a
    payload that is not an image (pack verify --full says which)."""
    if "shape" in meta:
        height, width = meta["shape"][:2]
        return int(width), int(height)
    try:
        with Image.open(io.BytesIO(payload)) as image:
            return image.size
    except (OSError, ValueError, Image.DecompressionBombError):
        return None
