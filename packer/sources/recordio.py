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

import itertools
import logging
import math
import os
import struct
from array import array
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, BinaryIO, Iterator

from readers.fields import FieldSpec, encode_value

from ..errors import RejectedFile
from .classes import read_classes
from .inputs import Record, RecordError, ShardPlan, Source, fsspec_errors, is_file
from .ranges import InputFiles, RangeFile, index_lines
from .listing import UNLABELLED, Listing, ScanError

if TYPE_CHECKING:
    from ..plan.options import PackOptions

log = logging.getLogger(__name__)

MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack("<I", MAGIC)
PART_HEADER = struct.Struct("<II")
IMAGE_HEADER = struct.Struct("<IfQQ")
LENGTH_BITS = 29
LENGTH_MASK = (1 << LENGTH_BITS) - 1
WHOLE, FIRST, MIDDLE, LAST = range(4)
LABEL_ARRAY_FIELD = "label_array"
HEAD_BYTES = 256
"""What a reader thread reads first of a record: the part and image headers and any label array."""


def padded(length: int) -> int:
    return (length + 3) & ~3


def join_parts(data: bytes | memoryview, base: int = 0) -> tuple[bytes | memoryview, int]:
    """The record at the start of `data` (read at byte `base` of its file, which messages name):
    (its payload, the offset just past it, padding included). Split parts are joined with MAGIC
    put back between them; a whole record's payload is a view of `data`, not a copy (`unpack`
    copies the image out once)."""
    view = memoryview(data)
    parts: list[memoryview] = []
    position = 0
    while True:
        length, cflag = check_part(view[position:position + PART_HEADER.size], base + position, first=not parts)
        begin = position + PART_HEADER.size
        if begin + length > len(view):
            raise RecordError(f"part at byte {base + position} claims {length} bytes, past the end of the record "
                              f"(byte {base + len(view)})")
        parts.append(view[begin:begin + length])
        position = begin + padded(length)
        if cflag in (WHOLE, LAST):
            return MAGIC_BYTES.join(parts) if len(parts) > 1 else parts[0], min(position, len(view))


def check_part(header: bytes | memoryview, at: int, *, first: bool) -> tuple[int, int]:
    """(length, cflag) of the part header read at byte `at`: a RecordError when it is cut short,
    has another magic, or a continuation flag out of turn (`first`: it must start a record)."""
    if len(header) < PART_HEADER.size:
        raise RecordError(f"ends inside a part header at byte {at}")
    magic, lrec = PART_HEADER.unpack_from(header)
    if magic != MAGIC:
        raise RecordError(f"bad magic 0x{magic:08x} at byte {at} (expected 0x{MAGIC:08x})")
    length, cflag = lrec & LENGTH_MASK, lrec >> LENGTH_BITS
    if cflag > LAST or (cflag in (WHOLE, FIRST)) != first:
        raise RecordError(f"part at byte {at} has continuation flag {cflag} "
                          + ("but starts a record" if first else "inside a split record"))
    return length, cflag


def whole_record(head: bytes, length: int) -> tuple[int, int] | None:
    """Where the image of a record read `length` bytes long lies, from its first HEAD_BYTES: (start,
    end) within the record, when it is one part that fills the range and its labels are in `head`;
    None otherwise (a split or damaged record: read it whole, and let `join_parts` say what is wrong)."""
    if len(head) < PART_HEADER.size + IMAGE_HEADER.size:
        return None
    magic, lrec = PART_HEADER.unpack_from(head)
    size, cflag = lrec & LENGTH_MASK, lrec >> LENGTH_BITS
    start = PART_HEADER.size + IMAGE_HEADER.size + 4 * IMAGE_HEADER.unpack_from(head, PART_HEADER.size)[0]
    end = PART_HEADER.size + size
    if magic != MAGIC or cflag != WHOLE or end > length or min(PART_HEADER.size + padded(size), length) != length \
            or start > min(end, len(head)):
        return None
    return start, end


def next_record(handle: BinaryIO, offset: int, size: int) -> int:
    """Offset just past the record starting at `offset`, reading only its part headers."""
    position = offset
    first = True
    while True:
        handle.seek(position)
        length, cflag = check_part(handle.read(PART_HEADER.size), position, first=first)
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


def unpack(payload: bytes | memoryview) -> ImageRecord:
    """mxnet.recordio.unpack, without MXNet; the image comes out as bytes of its own."""
    if len(payload) < IMAGE_HEADER.size:
        raise RecordError(f"payload of {len(payload)} bytes is shorter than the {IMAGE_HEADER.size}-byte image header")
    flag, label, id_, id2 = IMAGE_HEADER.unpack_from(payload)
    start = IMAGE_HEADER.size + 4 * flag
    if start > len(payload):
        raise RecordError(f"header says {flag} labels follow, but the payload has only {len(payload)} bytes")
    labels = struct.unpack_from(f"<{flag}f", payload, IMAGE_HEADER.size) if flag else ()
    return ImageRecord(flag, label, id_, id2, labels, bytes(payload[start:]))


WIDTH_PROBES = 64
"""Image records tried, from the first, for the label-array length every record must have."""


def read_index(path: str, size: int, rec_name: str) -> tuple[tuple[array, array], list[str]]:
    """The `.idx` beside a `.rec`: keys and offsets in file order (arrays: at millions of records,
    tuples would cost a few hundred bytes each), and the problems found (an offset outside the
    file, a malformed line, two keys at one offset): each a reject naming the line."""
    keys, offsets = array("q"), array("q")
    problems: list[str] = []
    name = os.path.basename(path)
    for number, values, line in index_lines(path):
        if values is None:
            problems.append(f"{name} line {number}: not 'key<TAB>offset': {line.strip()[:60]!r}")
            continue
        key, offset = values
        if not -2**63 <= key < 2**63:
            problems.append(f"{name} line {number}: key {str(key)[:30]} does not fit in 64 bits")
            continue
        if not 0 <= offset < size:
            problems.append(f"{name} line {number}: record {key} at byte {offset} is outside {rec_name} "
                            f"({size} bytes)")
            continue
        keys.append(key)
        offsets.append(offset)
    if any(offset > following for offset, following in zip(offsets, offsets[1:])):  # not in file order: sort
        order = sorted(range(len(offsets)), key=offsets.__getitem__)
        keys, offsets = array("q", (keys[i] for i in order)), array("q", (offsets[i] for i in order))
    unique_keys, unique_offsets = array("q"), array("q")
    previous: tuple[int, int] | None = None
    for key, offset in zip(keys, offsets):
        if previous is not None and previous[1] == offset:
            problems.append(f"{name}: records {previous[0]} and {key} both at byte {offset}")
        else:
            unique_keys.append(key)
            unique_offsets.append(offset)
        previous = key, offset
    return (unique_keys, unique_offsets), problems


def index_path(path: str) -> str:
    """`train.rec` -> `train.idx`, where im2rec and insightface put the index."""
    return os.path.splitext(path)[0] + ".idx"


def scan(source: Source, options: PackOptions) -> Listing:
    """The image records of every `.rec` in `source.inputs`, in file order, from their `.idx` or
    one pass over the part headers; labels are read with each sample."""
    listing = Listing(root=source.root, classes=read_classes(options.classes) if options.classes else [],
                      locations=array("q"))
    widths: dict[int, str] = {}  # label-array length -> the file that has it
    for number, path in enumerate(source.inputs):
        name = os.path.relpath(path, source.root)
        width = scan_file(listing, number, path, name)
        if width is not None:
            widths.setdefault(width, name)
    if len(widths) > 1:
        raise ScanError("; ".join(f"{name}: {width} labels per record" for width, name in widths.items())
                        + ": every input must have label arrays of one length")
    width = next(iter(widths), 0)
    if width:
        listing.fields = [FieldSpec(LABEL_ARRAY_FIELD, "array", dtype="float32", shape=(width,))]
    log.info("scanned %d RecordIO files under %s: %d samples, %d rejected", len(source.inputs), source.root,
             len(listing), len(listing.rejects))
    return listing


def scan_file(listing: Listing, number: int, path: str, name: str) -> int | None:
    """List one file's image records; returns its label-array length (None: no image record read)."""
    try:
        with RangeFile(path) as file, fsspec_errors():
            handle, size = file.stream(), file.size
            keys, offsets, lengths = list_records(listing, handle, path, name, size)
            if not keys:
                return None
            first = _unpack_at(handle, offsets[0], lengths[0])
            header = (first is not None and first.flag > 0 and not first.image  # insightface's header record
                      and math.isfinite(first.labels[0]))
            end = int(first.labels[0]) if header and first is not None else None

            def images() -> Iterator[int]:
                """Positions of the image records: after an insightface header, those before its end."""
                for position in range(1 if header else 0, len(keys)):
                    if end is None or keys[position] < end:
                        yield position

            probes = [record for position in itertools.islice(images(), WIDTH_PROBES)
                      if (record := _unpack_at(handle, offsets[position], lengths[position])) is not None]
            # From the first record that will be packed: a rejected one must not decide the layout of the rest.
            found = next((record for record in probes if packing_problem(record) is None),
                         next((record for record in probes if record.image), None))
            width = found.flag if found is not None else None
    except OSError as exc:
        raise ScanError(f"{path}: cannot read ({exc.strerror or exc})") from None
    assert listing.locations is not None
    count = 0
    for position in images():
        listing.paths.append(f"{name}/{keys[position]}")
        listing.labels.append(UNLABELLED)  # read with the sample
        listing.sizes.append(lengths[position])
        listing.locations.extend((number, offsets[position], lengths[position]))
        count += 1
    if header:
        listing.ignored_other += len(keys) - 1 - count  # identity records: not samples
    return width


def list_records(listing: Listing, handle: BinaryIO, path: str, name: str, size: int) -> tuple[array, array, array]:
    """Keys, offsets and lengths of every record: from the .idx (keys as it gives them), else from
    one pass over the part headers (keys 0, 1, ... in file order). Bad entries become rejects."""
    idx = index_path(path)
    if is_file(idx):
        (keys, offsets), problems = read_index(idx, size, name)
        listing.rejects += [(name, problem) for problem in problems]
        ends = itertools.chain(itertools.islice(offsets, 1, None), [size])
        return keys, offsets, array("q", (end - offset for offset, end in zip(offsets, ends)))
    keys, offsets, lengths = array("q"), array("q"), array("q")
    try:
        for key, (offset, length) in enumerate(record_ranges(handle, size)):
            keys.append(key)
            offsets.append(offset)
            lengths.append(length)
    except RecordError as exc:
        listing.rejects.append((f"{name}/{len(keys)}", f"{exc}: the rest of {name} cannot be read"))
    return keys, offsets, lengths


def _unpack_at(handle: BinaryIO, offset: int, length: int) -> ImageRecord | None:
    """The record at `offset`, or None when it is damaged (its reject comes when it is packed)."""
    handle.seek(offset)
    try:
        return unpack(join_parts(handle.read(length), offset)[0])
    except RecordError:
        return None


def packing_problem(record: ImageRecord) -> str | None:
    """Why this record cannot be a sample whatever the file's label-array length; None if it can."""
    if not record.image:
        return "no image bytes after its header"
    label = record.class_label
    if not math.isfinite(label) or label < 0 or label != int(label):
        return f"label {label} is not a class index (a whole number >= 0)"
    return None


class RecordIOReader:
    """Reads one record's byte range and unpacks its label, label array and image."""

    def __init__(self, plan: ShardPlan) -> None:
        self.files = InputFiles(plan.inputs)
        self.spec = next((spec for spec in plan.fields if spec.name == LABEL_ARRAY_FIELD), None)
        self.width = self.spec.shape[0] if self.spec is not None and self.spec.shape else 0

    def __call__(self, input: int, offset: int, length: int) -> Record:
        head = self.files.read(input, offset, min(length, HEAD_BYTES))
        whole = whole_record(head, length)
        if whole is not None:  # the usual record: read its image alone, as a file's bytes would be
            start, end = whole
            image = self.files.read(input, offset + start, end - start)
            if len(image) == end - start:
                return self.sample(replace(unpack(head[PART_HEADER.size:start]), image=image), offset)
        data = self.files.read(input, offset, length)
        try:
            if len(data) < length:
                raise RecordError(f"the file ends at byte {offset + len(data)}, before the record does "
                                  "(shorter than when it was scanned)")
            payload, end = join_parts(data, offset)
            if end != length:
                raise RecordError(f"the record ends at byte {offset + end}, but the next one should start at byte "
                                  f"{offset + length} (the .idx disagrees with the .rec)")
            record = unpack(payload)
        except RecordError as exc:
            raise RejectedFile(f"record at byte {offset}: {exc}") from None
        return self.sample(record, offset)

    def sample(self, record: ImageRecord, offset: int) -> Record:
        problem = packing_problem(record)
        if problem is None and record.flag != self.width:
            problem = f"{record.flag} labels, where the first packable image record has {self.width}"
        if problem is not None:
            raise RejectedFile(f"record at byte {offset}: {problem}")
        label = record.class_label
        fields = {}
        if self.spec is not None:
            fields[LABEL_ARRAY_FIELD] = encode_value(self.spec, list(record.labels))
        return Record(image=record.image, label=int(label), fields=fields)

    def close(self) -> None:
        self.files.close()


def open_reader(plan: ShardPlan) -> RecordIOReader:
    return RecordIOReader(plan)
