"""HDF5 shards: batched writing with bounded memory, string columns, lock-free and damaged reads."""

from __future__ import annotations

import json
import os
import random
import zlib
from pathlib import Path

import h5py
import pytest
from imagefolders import image_bytes

import readers
from packer.run.pipeline import pack
from packer.plan.options import PackOptions
from packer.write.writers import Sample
from packer.write.writers import hdf5 as hdf5_writer
from packer.write.writers.hdf5 import HDF5Writer
from readers.hdf5 import read_raw_paths
from readers.manifest import sample_key

BAD_NAME = os.fsdecode(b"caf\xe9")  # Latin-1 bytes: not UTF-8


def sample(index: int, payload: bytes, path: str, meta: dict | None = None) -> Sample:
    return Sample(key=sample_key(0, index), label=index % 3, path=path, payload=payload,
                  meta=meta or {"format": "jpeg"}, extension="jpg", crc32=zlib.crc32(payload))


def test_writes_in_bounded_batches_and_grows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hdf5_writer, "IMAGE_CHUNK", 256)
    monkeypatch.setattr(hdf5_writer, "FLUSH_BYTES", 1000)
    monkeypatch.setattr(hdf5_writer, "COLUMN_BATCH", 3)
    monkeypatch.setattr(hdf5_writer, "COLUMN_CHUNK", 2)
    rng = random.Random(3)
    payloads = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 700))) for _ in range(40)]
    paths = [f"c/{i}.jpg" if i % 7 else f"c/{BAD_NAME}{i}.jpg" for i in range(len(payloads))]
    path = tmp_path / "shard.h5"
    writer = HDF5Writer(path, expected_bytes=10, classes=["c", BAD_NAME])  # far too small: must grow
    for i, (payload, name) in enumerate(zip(payloads, paths)):
        writer.add(sample(i, payload, name))
        assert len(writer._payloads._buffer) < 1000  # never more than FLUSH_BYTES held in memory
    writer.close()
    with h5py.File(path, "r") as f:
        assert f["images"].chunks == (256,) and f["images"].shape == (sum(map(len, payloads)),)
        offsets = f["offsets"][:]
        assert [f["images"][offsets[i]:offsets[i + 1]].tobytes() for i in range(len(payloads))] == payloads
        assert list(f["labels"][:]) == [i % 3 for i in range(len(payloads))]
        raw = read_raw_paths(f)
        assert sorted(raw) == [0, 7, 14, 21, 28, 35]
        stored = [raw.get(i, text) for i, text in enumerate(f["paths"].asstr()[:])]
        assert stored == paths
        assert f["paths"].asstr()[7] == "c/caf\\xe97.jpg"  # readable stand-in, valid UTF-8
        assert json.loads(f.attrs["classes"]) == ["c", BAD_NAME]
        assert {name for name, item in f.items() if item.shape[0] != len(payloads)} == {"images", "offsets"}
        assert f.attrs["num_samples"] == len(payloads)


def test_meta_without_a_column_is_refused(tmp_path: Path) -> None:
    writer = HDF5Writer(tmp_path / "shard.h5", expected_bytes=10, classes=[])
    with pytest.raises(ValueError, match=r"no column for meta keys \['exif'\]"):
        writer.add(sample(0, b"x", "a.jpg", {"format": "jpeg", "exif": ""}))
    with pytest.raises(ValueError, match="longer than 8 bytes"):
        writer.add(sample(0, b"x", "a.jpg", {"format": "jpeg2000x"}))


@pytest.fixture
def small_hdf5(tmp_path: Path) -> Path:
    """6 images of 2 classes packed as HDF5 in 2 shards of 3; the test's own, to damage."""
    root = tmp_path / "src"
    rng = random.Random(0)
    for i in range(6):
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (root / f"c{i % 2}" / f"{i}.jpg").write_bytes(image_bytes(rng))
    out = tmp_path / "out"
    pack(root, out, PackOptions(format="hdf5", shard_size=3, order="sorted"))  # ds[4] is c1/3.jpg
    return out


def test_reader_opens_without_file_locking(small_hdf5: Path) -> None:
    ds = readers.open_dataset(small_hdf5, decode="bytes", fields=("label", "path"))
    assert isinstance(ds, readers.HDF5Dataset) and ds._handles == {}  # nothing opened up front
    assert ds[4] == (1, "c1/3.jpg")
    assert ds.handle(1).file.id.get_access_plist().get_file_locking()[0] == 0
    ds.close()


def test_damaged_shards_name_the_file(small_hdf5: Path) -> None:
    shard = small_hdf5 / "shard-000001.h5"
    with h5py.File(shard, "r+") as f:
        f.attrs["layout"] = "pixels"
    with pytest.raises(readers.DatasetError, match=f"{shard}: unknown HDF5 payload layout 'pixels'"):
        readers.open_dataset(small_hdf5)[3]
    with h5py.File(shard, "r+") as f:
        f.attrs["layout"] = "flat"
        f["offsets"].resize((3,))
    with pytest.raises(readers.DatasetError, match=f"{shard}: offsets holds 2 samples, index.json says 3"):
        readers.open_dataset(small_hdf5)[3]
    shard.write_bytes(b"not hdf5")
    with pytest.raises(readers.DatasetError, match=f"{shard}: cannot open HDF5 shard"):
        readers.open_dataset(small_hdf5)[3]
