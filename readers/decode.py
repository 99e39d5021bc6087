"""Turn a stored payload into what training code asked for: PIL, numpy, tensor or bytes.

A payload is either encoded image bytes (`format` jpeg/png/bmp/...) or, for `format: "raw"`,
uint8 pixels in HWC order with `shape` in the meta. `to_mode` is the one definition of how any
Pillow mode becomes RGB or L; the packer uses it too, so decoding an `original` sample here gives
the same pixels as packing it with `--store raw`.
"""

from __future__ import annotations

import functools
import io
import math
import numbers
from typing import Any, Callable

import numpy as np
from PIL import ExifTags, Image, ImageOps, JpegImagePlugin

from .manifest import DECODE_MODES

Size = tuple[int, int]
Decoder = Callable[[memoryview, dict[str, Any]], Any]

# Transparent pixels are composited onto white: the hidden colour under alpha 0 is arbitrary.
BACKGROUND = 255
DCT_SCALES = (8, 4, 2, 1)
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")
_ORIENTATION = ExifTags.Base.Orientation
_SWAPS_AXES = (5, 6, 7, 8)


def _to_8bit(image: Image.Image) -> Image.Image:
    """16-bit and 32-bit integer images scaled (v / 257, rounded) to L; float images taken as 0..1."""
    array = np.asarray(image)
    if image.mode == "F":
        scaled = np.rint(np.clip(np.nan_to_num(array.astype(np.float64), nan=0.0), 0.0, 1.0) * 255.0)
    else:
        scaled = (np.clip(array.astype(np.int64), 0, 65535) + 128) // 257
    return Image.fromarray(scaled.astype(np.uint8))


def to_mode(image: Image.Image, mode: str = "RGB") -> Image.Image:
    """Any Pillow mode to `mode` ("RGB" or "L"): 16-bit scaled, not clipped; alpha over white."""
    if image.mode == mode:
        return image
    if image.mode in _SIXTEEN_BIT or image.mode == "F":
        image = _to_8bit(image)
    elif image.mode in ("P", "RGB", "L") and "transparency" in image.info:
        image = image.convert("LA" if image.mode == "L" else "RGBA")
    elif image.mode in ("PA", "RGBa"):
        image = image.convert("RGBA")
    elif image.mode == "La":
        image = image.convert("LA")
    if image.mode in ("RGBA", "LA"):
        alpha = image.getchannel("A")
        base = image.mode[:-1]
        opaque = image.convert(base)
        if alpha.getextrema() != (255, 255):
            background = Image.new(base, image.size, (BACKGROUND,) * len(base))
            background.paste(opaque, mask=alpha)
            opaque = background
        image = opaque
    return image if image.mode == mode else image.convert(mode)


def reduction(width: int, height: int, size: Size) -> int:
    """The power-of-two reduction (1, 2, 4, 8) that brings (width, height) nearest to `size`.

    Nearest on a log scale for the limiting side: the result is within a factor of sqrt(2) of the
    requested (H, W) on the side that needs the least reduction, never smaller than 1/sqrt(2) of it.
    """
    want_h, want_w = size
    ratio = min(width / want_w, height / want_h) * math.sqrt(2)
    return next((scale for scale in DCT_SCALES if ratio >= scale), 1)


def open_image(payload: bytes | memoryview, meta: dict[str, Any], size: Size | None = None) -> Image.Image:
    """Decode a payload to a PIL image in the recorded mode (default RGB), EXIF orientation applied.

    With `size`, JPEGs decode at a reduced DCT scale (Pillow draft mode) and other payloads are
    box-reduced by the same power of two, so every store gives the same approximate size.
    """
    mode = meta.get("mode", "RGB")
    if meta.get("format") == "raw":
        pixels = raw_array(payload, meta)
        image = Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels)
        orientation = 1
    else:
        image = Image.open(io.BytesIO(payload))
        # Samples the packer decoded already had their orientation applied and carry no EXIF.
        orientation = 1 if "shape" in meta else image.getexif().get(_ORIENTATION, 1)
        if size is not None and isinstance(image, JpegImagePlugin.JpegImageFile):  # also MPO
            width, height = image.size
            if orientation in _SWAPS_AXES:
                size = (size[1], size[0])
            scale = reduction(width, height, size)
            image.draft(mode if mode == "L" else "RGB", (width // scale, height // scale))
            size = None
    if orientation != 1:
        image = ImageOps.exif_transpose(image)
    image = to_mode(image, mode)  # before reducing: averaging palette indices would be wrong
    if size is not None:
        scale = reduction(*image.size, size)
        if scale > 1:
            image = image.reduce(scale)
    image.load()
    return image


def raw_array(payload: bytes | memoryview, meta: dict[str, Any]) -> np.ndarray:
    """A read-only HWC uint8 view of a raw payload: no copy."""
    return np.frombuffer(payload, dtype=np.dtype(meta.get("dtype", "uint8"))).reshape(meta["shape"])


def decode_pil(payload: bytes | memoryview, meta: dict[str, Any], size: Size | None = None) -> Image.Image:
    return open_image(payload, meta, size)


def decode_numpy(payload: bytes | memoryview, meta: dict[str, Any], size: Size | None = None) -> np.ndarray:
    """HWC uint8. Raw samples come back as read-only views of the record (copy before writing)."""
    if meta.get("format") == "raw":
        array = raw_array(payload, meta)
        if size is None or reduction(array.shape[1], array.shape[0], size) == 1:
            return array
    array = np.array(open_image(payload, meta, size))
    return array[:, :, None] if array.ndim == 2 else array


def decode_tensor(payload: bytes | memoryview, meta: dict[str, Any], size: Size | None = None) -> Any:
    """A contiguous CHW uint8 tensor.

    Transposing here (numpy, ~50 us at 224x224) is several times cheaper than letting the
    DataLoader's collate stack permuted views, and it is the one copy raw samples need anyway.
    """
    import torch

    chw = decode_numpy(payload, meta, size).transpose(2, 0, 1)
    # One channel transposes to a contiguous view: a raw record's (read-only) must still be copied.
    return torch.from_numpy(np.ascontiguousarray(chw) if chw.flags.writeable else chw.copy())


def decode_bytes(payload: bytes | memoryview, meta: dict[str, Any]) -> bytes:
    """The payload as bytes; a view of a whole bytes object is that object (bytes are immutable),
    so a reader that reads a payload into its own bytes hands it on without a copy."""
    if isinstance(payload, memoryview) and isinstance(payload.obj, bytes) and payload.nbytes == len(payload.obj):
        return payload.obj
    return bytes(payload)


_DECODERS: dict[str, Decoder] = {
    "pil": decode_pil,
    "numpy": decode_numpy,
    "tensor": decode_tensor,
    "bytes": decode_bytes,
}


def check_size(size: Any) -> Size:
    """A decode_size must be two positive ints (H, W)."""
    if (
        not isinstance(size, (tuple, list))
        or len(size) != 2
        or not all(isinstance(side, numbers.Integral) and not isinstance(side, bool) and side > 0 for side in size)
    ):
        raise ValueError(f"decode_size must be (height, width) with two positive ints, not {size!r}")
    return int(size[0]), int(size[1])


def get_decoder(mode: str, size: Size | None = None) -> Decoder:
    """The payload+meta -> image function for one of DECODE_MODES (picklable, for spawn workers)."""
    try:
        decoder = _DECODERS[mode]
    except KeyError:
        raise ValueError(f"decode must be one of {', '.join(DECODE_MODES)}, not {mode!r}") from None
    if size is None:
        return decoder
    if mode == "bytes":
        raise ValueError("decode_size has no effect with decode='bytes' (bytes are returned as stored)")
    return functools.partial(decoder, size=check_size(size))
