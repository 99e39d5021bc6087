"""HDF5 shards: the payload layouts a file's `layout` attribute names, and how names are stored.

The string column `paths` holds UTF-8 text; a name that is not valid UTF-8 is stored there in a
readable stand-in form, and exactly in the `paths_raw` attribute. Only per-sample datasets sit at
the root (Hugging Face's hdf5 builder reads every one as a column): the class names are the
`classes` attribute. Both attributes are JSON text, whose `\\udcXX` escapes keep `os.fsdecode`
names exact. Format version 1 kept both in datasets (`<name>_raw`, `<name>_raw_index`, `classes`).
"""

from __future__ import annotations

import json
import os

LAYOUT_FLAT = "flat"  # payloads back to back in `images` (uint8), bounds in `offsets`
LAYOUT_FIXED = "fixed"  # raw pixels of one shape: `images` is (N, H, W, C) uint8
CODEC_WIDTH = 8  # bytes of the fixed-length ASCII `formats` column (a sample's codec)
CLASSES_ATTRIBUTE = "classes"
RAW_PATHS_ATTRIBUTE = "paths_raw"
V1_RAW_SUFFIX = "_raw"
V1_RAW_INDEX_SUFFIX = "_raw_index"


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


def encode_raw_names(names: dict[int, str]) -> str:
    """The `paths_raw` attribute: position -> exact name, for the names `encode_name` replaced."""
    return json.dumps({str(position): name for position, name in names.items()})


def parse_raw_names(text: str) -> dict[int, str]:
    return {int(position): name for position, name in json.loads(text).items()}
