"""Turn stored image bytes into what training code asked for: PIL, numpy, tensor or bytes."""

from __future__ import annotations

import io
from typing import Any, Callable

import numpy as np
from PIL import Image, ImageOps

def decode_pil(payload: bytes | memoryview, meta: dict[str, Any]) -> Image.Image:
    """Decode an encoded image to RGB (or the mode the packer recorded), EXIF orientation applied."""
    with Image.open(io.BytesIO(payload)) as image:
        oriented = ImageOps.exif_transpose(image)
        return oriented.convert(meta.get("mode", "RGB"))


def pil_to_numpy(image: Image.Image) -> np.ndarray:
    array = np.array(image)
    if array.ndim == 2:
        array = array[:, :, None]
    return array


def numpy_to_tensor(array: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1)


def decode_bytes(payload: bytes | memoryview, meta: dict[str, Any]) -> bytes:
    return bytes(payload)


def decode_numpy(payload: bytes | memoryview, meta: dict[str, Any]) -> np.ndarray:
    return pil_to_numpy(decode_pil(payload, meta))


def decode_tensor(payload: bytes | memoryview, meta: dict[str, Any]) -> Any:
    return numpy_to_tensor(decode_numpy(payload, meta))


_DECODERS: dict[str, Callable[[memoryview, dict[str, Any]], Any]] = {
    "pil": decode_pil,
    "numpy": decode_numpy,
    "tensor": decode_tensor,
    "bytes": decode_bytes,
}
DECODE_MODES = tuple(_DECODERS)


def get_decoder(mode: str) -> Callable[[memoryview, dict[str, Any]], Any]:
    """Return the payload+meta -> image function for one of DECODE_MODES (module-level: picklable)."""
    try:
        return _DECODERS[mode]
    except KeyError:
        raise ValueError(f"decode must be one of {', '.join(DECODE_MODES)}, not {mode!r}") from None
