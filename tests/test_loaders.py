"""Pack outputs open, as is, in the loaders our users train with: Hugging Face `datasets` (the
webdataset and hdf5 builders, and the folder through its dataset card) and `wids`. Bytes, labels,
class names and keys are compared with the source exactly."""

from __future__ import annotations

import json
import random
from pathlib import Path

import datasets
import numpy as np
import pytest
import wids

import readers
from packer.run.pipeline import pack
from packer.plan.options import PackOptions
from clirun import run
from imagefolders import image_bytes as jpeg_bytes
from imagefolders import make_caption_folder, make_image_folder
from readers.layouts.hdf5 import encode_name
from readers.manifest import sample_key

datasets.disable_progress_bars()


@pytest.fixture(scope="module")
def wds_out(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    """The seeded folder (PNG and JPEG, nested, a non-ASCII name) packed as wds in shards of 4. Without
    the non-UTF-8 file name: Arrow cannot hold its `path` string (docs/reading.md says so)."""
    root = tmp_path_factory.mktemp("loaders") / "src"
    files = make_image_folder(root)
    out = root.parent / "out"
    pack(root, out, PackOptions(format="wds", shard_size=4))
    return out, files


def stored(out: Path, field: str) -> list:
    """One field of every sample, in stored order, through our own reader."""
    return [value for (value,) in readers.open_dataset(out, fields=(field,))]


def reference(out: Path, decode: str = "bytes") -> list[tuple]:
    """(image, label, path) of every sample, in order, through our own reader."""
    dataset = readers.open_dataset(out, decode=decode, fields=("image", "label", "path"))
    return [dataset[index] for index in range(len(dataset))]


def keys(out: Path) -> list[str]:
    return [sample_key(shard, row) for shard, info in enumerate(readers.load_manifest(out).shards)
            for row in range(info.num_samples)]


def image_bytes(row: dict) -> bytes:
    """The one image column a webdataset row has (named by its member's extension)."""
    (image,) = [row[column] for column in ("jpg", "png") if row.get(column) is not None]
    return image["bytes"]


@pytest.mark.parametrize("streaming", [False, True])
def test_hf_webdataset_builder_reads_the_tars(wds_out, tmp_path: Path, streaming: bool) -> None:
    out, files = wds_out
    shards = sorted(str(path) for path in out.glob("shard-*.tar"))
    features = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path)).features
    loaded = datasets.load_dataset("webdataset", data_files={"train": shards}, split="train",
                                   streaming=streaming, cache_dir=str(tmp_path), features=features)
    loaded = loaded.cast_column("jpg", datasets.Image(decode=False)).cast_column("png", datasets.Image(decode=False))
    rows = list(loaded)
    assert [(image_bytes(row), row["cls"], row["pack.json"]["path"]) for row in rows] == reference(out)
    assert [row["__key__"] for row in rows] == keys(out)
    assert all(files[path] == image for image, _, path in reference(out))


def test_hf_loads_the_wds_folder_through_its_card(wds_out, tmp_path: Path) -> None:
    out, _ = wds_out
    loaded = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path))
    manifest = readers.load_manifest(out)
    assert loaded.features["cls"].names == manifest.classes
    assert isinstance(loaded.features["jpg"], datasets.Image) and isinstance(loaded.features["png"], datasets.Image)
    assert loaded[0]["jpg"].size == readers.open_dataset(out)[0][0].size  # decoded to PIL as an image
    loaded = loaded.cast_column("jpg", datasets.Image(decode=False)).cast_column("png", datasets.Image(decode=False))
    assert [(image_bytes(row), row["cls"], row["pack.json"]["path"]) for row in loaded] == reference(out)
    streamed = datasets.load_dataset(str(out), split="train", streaming=True)
    assert [(row["cls"], row["__key__"]) for row in streamed] == [(label, key) for (_, label, _), key in
                                                                   zip(reference(out), keys(out))]


def test_hf_reads_raw_pixels_as_arrays(tmp_path: Path) -> None:
    root = tmp_path / "src"
    make_image_folder(root)
    out = tmp_path / "raw"
    pack(root, out, PackOptions(format="wds", store="raw", center_crop=8, shard_size=6))
    loaded = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "cache")).with_format("numpy")
    expected = reference(out, decode="numpy")
    assert len(loaded) == len(expected)
    for row, (image, label, path) in zip(loaded, expected):
        assert row["npy"].shape == (8, 8, 3)
        np.testing.assert_array_equal(row["npy"], image)
        assert (row["cls"], row["pack.json"]["path"]) == (label, path)


@pytest.mark.parametrize("streaming", [False, True])
def test_hf_card_types_each_field_as_a_column(tmp_path: Path, streaming: bool) -> None:
    """`--sidecars txt,json`: the card names the field columns as HF's webdataset builder makes them
    (`txt` text, `json` JSON, beside pack's `pack.json` meta), and each holds the sidecar exactly."""
    samples = make_caption_folder(tmp_path / "src")
    out = tmp_path / "out"
    code, output = run("wds", tmp_path / "src", out, "--sidecars", "txt,json", "--shard-size", "4", "-q")
    assert code == 0, output
    loaded = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "cache"), streaming=streaming)
    features = loaded.features
    assert features["txt"] == datasets.Value("string") and isinstance(features["json"], datasets.Json)
    assert set(features) == {"jpg", "cls", "txt", "json", "pack.json", "__key__", "__url__"}
    rows = list(loaded)
    paths = stored(out, "path")
    assert [row["pack.json"]["path"] for row in rows] == paths and sorted(paths) == sorted(samples)
    assert [row["__key__"] for row in rows] == keys(out)
    for row in rows:
        _, caption, meta = samples[row["pack.json"]["path"]]
        assert row["txt"] == caption
        # HF's Json feature re-serialises with ujson, which keeps 10 decimals of a float.
        score = row["json"]["extra"].pop("score")
        assert score == pytest.approx(meta["extra"]["score"], abs=1e-9)
        assert row["json"] == dict(meta, extra={"tags": meta["extra"]["tags"]})
        assert row["txt"] == (tmp_path / "src" / row["pack.json"]["path"]).with_suffix(".txt").read_text("utf-8")
    plain = datasets.load_dataset("webdataset", data_files={"train": sorted(str(p) for p in out.glob("shard-*.tar"))},
                                  split="train", cache_dir=str(tmp_path / "cache2"), features=features)
    assert [row["txt"] for row in plain] == [row["txt"] for row in rows]  # the card's columns are the builder's


def test_hf_hdf5_builder_reads_fixed_pixels_with_and_without_the_card(image_folder, tmp_path: Path) -> None:
    root, _ = image_folder
    out = tmp_path / "h5"
    pack(root, out, PackOptions(format="hdf5", store="raw", center_crop=8, shard_size=6))
    expected = reference(out, decode="numpy")
    shards = sorted(str(path) for path in out.glob("shard-*.h5"))
    plain = datasets.load_dataset("hdf5", data_files={"train": shards}, split="train",
                                  cache_dir=str(tmp_path / "cache")).with_format("numpy")
    carded = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "cache2"))
    assert carded.features["labels"].names == readers.load_manifest(out).classes
    assert len(plain) == len(carded) == len(expected)
    for row, card_row, (image, label, path) in zip(plain, carded.with_format("numpy"), expected):
        np.testing.assert_array_equal(row["images"], image)
        np.testing.assert_array_equal(card_row["images"], image)
        assert row["labels"] == card_row["labels"] == label
        assert row["paths"] == card_row["paths"] == encode_name(path)[0]


def test_wids_reads_the_descriptor(packed_as) -> None:
    out, files = packed_as("wds")  # wids keeps names as bytes: the non-UTF-8 one included
    dataset = wids.ShardListDataset(str(out / "wids.json"), transformations=[])  # members as streams
    expected = reference(out)
    assert len(dataset) == len(expected)
    decoded = wids.ShardListDataset(str(out / "wids.json"))[len(expected) - 1]  # its default: PIL, int
    assert (decoded[".cls"], decoded[".jpg"].size) == (expected[-1][1], readers.open_dataset(out)[-1][0].size)
    for index, (image, label, path) in enumerate(expected):
        sample = dataset[index]
        extension = ".png" if ".png" in sample else ".jpg"
        assert sample[extension].read() == image == files[path]
        assert int(sample[".cls"].read()) == label
        assert json.loads(sample[".pack.json"].read())["path"] == path
        assert sample["__key__"] == keys(out)[index]


def test_hf_hdf5_card_reads_the_fields_group(tmp_path: Path) -> None:
    """Fixed-layout HDF5 with fields: the card's `fields` struct column holds each field dataset."""
    samples = make_caption_folder(tmp_path / "src")
    out = tmp_path / "out"
    code, output = run("hdf5", tmp_path / "src", out, "--sidecars", "txt,json", "--store", "raw",
                       "--center-crop", "8", "-q")
    assert code == 0, output
    carded = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "cache"))
    assert carded.features["fields"] == {"txt": datasets.Value("string"), "json": datasets.Value("string")}
    assert [row["paths"] for row in carded] == stored(out, "path") and sorted(stored(out, "path")) == sorted(samples)
    for row in carded:
        _, caption, meta = samples[row["paths"]]
        assert row["fields"]["txt"] == caption and json.loads(row["fields"]["json"]) == meta


def test_hf_loads_integer_labels_without_class_names(tmp_path: Path) -> None:
    """Metadata with integer labels and no --classes: classes "0".."K-1" (K = the largest label + 1),
    which the card's ClassLabel names, so every label loads."""
    root = tmp_path / "src"
    root.mkdir()
    rng = random.Random(4)
    lines = []
    for index in range(4):
        (root / f"{index}.jpg").write_bytes(jpeg_bytes(rng))
        lines.append(json.dumps({"file_name": f"{index}.jpg", "label": index * 3}))
    (tmp_path / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    pack(root, out, PackOptions(format="wds", metadata=str(tmp_path / "metadata.jsonl")))
    assert readers.load_manifest(out).classes == [str(index) for index in range(10)]
    loaded = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "cache"))
    assert [row["cls"] for row in loaded] == stored(out, "label") and sorted(stored(out, "label")) == [0, 3, 6, 9]
