"""Bytes of one source file in, stored bytes plus record metadata out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import RejectedFile

STORES = ("original",)

# Leading bytes that identify each format we accept, and the extension it is stored under.
_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
    (b"P5", "ppm"),
    (b"P6", "ppm"),
)
EXTENSIONS = {"jpeg": "jpg", "png": "png", "gif": "gif", "bmp": "bmp", "tiff": "tif", "webp": "webp", "ppm": "ppm"}


def sniff_format(data: bytes) -> str | None:
    """The image format from the file's content, never from its name."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    for signature, name in _SIGNATURES:
        if data.startswith(signature):
            return name
    return None


@dataclass(frozen=True)
class Encoded:
    payload: bytes
    meta: dict[str, Any]

    @property
    def extension(self) -> str:
        return EXTENSIONS[self.meta["format"]]


def encode(data: bytes, store: str) -> Encoded:
    """Check a source file's bytes and produce what gets stored; raises RejectedFile."""
    if not data:
        raise RejectedFile("empty file")
    kind = sniff_format(data)
    if kind is None:
        raise RejectedFile("not an image (unrecognised content)")
    if store != "original":
        raise ValueError(f"unknown store {store!r}")
    return Encoded(payload=data, meta={"format": kind})
