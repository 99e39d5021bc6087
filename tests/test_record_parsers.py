"""The RecordIO and TFRecord parsers against files the test writers lay out as MXNet and TensorFlow do."""

from __future__ import annotations

import random
import struct

import pytest

from imagefolders import image_bytes
from packer.sources import recordio, tfrecord
from recordfiles import (
    RECORDIO_MAGIC,
    example,
    insightface_payloads,
    recordio_parts,
    recordio_payload,
    write_recordio,
    write_tfrecord,
)


def magic_inside(rng: random.Random) -> bytes:
    """A JPEG with the RecordIO magic at two 4-aligned places of its payload: a writer splits it."""
    image = image_bytes(rng)
    return image + b"\0" * (-len(image) % 4) + RECORDIO_MAGIC + b"abcd" + RECORDIO_MAGIC + b"tail"


def test_split_records_are_joined_with_the_magic_put_back(tmp_path):
    rng = random.Random(0)
    payloads = [recordio_payload(image_bytes(rng), 3.0), recordio_payload(magic_inside(rng), 1.0),
                recordio_payload(image_bytes(rng), [2.0, 0.5, 0.25])]
    assert len(recordio_parts(payloads[1])) == 3  # the writer really split it
    offsets = write_recordio(tmp_path / "a.rec", payloads)
    data = (tmp_path / "a.rec").read_bytes()
    with open(tmp_path / "a.rec", "rb") as handle:
        ranges = list(recordio.record_ranges(handle, len(data)))
    assert [offset for offset, _ in ranges] == offsets
    for (offset, length), payload in zip(ranges, payloads):
        joined, end = recordio.join_parts(data[offset:offset + length])
        assert joined == payload and end == length
    third = recordio.unpack(payloads[2])
    assert third.flag == 3 and third.labels == (2.0, 0.5, 0.25) and third.class_label == 2.0
    assert recordio.unpack(payloads[1]).class_label == 1.0


def test_bad_magic_and_length_are_named(tmp_path):
    rng = random.Random(1)
    write_recordio(tmp_path / "a.rec", [recordio_payload(image_bytes(rng), 0.0)] * 2)
    data = bytearray((tmp_path / "a.rec").read_bytes())
    with pytest.raises(recordio.RecordError, match="bad magic 0x00000000 at byte 0"):
        recordio.join_parts(b"\0" * 16)
    data[4:8] = struct.pack("<I", 1 << 20)
    with pytest.raises(recordio.RecordError, match="claims 1048576 bytes, past the end of the record"):
        recordio.join_parts(bytes(data))
    data[4:8] = struct.pack("<I", (3 << 29) | 10)
    with pytest.raises(recordio.RecordError, match="continuation flag 3 but starts a record"):
        recordio.join_parts(bytes(data))


def test_index_outside_the_file_is_a_problem_naming_the_line(tmp_path):
    (tmp_path / "a.idx").write_text("0\t0\n1\t40\n2\t9999\nnonsense\n3\t40\n")
    (keys, offsets), problems = recordio.read_index(str(tmp_path / "a.idx"), 100, "a.rec")
    assert list(zip(keys, offsets)) == [(0, 0), (1, 40)]
    assert problems == ["a.idx line 3: record 2 at byte 9999 is outside a.rec (100 bytes)",
                        "a.idx line 4: not 'key<TAB>offset': 'nonsense'",
                        "a.idx: records 1 and 3 both at byte 40"]


def test_insightface_header_record_has_no_image():
    rng = random.Random(2)
    payloads = insightface_payloads([image_bytes(rng) for _ in range(3)], [0, 0, 1])
    header = recordio.unpack(payloads[0])
    assert header.flag == 2 and header.image == b"" and header.labels == (4.0, 6.0)
    assert recordio.unpack(payloads[1]).class_label == 0.0 and recordio.unpack(payloads[3]).class_label == 1.0
    assert recordio.unpack(payloads[4]).image == b""


def test_tfrecord_framing_crc_and_example_decoding(tmp_path):
    rng = random.Random(3)
    image = image_bytes(rng)
    records = [example({"image/encoded": image, "image/class/label": 7, "image/class/text": "tench",
                        "bbox": [0.25, 0.5], "ids": [-3, 1 << 40], "empty": []}),
               example({"image/encoded": image_bytes(rng), "image/class/label": 1})]
    offsets = write_tfrecord(tmp_path / "a.tfrecord", records, bad_crc=[1], index=True)
    data = (tmp_path / "a.tfrecord").read_bytes()
    with open(tmp_path / "a.tfrecord", "rb") as handle:
        ranges = list(tfrecord.record_ranges(handle, len(data)))
    assert [offset for offset, _ in ranges] == offsets
    offsets_and_lengths = tfrecord.read_index(tfrecord.index_path(str(tmp_path / "a.tfrecord")), len(data), "a.tfrecord")
    assert list(zip(*offsets_and_lengths)) == ranges
    offset, length = ranges[0]
    features = tfrecord.parse_example(tfrecord.record_data(data[offset:offset + length], offset))
    assert features == {"image/encoded": ("bytes", [image]), "image/class/label": ("int64", [7]),
                        "image/class/text": ("bytes", [b"tench"]), "bbox": ("float", [0.25, 0.5]),
                        "ids": ("int64", [-3, 1 << 40]), "empty": ("int64", [])}
    offset, length = ranges[1]
    with pytest.raises(tfrecord.RecordError, match=f"bad data CRC in the record at byte {offset}"):
        tfrecord.record_data(data[offset:offset + length], offset)
    damaged = bytearray(data)
    damaged[0] ^= 1
    with pytest.raises(tfrecord.RecordError, match="bad length CRC at byte 0"):
        tfrecord.record_data(bytes(damaged[:length]), 0)
    assert tfrecord.field_name("image/class/text") == "image_class_text"


def test_an_index_out_of_file_order_lists_records_in_file_order(tmp_path):
    (tmp_path / "a.idx").write_text("2\t80\n0\t0\n1\t40\n")
    (keys, offsets), problems = recordio.read_index(str(tmp_path / "a.idx"), 100, "a.rec")
    assert (list(keys), list(offsets), problems) == ([0, 1, 2], [0, 40, 80], [])
