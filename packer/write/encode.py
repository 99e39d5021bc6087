"""Bytes of one source file in, stored bytes plus record metadata out.

`encode` is a pure function of the file's bytes and the options (no I/O, no globals), so it can
run in worker processes. Stores other than `original` decode the image (see `packer.write.pixels`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from readers.manifest import STORES, payload_crc32

PIXEL_MODES = ("RGB", "L")
"""Pillow modes a decoding store converts to (`--mode`): colour or greyscale."""
DEFAULT_QUALITY = 90
ENCODE_OPTIONS = ("store", "mode", "resize", "max_side", "center_crop", "quality")

# Leading bytes that identify each codec we accept.
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
EXTENSIONS = {"jpeg": "jpg", "png": "png", "gif": "gif", "bmp": "bmp", "tiff": "tif", "webp": "webp", "ppm": "ppm",
              "raw": "raw"}


def sniff_codec(data: bytes) -> str | None:
    """The image's codec from the file's content, never from its name."""
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
    # Computed where the payload is made, in a reader thread (zlib's crc32 was 9% of the CPU
    # time of packing 20k JPEGs; see payload_crc32).
    crc32: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "crc32", payload_crc32(self.payload))

    @property
    def extension(self) -> str:
        return EXTENSIONS[self.meta["format"]]


def encode(
    data: bytes,
    store: str = "original",
    *,
    codec: str,
    mode: str = "RGB",
    resize: int | None = None,
    max_side: int | None = None,
    center_crop: int | None = None,
    quality: int = DEFAULT_QUALITY,
) -> Encoded:
    """What gets stored for a file `validate.check_image` accepted as codec `codec`.

    `original` passes the bytes through. `raw` stores uint8 HWC pixels (meta `shape`, `dtype`),
    `bmp` lossless BMP bytes, `jpeg` a re-encoding at `quality`; all three record `shape` and `mode`.
    """
    if store not in STORES:
        raise ValueError(f"unknown store {store!r}")
    if store == "original":
        if resize is not None or max_side is not None or center_crop is not None or mode != "RGB":
            raise ValueError("resizing, cropping and --mode need a decoding store (raw, bmp or jpeg)")
        return Encoded(payload=data, meta={"format": codec})
    if mode not in PIXEL_MODES:
        raise ValueError(f"unknown mode {mode!r}")
    # Imported here: Pillow and numpy cost every spawned packing worker ~0.1 s, and passthrough needs neither.
    from .pixels import store_pixels

    payload, meta = store_pixels(data, store, mode, resize, max_side, center_crop, quality)
    return Encoded(payload=payload, meta=meta)
