"""Bytes of one source file in, stored bytes plus record metadata out.

`encode` is a pure function of the file's bytes and the options (no I/O, no globals), so it can
run in worker processes. Stores other than `original` decode the image at pack time: EXIF
orientation applied, the mode converted with `readers.decode.to_mode` (the readers' own rule),
then an optional torchvision-style resize and center crop.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Mapping

from PIL import Image, ImageOps

from readers.decode import to_mode

from .errors import RejectedFile

STORES = ("original", "raw", "bmp", "jpeg")
MODES = ("RGB", "L")
DEFAULT_QUALITY = 90
# Antialiased bilinear: what torchvision's Resize does to PIL images, so `--resize 256
# --center-crop 224` gives the pixels of `Resize(256), CenterCrop(224)`.
RESAMPLE = Image.Resampling.BILINEAR
ENCODE_OPTIONS = ("store", "mode", "resize", "max_side", "center_crop", "quality")

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
EXTENSIONS = {"jpeg": "jpg", "png": "png", "gif": "gif", "bmp": "bmp", "tiff": "tif", "webp": "webp", "ppm": "ppm",
              "raw": "raw"}


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


def encode_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `encode` from a plan's options (unset ones left to defaults)."""
    return {key: options[key] for key in ENCODE_OPTIONS if options.get(key) is not None}


def resized_size(width: int, height: int, resize: int | None, max_side: int | None) -> tuple[int, int]:
    """torchvision's rule: shorter side to `resize`, then the longer side capped at `max_side`.

    `max_side` alone only shrinks: images whose longer side is within it keep their size.
    """
    short, long = sorted((width, height))
    new_short, new_long = short, long
    if resize is not None:
        new_short, new_long = resize, int(resize * long / short)
    if max_side is not None and new_long > max_side:
        new_short, new_long = int(max_side * new_short / new_long), max_side
    new_short = max(1, new_short)
    return (new_short, new_long) if width <= height else (new_long, new_short)


def center_crop(image: Image.Image, side: int) -> Image.Image:
    """torchvision's CenterCrop: pad with black to at least side x side, then crop the middle."""
    width, height = image.size
    if side > width or side > height:
        padded = Image.new(image.mode, (max(width, side), max(height, side)), 0)
        padded.paste(image, (max(0, (side - width) // 2), max(0, (side - height) // 2)))
        image = padded
        width, height = image.size
    top = int(round((height - side) / 2.0))
    left = int(round((width - side) / 2.0))
    return image.crop((left, top, left + side, top + side))


def decode_image(
    data: bytes, mode: str, resize: int | None, max_side: int | None, crop: int | None
) -> Image.Image:
    """Decode, orient, convert, resize, crop; any decoding problem is a RejectedFile."""
    try:
        image = Image.open(io.BytesIO(data))
        ImageOps.exif_transpose(image, in_place=True)  # decodes; no copy when there is no rotation
        image = to_mode(image, mode)
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types on malformed files; one file must not stop a run
        raise RejectedFile(f"cannot decode: {exc or type(exc).__name__}") from None
    size = resized_size(*image.size, resize, max_side)
    if size != image.size:
        image = image.resize(size, RESAMPLE)
    if crop is not None:
        image = center_crop(image, crop)
    return image


def encode(
    data: bytes,
    store: str = "original",
    *,
    mode: str = "RGB",
    resize: int | None = None,
    max_side: int | None = None,
    center_crop: int | None = None,
    quality: int = DEFAULT_QUALITY,
) -> Encoded:
    """Check a source file's bytes and produce what gets stored; raises RejectedFile.

    `original` passes the bytes through. `raw` stores uint8 HWC pixels (meta `shape`, `dtype`),
    `bmp` lossless BMP bytes, `jpeg` a re-encoding at `quality`; all three record `shape` and `mode`.
    """
    if not data:
        raise RejectedFile("empty file")
    kind = sniff_format(data)
    if kind is None:
        raise RejectedFile("not an image (unrecognised content)")
    if store not in STORES:
        raise ValueError(f"unknown store {store!r}")
    if store == "original":
        if resize is not None or max_side is not None or center_crop is not None or mode != "RGB":
            raise ValueError("resizing, cropping and --mode need a decoding store (raw, bmp or jpeg)")
        return Encoded(payload=data, meta={"format": kind})
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    image = decode_image(data, mode, resize, max_side, center_crop)
    width, height = image.size
    meta: dict[str, Any] = {"format": store, "shape": [height, width, len(mode)], "mode": mode}
    if store == "raw":
        meta["dtype"] = "uint8"
        return Encoded(payload=image.tobytes(), meta=meta)
    buffer = io.BytesIO()
    if store == "bmp":
        image.save(buffer, format="BMP")
    else:
        image.save(buffer, format="JPEG", quality=quality)
    return Encoded(payload=buffer.getvalue(), meta=meta)
