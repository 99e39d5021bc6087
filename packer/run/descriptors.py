"""Files other loaders look for beside the shards, so each opens a pack output with no code of ours.

`merge` writes them before index.json (which stays last) and lists each in its `descriptors`
with size and sha256, so `pack verify` covers them. docs/FORMAT.md "Loader descriptors" says
what each holds:

    _info.json   timm's `wds/` reader: splits with their shards and sample counts   (wds)
    wids.json    wids' ShardListDataset: the shard list                              (wds)
    README.md    a Hugging Face dataset card whose YAML header says which files form
                 the split and types every column: the image, the label (ClassLabel with
                 names), pack's meta and each field (wds; hdf5 fixed layout)
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from readers.fields import FieldSpec
from readers.layouts.hdf5 import FIELDS_GROUP, STORAGE_NUMERIC, field_storage, numeric_layout
from readers.layouts.wds import LABEL_EXTENSION, META_EXTENSION, PIXELS_EXTENSION, field_extension
from readers.manifest import CARD_NAME, TIMM_INFO_NAME, WIDS_NAME, FileInfo, Manifest

from ..stores.fsutil import atomic_write_text

DEFAULT_SPLIT = "train"
PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# The record meta of every sample (FORMAT.md "Per-sample record"): the `.pack.json` member's HF type.
META_FEATURES: dict[str, Any] = {"label": "int64", "path": "string", "format": "string", "crc32": "int64"}
DECODED_META_FEATURES: dict[str, Any] = {"shape": {"list": "int64"}, "mode": "string"}
# A field's value as HF types it (readers/fields.py types; `array` below, `json` is HF's Json).
FIELD_VALUE_FEATURES = {"str": "string", "int": "int64", "float": "float64", "bool": "bool", "json": "json"}


def timm_info(manifest: Manifest, split: str) -> dict[str, Any]:
    return {"splits": {split: {
        "name": split,
        "num_samples": manifest.num_samples,
        "filenames": [shard.name for shard in manifest.shards],
        "shard_lengths": [shard.num_samples for shard in manifest.shards],
    }}}


def wids_descriptor(manifest: Manifest, split: str) -> dict[str, Any]:
    """wids resolves each `url` against the descriptor's own folder."""
    return {"wids_version": 1, "name": split,
            "shardlist": [{"url": shard.name, "nsamples": shard.num_samples} for shard in manifest.shards]}


def label_type(classes: list[str]) -> dict[str, Any] | str:
    """A ClassLabel carrying the class names; plain integers when there are none (a flat folder,
    or metadata with integer labels and no --classes), which a ClassLabel of no names would refuse."""
    if not classes:
        return "int64"
    return {"class_label": {"names": {str(index): name for index, name in enumerate(classes)}}}


def wds_features(manifest: Manifest, image_extensions: list[str], pixel_shape: tuple[int, ...] | None) -> list[dict[str, Any]]:
    """One column per member extension (HF's webdataset builder names a column by everything
    after the member name's first dot, and decodes `.txt` to text and `.json` to JSON): each
    image extension present, the label, each field (`txt`, `caption.txt`, `json`, ...), the
    meta (`pack.json`), and the builder's `__key__` and `__url__`."""
    images = [{"name": extension, "dtype": "image"} if extension != PIXELS_EXTENSION else
              {"name": extension, **pixels_feature(pixel_shape)} for extension in image_extensions]
    meta = dict(META_FEATURES, **(DECODED_META_FEATURES if manifest.store != "original" else {}))
    if manifest.store == "raw":
        meta["dtype"] = "string"
    fields = [{"name": field_extension(spec), **field_feature(spec)} for spec in manifest.fields]
    return [*images, {"name": LABEL_EXTENSION, "dtype": label_type(manifest.classes)}, *fields,
            {"name": META_EXTENSION, "struct": [{"name": name, **typed(kind)} for name, kind in meta.items()]},
            {"name": "__key__", "dtype": "string"}, {"name": "__url__", "dtype": "string"}]


def field_feature(spec: FieldSpec) -> dict[str, Any]:
    """A field's column type for the values a wds member decodes to: a `str` field is text, JSON
    numbers are Values, an array of known rank nested lists of its dtype, anything else Json."""
    if spec.type == "array":
        if spec.shape is None or spec.dtype is None:
            return {"dtype": "json"}
        nested: Any = spec.dtype
        for _ in spec.shape:
            nested = {"list": nested}
        return nested
    return {"dtype": FIELD_VALUE_FEATURES[spec.type]}


def hdf5_field_feature(spec: FieldSpec) -> dict[str, Any]:
    """A field's type as HF's hdf5 builder reads its dataset `fields/<name>`: numeric datasets
    by their row shape (a Value, a fixed-length list, an ArrayND), string datasets as text (for
    JSON fields, the JSON document)."""
    if field_storage(spec) != STORAGE_NUMERIC:
        return {"dtype": "string"}
    dtype, row = numeric_layout(spec)
    if not row:
        return {"dtype": dtype}
    if len(row) == 1:
        return {"list": dtype, "length": row[0]}
    return {"dtype": {f"array{len(row)}_d": {"shape": list(row), "dtype": dtype}}}


def pixels_feature(shape: tuple[int, ...] | None) -> dict[str, Any]:
    """Raw pixels: a fixed (H, W, C) array when every sample has one shape, else nested lists."""
    if shape is not None:
        return {"dtype": {"array3_d": {"shape": list(shape), "dtype": "uint8"}}}
    return {"list": {"list": {"list": "uint8"}}}


def typed(kind: Any) -> dict[str, Any]:
    return {"dtype": kind} if isinstance(kind, str) else kind


def hdf5_features(manifest: Manifest, pixel_shape: tuple[int, ...]) -> list[dict[str, Any]]:
    """The per-sample datasets of a fixed-layout HDF5 shard that a reader wants (FORMAT.md); the
    fields group is one struct column."""
    features = [{"name": "images", **pixels_feature(pixel_shape)},
                {"name": "labels", "dtype": label_type(manifest.classes)}, {"name": "paths", "dtype": "string"}]
    if manifest.fields:
        features.append({"name": FIELDS_GROUP,
                         "struct": [{"name": spec.name, **hdf5_field_feature(spec)} for spec in manifest.fields]})
    return features


def dataset_card(manifest: Manifest, split: str, data_files: str, features: list[dict[str, Any]]) -> str:
    header = {"configs": [{"config_name": "default", "data_files": [{"split": split, "path": data_files}]}],
              "dataset_info": {"features": features}}
    yaml = "\n".join(to_yaml(header))
    return (f"---\n{yaml}\n---\n\n# {split}: {manifest.num_samples} samples in "
            f"{len(manifest.shards)} {manifest.format} shards\n\nPacked by {manifest.tool_version} "
            f"(store `{manifest.store}`); `datasets.load_dataset(\"<this folder>\")` reads it. The "
            "files are described in index.json and pack's docs/FORMAT.md.\n")


def to_yaml(value: dict[str, Any] | list[Any], depth: int = 0) -> list[str]:
    """Block YAML lines for nested dicts and lists of strings and ints; values and keys other than
    identifiers are written as JSON, which YAML reads as double-quoted scalars ("0" stays a string)."""
    pad = "  " * depth
    lines: list[str] = []
    for key, item in value.items() if isinstance(value, dict) else ((None, item) for item in value):
        lead = f"{pad}{key if PLAIN_KEY.fullmatch(str(key)) else json.dumps(key)}:" if key is not None else f"{pad}-"
        if isinstance(item, (dict, list)) and item:
            nested = to_yaml(item, depth + 1)
            if key is None:  # "- " then the item's first line, the rest indented under it
                lines += [f"{lead} {nested[0].lstrip()}", *nested[1:]]
            else:
                lines += [lead, *nested]
        else:
            lines.append(f"{lead} {json.dumps(item)}")
    return lines


def descriptor_texts(manifest: Manifest, split: str, image_extensions: list[str],
                     pixel_shape: tuple[int, ...] | None) -> dict[str, str]:
    """name -> text of every descriptor the dataset's format gets. `pixel_shape` is the (H, W, C)
    of every sample when the options fix one (then HDF5 shards use the fixed layout)."""
    texts: dict[str, str] = {}
    if manifest.format == "wds":
        texts[TIMM_INFO_NAME] = json.dumps(timm_info(manifest, split), indent=2) + "\n"
        texts[WIDS_NAME] = json.dumps(wids_descriptor(manifest, split), indent=2) + "\n"
        texts[CARD_NAME] = dataset_card(manifest, split, "shard-*.tar",
                                        wds_features(manifest, image_extensions, pixel_shape))
    elif manifest.format == "hdf5" and pixel_shape is not None:
        texts[CARD_NAME] = dataset_card(manifest, split, "shard-*.h5", hdf5_features(manifest, pixel_shape))
    return texts


def write_descriptors(out: Path, texts: dict[str, str]) -> list[FileInfo]:
    """Write each descriptor atomically; their FileInfo for index.json."""
    written = []
    for name, text in texts.items():
        atomic_write_text(out / name, text)
        data = text.encode("utf-8")
        written.append(FileInfo(name=name, bytes=len(data), sha256=hashlib.sha256(data).hexdigest()))
    return written
