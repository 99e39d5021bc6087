"""TFRecord files of `tf.train.Example` (ImageNet as TPU users keep it), read by our own code:
no TensorFlow, no protobuf.

Framing: per record `u64 length`, `u32 masked crc32c(length)`, the data, `u32 masked
crc32c(data)`; both CRCs are checked (a bad one rejects that record, named). The data is an
Example: `features` (field 1) is a map of name -> Feature, each a bytes, float or int64 list
(fields 1, 2, 3), decoded here from the protobuf wire format.

Which feature is what: `--image-key` (default `image/encoded`) is the image, `--label-key`
(default `image/class/label`) the label, plus `--label-offset` (-1 for ImageNet's 1-based
labels). Every other feature becomes a field named after it with every character other than a
letter, digit or `_` replaced by `_` (`image/class/text` -> `image_class_text`). Its type comes
from the first records (`SCHEMA_RECORDS`): a feature holding exactly one value in each of them
is a scalar (`int`, `float`, or `str` for UTF-8 bytes), any other an array (`int64` or
`float32`, of varying length) or, for bytes, a `json` list of strings. A feature that is not
always there is optional. Binary bytes (not UTF-8: a second image, a mask) fit no field type
and are left out (logged). A later record that does not fit (a scalar with two values, a
missing required feature) is a reject naming the feature.

A `.tfindex` beside a file (`offset length` lines, the `tfrecord` package's index) is used to
plan without reading the file; without one the scan hops from record header to record header.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from array import array
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator

import google_crc32c

from readers.fields import FieldSpec, check_field_name, encode_value

from ..errors import RejectedFile
from ..plan.options import PackOptions
from .classes import read_classes
from .inputs import Record, RecordError, ShardPlan, Source, fsspec_errors, is_file
from .ranges import InputFiles, RangeFile, index_lines
from .listing import UNLABELLED, Listing, ScanError

log = logging.getLogger(__name__)

LENGTH = struct.Struct("<Q")
CRC = struct.Struct("<I")
HEADER_BYTES = LENGTH.size + CRC.size
FOOTER_BYTES = CRC.size
OVERHEAD = HEADER_BYTES + FOOTER_BYTES
INDEX_SUFFIX = ".tfindex"
BYTES, FLOATS, INTS = "bytes", "float", "int64"
_KINDS = {1: BYTES, 2: FLOATS, 3: INTS}
_NOT_NAME = re.compile(r"[^A-Za-z0-9_]")
SCHEMA_RECORDS = 64
"""How many records (from the start of the first file) decide the fields' types."""

Feature = tuple[str, list]  # (kind, values): bytes values, floats or ints


def masked_crc32c(data: bytes | memoryview) -> int:
    """TFRecord's masked CRC-32C, so a CRC of data that holds CRCs stays well distributed."""
    crc = google_crc32c.value(bytes(data)) if isinstance(data, memoryview) else google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def check_header(header: bytes, offset: int) -> int:
    """The data length a record header gives, once its CRC agrees."""
    if len(header) < HEADER_BYTES:
        raise RecordError(f"ends inside the record header at byte {offset}")
    length, crc = LENGTH.unpack_from(header), CRC.unpack_from(header, LENGTH.size)
    if masked_crc32c(header[:LENGTH.size]) != crc[0]:
        raise RecordError(f"bad length CRC at byte {offset} (damaged, or not a TFRecord file)")
    return length[0]


def record_data(data: bytes, offset: int) -> memoryview:
    """The checked data of the record `data` holds whole (header, data, footer), read at `offset`."""
    length = check_header(data[:HEADER_BYTES], offset)
    if HEADER_BYTES + length + FOOTER_BYTES != len(data):
        raise RecordError(f"record at byte {offset} is {length + OVERHEAD} bytes, but {len(data)} were expected "
                          "(the file changed since the scan, or its index disagrees with it)")
    view = memoryview(data)[HEADER_BYTES:HEADER_BYTES + length]
    (crc,) = CRC.unpack_from(data, HEADER_BYTES + length)
    if masked_crc32c(view) != crc:
        raise RecordError(f"bad data CRC in the record at byte {offset}")
    return view


def record_ranges(handle: BinaryIO, size: int) -> Iterator[tuple[int, int]]:
    """(offset, length) of every record, headers only; a RecordError stops it (no boundary past it)."""
    offset = 0
    while offset < size:
        handle.seek(offset)
        length = check_header(handle.read(HEADER_BYTES), offset)
        end = offset + length + OVERHEAD
        if end > size:
            raise RecordError(f"record at byte {offset} claims {length} bytes, past the end ({size})")
        yield offset, end - offset
        offset = end


def read_index(path: str, size: int, name: str) -> tuple[array, array]:
    """A `.tfindex`'s offsets and lengths (arrays: a tuple a record costs ~120 bytes, GBs at
    ImageNet's 1.28M records); one outside the file is an error naming the line."""
    offsets, lengths = array("q"), array("q")
    for number, values, line in index_lines(path):
        if values is None:
            raise RecordError(f"{path} line {number}: not 'offset length': {line.strip()[:60]!r}")
        offset, length = values
        if offset < 0 or length < OVERHEAD or offset + length > size:
            raise RecordError(f"{path} line {number}: record at byte {offset} of {length} bytes is outside "
                              f"{name} ({size} bytes)")
        offsets.append(offset)
        lengths.append(length)
    return offsets, lengths


def index_path(path: str) -> str | None:
    """The `.tfindex` beside a record file: `train.tfrecord.tfindex` or `train.tfindex`."""
    for candidate in (path + INDEX_SUFFIX, os.path.splitext(path)[0] + INDEX_SUFFIX):
        if is_file(candidate):
            return candidate
    return None


# The protobuf wire format, as much as Example needs.

def _varint(data: memoryview, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if position >= len(data):
            raise RecordError("truncated varint")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
        if shift >= 70:
            raise RecordError("varint longer than 10 bytes")


def _fields(data: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of a message: an int for varints and fixed words, a
    view for length-delimited values."""
    position = 0
    while position < len(data):
        key, position = _varint(data, position)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, position = _varint(data, position)
            yield number, wire, value
        elif wire == 2:
            length, position = _varint(data, position)
            if position + length > len(data):
                raise RecordError("a length-delimited value runs past its message")
            yield number, wire, data[position:position + length]
            position += length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if position + width > len(data):
                raise RecordError("truncated fixed-width value")
            yield number, wire, int.from_bytes(data[position:position + width], "little")
            position += width
        else:
            raise RecordError(f"unsupported protobuf wire type {wire}")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _feature(data: memoryview) -> Feature:
    kind, values = BYTES, []  # a Feature with no list set is an empty one
    for number, wire, value in _fields(data):
        if number not in _KINDS or wire != 2:
            continue
        kind, values = _KINDS[number], []
        assert isinstance(value, memoryview)
        for item, item_wire, item_value in _fields(value):
            if item != 1:
                continue
            if kind == BYTES and item_wire == 2:
                values.append(bytes(item_value))  # type: ignore[arg-type]
            elif kind == INTS and item_wire == 0:
                values.append(_signed(item_value))  # type: ignore[arg-type]
            elif kind == INTS and item_wire == 2:  # packed
                packed, position = item_value, 0
                assert isinstance(packed, memoryview)
                while position < len(packed):
                    number_value, position = _varint(packed, position)
                    values.append(_signed(number_value))
            elif kind == FLOATS and item_wire == 5:
                values.append(struct.unpack("<f", struct.pack("<I", item_value))[0])  # type: ignore[arg-type]
            elif kind == FLOATS and item_wire == 2:  # packed
                packed = item_value
                assert isinstance(packed, memoryview)
                if len(packed) % 4:
                    raise RecordError("a packed float list whose length is not a multiple of 4")
                values.extend(struct.unpack(f"<{len(packed) // 4}f", packed))
            else:
                raise RecordError(f"a {kind} list item of wire type {item_wire}")
    return kind, values


def parse_example(data: bytes | memoryview) -> dict[str, Feature]:
    """A serialized tf.train.Example -> {feature name: (kind, values)}."""
    features: dict[str, Feature] = {}
    for number, wire, value in _fields(memoryview(data)):
        if number != 1 or wire != 2:
            continue
        assert isinstance(value, memoryview)
        for entry_number, entry_wire, entry in _fields(value):
            if entry_number != 1 or entry_wire != 2:
                continue
            assert isinstance(entry, memoryview)
            key, feature = None, (BYTES, [])
            for part, part_wire, part_value in _fields(entry):
                if part == 1 and part_wire == 2:
                    try:
                        key = bytes(part_value).decode("utf-8")  # type: ignore[arg-type]
                    except UnicodeDecodeError:
                        raise RecordError("a feature name that is not UTF-8") from None
                elif part == 2 and part_wire == 2:
                    feature = _feature(part_value)  # type: ignore[arg-type]
            if key is not None:
                features[key] = feature
    return features


def field_name(feature: str) -> str:
    """`image/class/text` -> `image_class_text`: a feature's name as a field name (a reserved
    name, such as `label`, gets a trailing `_`)."""
    name = _NOT_NAME.sub("_", feature).strip("_") or "feature"
    return name + "_" if check_field_name(name) and not check_field_name(name + "_") else name


def scan(source: Source, options: PackOptions) -> Listing:
    """The records of every file in `source.inputs`, in file order, from their `.tfindex` or one
    pass over the record headers; the first records decide the fields."""
    listing = Listing(root=source.root, classes=read_classes(options.classes) if options.classes else [],
                      locations=array("q"))
    assert listing.locations is not None
    for number, path in enumerate(source.inputs):
        name = os.path.relpath(path, source.root)
        for position, (offset, length) in enumerate(zip(*file_ranges(listing, path, name))):
            listing.paths.append(f"{name}/{position}")
            listing.labels.append(UNLABELLED)  # read with the sample
            listing.sizes.append(length)
            listing.locations.extend((number, offset, length))
    listing.fields = infer_fields(listing, options, list(source.inputs))
    log.info("scanned %d TFRecord files under %s: %d samples, %d rejected", len(source.inputs), source.root,
             len(listing), len(listing.rejects))
    return listing


def file_ranges(listing: Listing, path: str, name: str) -> tuple[array, array]:
    """Offsets and lengths of a file's records, from its `.tfindex` or one pass over the headers."""
    try:
        offsets, lengths = array("q"), array("q")
        with RangeFile(path) as file, fsspec_errors():
            index = index_path(path)
            if index is not None:
                try:
                    return read_index(index, file.size, name)
                except RecordError as exc:
                    raise ScanError(str(exc)) from None
            try:
                for offset, length in record_ranges(file.stream(), file.size):
                    offsets.append(offset)
                    lengths.append(length)
            except RecordError as exc:
                listing.rejects.append((f"{name}/{len(offsets)}", f"{exc}: the rest of {name} cannot be read"))
        return offsets, lengths
    except OSError as exc:
        raise ScanError(f"{path}: cannot read ({exc.strerror or exc})") from None


@dataclass
class _Seen:
    kind: str
    empty_only: bool = True
    records: int = 0
    scalar: bool = True
    text: bool = True


def infer_fields(listing: Listing, options: PackOptions, inputs: list[str]) -> list[FieldSpec]:
    """The fields, typed from the first SCHEMA_RECORDS readable records (see the module's docstring)."""
    assert listing.locations is not None
    seen: dict[str, _Seen] = {}
    read = 0
    files = InputFiles(inputs)
    try:
        for position in range(min(len(listing), SCHEMA_RECORDS)):
            input, offset, length = listing.locations[3 * position:3 * position + 3]
            try:
                features = parse_example(record_data(files.read(input, offset, length), offset))
            except (RecordError, RejectedFile):
                continue  # its reject comes when it is packed
            read += 1
            for key, (kind, values) in features.items():
                if key in (options.image_key, options.label_key):
                    continue
                entry = seen.setdefault(key, _Seen(kind))
                if values and entry.empty_only:  # an empty list's kind says nothing: writers pick any
                    entry.kind, entry.empty_only = kind, False
                entry.records += 1
                entry.scalar &= len(values) == 1 and (entry.kind == kind or not values)
                entry.text &= kind != BYTES or all(_is_text(value) for value in values)
    finally:
        files.close()
    specs: dict[str, FieldSpec] = {}
    for key, entry in sorted(seen.items()):
        if entry.kind == BYTES and not entry.text:
            log.warning("feature %r holds binary bytes, which no field type stores: left out", key)
            continue
        name = field_name(key)
        problem = check_field_name(name)
        if problem or name in specs:
            raise ScanError(f"{inputs[0]}: feature {key!r} cannot be "
                            f"field {name!r}: " + (problem or "another feature has that name"))
        optional = entry.records < read
        if entry.kind == BYTES:
            specs[name] = FieldSpec(name, "str" if entry.scalar else "json", optional)
        elif entry.scalar:
            specs[name] = FieldSpec(name, "int" if entry.kind == INTS else "float", optional)
        else:
            specs[name] = FieldSpec(name, "array", optional, "int64" if entry.kind == INTS else "float32")
    return list(specs.values())


def _is_text(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class TFRecordReader:
    """Reads one record's byte range, checks both CRCs and takes image, label and fields out of its Example."""

    def __init__(self, plan: ShardPlan) -> None:
        self.files = InputFiles(plan.inputs)
        self.image_key, self.label_key = plan.options.image_key, plan.options.label_key
        self.label_offset = plan.options.label_offset
        self.specs = {spec.name: spec for spec in plan.fields}

    def __call__(self, input: int, offset: int, length: int) -> Record:
        data = self.files.read(input, offset, length)
        try:
            features = parse_example(record_data(data, offset))
        except RecordError as exc:
            raise RejectedFile(f"record at byte {offset}: {exc}") from None
        image = features.pop(self.image_key, None)
        if image is None or image[0] != BYTES or len(image[1]) != 1:
            what = "no" if image is None else f"a {image[0]} list of {len(image[1])} values as its"
            raise RejectedFile(f"record at byte {offset}: {what} {self.image_key} feature (--image-key)")
        label = self._label(features.pop(self.label_key, None), offset)
        fields: dict[str, bytes] = {}
        present = set()
        for key, (kind, values) in features.items():
            spec = self.specs.get(field_name(key))
            if spec is None:
                continue  # not in the first records: not a field
            present.add(spec.name)
            value = self._value(spec, key, kind, values, offset)
            if value is not None:
                fields[spec.name] = encode_value(spec, value)
        missing = [name for name, spec in self.specs.items() if name not in present and not spec.optional]
        if missing:
            raise RejectedFile(f"record at byte {offset}: no feature for field {missing[0]!r}, which the first "
                               "records all have")
        return Record(image=image[1][0], label=label, fields=fields)

    def _label(self, feature: Feature | None, offset: int) -> int:
        if feature is None:
            return UNLABELLED
        kind, values = feature
        if kind != INTS or len(values) != 1:
            raise RejectedFile(f"record at byte {offset}: {self.label_key} is a {kind} list of {len(values)} values, "
                               "not one integer (--label-key)")
        label = values[0] + self.label_offset
        if label < 0:
            raise RejectedFile(f"record at byte {offset}: label {values[0]} + --label-offset {self.label_offset} "
                               "is negative")
        return label

    @staticmethod
    def _value(spec: FieldSpec, key: str, kind: str, values: list, offset: int) -> Any:
        expected = {"str": BYTES, "json": BYTES, "int": INTS, "float": FLOATS}.get(
            spec.type, INTS if spec.dtype == "int64" else FLOATS)
        if kind != expected and values:  # an empty list of any kind is an empty list
            raise RejectedFile(f"record at byte {offset}: feature {key!r} is a {kind} list, where the first records "
                               f"have a {expected} list")
        if spec.type in ("str", "int", "float"):
            if not values and spec.optional:
                return None
            if len(values) != 1:
                raise RejectedFile(f"record at byte {offset}: feature {key!r} has {len(values)} values, where the "
                                   "first records have one")
        if kind == BYTES:
            try:
                texts = [value.decode("utf-8") for value in values]
            except UnicodeDecodeError:
                raise RejectedFile(f"record at byte {offset}: feature {key!r} is not UTF-8 text") from None
            return texts[0] if spec.type == "str" else texts
        return values[0] if spec.type in ("int", "float") else values

    def close(self) -> None:
        self.files.close()


def open_reader(plan: ShardPlan) -> TFRecordReader:
    return TFRecordReader(plan)
