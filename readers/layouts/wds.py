"""WebDataset tar shards: fixed ustar headers, member keys, and the shard's two indexes.

Per sample, regular-file members share a key (`manifest.sample_key`: shard and row, zero-padded,
no dots: WebDataset splits key and extension at the first dot), in this order: `<key>.<ext>` (the
image; raw pixels as `.npy`), `<key>.cls` (the label), one member per present field
(`field_extension`: `<key>.txt`, `<key>.json`, `<key>.caption.txt`, ...) in index.json's field
order, and the record meta last: `<key>.pack.json` (version 2; `<key>.json` in version 1, which
had no fields). Headers are fixed (mtime 0, uid/gid 0, no user or group names, mode 0644), so the
same samples in the same order give a byte-identical tar. The `.packidx` sidecar is a header
(magic, uint32 LE column count, int64 LE sample count), then per sample int64 LE: image data
offset, image size, meta data offset, meta size, then (offset, size) per field, size -1 when
absent; offsets count from the start of the tar. The `.idx` sidecar is the index DALI's `wds2idx`
would write (its text format v1.2, every member), so `fn.readers.webdataset` takes it as
`index_paths`.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Sequence

from ..fields import FieldSpec

BLOCK = 512
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
MAX_MEMBER_SIZE = 8**11 - 1  # what the 11 octal digits of a ustar size field hold (8 GiB)
ZERO_BLOCK = bytes(BLOCK)


class TarError(ValueError):
    """A tar header (or index) that is damaged or not what pack writes; callers add the file name."""


@dataclass(frozen=True)
class Member:
    name: str
    size: int


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


def padding(size: int) -> int:
    """Zero bytes after a member's data up to the next 512-byte block."""
    return -size % BLOCK


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


def encode_header(name: bytes, size: int) -> bytes:
    """The 512-byte ustar header of a regular file with fixed metadata; `parse_header` reads it."""
    if len(name) > 100:
        raise ValueError(f"tar member name longer than 100 bytes: {name!r}")
    if size > MAX_MEMBER_SIZE:
        raise ValueError(f"tar member {name!r} is larger than a ustar header can describe")
    size_field = _octal(size, 12)
    checksum = _FIXED_SUM + sum(name) + sum(size_field)
    return b"".join(
        (name.ljust(100, b"\0"), _MODE_UID_GID, size_field, _MTIME, b"%06o\0 " % checksum, _TAIL)
    )


def encode_member(name: bytes, data: bytes) -> bytes:
    """A whole member in one piece: header, data, zero padding to the next block."""
    return encode_header(name, len(data)) + data + ZERO_BLOCK[: padding(len(data))]


def canonical_header(block: bytes) -> tuple[bytes, int] | None:
    """(name, size) of a header exactly as `encode_header` writes it, checksum included, else None
    (then `parse_header` says what it is). The fixed fields are compared whole and the checksum
    summed over the name and size alone: a fifth of `parse_header`'s time, which a streaming read
    pays three times per sample."""
    if block[100:124] != _MODE_UID_GID or block[136:148] != _MTIME or block[156:] != _TAIL:
        return None
    name = block[:100].rstrip(b"\0")
    size_field = block[124:136]
    if b"\0" in name or block[148:156] != b"%06o\0 " % (_FIXED_SUM + sum(name) + sum(size_field)):
        return None
    try:
        size = int(size_field[:11], 8)
    except ValueError:
        return None
    return (name, size) if size_field == _octal(size, 12) else None  # int() also takes " +_"


def parse_header(block: bytes | memoryview, *, checksum: bool = True) -> Member | None:
    """One 512-byte ustar header -> its member, or None for the all-zero end-of-archive block.

    Random access skips the checksum (summing 512 bytes costs more than the rest of a read):
    there the caller compares the name and size with what the index says instead.
    """
    block = bytes(block)
    if block == ZERO_BLOCK:
        return None
    try:
        size = int(block[124:136].rstrip(b"\0 ") or b"0", 8)
        valid = not checksum or int(block[148:156].rstrip(b"\0 ") or b"-1", 8) == (
            sum(block) - sum(block[148:156]) + 8 * ord(" ")
        )
    except ValueError:
        valid = False
    if not valid:
        raise TarError("bad tar header")
    if block[156:157] not in (b"0", b"\0"):
        raise TarError(f"tar member of type {block[156:157]!r}; only regular files are expected")
    name = block[:100].split(b"\0", 1)[0]
    prefix = block[345:500].split(b"\0", 1)[0] if block[257:262] == b"ustar" else b""
    if prefix:
        name = prefix + b"/" + name
    return Member(name=check_member_name(os.fsdecode(name)), size=size)


def check_member_name(name: str) -> str:
    """Refuse member names that could escape an extraction directory."""
    if not name or name.startswith("/") or ".." in name.split("/"):
        raise TarError(f"unsafe tar member name {name!r}")
    return name


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


def split_name(name: str) -> tuple[str, str]:
    """WebDataset's rule: the key ends at the first dot of the last path component."""
    directory, _, base = name.rpartition("/")
    stem, dot, extension = base.partition(".")
    return (directory + "/" if directory else "") + stem, extension if dot else ""


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
