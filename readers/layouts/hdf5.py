"""HDF5 shards: the payload layouts a file's `layout` attribute names, and how names are stored.

The string column `paths` holds UTF-8 text; a name that is not valid UTF-8 is stored there in a
readable stand-in form, and exactly in the `paths_raw` attribute. Only per-sample datasets sit at
the root (Hugging Face's hdf5 builder reads every one as a column): the class names are the
`classes` attribute. Both attributes are JSON text, whose `\\udcXX` escapes keep `os.fsdecode`
names exact. Format version 1 kept both in datasets (`<name>_raw`, `<name>_raw_index`, `classes`).

Fields are datasets `fields/<name>`, one row per sample (so per-sample too: HF's builder reads the
group as one struct column), stored as `field_storage` says: a numeric column for numbers and
arrays of one shape, UTF-8 strings for text, and UTF-8 JSON strings (`null` for an absent value)
for everything else.
"""

from __future__ import annotations

import json
import os

from ..fields import FieldSpec

LAYOUT_FLAT = "flat"  # payloads back to back in `images` (uint8), bounds in `offsets`
LAYOUT_FIXED = "fixed"  # raw pixels of one shape: `images` is (N, H, W, C) uint8
CODEC_WIDTH = 8  # bytes of the fixed-length ASCII `formats` column (a sample's codec)
FIELDS_GROUP = "fields"
STORAGE_NUMERIC = "numeric"  # an (N, *shape) int64 / float64 / bool dataset
STORAGE_TEXT = "text"  # UTF-8 strings (`h5py.string_dtype("utf-8")`)
STORAGE_JSON = "json"  # UTF-8 strings, each a JSON document
NUMERIC_DTYPES = {"int": "int64", "float": "float64", "bool": "bool"}

CLASSES_ATTRIBUTE = "classes"
RAW_PATHS_ATTRIBUTE = "paths_raw"
V1_RAW_SUFFIX = "_raw"
V1_RAW_INDEX_SUFFIX = "_raw_index"


def field_dataset(name: str) -> str:
    return f"{FIELDS_GROUP}/{name}"


def field_storage(spec: FieldSpec) -> str:
    """How a field's dataset stores it: numbers and same-shape arrays natively, when always present."""
    if spec.optional:
        return STORAGE_JSON
    if spec.type in NUMERIC_DTYPES or (spec.type == "array" and spec.shape is not None):
        return STORAGE_NUMERIC
    return STORAGE_TEXT if spec.type == "str" else STORAGE_JSON


def numeric_layout(spec: FieldSpec) -> tuple[str, tuple[int, ...]]:
    """(dtype, row shape) of a field stored as STORAGE_NUMERIC."""
    if spec.type == "array":
        assert spec.dtype is not None and spec.shape is not None
        return spec.dtype, spec.shape
    return NUMERIC_DTYPES[spec.type], ()


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
