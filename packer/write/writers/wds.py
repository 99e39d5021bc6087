"""wds (WebDataset tar) shard writer: ustar headers built here, streamed straight to the file.

Python's tarfile (and webdataset's TarWriter on top of it) build each header through many small
steps; here every header is one template with the name, size and checksum filled in
(`readers.layouts.wds.encode_header`), and the image bytes are written without copying. Each
shard's offset index goes to the `.packidx` sidecar, and DALI's index of it to `.idx` (layouts in
readers/layouts/wds.py and docs/FORMAT.md).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import BinaryIO, Sequence

from readers.fields import FieldSpec
from readers.layouts.wds import (
    ABSENT,
    DALI_INDEX_EXTENSION,
    INDEX_EXTENSION,
    LABEL_EXTENSION,
    META_EXTENSION,
    PIXELS_EXTENSION,
    encode_dali_index,
    encode_dali_sample,
    encode_index_header,
    encode_npy_header,
    field_extension,
    image_extension,
    index_row,
)
from readers.tar import BLOCK, ZERO_BLOCK, encode_header, encode_member, padding

from .base import Sample, ShardWriter, sidecar_path

WRITE_BUFFER = 1 << 20
_LABEL_SUFFIX = b"." + LABEL_EXTENSION.encode("ascii")
_META_SUFFIX = b"." + META_EXTENSION.encode("ascii")


class WdsWriter(ShardWriter):
    """Per sample `<key>.<ext>` (`.npy` for raw pixels), `<key>.cls`, a member per present field and
    `<key>.pack.json` (`readers.manifest.sample_key`)."""

    format = "wds"

    def __init__(self, path: Path, expected_bytes: int, classes: Sequence[str],
                 sample_shape: tuple[int, int, int] | None = None, fields: Sequence[FieldSpec] = ()) -> None:
        super().__init__(path, expected_bytes, classes, sample_shape, fields)
        self._field_suffixes = [(spec.name, b"." + field_extension(spec).encode("ascii")) for spec in self.fields]
        self._index_row = index_row(len(self.fields))
        self._tar: BinaryIO = open(path, "wb", buffering=WRITE_BUFFER)
        try:
            self._index: BinaryIO = open(sidecar_path(path, INDEX_EXTENSION), "wb", buffering=WRITE_BUFFER)
        except BaseException:  # not yet inside `with`, so abort() will not run: close the tar here
            self._tar.close()
            raise
        self._index.write(encode_index_header(0, len(self.fields)))  # the count is set by close()
        self._dali_samples: list[str] = []  # DALI's index starts with the count: written by close()
        self._position = 0
        self._count = 0
        self._hash = hashlib.sha256()  # the tar is written front to back: hash it on the way

    def add(self, sample: Sample) -> None:
        if not sample.extension.isalnum():
            raise ValueError(f"{self.path}: extension {sample.extension!r} would break the wds key")
        key = sample.key.encode("ascii")
        payload, extension = sample.payload, image_extension(sample.extension)
        if extension == PIXELS_EXTENSION:
            payload = encode_npy_header(sample.meta["shape"]) + payload
        meta = json.dumps(sample.record_meta(), separators=(",", ":")).encode("ascii")
        image_name = key + b"." + extension.encode("ascii")
        label = b"%d" % sample.label
        image_offset = self._position + BLOCK
        label_offset = image_offset + len(payload) + padding(len(payload)) + BLOCK
        after_image = ZERO_BLOCK[: padding(len(payload))] + encode_member(key + _LABEL_SUFFIX, label)
        members = [(image_name, image_offset, len(payload)), (key + _LABEL_SUFFIX, label_offset, len(label))]
        field_columns: list[int] = []
        for name, suffix in self._field_suffixes:
            data = sample.fields.get(name)
            if data is None:
                field_columns += (0, ABSENT)
                continue
            field_offset = image_offset + len(payload) + len(after_image) + BLOCK
            field_columns += (field_offset, len(data))
            members.append((key + suffix, field_offset, len(data)))
            after_image += encode_member(key + suffix, data)
        json_offset = image_offset + len(payload) + len(after_image) + BLOCK
        after_image += encode_member(key + _META_SUFFIX, meta)
        members.append((key + _META_SUFFIX, json_offset, len(meta)))
        self._dali_samples.append(encode_dali_sample([(name.decode("ascii"), offset, size)
                                                      for name, offset, size in members]))
        for part in (encode_header(image_name, len(payload)), payload, after_image):
            self._tar.write(part)  # the image bytes are not copied
            self._hash.update(part)
        self._position = image_offset + len(payload) + len(after_image)
        self._index.write(self._index_row.pack(image_offset, len(payload), json_offset, len(meta), *field_columns))
        self._count += 1

    def close(self) -> None:
        self._tar.write(ZERO_BLOCK * 2)  # end of archive
        self._hash.update(ZERO_BLOCK * 2)
        self.sha256 = self._hash.hexdigest()
        self._index.seek(0)
        self._index.write(encode_index_header(self._count, len(self.fields)))
        sidecar_path(self.path, DALI_INDEX_EXTENSION).write_bytes(encode_dali_index(self._dali_samples))
        self._tar.close()
        self._index.close()

    def abort(self) -> None:
        self._tar.close()
        self._index.close()
