"""Sidecar files: `a/x.txt` beside `a/x.jpg` becomes field `txt` of that sample.

WebDataset's and img2dataset's convention (`x.jpg` + `x.txt` caption + `x.json` metadata). A
sidecar is read with its image, in the reader thread; its bytes are stored as they are, once
checked: `json` sidecars must hold valid JSON (field type `json`), any other extension UTF-8
text (type `str`). A missing sidecar rejects the sample, or with `optional` leaves the field absent.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

from readers.fields import FieldSpec, check_field_name

from ..errors import RejectedFile
from .listing import IMAGE_EXTENSIONS

JSON_EXTENSION = "json"


def extension_problem(extension: str) -> str | None:
    """Why `extension` cannot name a sidecar field, or None."""
    if "." + extension.lower() in IMAGE_EXTENSIONS:
        return "an image extension: such files are packed as images"
    return check_field_name(extension)


def sidecar_specs(extensions: Sequence[str], optional: bool) -> list[FieldSpec]:
    return [FieldSpec(extension, "json" if extension == JSON_EXTENSION else "str", optional=optional)
            for extension in extensions]


def sidecar_name(path: str, extension: str) -> str:
    """`a/x.jpg` -> `a/x.txt`: the image's path up to its extension, then the sidecar's."""
    return f"{os.path.splitext(path)[0]}.{extension}"


def read_sidecars(root: str, path: str, extensions: Sequence[str], optional: bool) -> dict[str, bytes]:
    """The stored bytes of the sidecars of the image at `path`; RejectedFile names a bad one."""
    stored = {}
    for extension in extensions:
        name = sidecar_name(path, extension)
        try:
            with open(os.path.join(root, name), "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            if optional:
                continue
            raise RejectedFile(f"missing sidecar {name} (--sidecars-optional packs the sample without it)") from None
        except OSError as exc:
            raise RejectedFile(f"{name}: cannot read ({exc.strerror or exc})") from None
        stored[extension] = checked_text(name, extension, data)
    return stored


def checked_text(name: str, extension: str, data: bytes) -> bytes:
    """A sidecar's (or tar member's) bytes, once known to be UTF-8 text (JSON for `json`); a
    RejectedFile naming it otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RejectedFile(f"{name}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    if extension == JSON_EXTENSION:
        try:
            json.loads(text)
        except ValueError as exc:
            raise RejectedFile(f"{name}: invalid JSON ({exc})") from None
    return data
