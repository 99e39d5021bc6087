"""WebDataset tar shard writer: ustar headers built here, streamed straight to the file.

Python's tarfile (and webdataset's TarWriter on top of it) build each header through many small
steps; here every header is one template with the name, size and checksum filled in, and the
image bytes are written without copying. Headers are fixed (mtime 0, uid/gid 0, no user or group
names, mode 0644), so the same samples in the same order give a byte-identical tar. Each shard's
offset index goes to the `.idx` sidecar (layout in readers/webdataset.py and docs/FORMAT.md).
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import BinaryIO, Sequence

from readers.manifest import (
    TAR_BLOCK,
    TAR_INDEX_COLUMNS,
    TAR_INDEX_EXTENSION,
    TAR_INDEX_HEADER,
    TAR_INDEX_MAGIC,
    tar_key,
    tar_padding,
)

from .base import Sample, ShardWriter, sidecar_path

WRITE_BUFFER = 1 << 20
MAX_MEMBER_SIZE = 8**11 - 1  # what the 11 octal digits of a ustar size field hold (8 GiB)
_INDEX_ROW = struct.Struct("<%dq" % TAR_INDEX_COLUMNS)
_ZEROS = bytes(TAR_BLOCK)


def _octal(value: int, width: int) -> bytes:
    """A ustar numeric field: zero-padded octal digits and a NUL."""
    return b"%0*o\0" % (width - 1, value)


_MODE_UID_GID = _octal(0o644, 8) + _octal(0, 8) + _octal(0, 8)
_MTIME = _octal(0, 12)
# typeflag '0' (regular file), no link name, POSIX ustar magic and version, then empty user and
# group names, device numbers (unused for regular files; empty as tarfile writes them), prefix
# and padding to 512 bytes.
_TAIL = b"0" + bytes(100) + b"ustar\x0000" + bytes(32 + 32 + 8 + 8 + 155 + 12)
_FIXED_SUM = sum(_MODE_UID_GID) + sum(_MTIME) + 8 * ord(" ") + sum(_TAIL)


def tar_header(name: bytes, size: int) -> bytes:
    """The 512-byte ustar header of a regular file with fixed metadata."""
    if len(name) > 100:
        raise ValueError(f"tar member name longer than 100 bytes: {name!r}")
    if size > MAX_MEMBER_SIZE:
        raise ValueError(f"tar member {name!r} is larger than a ustar header can describe")
    size_field = _octal(size, 12)
    checksum = _FIXED_SUM + sum(name) + sum(size_field)
    return b"".join(
        (name.ljust(100, b"\0"), _MODE_UID_GID, size_field, _MTIME, b"%06o\0 " % checksum, _TAIL)
    )


def small_member(name: bytes, data: bytes) -> bytes:
    """A whole member in one piece: header, data, zero padding to the next block."""
    return tar_header(name, len(data)) + data + _ZEROS[: tar_padding(len(data))]


class WebDatasetWriter(ShardWriter):
    """Per sample `<key>.<ext>`, `<key>.cls` and `<key>.json`, key = local index, 10 digits."""

    format = "wds"
    extension = ".tar"
    sidecars = (TAR_INDEX_EXTENSION,)

    def __init__(self, path: Path, expected_bytes: int, classes: Sequence[str],
                 sample_shape: tuple[int, int, int] | None = None) -> None:
        super().__init__(path, expected_bytes, classes, sample_shape)
        self._tar: BinaryIO = open(path, "wb", buffering=WRITE_BUFFER)
        self._index: BinaryIO = open(sidecar_path(path, TAR_INDEX_EXTENSION), "wb", buffering=WRITE_BUFFER)
        self._index.write(TAR_INDEX_HEADER.pack(TAR_INDEX_MAGIC, TAR_INDEX_COLUMNS, 0))  # count set by close()
        self._position = 0
        self._count = 0
        self._hash = hashlib.sha256()  # the tar is written front to back: hash it on the way

    def add(self, sample: Sample) -> None:
        if not sample.extension.isalnum():
            raise ValueError(f"{self.path}: extension {sample.extension!r} would break the WebDataset key")
        key = tar_key(sample.local_index).encode("ascii")
        payload = sample.payload
        meta = json.dumps(sample.record_meta(), separators=(",", ":")).encode("ascii")
        image_offset = self._position + TAR_BLOCK
        labels = small_member(key + b".cls", b"%d" % sample.label)
        after_image = _ZEROS[: tar_padding(len(payload))] + labels
        json_offset = image_offset + len(payload) + len(after_image) + TAR_BLOCK
        after_image += small_member(key + b".json", meta)
        for part in (tar_header(key + b"." + sample.extension.encode("ascii"), len(payload)), payload, after_image):
            self._tar.write(part)  # the image bytes are not copied
            self._hash.update(part)
        self._position = image_offset + len(payload) + len(after_image)
        self._index.write(_INDEX_ROW.pack(image_offset, len(payload), json_offset, len(meta)))
        self._count += 1

    def close(self) -> None:
        self._tar.write(_ZEROS * 2)  # end of archive
        self._hash.update(_ZEROS * 2)
        self.sha256 = self._hash.hexdigest()
        self._index.seek(0)
        self._index.write(TAR_INDEX_HEADER.pack(TAR_INDEX_MAGIC, TAR_INDEX_COLUMNS, self._count))
        self._tar.close()
        self._index.close()
