"""Per-sample fields beyond image and label: their names, types and stored bytes (torch-free).

index.json lists every field with its type (`FieldSpec`); each format stores a field's value as
the bytes `encode_value` makes (UTF-8 text for `str`, JSON for every other type), except where
its layout keeps a column natively (HDF5 numeric columns). `parse_value` is the inverse, with
arrays back as numpy arrays. The packer and the readers both use this module.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

BUILTIN_FIELDS = ("image", "label", "path", "index")
FIELD_TYPES = ("str", "int", "float", "bool", "array", "json")
ARRAY_DTYPES = ("int64", "float64", "float32", "bool")
# Names a field cannot take: the built-in fields, what the wds layout uses for the image, label
# and record members (image extensions, `cls`, `pack`).
RESERVED_NAMES = frozenset({*BUILTIN_FIELDS, "cls", "pack", "jpg", "png", "gif", "bmp", "tif", "webp", "ppm", "raw", "npy"})
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]{0,63}")


@dataclass(frozen=True)
class FieldSpec:
    """One per-sample field as index.json names it.

    `array` fields are numeric lists: `dtype` one of ARRAY_DTYPES, `shape` the shape every sample
    shares, or None when shapes differ. `optional` fields may be absent from a sample (read as None).
    """

    name: str
    type: str
    optional: bool = False
    dtype: str | None = None
    shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.type not in FIELD_TYPES:
            raise ValueError(f"field {self.name!r}: unknown type {self.type!r} (one of {', '.join(FIELD_TYPES)})")
        if (self.type == "array") != (self.dtype is not None) or (self.dtype is not None and self.dtype not in ARRAY_DTYPES):
            raise ValueError(f"field {self.name!r}: dtype {self.dtype!r} does not fit type {self.type!r}")
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(int(side) for side in self.shape))

    @property
    def stackable(self) -> bool:
        """Whether every sample's value is a number or an array of one shape (a batch stacks them)."""
        return not self.optional and (self.type in ("int", "float", "bool") or
                                      (self.type == "array" and self.shape is not None))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["shape"] = None if self.shape is None else list(self.shape)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FieldSpec:
        shape = data.get("shape")
        return cls(name=str(data["name"]), type=str(data["type"]), optional=bool(data.get("optional", False)),
                   dtype=data.get("dtype"), shape=None if shape is None else tuple(shape))


def check_field_name(name: str) -> str | None:
    """Why `name` cannot name a field (it becomes a tar member extension and an HDF5 dataset), or None."""
    if not _NAME.fullmatch(name):
        return "a field name is 1-64 letters, digits or _, starting with a letter or digit"
    if name.lower() in RESERVED_NAMES:
        return f"reserved (taken by the image, label or record: {', '.join(sorted(RESERVED_NAMES))})"
    return None


def encode_value(spec: FieldSpec, value: Any) -> bytes:
    """A value's stored bytes: UTF-8 text for `str` fields, compact JSON (UTF-8) for the others.

    Raises ValueError for a value that cannot be stored (a string with lone surrogates).
    """
    if spec.type == "str":
        if not isinstance(value, str):
            raise ValueError(f"field {spec.name!r}: expected text, got {type(value).__name__}")
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"field {spec.name!r}: not valid Unicode ({exc.reason})") from None


def parse_value(spec: FieldSpec, data: bytes | memoryview | str) -> Any:
    """The value stored bytes (or their text) hold: str, a JSON value, or a numpy array for `array`."""
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8")
        return text if spec.type == "str" else from_json(spec, json.loads(text))
    except ValueError as exc:  # damaged bytes: invalid UTF-8 or JSON
        raise ValueError(f"field {spec.name!r}: {exc}") from None


def from_json(spec: FieldSpec, value: Any) -> Any:
    """A parsed JSON value as the reader hands it out: `array` fields become numpy arrays."""
    if spec.type == "array" and value is not None:
        import numpy as np  # here: the packer imports this module, and LMDB workers never need numpy

        return np.asarray(value, dtype=spec.dtype)
    return value
