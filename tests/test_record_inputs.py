"""MXNet RecordIO and TFRecord files as SRC: the same samples as packing the images from a folder,
with workers, tasks + merge, resume and rejects as for folders. Tests that compare samples by
position pack with order sorted (tests/test_order.py: the windowed shuffle)."""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import numpy as np
import pytest

import packer
import readers
from clirun import run
from imagefolders import image_bytes
from recordfiles import (
    RECORDIO_MAGIC,
    example,
    insightface_payloads,
    recordio_parts,
    recordio_payload,
    write_recordio,
    write_tfrecord,
)


def with_magic_inside(image: bytes) -> bytes:
    """The JPEG with a comment segment holding RecordIO's magic 4-aligned in a record's payload
    (the 24-byte header, and label arrays, keep the image 4-aligned): MXNet's writer splits it."""
    comment = b"ab" + RECORDIO_MAGIC + b"cdef" + RECORDIO_MAGIC + b"gh"
    return image[:2] + b"\xff\xfe" + struct.pack(">H", len(comment) + 2) + comment + image[2:]


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> tuple[Path, list[tuple[str, bytes, int]]]:
    """A class folder, and its images in packing order as (path, bytes, label); some hold the magic."""
    root = tmp_path_factory.mktemp("records") / "images"
    rng = random.Random(5)
    listed = []
    for label in range(3):
        for number in range(4):
            data = image_bytes(rng)
            if number % 2:
                data = with_magic_inside(data)
            listed.append((f"class_{label}/{number:02d}.jpg", data, label))
    for path, data, _ in listed:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    return root, listed


def contents(out: Path, *fields: str) -> list[tuple]:
    ds = readers.open_dataset(out, decode="bytes", fields=("image", "label", *fields))
    return [(bytes(image), int(label), *rest) for image, label, *rest in ds]


@pytest.fixture(scope="module")
def from_folder(samples, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("folder") / "out"
    packer.pack(samples[0], out, order="sorted", format="hdf5", shard_size=5, workers=1)
    return out


@pytest.mark.parametrize("index", [True, False], ids=["idx", "no-idx"])
def test_recordio_packs_the_same_samples_as_the_folder(samples, from_folder, tmp_path, index):
    _, listed = samples
    rec = tmp_path / "train.rec"
    payloads = [recordio_payload(data, float(label), id=key) for key, (_, data, label) in enumerate(listed)]
    assert sum(len(recordio_parts(payload)) > 1 for payload in payloads) == 6  # split records are there
    write_recordio(rec, payloads, index=index)
    code, output = run("hdf5", "--order", "sorted", rec, tmp_path / "out", "--shard-size", 5, "--workers", 2, "-q")
    assert code == 0, output
    assert contents(tmp_path / "out") == contents(from_folder)
    paths = [path for _, path in readers.open_dataset(tmp_path / "out", fields=("label", "path"))]
    assert paths == [f"train.rec/{key}" for key in range(len(listed))]


def test_label_arrays_become_a_float32_field(samples, tmp_path):
    _, listed = samples
    arrays = [[float(label), 0.5 * key, -1.25] for key, (_, _, label) in enumerate(listed)]
    write_recordio(tmp_path / "a.rec", [recordio_payload(data, array) for (_, data, _), array in zip(listed, arrays)])
    packer.pack(tmp_path / "a.rec", tmp_path / "out", order="sorted", format="lmdb")
    got = contents(tmp_path / "out", "label_array")
    assert [(image, label) for image, label, _ in got] == [(data, label) for _, data, label in listed]
    for (_, _, array), expected in zip(got, arrays):
        assert array.dtype == np.float32 and array.tolist() == expected
    spec = json.loads((tmp_path / "out" / "index.json").read_text())["fields"]
    assert spec == [{"name": "label_array", "type": "array", "optional": False, "dtype": "float32", "shape": [3]}]


def test_insightface_header_and_identity_records_are_not_samples(samples, tmp_path):
    _, listed = samples
    images = [data for _, data, _ in listed]
    identities = [key // 3 for key in range(len(images))]
    write_recordio(tmp_path / "train.rec", insightface_payloads(images, identities))
    summary = packer.pack(tmp_path / "train.rec", tmp_path / "out", order="sorted", format="wds")
    assert summary.num_samples == len(images) and summary.rejects == 0
    assert summary.ignored == len(set(identities))  # the identity records
    assert contents(tmp_path / "out") == list(zip(images, identities))


def test_damaged_records_are_rejects_naming_file_and_record(samples, tmp_path):
    _, listed = samples
    rec = tmp_path / "a.rec"
    offsets = write_recordio(rec, [recordio_payload(data, float(label)) for _, data, label in listed])
    data = bytearray(rec.read_bytes())
    data[offsets[3]:offsets[3] + 4] = b"\0\0\0\0"  # record 3's magic
    rec.write_bytes(bytes(data))
    with open(rec.with_suffix(".idx"), "a") as handle:
        handle.write(f"99\t{len(data) + 100}\n")
    summary = packer.pack(rec, tmp_path / "out", format="lmdb")
    assert summary.num_samples == len(listed) - 1
    rejects = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert rejects == [
        {"path": "a.rec", "reason": f"a.idx line {len(listed) + 1}: record 99 at byte {len(data) + 100} is outside "
                                    f"a.rec ({len(data)} bytes)"},
        {"path": "a.rec/3", "reason": f"record at byte {offsets[3]}: bad magic 0x00000000 at byte {offsets[3]} "
                                      f"(expected 0xced7230a)"},
    ]
    code, output = run("lmdb", rec, tmp_path / "strict", "--on-error", "fail")
    assert code == 1 and output.strip().splitlines()[-1].startswith("Error: ")
    # Without the .idx nothing past the bad header can be found: the rest is one reject.
    rec.with_suffix(".idx").unlink()
    summary = packer.pack(rec, tmp_path / "sequential", format="lmdb")
    assert summary.num_samples == 3 and summary.rejects == 1
    (reject,) = [json.loads(line) for line in (tmp_path / "sequential" / "rejects.jsonl").read_text().splitlines()]
    assert reject["path"] == "a.rec/3" and "the rest of a.rec cannot be read" in reject["reason"]


def test_recordio_tasks_merge_and_resume_give_the_same_shards(samples, tmp_path):
    _, listed = samples
    rec = tmp_path / "train.rec"
    write_recordio(rec, [recordio_payload(data, float(label)) for _, data, label in listed])
    whole = packer.pack(rec, tmp_path / "whole", format="wds", shard_size=4, workers=2)
    for task in range(3):
        code, output = run("wds", rec, tmp_path / "tasks", "--shard-size", 4, "--task-index", task, "--task-count",
                           3, "-q")
        assert code == 0, output
    assert run("merge", tmp_path / "tasks")[0] == 0
    packer.pack(rec, tmp_path / "resumed", format="wds", shard_size=4, task_index=1, task_count=3)
    resumed = packer.pack(rec, tmp_path / "resumed", format="wds", shard_size=4)
    assert resumed.resumed_shards == 1 and whole.num_shards == 3

    def shards(out: Path) -> list:
        return [(shard["name"], shard["sha256"]) for shard in json.loads((out / "index.json").read_text())["shards"]]

    assert shards(tmp_path / "whole") == shards(tmp_path / "tasks") == shards(tmp_path / "resumed")


def imagenet_records(listed: list[tuple[str, bytes, int]]) -> list[bytes]:
    """Examples as ImageNet's TFRecords hold them: 1-based labels, synset text, a bbox list of 0-2
    values (the test writer writes an empty list as an int64 list: an empty list's kind says nothing)."""
    return [example({"image/encoded": data, "image/class/label": label + 1, "image/class/text": f"class {label}",
                     "image/height": 32, "image/object/bbox/xmin": [0.25] * (key % 3), "image/filename": path})
            for key, (path, data, label) in enumerate(listed)]


def test_tfrecord_packs_the_same_samples_as_the_folder(samples, from_folder, tmp_path):
    _, listed = samples
    records = imagenet_records(listed)
    write_tfrecord(tmp_path / "train-00000-of-00002", records[:7], index=True)
    write_tfrecord(tmp_path / "train-00001-of-00002", records[7:])
    code, output = run("lmdb", "--order", "sorted", str(tmp_path / "train-*-of-00002"), tmp_path / "out",
                       "--input-format", "tfrecord",
                       "--label-offset", -1, "--workers", 2, "--shard-size", 5, "-q")
    assert code == 0, output
    assert contents(tmp_path / "out") == contents(from_folder)
    got = readers.open_dataset(tmp_path / "out", fields=("path", "image_class_text", "image_height",
                                                         "image_object_bbox_xmin", "image_filename"))
    for key, ((path, _, label), (where, text, height, xmin, filename)) in enumerate(zip(listed, got)):
        assert where == f"train-0000{key // 7}-of-00002/{key % 7}"
        assert (text, height, filename) == (f"class {label}", 32, path)
        assert xmin.dtype == np.float32 and xmin.tolist() == [0.25] * (key % 3)


def test_a_bad_tfrecord_crc_is_a_reject_naming_file_and_record(samples, tmp_path):
    _, listed = samples
    offsets = write_tfrecord(tmp_path / "a.tfrecord", imagenet_records(listed), bad_crc=[2])
    summary = packer.pack(tmp_path / "a.tfrecord", tmp_path / "out", order="sorted", format="hdf5", label_offset=-1)
    assert summary.num_samples == len(listed) - 1
    (reject,) = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert reject == {"path": "a.tfrecord/2", "reason": f"record at byte {offsets[2]}: bad data CRC in the record "
                                                        f"at byte {offsets[2]}"}
    labels = [label for _, label in readers.open_dataset(tmp_path / "out", decode="bytes")]
    assert labels == [label for key, (_, _, label) in enumerate(listed) if key != 2]


def test_tfrecord_options_need_tfrecord_input(samples, tmp_path):
    with pytest.raises(packer.PackError, match="--label-offset applies to TFRecord input"):
        packer.pack(samples[0], tmp_path / "out", format="lmdb", label_offset=-1)


def test_an_index_that_disagrees_with_its_file(samples, tmp_path):
    _, listed = samples
    rec = tmp_path / "a.rec"
    offsets = write_recordio(rec, [recordio_payload(data, float(label)) for _, data, label in listed[:4]])
    rec.with_suffix(".idx").write_text(f"0\t{offsets[0]}\n1\t{offsets[1]}\n3\t{offsets[3]}\n")  # record 2 left out
    packer.pack(rec, tmp_path / "out", format="lmdb")
    (reject,) = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert reject == {"path": "a.rec/1", "reason": f"record at byte {offsets[1]}: the record ends at byte {offsets[2]}, "
                                                   f"but the next one should start at byte {offsets[3]} "
                                                   "(the .idx disagrees with the .rec)"}
    tfrecord = tmp_path / "b.tfrecord"
    write_tfrecord(tfrecord, imagenet_records(listed[:2]))
    Path(f"{tfrecord}.tfindex").write_text(f"0 {tfrecord.stat().st_size + 1}\n")
    with pytest.raises(packer.PackError, match=r"b.tfrecord.tfindex line 1: record at byte 0 of \d+ bytes is outside"):
        packer.pack(tfrecord, tmp_path / "tf", format="lmdb")


def test_odd_recordio_headers_and_labels_are_rejects_not_tracebacks(tmp_path):
    """A header record whose end is NaN, a first image record that cannot be read (the label-array
    length comes from the next), a label beyond int64 and an .idx key beyond 64 bits: rejects
    naming the record or line, the other records packed."""
    rng = random.Random(11)
    images = [image_bytes(rng) for _ in range(3)]
    src = tmp_path / "src"
    src.mkdir()
    write_recordio(src / "nan.rec", [recordio_payload(b"", [float("nan"), 5.0]), recordio_payload(images[0], 1.0),
                                     recordio_payload(images[1], 2.0)])
    write_recordio(src / "first.rec", [recordio_payload(image, [float(n), 0.5]) for n, image in enumerate(images)])
    damaged = bytearray((src / "first.rec").read_bytes())
    damaged[0] ^= 0xFF  # record 0's magic
    (src / "first.rec").write_bytes(bytes(damaged))
    write_recordio(src / "huge.rec", [recordio_payload(images[0], 1e20), recordio_payload(images[1], 1.0)])
    for name, expected in [("nan", {"nan.rec/0": "record at byte 0: no image bytes after its header"}),
                           ("first", {"first.rec/0": "record at byte 0: bad magic 0xced723f5 at byte 0 "
                                                     "(expected 0xced7230a)"}),
                           ("huge", {"huge.rec/0": "label 100000002004087734272 is out of range (0 to "
                                                   "9223372036854775807)"})]:
        out = tmp_path / f"out-{name}"
        summary = packer.pack(src / f"{name}.rec", out, format="hdf5", workers=1)
        rejects = {row["path"]: row["reason"] for row in map(json.loads, (out / "rejects.jsonl").read_text().splitlines())}
        assert rejects == expected and summary.num_samples == (2 if name != "huge" else 1), name
    (src / "huge.idx").write_text("99999999999999999999\t0\n")
    code, output = run("wds", src / "huge.rec", tmp_path / "out-key", "--on-error", "fail")
    assert code == 1 and "huge.idx line 1: key 99999999999999999999 does not fit in 64 bits" in output.splitlines()[-1]
