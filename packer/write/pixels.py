"""Pixel work of the decoding stores: decode, orient, convert, resize, crop, then store.

EXIF orientation is applied, the mode converted with `readers.decode.to_mode` (the readers' own
rule, so an `original` sample decoded on read equals its `raw` form), then an optional resize and
center crop that follow torchvision's size arithmetic.
"""

from __future__ import annotations

import io
from typing import Any

from PIL import Image, ImageOps

from readers.decode import to_mode

from ..errors import RejectedFile

# Antialiased bilinear: what torchvision's Resize does to PIL images, so `--resize 256
# --center-crop 224` follows `Resize(256), CenterCrop(224)`.
RESAMPLE = Image.Resampling.BILINEAR


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


def store_pixels(
    data: bytes, store: str, mode: str, resize: int | None, max_side: int | None, crop: int | None, quality: int
) -> tuple[bytes, dict[str, Any]]:
    """The payload and meta of a raw, bmp or jpeg sample."""
    image = decode_image(data, mode, resize, max_side, crop)
    width, height = image.size
    meta: dict[str, Any] = {"format": store, "shape": [height, width, len(mode)], "mode": mode}
    if store == "raw":
        meta["dtype"] = "uint8"
        return image.tobytes(), meta
    buffer = io.BytesIO()
    if store == "bmp":
        image.save(buffer, format="BMP")
    else:
        image.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue(), meta
