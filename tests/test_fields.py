"""Per-sample fields in every format: stored, listed in index.json, read back by our readers and by
each format's own library; datasets packed before fields existed (format version 1) still open."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import h5py
import lmdb
import numpy as np
import pytest
import torch
import webdataset
from clirun import run
from imagefolders import image_bytes

import readers
from packer.stores.fsutil import sha256_file
from packer.write.writers import WRITERS, Sample, sidecar_path
from readers.fields import FieldSpec, encode_value
from readers.manifest import FileInfo, Manifest, ShardInfo, payload_crc32, sample_key, shard_name

SPECS = [
    FieldSpec("txt", "str"),
    FieldSpec("json", "json"),
    FieldSpec("count", "int"),
    FieldSpec("score", "float"),
    FieldSpec("flag", "bool"),
    FieldSpec("bbox", "array", dtype="float64", shape=(4,)),
    FieldSpec("points", "array", dtype="int64"),
    FieldSpec("note", "str", optional=True),
    FieldSpec("size", "array", optional=True, dtype="int64", shape=(2,)),
]


def values(i: int) -> dict[str, Any]:
    """Sample i's field values; odd samples lack the optional ones."""
    row: dict[str, Any] = {
        "txt": f"a caption, ünïcode 名前 {i}\nsecond line",
        "json": {"url": f"http://x/{i}.jpg", "nested": {"list": [i, None, True, "s"]}, "f": 0.1 * i},
        "count": i - 2,
        "score": i / 3,
        "flag": i % 2 == 0,
        "bbox": [i, 1.5, 2.25, 1e-9],
        "points": list(range(i)),
    }
    if i % 2 == 0:
        row.update(note=f"note {i}", size=[i, 2 * i])
    return row


def write_dataset(out: Path, fmt: str, count: int = 5, per_shard: int = 3) -> list[bytes]:
    """`count` samples with every kind of field, written shard by shard with the format's writer,
    then index.json, as the pipeline would; returns the payloads in sample order."""
    out.mkdir()
    writer_cls = WRITERS[fmt]
    payloads = [image_bytes(random.Random(i)) for i in range(count)]
    shards = []
    for shard, start in enumerate(range(0, count, per_shard)):
        name = shard_name(shard, writer_cls.extension)
        with writer_cls(out / name, expected_bytes=sum(map(len, payloads)), classes=["a"], fields=SPECS) as writer:
            for local, i in enumerate(range(start, min(count, start + per_shard))):
                stored = {spec.name: encode_value(spec, values(i)[spec.name]) for spec in SPECS
                          if spec.name in values(i)}
                writer.add(Sample(key=sample_key(shard, local), label=0, path=f"a/{i}.jpg", payload=payloads[i],
                                  meta={"format": "jpeg"}, extension="jpg", crc32=payload_crc32(payloads[i]),
                                  fields=stored))
        sidecars = []
        for extension in writer_cls.sidecars:
            final = out / shard_name(shard, extension)
            sidecar_path(out / name, extension).rename(final)
            sidecars.append(FileInfo(final.name, final.stat().st_size, sha256_file(final)))
        shards.append(ShardInfo(name, min(count, start + per_shard) - start, (out / name).stat().st_size,
                                sha256_file(out / name), tuple(sidecars)))
    manifest = Manifest(format=fmt, store="original", num_samples=count, classes=["a"], shards=shards,
                        class_counts=[count], fields=SPECS)
    (out / "index.json").write_text(manifest.to_json())
    return payloads


def assert_same(value: Any, expected: Any) -> None:
    if isinstance(expected, list) and isinstance(value, np.ndarray):
        np.testing.assert_array_equal(value, np.asarray(expected))
    else:
        assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_every_field_round_trips(fmt: str, tmp_path: Path) -> None:
    payloads = write_dataset(tmp_path / "out", fmt)
    names = tuple(spec.name for spec in SPECS)
    ds = readers.open_dataset(tmp_path / "out", decode="bytes", fields=("image", *names, "label"))
    assert ds.manifest.fields == SPECS and ds.manifest.version == 2
    random_access = [ds[i] for i in range(len(ds))]
    streamed = list(ds)  # wds: read front to back, without the index
    for i, (payload, *fields, label) in [*enumerate(random_access), *enumerate(streamed)]:
        assert payload == payloads[i] and label == 0
        for spec, value in zip(SPECS, fields):
            expected = values(i).get(spec.name)
            if spec.type == "array" and expected is not None:
                assert isinstance(value, np.ndarray) and value.dtype == np.dtype(spec.dtype)
            assert_same(value, expected)
    # A subset, in the caller's order.
    assert readers.open_dataset(tmp_path / "out", fields=("note", "txt"))[1] == (None, values(1)["txt"])


def test_unknown_field_names_the_available_ones(tmp_path: Path) -> None:
    write_dataset(tmp_path / "out", "lmdb")
    with pytest.raises(readers.DatasetError, match="no field 'caption'; available: image, label, path, index, txt, json"):
        readers.open_dataset(tmp_path / "out", fields=("image", "caption"))


def test_loader_stacks_numbers_and_lists_the_rest(tmp_path: Path) -> None:
    write_dataset(tmp_path / "out", "hdf5", count=4)
    ds = readers.open_dataset(tmp_path / "out", decode="bytes", fields=("label", "txt", "json", "count", "score",
                                                                         "flag", "bbox", "points", "note", "size"))
    loader = readers.make_loader(ds, batch_size=4, shuffle=False, num_workers=0)
    label, txt, meta, count, score, flag, bbox, points, note, size = next(iter(loader))
    assert torch.equal(label, torch.zeros(4, dtype=torch.int64))
    assert txt == [values(i)["txt"] for i in range(4)]
    assert meta == [values(i)["json"] for i in range(4)]
    assert torch.equal(count, torch.tensor([-2, -1, 0, 1]))
    assert score.dtype == torch.float64 and flag.tolist() == [True, False, True, False]
    assert bbox.shape == (4, 4) and bbox[3].tolist() == values(3)["bbox"]
    assert [p.tolist() for p in points] == [values(i)["points"] for i in range(4)]  # shapes differ: a list
    assert note == ["note 0", None, "note 2", None]
    assert size[1] is None and size[2].tolist() == [2, 4]


def test_each_library_sees_the_fields(tmp_path: Path) -> None:
    for fmt in WRITERS:
        write_dataset(tmp_path / fmt, fmt, count=2, per_shard=2)
    env = lmdb.open(str(tmp_path / "lmdb" / "shard-000000.lmdb"), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        assert txn.get(b"000000_0000000000.txt").decode() == values(0)["txt"]
        assert json.loads(txn.get(b"000000_0000000001.json")) == values(1)["json"]
        assert txn.get(b"000000_0000000001.note") is None
    env.close()
    with h5py.File(tmp_path / "hdf5" / "shard-000000.h5", "r") as f:
        assert list(f["fields/txt"].asstr()[:]) == [values(i)["txt"] for i in range(2)]
        assert f["fields/bbox"].shape == (2, 4) and f["fields/bbox"].dtype == np.float64
        assert f["fields/count"][:].tolist() == [-2, -1]
        assert [json.loads(text) for text in f["fields/note"].asstr()[:]] == ["note 0", None]
    samples = list(webdataset.WebDataset(str(tmp_path / "wds" / "shard-000000.tar"), shardshuffle=False).decode())
    assert samples[0]["txt"] == values(0)["txt"] and samples[0]["json"] == values(0)["json"]
    assert samples[0]["bbox.json"] == values(0)["bbox"] and samples[0]["note.txt"] == "note 0"
    assert "note.txt" not in samples[1] and samples[1]["pack.json"]["path"] == "a/1.jpg"


def test_info_and_verify_list_and_check_fields(tmp_path: Path) -> None:
    write_dataset(tmp_path / "out", "lmdb")
    code, output = run("info", tmp_path / "out")
    assert code == 0, output
    assert "fields       txt (str), json (json), count (int), score (float), flag (bool), " \
           "bbox (array float64 [4]), points (array int64 (shapes vary)), note (str, optional), " \
           "size (array int64 [2], optional)" in output
    code, output = run("verify", "--full", "-q", tmp_path / "out")
    assert code == 0, output
    env = lmdb.open(str(tmp_path / "out" / "shard-000000.lmdb"), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        txn.put(b"000000_0000000001.json", b"{not json")
        txn.delete(b"000000_0000000002.txt")
    env.close()
    code, output = run("verify", "--full", "-q", tmp_path / "out")
    assert code == 1, output
    assert "shard-000000.lmdb: sample 1: unreadable (field 'json': Expecting property name" in output
    assert "shard-000000.lmdb: sample 2 is damaged (no 'txt' field)" in output


V1 = Path(__file__).parent / "data" / "v1"


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_version_1_datasets_still_open(fmt: str, tmp_path: Path) -> None:
    """tests/data/v1/<fmt>-original was packed from tests/data/v1/src by pack before fields and
    before shard_row keys (118573d, whose output is byte-identical to 0585019's)."""
    out = tmp_path / fmt
    shutil.copytree(V1 / f"{fmt}-original", out)
    ds = readers.open_dataset(out, decode="bytes", fields=("image", "label", "path"))
    assert ds.manifest.version == 1 and ds.manifest.fields == []
    expected = [((V1 / "src" / path).read_bytes(), label, path)
                for label, path in ((0, "class_0/img0.jpg"), (0, "class_0/img1.jpg"), (0, "class_0/img2.jpg"),
                                    (1, "class_1/img0.jpg"), (1, "class_1/img1.jpg"), (1, "class_1/img2.jpg"))]
    assert [ds[i] for i in range(len(ds))] == expected
    assert list(ds) == expected
    code, output = run("verify", "--full", "-q", out)
    assert code == 0, output
