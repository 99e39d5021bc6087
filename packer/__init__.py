"""pack: turn folders of images into LMDB, HDF5 or WebDataset shards.

`packer.pack(src, out, format=..., **options)` is the `pack` command from Python, `packer.merge(out)`
`pack merge`, and `packer.pack_samples(fn, inputs, out, format=...)` packs samples made by code
(`packer.api`).
"""

from __future__ import annotations

from typing import Any

from .version import __version__

__all__ = ["PackError", "Summary", "__version__", "merge", "pack", "pack_samples"]


def __getattr__(name: str) -> Any:
    """The API, imported on first use: spawned shard workers import `packer.*` modules and need none of it."""
    if name in ("pack", "pack_samples", "merge"):
        from . import api

        return getattr(api, name)
    if name == "PackError":
        from .errors import PackError

        return PackError
    if name == "Summary":
        from .run.pipeline import Summary

        return Summary
    raise AttributeError(f"module 'packer' has no attribute {name!r}")
