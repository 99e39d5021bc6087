"""MXNet RecordIO (`train.rec`, with `train.idx` beside it or not), read by our own code: MXNet is
retired and no longer installs on current Python.

Framing (dmlc-core recordio.h): a record is one or more parts, each `u32 MAGIC`, `u32 lrec`
(length: the low 29 bits; cflag: the top 3, 0 whole, 1 first, 2 middle, 3 last), the data, zero
padding to 4 bytes. A writer splits a record where MAGIC appears 4-aligned inside it and drops
that MAGIC; the reader puts it back between the parts. Payload (mxnet.recordio.pack): `<IfQQ`
(flag, label, id, id2); when flag > 0, `flag` float32 labels follow (the first is the class,
the whole array becomes field `label_array`), then the image bytes.

insightface (MS1M, Glint360K): record 0 is a header without image whose first label is one past
the last image record; identity records follow the images and are not samples.

With a `.idx` (`key\\toffset` lines) the scan reads only the `.idx`, the header record and the
first image record; without one it hops from part header to part header through the file once
(8 bytes read per part, never the images). Each sample is the byte range of its record, read by
the reader threads with one pread: nothing is extracted to disk.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import BinaryIO, Iterator

MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack("<I", MAGIC)
PART_HEADER = struct.Struct("<II")
IMAGE_HEADER = struct.Struct("<IfQQ")
LENGTH_BITS = 29
LENGTH_MASK = (1 << LENGTH_BITS) - 1
WHOLE, FIRST, MIDDLE, LAST = range(4)
LABEL_ARRAY_FIELD = "label_array"


class RecordError(ValueError):
    """A record that cannot be read; the message says where and why."""


def padded(length: int) -> int:
    return (length + 3) & ~3


def join_parts(data: bytes | memoryview, start: int = 0) -> tuple[bytes, int]:
    """The record whose first part starts at `start` of `data`: (its payload, the offset just past
    it, padding included). Split parts are joined with MAGIC put back between them."""
    view = memoryview(data)
    parts: list[memoryview] = []
    position = start
    while True:
        if position + PART_HEADER.size > len(view):
            raise RecordError(f"ends inside a part header at byte {position}" if parts or position < len(view)
                              else f"no record at byte {position}")
        magic, lrec = PART_HEADER.unpack_from(view, position)
        if magic != MAGIC:
            raise RecordError(f"bad magic 0x{magic:08x} at byte {position} (expected 0x{MAGIC:08x})")
        length, cflag = lrec & LENGTH_MASK, lrec >> LENGTH_BITS
        if cflag > LAST or (cflag in (WHOLE, FIRST)) != (not parts):
            raise RecordError(f"part at byte {position} has continuation flag {cflag} "
                              + ("inside a split record" if parts else "but starts a record"))
        begin = position + PART_HEADER.size
        if begin + length > len(view):
            raise RecordError(f"part at byte {position} claims {length} bytes, past the end ({len(view)})")
        parts.append(view[begin:begin + length])
        position = begin + padded(length)
        if cflag in (WHOLE, LAST):
            return MAGIC_BYTES.join(parts) if len(parts) > 1 else bytes(parts[0]), min(position, len(view))


def next_record(handle: BinaryIO, offset: int, size: int) -> int:
    """Offset just past the record starting at `offset`, reading only its part headers."""
    position = offset
    first = True
    while True:
        handle.seek(position)
        header = handle.read(PART_HEADER.size)
        if len(header) < PART_HEADER.size:
            raise RecordError(f"ends inside a part header at byte {position}")
        magic, lrec = PART_HEADER.unpack(header)
        if magic != MAGIC:
            raise RecordError(f"bad magic 0x{magic:08x} at byte {position} (expected 0x{MAGIC:08x})")
        length, cflag = lrec & LENGTH_MASK, lrec >> LENGTH_BITS
        if cflag > LAST or (cflag in (WHOLE, FIRST)) != first:
            raise RecordError(f"part at byte {position} has continuation flag {cflag} "
                              + ("but starts a record" if first else "inside a split record"))
        end = position + PART_HEADER.size + length
        if end > size:
            raise RecordError(f"part at byte {position} claims {length} bytes, past the end ({size})")
        position = min(position + PART_HEADER.size + padded(length), size)
        first = False
        if cflag in (WHOLE, LAST):
            return position


def record_ranges(handle: BinaryIO, size: int) -> Iterator[tuple[int, int]]:
    """(offset, length) of every record, in file order: one pass over the part headers.
    A RecordError stops it: past a bad header no record boundary can be trusted."""
    offset = 0
    while offset < size:
        end = next_record(handle, offset, size)
        yield offset, end - offset
        offset = end


@dataclass(frozen=True)
class ImageRecord:
    """A payload unpacked: the image header, the label array (flag > 0) and the image bytes."""

    flag: int
    label: float
    id: int
    id2: int
    labels: tuple[float, ...]
    image: bytes

    @property
    def class_label(self) -> float:
        return self.labels[0] if self.labels else self.label


def unpack(payload: bytes) -> ImageRecord:
    """mxnet.recordio.unpack, without MXNet."""
    if len(payload) < IMAGE_HEADER.size:
        raise RecordError(f"payload of {len(payload)} bytes is shorter than the {IMAGE_HEADER.size}-byte image header")
    flag, label, id_, id2 = IMAGE_HEADER.unpack_from(payload)
    start = IMAGE_HEADER.size + 4 * flag
    if start > len(payload):
        raise RecordError(f"header says {flag} labels follow, but the payload has only {len(payload)} bytes")
    labels = struct.unpack_from(f"<{flag}f", payload, IMAGE_HEADER.size) if flag else ()
    return ImageRecord(flag, label, id_, id2, labels, payload[start:])


def read_index(path: str, size: int, rec_name: str) -> tuple[list[tuple[int, int]], list[str]]:
    """The `.idx` beside a `.rec`: (key, offset) pairs in file order, and the problems found
    (an offset outside the file, a malformed line): each a reject naming the line."""
    entries: list[tuple[int, int]] = []
    problems: list[str] = []
    name = os.path.basename(path)
    with open(path, encoding="ascii", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            fields = line.split()
            if not fields:
                continue
            try:
                key, offset = int(fields[0]), int(fields[1])
                if len(fields) != 2:
                    raise ValueError
            except (ValueError, IndexError):
                problems.append(f"{name} line {number}: not 'key<TAB>offset': {line.strip()[:60]!r}")
                continue
            if not 0 <= offset < size:
                problems.append(f"{name} line {number}: record {key} at byte {offset} is outside {rec_name} "
                                f"({size} bytes)")
                continue
            entries.append((key, offset))
    entries.sort(key=lambda entry: entry[1])
    for (key, offset), (other, following) in zip(entries, entries[1:]):
        if offset == following:
            problems.append(f"{name}: records {key} and {other} both at byte {offset}")
    seen: set[int] = set()
    unique = []
    for key, offset in entries:
        if offset not in seen:
            seen.add(offset)
            unique.append((key, offset))
    return unique, problems
