"""Container inputs as SRC: what SRC is recognised as, and WebDataset tar shards packed like folders."""

from __future__ import annotations

import io
import json
import random
import tarfile
from pathlib import Path

import pytest
import webdataset
from clirun import run
from imagefolders import image_bytes

import readers
from packer.pipeline import pack
from packer.plan import PackOptions
from packer.sources.inputs import expand_braces, resolve_source
from packer.sources.listing import ScanError


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(out.glob("shard-*"))}


def manifest(out: Path) -> dict:
    index = json.loads((out / "index.json").read_text())
    index.pop("tool_version")
    return index


def write_tars(folder: Path, shards: int = 3, per_shard: int = 5, seed: int = 0) -> list[dict]:
    """WebDataset shards written by webdataset.TarWriter (jpg, cls, txt, json); returns the samples in order."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    samples = []
    for shard in range(shards):
        with webdataset.TarWriter(str(folder / f"data-{shard:06d}.tar")) as writer:
            for _ in range(per_shard):
                number = len(samples)
                sample = {"__key__": f"{number:09d}", "jpg": image_bytes(rng), "cls": number % 3,
                          "txt": f"a caption, number {number}", "json": {"number": number, "url": f"http://x/{number}"}}
                writer.write(sample)
                samples.append(sample)
    return samples


def read_back(out: Path) -> list[tuple]:
    return list(readers.open_dataset(out, decode="bytes", fields=("image", "label", "txt", "json")))


@pytest.fixture
def tars(tmp_path: Path) -> tuple[Path, list[dict]]:
    folder = tmp_path / "shards"
    return folder, write_tars(folder)


def test_src_kind_is_recognised(tmp_path: Path, tars: tuple[Path, list[dict]]) -> None:
    folder, _ = tars
    names = [str(folder / f"data-{k:06d}.tar") for k in range(3)]
    assert resolve_source(folder).kind == "tar" and list(resolve_source(folder).inputs) == names
    assert resolve_source(folder).root == str(folder)
    assert list(resolve_source(folder / "data-{000000..000001}.tar").inputs) == names[:2]
    assert list(resolve_source(str(folder / "data-*.tar")).inputs) == names
    assert resolve_source(folder / "data-000002.tar").inputs == (names[2],)
    (folder / "data-000000.parquet").write_bytes(b"PAR1")  # img2dataset's files beside the shards
    (folder / "data-000000_stats.json").write_text("{}")
    assert resolve_source(folder).kind == "tar" and len(resolve_source(folder).inputs) == 3
    images = tmp_path / "images"
    (images / "a").mkdir(parents=True)
    (images / "a" / "x.jpg").write_bytes(b"")
    assert resolve_source(images).kind == "folder"
    (tmp_path / "train.rec").write_bytes(b"")
    (tmp_path / "a.tfrecord").write_bytes(b"")
    (tmp_path / "train-00000-of-00002").write_bytes(b"")
    assert resolve_source(tmp_path / "train.rec").kind == "recordio"
    assert resolve_source(tmp_path / "*.tfrecord").kind == "tfrecord"
    assert resolve_source(tmp_path / "train-*-of-00002", "tfrecord").kind == "tfrecord"
    with pytest.raises(ScanError, match="--input-format"):
        resolve_source(tmp_path / "train-*-of-00002")
    with pytest.raises(ScanError, match="data-000003.tar: does not exist"):
        resolve_source(folder / "data-{000002..000003}.tar")
    assert resolve_source(folder, "folder").kind == "folder"
    assert expand_braces("a{0..2}b{x,y}") == ["a0bx", "a0by", "a1bx", "a1by", "a2bx", "a2by"]


def test_an_input_with_no_readable_sample_says_why(tmp_path: Path) -> None:
    (tmp_path / "train.rec").write_bytes(b"\0" * 64)
    code, output = run("lmdb", tmp_path / "train.rec", tmp_path / "out")
    assert code == 1 and "no image files found (rejected: train.rec/0: bad magic 0x00000000 at byte 0" in output
    assert "Traceback" not in output


def test_tar_shards_pack_like_the_same_images_from_a_folder(tmp_path: Path, tars: tuple[Path, list[dict]]) -> None:
    folder, samples = tars
    images = tmp_path / "images"
    images.mkdir()
    rows = []
    for sample in samples:  # the same samples as loose files with sidecars, labels from a metadata file
        key = sample["__key__"]
        (images / f"{key}.jpg").write_bytes(sample["jpg"])
        (images / f"{key}.txt").write_text(sample["txt"])
        (images / f"{key}.json").write_text(json.dumps(sample["json"]))
        rows.append({"file_name": f"{key}.jpg", "label": sample["cls"]})
    (tmp_path / "meta.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    for fmt in ("lmdb", "wds"):
        from_tars, from_folder = tmp_path / f"tars-{fmt}", tmp_path / f"folder-{fmt}"
        summary = pack(folder, from_tars, PackOptions(format=fmt, shard_size=4))
        pack(images, from_folder, PackOptions(format=fmt, shard_size=4, metadata=str(tmp_path / "meta.jsonl"),
                                              sidecars=("json", "txt")))
        assert summary.num_samples == len(samples) and summary.rejects == 0
        expected = [(sample["jpg"], sample["cls"], sample["txt"], sample["json"]) for sample in samples]
        assert [(bytes(image), *rest) for image, *rest in read_back(from_tars)] == expected
        assert read_back(from_tars) == read_back(from_folder)
        ours, theirs = manifest(from_tars), manifest(from_folder)
        for key in ("num_samples", "classes", "class_counts", "source_bytes", "fields", "store"):
            assert ours[key] == theirs[key], key
        paths = readers.open_dataset(from_tars, fields=("path",))
        assert paths[6] == ("data-000001.tar/000000006",)


def test_tasks_then_merge_equal_one_run(tmp_path: Path, tars: tuple[Path, list[dict]]) -> None:
    folder, _ = tars
    pattern = str(folder / "data-{000000..000002}.tar")
    one, split = tmp_path / "one", tmp_path / "split"
    assert run("hdf5", pattern, one, "--shard-size", "2", "-q", "--workers", "2")[0] == 0
    for task in ("2", "0", "1"):
        code, output = run("hdf5", pattern, split, "--shard-size", "2", "-q", "--task-index", task, "--task-count", "3")
        assert code == 0, output
    assert not (split / "index.json").exists()
    assert run("merge", split)[0] == 0
    assert shard_bytes(split) == shard_bytes(one) and manifest(split) == manifest(one)
    assert len(shard_bytes(one)) == 8
