"""Writers of MXNet RecordIO and TFRecord files for tests, following the formats' own writers
(dmlc-core recordio, mxnet.recordio.pack, TensorFlow's record writer and Example protos), so the
packer's readers are checked against files laid out as the real tools lay them out."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Iterable, Sequence

import google_crc32c

RECORDIO_MAGIC = struct.pack("<I", 0xCED7230A)


def recordio_payload(image: bytes, label: float | Sequence[float] = 0.0, id: int = 0, id2: int = 0) -> bytes:
    """mxnet.recordio.pack: a scalar label goes in the header (flag 0); a sequence becomes
    `flag` float32 labels after it (header label 0)."""
    if isinstance(label, (int, float)):
        return struct.pack("<IfQQ", 0, float(label), id, id2) + image
    return struct.pack("<IfQQ", len(label), 0.0, id, id2) + struct.pack(f"<{len(label)}f", *label) + image


def recordio_parts(data: bytes) -> list[tuple[int, bytes]]:
    """(cflag, part) as dmlc's writer splits a record: at every 4-aligned MAGIC, which it drops."""
    cuts = [position for position in range(0, len(data) - 3, 4) if data[position:position + 4] == RECORDIO_MAGIC]
    if not cuts:
        return [(0, data)]
    parts, start = [], 0
    for number, cut in enumerate(cuts):
        parts.append((1 if number == 0 else 2, data[start:cut]))
        start = cut + 4
    return parts + [(3, data[start:])]


def write_recordio(path: Path, payloads: Iterable[bytes], *, index: bool = True) -> list[int]:
    """Write a .rec (and its .idx: `key\\toffset`, keys 0, 1, ...); returns every record's offset."""
    offsets = []
    with open(path, "wb") as handle:
        for payload in payloads:
            offsets.append(handle.tell())
            for cflag, part in recordio_parts(payload):
                handle.write(RECORDIO_MAGIC + struct.pack("<I", (cflag << 29) | len(part)) + part)
                handle.write(b"\0" * (-len(part) % 4))
    if index:
        path.with_suffix(".idx").write_text("".join(f"{key}\t{offset}\n" for key, offset in enumerate(offsets)))
    return offsets


def insightface_payloads(images: Sequence[bytes], identities: Sequence[int]) -> list[bytes]:
    """insightface's layout: a header record (flag 2, labels (one past the last image record,
    one past the last identity record)), the images (flag 0, label the identity), then one
    record per identity (labels: its image record range), without image."""
    first_identity = len(images) + 1
    header = recordio_payload(b"", [float(first_identity), float(first_identity + len(set(identities)))])
    records = [recordio_payload(image, float(identity), id=key)
               for key, (image, identity) in enumerate(zip(images, identities), 1)]
    ranges = []
    for identity in sorted(set(identities)):
        keys = [key for key, value in enumerate(identities, 1) if value == identity]
        ranges.append(recordio_payload(b"", [float(keys[0]), float(keys[-1] + 1)]))
    return [header, *records, *ranges]


# TFRecord: framing, and the Example protobuf's wire format (field numbers from example.proto/feature.proto).

def masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64: ten bytes of two's complement, as protobuf writes them
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def delimited(number: int, data: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(data)) + data


def feature(value: Any) -> bytes:
    """A Feature: bytes/str -> bytes_list, int -> int64_list, float -> float_list; lists of them too."""
    values = value if isinstance(value, list) else [value]
    if all(isinstance(item, (bytes, str)) for item in values) and values:
        items = b"".join(delimited(1, item.encode() if isinstance(item, str) else item) for item in values)
        return delimited(1, items)
    if all(isinstance(item, int) for item in values):
        return delimited(3, delimited(1, b"".join(varint(item) for item in values)))  # packed
    return delimited(2, delimited(1, struct.pack(f"<{len(values)}f", *values)))  # packed


def example(features: dict[str, Any]) -> bytes:
    entries = b"".join(delimited(1, delimited(1, key.encode()) + delimited(2, feature(value)))
                       for key, value in features.items())
    return delimited(1, entries)


def write_tfrecord(path: Path, records: Iterable[bytes], *, bad_crc: Sequence[int] = (), index: bool = False) -> list[int]:
    """Write records (u64 length, masked crc32c of it, data, masked crc32c of the data); records
    whose position is in `bad_crc` get a wrong data CRC. With `index`, a `.tfindex` beside it."""
    offsets, lengths = [], []
    with open(path, "wb") as handle:
        for position, data in enumerate(records):
            offsets.append(handle.tell())
            length = struct.pack("<Q", len(data))
            crc = masked_crc(data) ^ (1 if position in bad_crc else 0)
            handle.write(length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", crc))
            lengths.append(handle.tell() - offsets[-1])
    if index:
        Path(f"{path}.tfindex").write_text("".join(f"{offset} {length}\n" for offset, length in zip(offsets, lengths)))
    return offsets
