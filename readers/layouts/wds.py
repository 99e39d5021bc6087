"""WebDataset tar shards: fixed ustar headers, member keys, and the shard's two indexes.

Per sample, regular-file members share a key (`manifest.sample_key`: shard and row, zero-padded,
no dots: WebDataset splits key and extension at the first dot), in this order: `<key>.<ext>` (the
image; raw pixels as `.npy`), `<key>.cls` (the label), one member per present field
(`field_extension`: `<key>.txt`, `<key>.json`, `<key>.caption.txt`, ...) in index.json's field
order, and the record meta last: `<key>.pack.json` (version 2; `<key>.json` in version 1, which
had no fields). Headers are fixed (mtime 0, uid/gid 0, no user or group names, mode 0644:
`readers.tar.encode_header`), so the same samples in the same order give a byte-identical tar. The `.packidx` sidecar is a header
(magic, uint32 LE column count, int64 LE sample count), then per sample int64 LE: image data
offset, image size, meta data offset, meta size, then (offset, size) per field, size -1 when
absent; offsets count from the start of the tar. The `.idx` sidecar is the index DALI's `wds2idx`
would write (its text format v1.2, every member), so `fn.readers.webdataset` takes it as
`index_paths`.
"""

from __future__ import annotations

import struct
from typing import Sequence

from ..fields import FieldSpec
from ..tar import TarError, split_name

LABEL_EXTENSION = "cls"
META_EXTENSION = "pack.json"  # pack's record meta: `json` is left to a user field
V1_META_EXTENSION = "json"  # format version 1 (no fields)
PIXELS_EXTENSION = "npy"  # raw pixels, in NumPy's own format
V1_PIXELS_EXTENSION = "raw"  # format version 1: the bare pixels (HF datasets takes `.raw` for audio)
NPY_MAGIC = b"\x93NUMPY\x01\x00"  # .npy format version 1.0: magic, then uint16 LE header length
NPY_ALIGN = 64
INDEX_EXTENSION = ".packidx"  # pack's offset index: a name no other tool writes
V1_INDEX_EXTENSION = ".idx"  # where format version 1 kept it, which DALI's wds2idx overwrites
DALI_INDEX_EXTENSION = ".idx"  # DALI's default index name, in its own text format
DALI_INDEX_VERSION = "v1.2"
INDEX_MAGIC = b"PKX1"
INDEX_HEADER = struct.Struct("<4sIq")
INDEX_COLUMNS = 4  # before the fields' (offset, size) pairs
ABSENT = -1  # the size column of a field a sample does not have


def meta_extension(version: int) -> str:
    """Where a dataset of this format version keeps the record meta: `json` moved aside for fields."""
    return V1_META_EXTENSION if version < 2 else META_EXTENSION


def field_extension(spec: FieldSpec) -> str:
    """A field's member extension, typed as WebDataset decoders read it: text ends in `txt`, the
    rest (JSON) in `json`; a field named `txt` or `json` is that extension itself (img2dataset's)."""
    suffix = "txt" if spec.type == "str" else "json"
    return suffix if spec.name == suffix else f"{spec.name}.{suffix}"


def index_row(num_fields: int) -> struct.Struct:
    return struct.Struct("<%dq" % (INDEX_COLUMNS + 2 * num_fields))


def image_extension(sample_extension: str) -> str:
    """The member extension of a sample's image: its own, except `.npy` for raw pixels."""
    return PIXELS_EXTENSION if sample_extension == V1_PIXELS_EXTENSION else sample_extension


def encode_npy_header(shape: tuple[int, ...]) -> bytes:
    """The .npy 1.0 header of a C-order uint8 array of `shape`, padded as NumPy pads it (the data
    starts 64-byte aligned), so `np.load` and every tool that reads `.npy` members decode it."""
    text = "{'descr': '|u1', 'fortran_order': False, 'shape': %r, }" % (tuple(shape),)
    size = len(NPY_MAGIC) + 2 + len(text) + 1
    text += " " * (-size % NPY_ALIGN) + "\n"
    return NPY_MAGIC + struct.pack("<H", len(text)) + text.encode("ascii")


def npy_data(member: memoryview) -> memoryview:
    """The pixel bytes of a `.npy` member this module wrote (the shape is also in the record meta)."""
    if bytes(member[:len(NPY_MAGIC)]) != NPY_MAGIC or len(member) < len(NPY_MAGIC) + 2:
        raise TarError("not a .npy version 1.0 member")
    (length,) = struct.unpack_from("<H", member, len(NPY_MAGIC))
    return member[len(NPY_MAGIC) + 2 + length:]


def encode_dali_index(samples: list[str]) -> bytes:
    """DALI's index: a "v1.2 N" line, then per sample one line of `encode_dali_sample`."""
    return "".join([f"{DALI_INDEX_VERSION} {len(samples)}\n", *samples]).encode("ascii")


def encode_dali_sample(members: list[tuple[str, int, int]]) -> str:
    """One sample's line of a DALI index: per member (name, data offset, size) in tar order, the
    four fields `ext offset size name` that DALI's wds2idx writes."""
    return " ".join(f"{split_name(name)[1]} {offset} {size} {name}" for name, offset, size in members) + "\n"


def encode_index_header(num_samples: int, num_fields: int) -> bytes:
    return INDEX_HEADER.pack(INDEX_MAGIC, INDEX_COLUMNS + 2 * num_fields, num_samples)


def parse_index_header(header: bytes, num_fields: int) -> int:
    """The sample count an index header states; TarError if it is not a pack index header for
    `num_fields` fields."""
    if len(header) < INDEX_HEADER.size:
        raise TarError("truncated tar index")
    magic, columns, count = INDEX_HEADER.unpack(header)
    if magic != INDEX_MAGIC or columns != INDEX_COLUMNS + 2 * num_fields:
        raise TarError("not a pack tar index" if magic != INDEX_MAGIC
                       else f"tar index has {columns} columns, {INDEX_COLUMNS + 2 * num_fields} expected")
    return int(count)


def field_extensions(specs: Sequence[FieldSpec]) -> dict[str, FieldSpec]:
    """Member extension -> field, for grouping a sample's members."""
    return {field_extension(spec): spec for spec in specs}
