"""wds (WebDataset tar) shard writer: ustar headers built here, streamed straight to the file.

Python's tarfile (and webdataset's TarWriter on top of it) build each header through many small
steps; here every header is one template with the name, size and checksum filled in
(`readers.layouts.wds.encode_header`), and the image bytes are written without copying. Each
shard's offset index goes to the `.idx` sidecar (layout in readers/layouts/wds.py and docs/FORMAT.md).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import BinaryIO, Sequence

from readers.layouts.wds import (
    BLOCK,
    INDEX_EXTENSION,
    INDEX_ROW,
    LABEL_EXTENSION,
    META_EXTENSION,
    PIXELS_EXTENSION,
    ZERO_BLOCK,
    encode_header,
    encode_npy_header,
    encode_index_header,
    encode_member,
    padding,
)

from .base import Sample, ShardWriter, sidecar_path

WRITE_BUFFER = 1 << 20
_LABEL_SUFFIX = b"." + LABEL_EXTENSION.encode("ascii")
_META_SUFFIX = b"." + META_EXTENSION.encode("ascii")


class WdsWriter(ShardWriter):
    """Per sample `<key>.<ext>` (`.npy` for raw pixels), `<key>.cls` and `<key>.json` (`readers.manifest.sample_key`)."""

    format = "wds"
    extension = ".tar"
    sidecars = (INDEX_EXTENSION,)

    def __init__(self, path: Path, expected_bytes: int, classes: Sequence[str],
                 sample_shape: tuple[int, int, int] | None = None) -> None:
        super().__init__(path, expected_bytes, classes, sample_shape)
        self._tar: BinaryIO = open(path, "wb", buffering=WRITE_BUFFER)
        self._index: BinaryIO = open(sidecar_path(path, INDEX_EXTENSION), "wb", buffering=WRITE_BUFFER)
        self._index.write(encode_index_header(0))  # the count is set by close()
        self._position = 0
        self._count = 0
        self._hash = hashlib.sha256()  # the tar is written front to back: hash it on the way

    def add(self, sample: Sample) -> None:
        if not sample.extension.isalnum():
            raise ValueError(f"{self.path}: extension {sample.extension!r} would break the wds key")
        key = sample.key.encode("ascii")
        payload, extension = sample.payload, sample.extension
        if sample.meta["format"] == "raw":
            payload, extension = encode_npy_header(sample.meta["shape"]) + payload, PIXELS_EXTENSION
        meta = json.dumps(sample.record_meta(), separators=(",", ":")).encode("ascii")
        image_offset = self._position + BLOCK
        labels = encode_member(key + _LABEL_SUFFIX, b"%d" % sample.label)
        after_image = ZERO_BLOCK[: padding(len(payload))] + labels
        json_offset = image_offset + len(payload) + len(after_image) + BLOCK
        after_image += encode_member(key + _META_SUFFIX, meta)
        for part in (encode_header(key + b"." + extension.encode("ascii"), len(payload)), payload, after_image):
            self._tar.write(part)  # the image bytes are not copied
            self._hash.update(part)
        self._position = image_offset + len(payload) + len(after_image)
        self._index.write(INDEX_ROW.pack(image_offset, len(payload), json_offset, len(meta)))
        self._count += 1

    def close(self) -> None:
        self._tar.write(ZERO_BLOCK * 2)  # end of archive
        self._hash.update(ZERO_BLOCK * 2)
        self.sha256 = self._hash.hexdigest()
        self._index.seek(0)
        self._index.write(encode_index_header(self._count))
        self._tar.close()
        self._index.close()

    def abort(self) -> None:
        self._tar.close()
        self._index.close()
