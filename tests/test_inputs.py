"""Container inputs as SRC: what SRC is recognised as, and WebDataset tar shards packed like folders."""

from __future__ import annotations

import io
import json
import random
import shutil
import tarfile
import threading
from pathlib import Path
from typing import Callable

import pytest
import webdataset
from clirun import run
from imagefolders import image_bytes

import readers
from packer.plan.partition import Partition
from packer.sources import containers
from packer.run.pipeline import pack
from packer.plan.options import PackOptions
from packer.sources.inputs import expand_braces, resolve_source
from packer.sources.listing import ScanError
from readers.tar import read_members


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
    for fmt in ("lmdb", "wds"):  # sorted: sample by sample, in the tars' order
        from_tars, from_folder = tmp_path / f"tars-{fmt}", tmp_path / f"folder-{fmt}"
        summary = pack(folder, from_tars, PackOptions(format=fmt, shard_size=4, order="sorted"))
        pack(images, from_folder, PackOptions(format=fmt, shard_size=4, metadata=str(tmp_path / "meta.jsonl"),
                                              sidecars=("json", "txt"), order="sorted"))
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


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_bad_tar_samples_are_rejects_naming_tar_member_and_reason(tmp_path: Path) -> None:
    rng = random.Random(5)
    folder = tmp_path / "shards"
    folder.mkdir()
    with tarfile.open(folder / "a.tar", "w", format=tarfile.PAX_FORMAT) as tar:  # img2dataset writes PAX headers
        for name, data in [("k0.jpg", image_bytes(rng)), ("k0.cls", b"1"), ("k1.txt", b"no image here"),
                           ("k2.jpg", b"<html>not found</html>"), ("k3.jpg", image_bytes(rng)), ("k3.cls", b"cat"),
                           ("k5.jpg", image_bytes(rng)), ("k5.json", b"{broken")]:
            add_member(tar, name, data)
    good = image_bytes(rng)
    with tarfile.open(folder / "b.tar", "w") as tar:
        add_member(tar, "k6.jpg", good)
        add_member(tar, "k7.jpg", image_bytes(rng, size=(300, 300)))
    with tarfile.open(folder / "b.tar") as tar:
        cut = tar.getmember("k7.jpg").offset_data + 100
    (folder / "b.tar").write_bytes((folder / "b.tar").read_bytes()[:cut])  # cut inside k7.jpg
    with tarfile.open(folder / "c.tar", "w") as tar:
        add_member(tar, "k8.jpg", image_bytes(rng))
        add_member(tar, "k9.jpg", image_bytes(rng))
    with tarfile.open(folder / "c.tar") as tar:
        cut = tar.getmember("k9.jpg").offset + 100
    (folder / "c.tar").write_bytes((folder / "c.tar").read_bytes()[:cut])  # cut inside k9.jpg's header
    out = tmp_path / "out"
    summary = pack(folder, out, PackOptions(format="lmdb"))
    assert summary.num_samples == 2
    rejects = {row["path"]: row["reason"] for row in map(json.loads, (out / "rejects.jsonl").read_text().splitlines())}
    assert rejects["a.tar/k1"] == "no image member (members: k1.txt)"
    assert rejects["a.tar/k2"].startswith("k2.jpg: not an image")
    assert rejects["a.tar/k3"] == "k3.cls: label 'cat' is not an integer"
    assert rejects["a.tar/k5"].startswith("k5.json: invalid JSON")
    assert rejects["b.tar/k7"].startswith("member k7.jpg is truncated")
    assert rejects["c.tar"].startswith("truncated at byte ") and "after member k8.jpg" in rejects["c.tar"]
    assert rejects["c.tar/k8"].startswith("may be incomplete: truncated at byte ")  # the cut header may be its own
    assert len(rejects) == 7
    assert [(bytes(image), label) for image, label in readers.open_dataset(out, decode="bytes")][1] == (good, -1)
    code, output = run("lmdb", folder, tmp_path / "fail", "--on-error", "fail")
    assert code == 1 and output.strip().splitlines()[-1].startswith(f"Error: {folder / 'a.tar/k1'}: no image member")


def ustar_member(name: str, data: bytes, kind: bytes = b"0") -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = len(data), kind
    return info.tobuf(format=tarfile.USTAR_FORMAT) + data + bytes(-len(data) % 512)


@pytest.mark.parametrize("pax", [b"0 path=x\n", b"-9 path=x\n", b"12path=b.jpg\n", b"13 size=zz\n\0\0"])
def test_damaged_pax_headers_and_a_tar_cut_between_members_are_rejects(tmp_path: Path, pax: bytes) -> None:
    """A PAX record whose length does not move on (it looped forever), a PAX size that is not a
    number (a traceback), and a tar without its end-of-archive marker: rejects naming the tar; the
    sample before the damage, whose members may go on past it, too."""
    rng = random.Random(9)
    first = ustar_member("a.jpg", image_bytes(rng)) + ustar_member("a.cls", b"1")
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "pax.tar").write_bytes(first + ustar_member("pax", pax, b"x") + ustar_member("b.jpg", image_bytes(rng))
                                     + bytes(1024))
    (folder / "w.tar").write_bytes(ustar_member("c.jpg", image_bytes(rng)) + ustar_member("c.cls", b"2")
                                   + ustar_member("d.jpg", image_bytes(rng)))  # cut after d.jpg: d.cls may be gone
    out = tmp_path / "out"
    summary = pack(folder, out, PackOptions(format="wds"), workers=1)
    rejects = {row["path"]: row["reason"] for row in map(json.loads, (out / "rejects.jsonl").read_text().splitlines())}
    assert rejects["pax.tar"].startswith("damaged at byte ") and "PAX" in rejects["pax.tar"]
    assert "after member a.cls" in rejects["pax.tar"]
    assert rejects["pax.tar/a"].startswith("may be incomplete: damaged at byte ")
    assert rejects["w.tar"].startswith("truncated at byte ") and "no end-of-archive marker" in rejects["w.tar"]
    assert rejects["w.tar/d"].startswith("may be incomplete: truncated")
    assert summary.num_samples == 1 and len(rejects) == 4
    assert [(label, path) for _, label, path in readers.open_dataset(out, fields=("image", "label", "path"))] == \
        [(2, "w.tar/c")]


def test_interrupted_tar_run_resumes_to_the_same_bytes(tmp_path: Path, tars: tuple[Path, list[dict]]) -> None:
    folder, _ = tars
    reference, out = tmp_path / "reference", tmp_path / "out"
    pack(folder, reference, PackOptions(format="wds", shard_size=2))
    partial = pack(folder, out, PackOptions(format="wds", shard_size=2), partition=Partition(index=1, count=3))
    assert not partial.published and not (out / "index.json").exists()
    (out / "shard-000001.tar").write_bytes(b"damaged by the interruption")
    summary = pack(folder, out, PackOptions(format="wds", shard_size=2))
    assert summary.resumed_shards == 2 and summary.num_samples == 15
    assert shard_bytes(out) == shard_bytes(reference) and manifest(out) == manifest(reference)


@pytest.mark.parametrize("source_format", ["hdf5", "lmdb", "wds"])
def test_repacking_any_format_into_any_other_equals_packing_the_folder(packed_as: Callable, tmp_path: Path,
                                                                         source_format: str) -> None:
    source, _ = packed_as(source_format)
    for fmt in ("hdf5", "lmdb", "wds"):
        out = tmp_path / fmt
        summary = pack(source, out, PackOptions(format=fmt, shard_size=4, order="sorted"), workers=1)
        reference, _ = packed_as(fmt)  # sorted too: the repack keeps the source's order
        assert summary.rejects == 0 and shard_bytes(out) == shard_bytes(reference), (source_format, fmt)
        ours, theirs = manifest(out), manifest(reference)
        for changed in ("source_bytes", "options"):
            ours.pop(changed), theirs.pop(changed)
        ours["descriptors"] = theirs["descriptors"] = None  # they hash the manifest's own text
        assert ours == theirs


def test_repack_to_pixels_equals_packing_the_folder_to_pixels(packed_as: Callable, image_folder: tuple, tmp_path: Path) -> None:
    """`pack wds train.lmdb/ train-raw.wds --store raw --resize 256 --center-crop 224`, small."""
    source, _ = packed_as("lmdb")
    pixels: dict = dict(store="raw", resize=24, center_crop=16)
    code, output = run("wds", source, tmp_path / "raw", "--store", "raw", "--resize", "24", "--center-crop", "16",
                       "--order", "sorted", "-q")  # sorted: sample by sample, like the folder's
    assert code == 0, output
    pack(image_folder[0], tmp_path / "reference", PackOptions(format="wds", order="sorted", **pixels))
    assert read_raw(tmp_path / "raw") == read_raw(tmp_path / "reference")
    pack(tmp_path / "raw", tmp_path / "again", PackOptions(format="hdf5", store="raw", order="sorted"))  # raw in and out
    assert read_raw(tmp_path / "again") == read_raw(tmp_path / "reference")


def read_raw(out: Path) -> list[tuple]:
    return [(bytes(image), label, path) for image, label, path in
            readers.open_dataset(out, decode="bytes", fields=("image", "label", "path"))]


def test_a_damaged_input_shard_is_a_reject_per_lost_sample(packed_as: Callable, tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(packed_as("wds")[0], source)
    with tarfile.open(source / "shard-000001.tar") as tar:
        member = next(member for member in tar if member.name.endswith(".jpg"))
    data = bytearray((source / "shard-000001.tar").read_bytes())
    data[member.offset_data + 20] ^= 0xFF
    (source / "shard-000001.tar").write_bytes(bytes(data))
    summary = pack(source, tmp_path / "repacked", PackOptions(format="lmdb"))
    rejects = [json.loads(line) for line in (tmp_path / "repacked" / "rejects.jsonl").read_text().splitlines()]
    assert summary.num_samples == 18 and len(rejects) == 1
    shard, local = rejects[0]["path"].split("/")
    assert shard == "shard-000001.tar" and f"shard-000001.tar: sample {local}: damaged" in rejects[0]["reason"]


def test_tar_labels_through_a_class_list(tmp_path: Path, tars: tuple[Path, list[dict]]) -> None:
    folder, samples = tars
    (tmp_path / "classes.txt").write_text("zero\none\n")  # label 2 is not a class of this list
    summary = pack(folder, tmp_path / "out", PackOptions(format="lmdb", classes=str(tmp_path / "classes.txt")))
    assert summary.num_samples == 10 and summary.rejects == 5
    assert manifest(tmp_path / "out")["classes"] == ["zero", "one"]
    assert manifest(tmp_path / "out")["class_counts"] == [5, 5]
    reasons = {json.loads(line)["reason"] for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()}
    assert reasons == {f"label 2 is out of range for the 2 classes of {tmp_path / 'classes.txt'}"}
    code, output = run("lmdb", folder, tmp_path / "x", "--sidecars", "txt")
    assert code == 1 and "--sidecars applies to a folder of images, not to tar input" in output


@pytest.mark.parametrize("tar_format", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_tar_headers_are_read_as_the_tar_module_reads_them(tmp_path: Path, tar_format: int) -> None:
    long = "deep/" * 25 + "x.jpg" if tar_format != tarfile.USTAR_FORMAT else "a" * 90 + "/" + "b" * 90 + ".jpg"
    names = ["plain.jpg", long, "ünïcode-名前.txt", "dir/k.cls"]
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=tar_format) as tar:
        for number, name in enumerate(names):
            add_member(tar, name, bytes(range(number * 300 % 256)) * (number + 1))
    data = path.read_bytes()
    ours = [(member.name, member.data, member.size) for member in read_members(lambda at, size: data[at:at + size], 0, len(data))]
    with tarfile.open(path) as tar:
        assert ours == [(member.name, member.offset_data, member.size) for member in tar] and [name for name, _, _ in ours] == names


def test_input_format_names_what_the_file_names_do_not(tmp_path: Path, tars: tuple[Path, list[dict]]) -> None:
    folder, samples = tars
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for number, tar in enumerate(sorted(folder.glob("*.tar"))):
        shutil.copy(tar, renamed / f"train-{number:05d}-of-00003")
    code, output = run("lmdb", renamed / "train-*-of-00003", tmp_path / "out")
    assert code == 1 and "say it with --input-format" in output
    code, output = run("lmdb", renamed / "train-*-of-00003", tmp_path / "out", "--input-format", "tar")
    assert code == 0, output
    assert sorted(bytes(image) for image, _ in readers.open_dataset(tmp_path / "out", decode="bytes")) == \
        sorted(sample["jpg"] for sample in samples)
    code, output = run("lmdb", renamed, tmp_path / "folder", "--input-format", "folder")
    assert code == 1 and "no image files found" in output


def test_a_packed_dataset_in_a_bucket_repacks_like_the_local_one(packed_as: Callable, s3_packed: Callable,
                                                                  s3_options: dict, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`pack lmdb s3://bucket/x.wds out`: the index.json there makes it a packed dataset, whose
    shards the workers fetch through the readers' cache; the result is the local re-pack's."""
    import fsspec.config

    monkeypatch.setitem(fsspec.config.conf, "s3", s3_options)  # this process; the workers read the variable
    monkeypatch.setenv("FSSPEC_S3", json.dumps(s3_options))
    monkeypatch.setenv("PACK_CACHE_DIR", str(tmp_path / "cache"))
    url = s3_packed("wds")
    code, output = run("lmdb", url, tmp_path / "remote", "--shard-size", "4", "--workers", "2", "-q")
    assert code == 0, output
    pack(packed_as("wds")[0], tmp_path / "local", PackOptions(format="lmdb", shard_size=4), workers=1)
    assert shard_bytes(tmp_path / "remote") == shard_bytes(tmp_path / "local")  # the same shuffle
    pack(packed_as("wds")[0], tmp_path / "sorted", PackOptions(format="lmdb", shard_size=4, order="sorted"), workers=1)
    assert shard_bytes(tmp_path / "sorted") == shard_bytes(packed_as("lmdb")[0])
    code, output = run("lmdb", url, tmp_path / "tar-kind", "--input-format", "tar", "-q")
    assert code == 1 and output == f"Error: {url}: not a tar file; a URL SRC is a packed dataset, a folder of " \
        "images or one tar, .rec or .tfrecord file\n", output


def test_a_label_beyond_int64_is_a_reject(tmp_path: Path) -> None:
    """Every format stores labels as int64: a larger one is a reject naming the sample (HDF5 gave a traceback)."""
    rng = random.Random(10)
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "a.tar").write_bytes(ustar_member("a.jpg", image_bytes(rng)) + ustar_member("a.cls", b"99999999999999999999")
                                   + ustar_member("b.jpg", image_bytes(rng)) + ustar_member("b.cls", b"3") + bytes(1024))
    out = tmp_path / "out"
    summary = pack(folder, out, PackOptions(format="hdf5"), workers=1)
    rows = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert summary.num_samples == 1 and rows == [{"path": "a.tar/a", "reason": "label 99999999999999999999 is out of "
                                                  "range (0 to 9223372036854775807)"}]


def test_binary_tar_members_are_left_out_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "shards"
    folder.mkdir()
    rng = random.Random(1)
    with webdataset.TarWriter(str(folder / "data-000000.tar")) as writer:
        for number in range(4):
            writer.write({"__key__": f"{number:09d}", "jpg": image_bytes(rng), "cls": number,
                          "pth": b"\x80\x04\x95" + bytes(rng.randrange(256) for _ in range(64)),
                          "mp3": b"\xff\xfb" + bytes(64), "txt": f"caption {number}"})
    with caplog.at_level("WARNING"):
        code, output = run("wds", folder, tmp_path / "out")
    assert code == 0, output
    assert "packed 4 samples" in output and "0 rejected" in output and "8 non-image entries ignored" in output
    assert "members .mp3, .pth hold binary data, which no field type stores: left out" in caplog.text
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert [spec["name"] for spec in index["fields"]] == ["txt"]
    dataset = readers.open_dataset(tmp_path / "out", decode="bytes", fields=("label", "txt"))
    assert sorted(dataset) == [(number, f"caption {number}") for number in range(4)]


def test_input_format_takes_a_folder_of_inputs_without_their_suffix(tmp_path: Path) -> None:
    imagenet = tmp_path / "imagenet"
    imagenet.mkdir()
    for name in ("train-00000-of-00002", "train-00001-of-00002", "train-00000-of-00002.tfindex"):
        (imagenet / name).write_bytes(b"")
    source = resolve_source(imagenet, "tfrecord")
    assert source.kind == "tfrecord"
    assert [Path(name).name for name in source.inputs] == ["train-00000-of-00002", "train-00001-of-00002"]
    (imagenet / "README.txt").write_text("ImageNet")  # a file with a suffix is not an input
    assert len(resolve_source(imagenet, "tfrecord").inputs) == 2
    (imagenet / "validation-00000-of-00001").write_bytes(b"")  # two splits: never packed together
    with pytest.raises(ScanError, match=r"tfrecord files of several names \(train, validation\); choose one with a "
                                        r"pattern, e\.g\. '.*imagenet/train-\*'"):
        resolve_source(imagenet, "tfrecord")
    (imagenet / "train-00002-of-00002.tfrecord").write_bytes(b"")  # where some have the suffix, those
    assert [Path(name).name for name in resolve_source(imagenet, "tfrecord").inputs] == ["train-00002-of-00002.tfrecord"]


def test_inputs_are_read_ahead_in_chunks_within_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = {"a.tar": 10 << 20, "b.tar": 3 << 20}
    for name, size in sizes.items():
        with open(tmp_path / name, "wb") as handle:
            handle.truncate(size)
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(containers.os, "posix_fadvise", lambda fd, offset, length, advice: asked.append((offset, length)))
    (tmp_path / "packed-dataset").mkdir()
    inputs = [str(tmp_path / "packed-dataset"), str(tmp_path / "gone.tar"), *(str(tmp_path / name) for name in sizes)]
    chunk = containers.READ_AHEAD_CHUNK
    containers.ask_ahead(inputs, 20 << 20, threading.Event())
    assert asked == [(0, chunk), (chunk, chunk), (2 * chunk, (10 << 20) - 2 * chunk), (0, 3 << 20)]
    asked.clear()
    containers.ask_ahead(inputs, 6 << 20, threading.Event())
    assert asked == [(0, chunk), (chunk, (6 << 20) - chunk)]  # the budget, then no more
    asked.clear()
    stopped = threading.Event()
    stopped.set()
    containers.ask_ahead(inputs, 20 << 20, stopped)  # the scan has ended
    assert asked == []
