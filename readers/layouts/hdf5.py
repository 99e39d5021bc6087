"""HDF5 shards: the payload layouts a file's `layout` attribute names, and how names are stored.

A string column `<name>` holds UTF-8 text; a name that is not valid UTF-8 is stored there in a
readable stand-in form, with its exact bytes in `<name>_raw` and its position in `<name>_raw_index`.
"""

from __future__ import annotations

import os

LAYOUT_FLAT = "flat"  # payloads back to back in `images` (uint8), bounds in `offsets`
LAYOUT_FIXED = "fixed"  # raw pixels of one shape: `images` is (N, H, W, C) uint8
CODEC_WIDTH = 8  # bytes of the fixed-length ASCII `formats` column (a sample's codec)
RAW_SUFFIX = "_raw"
RAW_INDEX_SUFFIX = "_raw_index"


def encode_name(name: str) -> tuple[str, bytes | None]:
    """`name` as its UTF-8 column stores it, and its exact bytes when it is not valid UTF-8."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raw = os.fsencode(name)
        return raw.decode("utf-8", "backslashreplace"), raw
    return name, None


def parse_raw_name(raw: bytes) -> str:
    """The `os.fsdecode` form of a name's exact bytes, as the packer was given it."""
    return os.fsdecode(raw)
