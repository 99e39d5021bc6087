"""Shards read with only the plain libraries (lmdb, h5py, tarfile, webdataset, tar), as FORMAT.md says."""

from __future__ import annotations

import io
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import h5py
import lmdb
import numpy as np
import pytest
import webdataset
from imagefolders import image_bytes, make_caption_folder

from packer.run.pipeline import pack
from packer.plan.options import PackOptions
import readers
from readers.layouts.lmdb import parse_record

CLASSES = ["class_00", "class_01", "class_02"]


def pack_folder(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path, fmt: str) -> tuple[Path, dict[str, bytes], list[str]]:
    """Pack the fixture plus a PNG named .jpg; returns OUT, {path: bytes}, paths in sample order."""
    root, files = image_folder
    disguised = image_bytes(random.Random(5), "PNG")
    (root / "class_01" / "disguised.jpg").write_bytes(disguised)
    files = {**files, "class_01/disguised.jpg": disguised}
    out = tmp_path / fmt
    pack(root, out, PackOptions(format=fmt, shard_size=6, order="sorted"))  # sample i: the i-th sorted path
    return out, files, sorted(files)


def test_plain_lmdb_reads_a_shard(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    out, files, order = pack_folder(image_folder, tmp_path, "lmdb")
    env = lmdb.open(str(out / "shard-000001.lmdb"), subdir=False, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            meta, payload = parse_record(txn.get(b"000001_0000000000"))
            assert txn.stat()["entries"] == 6
    finally:
        env.close()
    assert meta["path"] == order[6] and bytes(payload) == files[meta["path"]]


def test_plain_h5py_reads_every_sample(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    out, files, order = pack_folder(image_folder, tmp_path, "hdf5")
    seen: list[str] = []
    for shard in sorted(out.glob("shard-*.h5")):
        with h5py.File(shard, "r") as f:
            assert f.attrs["layout"] == "flat" and f.attrs["pack_format_version"] == 2
            assert json.loads(f.attrs["classes"]) == CLASSES
            assert f["images"].dtype == np.uint8 and f["labels"].dtype == np.int64
            offsets = f["offsets"][:]
            paths = list(f["paths"].asstr()[:])
            raw = {int(i): name for i, name in json.loads(f.attrs["paths_raw"]).items()}
            assert len(offsets) == len(paths) + 1 == f.attrs["num_samples"] + 1
            for i, text in enumerate(paths):
                path = raw.get(i, text)
                data = f["images"][offsets[i]:offsets[i + 1]].tobytes()
                assert data == files[path]
                assert CLASSES[f["labels"][i]] == path.split("/")[0]
                assert f["formats"][i] == (b"png" if data.startswith(b"\x89PNG") else b"jpeg")
                seen.append(path)
    assert seen == order
    bad = [path for path in order if "bad-" in path]
    assert bad and os.fsencode(bad[0]).endswith(b"bad-\xff\xfe.jpg")


def member_names(out: Path) -> list[str]:
    return [name for shard in sorted(out.glob("shard-*.tar")) for name in tarfile.open(shard).getnames()]


def test_tarfile_reads_every_sample(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    out, files, order = pack_folder(image_folder, tmp_path, "wds")
    seen: list[str] = []
    for shard in sorted(out.glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            members = tar.getmembers()
            assert all(m.isfile() and m.mtime == 0 and m.uid == m.gid == 0 and not m.uname and not m.gname
                       for m in members)
            for image, cls, meta_member in zip(members[0::3], members[1::3], members[2::3]):
                key, ext = image.name.split(".")
                assert cls.name == key + ".cls" and meta_member.name == key + ".pack.json"
                meta = json.loads(tar.extractfile(meta_member).read())
                data = tar.extractfile(image).read()
                assert data == files[meta["path"]]
                assert int(tar.extractfile(cls).read()) == meta["label"] == CLASSES.index(meta["path"].split("/")[0])
                assert ext == {"jpeg": "jpg", "png": "png"}[meta["format"]]
                seen.append(meta["path"])
    assert seen == order
    for path in ("class_00/pic.PNG", "class_01/disguised.jpg"):  # PNG content: stored as .png
        position = order.index(path)
        names = tarfile.open(out / f"shard-{position // 6:06d}.tar").getnames()
        key = f"{position // 6:06d}_{position % 6:010d}"
        assert f"{key}.png" in names and f"{key}.jpg" not in names


def test_offset_index_locates_members(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    out, files, order = pack_folder(image_folder, tmp_path, "wds")
    raw = (out / "shard-000001.packidx").read_bytes()
    magic, columns, count = struct.unpack_from("<4sIq", raw)
    assert (magic, columns, count) == (b"PKX1", 4, 6)
    table = np.frombuffer(raw, dtype="<i8", offset=16).reshape(count, 4)
    tar = (out / "shard-000001.tar").read_bytes()
    for i, (image_at, image_size, json_at, json_size) in enumerate(table):
        meta = json.loads(tar[json_at:json_at + json_size])
        assert meta["path"] == order[6 + i]
        assert tar[image_at:image_at + image_size] == files[meta["path"]]


def test_webdataset_library_reads_the_shards(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    out, files, order = pack_folder(image_folder, tmp_path, "wds")
    urls = [str(path) for path in sorted(out.glob("shard-*.tar"))]
    samples = list(webdataset.WebDataset(urls, shardshuffle=False, empty_check=False))
    assert len(samples) == len(files)
    for sample, path in zip(samples, order):
        meta = json.loads(sample["pack.json"])
        image = sample.get("jpg", sample.get("png"))
        assert meta["path"] == path and image == files[path]
        assert int(sample["cls"]) == CLASSES.index(path.split("/")[0])
        assert "." not in sample["__key__"]
    keys = [sample["__key__"] for sample in samples]
    assert keys == [f"{position // 6:06d}_{position % 6:010d}" for position in range(len(files))]
    decoded = next(iter(webdataset.WebDataset(urls[:1], shardshuffle=False).decode("pil")))
    assert decoded["cls"] == 0 and decoded["jpg"].size[0] > 0


@pytest.mark.skipif(shutil.which("tar") is None, reason="no tar command")
def test_tar_command_lists_safe_names(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    out, files, _ = pack_folder(image_folder, tmp_path, "wds")
    listed: list[str] = []
    for shard in sorted(out.glob("shard-*.tar")):
        result = subprocess.run(["tar", "-tf", str(shard)], capture_output=True, text=True, check=True)
        assert result.stderr == ""
        listed += result.stdout.split()
    assert listed == member_names(out) and len(listed) == 3 * len(files)
    assert all(re.fullmatch(r"\d{6}_\d{10}\.(jpg|png|cls|pack\.json)", name) for name in listed)


def test_tar_shards_are_reproducible(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, _ = image_folder
    first, second = tmp_path / "first", tmp_path / "second"
    pack(root, first, PackOptions(format="wds", shard_size=6), workers=1)
    os.utime(next(root.rglob("*.jpg")), (12345, 12345))  # source mtimes must not leak into the tar
    pack(root, second, PackOptions(format="wds", shard_size=6), workers=3)
    names = sorted(path.name for path in first.glob("shard-*"))
    assert names == sorted(path.name for path in second.glob("shard-*")) and len(names) == 12
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    shards = lambda out: json.loads((out / "index.json").read_text())["shards"]  # noqa: E731
    assert shards(first) == shards(second)


def test_pack_and_readers_never_import_webdataset() -> None:
    """webdataset is a test extra only: every module of both packages imports without it."""
    code = ("import pkgutil, sys, importlib, packer, readers\n"
            "sys.modules['webdataset'] = None  # any import of it now raises ImportError\n"
            "for package in (packer, readers):\n"
            "    for module in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
            "        importlib.import_module(module.name)\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_raw_pixels_are_npy_members_that_numpy_and_webdataset_decode(
        image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, files = image_folder
    out = tmp_path / "raw"
    pack(root, out, PackOptions(format="wds", store="raw", shard_size=6))
    dataset = readers.open_dataset(out, decode="numpy", fields=("image", "label", "path"))
    expected = {path: (image, label) for image, label, path in (dataset[i] for i in range(len(dataset)))}
    assert len(expected) == len(files)
    urls = [str(path) for path in sorted(out.glob("shard-*.tar"))]
    for sample in webdataset.WebDataset(urls, shardshuffle=False, empty_check=False).decode():
        assert {"npy", "cls", "pack.json"} <= set(sample) and not {"raw", "jpg", "png", "json"} & set(sample)
        image, label = expected[sample["pack.json"]["path"]]
        assert sample["npy"].dtype == np.uint8 and sample["npy"].shape == image.shape
        np.testing.assert_array_equal(sample["npy"], image)
        assert sample["cls"] == label
    with tarfile.open(urls[0]) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".npy"))
        array = np.load(io.BytesIO(tar.extractfile(member).read()))
        assert array.shape == tuple(json.loads(tar.extractfile(member.name[:-3] + "pack.json").read())["shape"])


def dali_index_by_tarfile(tar_path: Path) -> str:
    """The index DALI's wds2idx writes when it falls back on tarfile: per regular member, grouped by
    key, `ext data_offset size name`, after a `v1.2 N` line."""
    samples: list[list[str]] = []
    last = None
    with tarfile.open(tar_path) as tar:
        for member in tar.getmembers():
            key, _, ext = member.name.partition(".")
            if key != last:
                samples.append([])
                last = key
            samples[-1].append(f"{ext} {member.offset_data} {member.size} {member.name}")
    return f"v1.2 {len(samples)}\n" + "".join(" ".join(sample) + "\n" for sample in samples)


@pytest.mark.parametrize("store", ["original", "raw"])
def test_dali_index_is_what_wds2idx_writes(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path,
                                           store: str) -> None:
    root, _ = image_folder
    out = tmp_path / store
    pack(root, out, PackOptions(format="wds", store=store, shard_size=6))
    tars = sorted(out.glob("shard-*.tar"))
    assert len(tars) == 4
    for tar in tars:
        assert tar.with_suffix(".idx").read_text("ascii") == dali_index_by_tarfile(tar)


def test_dali_index_lists_field_members(tmp_path: Path) -> None:
    """With fields, DALI's index lists every member (the fields and `pack.json` included) as wds2idx does."""
    make_caption_folder(tmp_path / "src")
    out = tmp_path / "out"
    pack(tmp_path / "src", out, PackOptions(format="wds", shard_size=4, sidecars=("txt", "json")))
    tars = sorted(out.glob("shard-*.tar"))
    assert len(tars) == 2
    for tar in tars:
        index = tar.with_suffix(".idx").read_text("ascii")
        assert index == dali_index_by_tarfile(tar)
        assert all(line.split()[::4] == ["jpg", "cls", "txt", "json", "pack.json"] for line in index.splitlines()[1:])
