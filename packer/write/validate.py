"""Check a candidate file's bytes before it is stored, and the policy for files that fail.

`check_image` is pure (bytes in, the image's codec out, or RejectedFile): reader threads call it
before `encode`. The quick checks read only the file's ends and its header (JPEG, PNG and GIF
sizes are read directly, other codecs through Pillow's header parser), so passthrough packing
stays fast; `full` also opens every file with Pillow and decodes every pixel.
"""

from __future__ import annotations

import functools
import io
import struct
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from readers.manifest import ON_ERROR_MODES

from .encode import sniff_codec
from ..errors import PackError, RejectedFile

VALIDATE_MODES = ("quick", "full")
# Above Pillow's own warning limit (~89M pixels: 9500x9500), below its hard limit (~179M).
DEFAULT_MAX_PIXELS = 100_000_000
# Cameras and some encoders pad files after the end marker with zeros or whitespace.
_PADDING = b"\x00 \t\r\n"
_PNG_END = b"IEND\xaeB`\x82"


@dataclass(frozen=True)
class ErrorPolicy:
    """What to do with rejected files; does not change the packed result, so not a PackOption."""

    on_error: str = "skip"
    max_errors: int | None = None

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR_MODES:
            raise PackError(f"--on-error must be one of {', '.join(ON_ERROR_MODES)}, not {self.on_error!r}")
        if self.max_errors is not None and self.max_errors < 0:
            raise PackError(f"--max-errors must be at least 0, not {self.max_errors}")

    def too_many(self, rejects: int) -> bool:
        return self.max_errors is not None and rejects > self.max_errors


def check_image(data: bytes, *, validate: str = "quick", max_pixels: int = DEFAULT_MAX_PIXELS) -> str:
    """The file's actual codec if it may be stored; raises RejectedFile with a short reason."""
    if not data:
        raise RejectedFile("empty file")
    codec = sniff_codec(data)
    if codec is None:
        raise RejectedFile("not an image (unrecognised content)")
    check_complete(data, codec)
    size = None if validate == "full" else header_size(data, codec)
    if size is not None:
        check_pixels(*size, max_pixels)
        return codec
    image_module = pillow()
    stage = "unreadable image header"
    try:
        with open_header(data, codec) as image:
            check_pixels(*image.size, max_pixels)
            if validate == "full":
                stage = "cannot decode"
                image.load()
    except image_module.DecompressionBombError as exc:
        raise RejectedFile(f"decompression bomb: {exc}") from None
    except image_module.UnidentifiedImageError:
        raise RejectedFile(f"{stage} ({codec}): not understood by Pillow") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise RejectedFile(f"{stage} ({codec}): {exc}") from None
    return codec


def check_pixels(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise RejectedFile(f"decompression bomb: {width}x{height} pixels > --max-pixels {max_pixels}")


# JPEG start-of-frame markers (C0-CF, except DHT C4, JPG C8 and DAC CC) carry the image size.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def header_size(data: bytes, codec: str) -> tuple[int, int] | None:
    """(width, height) from the first bytes of a JPEG, PNG or GIF, several times cheaper than
    Pillow's header parsing; None for other formats or an unusual header (Pillow then decides).
    """
    if codec == "png" and data[12:16] == b"IHDR" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return width, height
    if codec == "gif" and len(data) >= 10:
        width, height = struct.unpack("<HH", data[6:10])
        return width, height
    if codec == "jpeg":
        position = 2
        while position + 9 <= len(data) and data[position] == 0xFF:
            marker = data[position + 1]
            if marker in _SOF_MARKERS:
                height, width = struct.unpack(">HH", data[position + 5:position + 9])
                return (width, height) if width and height else None
            if marker == 0xFF:  # fill byte before a marker
                position += 1
                continue
            position += 2 + struct.unpack(">H", data[position + 2:position + 4])[0]
    return None


@functools.cache
def pillow() -> ModuleType:
    """PIL.Image, imported only when a header needs it: passthrough workers mostly never do.

    Our --max-pixels check replaces Pillow's bomb warning; a multi-frame GIF may still raise its error.
    """
    from PIL import Image

    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    Image.init()
    return Image


def open_header(data: bytes, codec: str) -> Any:
    """Parse only the header, through the format's own plugin: unlike `Image.open`, this skips
    Pillow's decompression-bomb check, so ours (--max-pixels, with the image's size) runs first.
    """
    Image = pillow()
    plugin = Image.OPEN.get(codec.upper())
    if plugin is None:
        return Image.open(io.BytesIO(data))
    factory, _ = plugin
    return factory(io.BytesIO(data), "")


def check_complete(data: bytes, codec: str) -> None:
    """Catch truncated downloads from the file's end: each format's end marker must be there. A
    JPEG's end-of-image marker may be followed by more bytes (a phone's trailer, a motion photo's
    video), which are kept: the file decodes."""
    if codec == "jpeg" and not data.rstrip(_PADDING).endswith(b"\xff\xd9") and not has_jpeg_end(data):
        raise RejectedFile("truncated JPEG (no end-of-image marker)")
    if codec == "png" and data.rfind(_PNG_END) < 0:
        raise RejectedFile("truncated PNG (no IEND chunk)")
    if codec == "gif" and not data.rstrip(_PADDING[:1]).endswith(b";"):
        raise RejectedFile("truncated GIF (no trailer)")


def has_jpeg_end(data: bytes) -> bool:
    """Whether an end-of-image marker follows the image's first scan. The segments before it are
    skipped by their lengths, so an EXIF thumbnail's own end marker does not count; inside and
    after the scans a 0xFF byte of data is followed by 0x00 or a restart marker, never 0xD9."""
    position = 2
    while position + 4 <= len(data) and data[position] == 0xFF:
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte before a marker
            position += 1
            continue
        if marker == 0xDA:  # start of scan: the entropy-coded data follows its header
            return data.find(b"\xff\xd9", position + 2) >= 0
        position += 2 + struct.unpack(">H", data[position + 2:position + 4])[0]
    return False
