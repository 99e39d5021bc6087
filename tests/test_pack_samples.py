"""packer.pack_samples: samples made by code, packed with the shards, workers, resume and
rejects of a folder. Tests that compare samples by position pack in sorted order (the inputs'
order; tests/test_order.py: the shuffle)."""

from __future__ import annotations

import json

import pytest

import packer
import readers
import samplefns
from imagefolders import make_image_folder


def rejects(out) -> list[dict]:
    return [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]


def test_pack_samples_with_two_workers_equals_packing_the_folder(tmp_path):
    root = tmp_path / "images"
    files = make_image_folder(root, classes=2, per_class=4)
    packer.pack(root, tmp_path / "folder", order="sorted", format="hdf5", shard_size=3)
    classes = sorted({path.split("/")[0] for path in files})
    inputs = [(str(root), path, classes.index(path.split("/")[0])) for path in sorted(files)]
    summary = packer.pack_samples(samplefns.from_file, inputs, tmp_path / "out", order="sorted", format="hdf5",
                                  shard_size=3, workers=2)
    assert summary.num_samples == len(files) and summary.num_shards == 3
    folder = readers.open_dataset(tmp_path / "folder", decode="bytes")
    ds = readers.open_dataset(tmp_path / "out", decode="bytes", fields=("image", "label", "path", "caption"))
    assert [(bytes(image), label) for image, label, _, _ in ds] == [(bytes(image), label) for image, label in folder]
    assert [(path, caption) for _, _, path, caption in ds] == [(str(n), f"a picture of {path}")
                                                              for n, (_, path, _) in enumerate(inputs)]


def test_failing_calls_and_bad_samples_are_rejects_naming_the_input(tmp_path):
    summary = packer.pack_samples(samplefns.flaky, range(8), tmp_path / "out", order="sorted", format="lmdb",
                                  workers=2, shard_size=4)
    assert summary.num_samples == 3 and summary.rejects == 5
    assert rejects(tmp_path / "out") == [
        {"path": "1", "reason": "fn(1) raised ValueError: no frame 1"},
        {"path": "4", "reason": "fn(4) raised ValueError: no frame 4"},
        {"path": "5", "reason": "fn(5): no image"},
        {"path": "6", "reason": "fn(6): field 'score' is a str, where the first sample has a float"},
        {"path": "7", "reason": "fn(7) raised ValueError: no frame 7"},
    ]
    ds = readers.open_dataset(tmp_path / "out", decode="numpy", fields=("image", "label", "score"))
    assert [(label, score) for _, label, score in ds] == [(0, 0.0), (2, 1.0), (3, 1.5)]
    assert all((image == samplefns.pixels(label)).all() for image, label, _ in ds)  # arrays stored losslessly


def test_a_list_of_samples_per_input(tmp_path):
    packer.pack_samples(samplefns.frames, [1, 3, 2], tmp_path / "out", order="sorted", format="wds")
    ds = readers.open_dataset(tmp_path / "out", decode="numpy", fields=("image", "label", "path", "frame"))
    assert [(label, path, frame.tolist()) for _, label, path, frame in ds] == [
        (1, "0", [1, 0]), (3, "1/0", [3, 0]), (3, "1/1", [3, 1]), (3, "1/2", [3, 2]), (2, "2/0", [2, 0]), (2, "2/1", [2, 1])]
    assert all((image == samplefns.pixels(label * 10 + frame[1])).all() for image, label, _, frame in ds)


def test_resume_and_other_inputs(tmp_path):
    out = tmp_path / "out"
    first = packer.pack_samples(samplefns.frames, [1, 2, 3, 4], out, format="lmdb", shard_size=1, task_index=0,
                                task_count=2)
    assert not first.published
    with pytest.raises(packer.PackError, match="holds an unfinished run of .*rerun with those, or pass --overwrite"):
        packer.pack_samples(samplefns.frames, [1, 2, 3], out, format="lmdb", shard_size=1)
    resumed = packer.pack_samples(samplefns.frames, [1, 2, 3, 4], out, format="lmdb", shard_size=1)
    assert resumed.resumed_shards == 2 and resumed.num_samples == 10
    again = packer.pack_samples(samplefns.frames, [2], out, format="lmdb", overwrite=True)
    assert again.num_samples == 2 and len(readers.open_dataset(out)) == 2


def test_a_function_workers_cannot_import_is_a_clear_error(tmp_path):
    with pytest.raises(packer.PackError, match="must be picklable for the spawned worker processes"):
        packer.pack_samples(lambda item: {"image": b""}, [1], tmp_path / "out", format="lmdb")


def test_a_failing_first_input_is_a_reject_and_fail_mode_names_the_input(tmp_path):
    summary = packer.pack_samples(samplefns.flaky, [1, 0, 2], tmp_path / "out", order="sorted",
                                  format="wds")  # fn(1) raises
    assert summary.num_samples == 2 and rejects(tmp_path / "out") == [
        {"path": "0", "reason": "fn(1) raised ValueError: no frame 1"}]
    ds = readers.open_dataset(tmp_path / "out", decode="numpy", fields=("label", "score"))
    assert list(ds) == [(0, 0.0), (2, 1.0)]
    with pytest.raises(packer.PackError, match=r"^pack_samples input 0: fn\(1\) raised ValueError: no frame 1 "
                                               r"\(--on-error fail\)$"):
        packer.pack_samples(samplefns.flaky, [1, 0, 2], tmp_path / "fail", order="sorted", format="wds",
                            on_error="fail")
    with pytest.raises(packer.PackError, match=r"fn raised for the first 3 inputs \(the first: fn\(0\) raised "
                                               r"RuntimeError: cannot make 0\)"):
        packer.pack_samples(samplefns.always_fails, [0, 1, 2], tmp_path / "none", order="sorted", format="wds")


def test_shard_bytes_and_a_list_src_are_clear_errors(tmp_path):
    with pytest.raises(packer.PackError, match="pack_samples: shard_bytes does not apply"):
        packer.pack_samples(samplefns.flaky, [0], tmp_path / "out", format="wds", shard_bytes="1MB")
    with pytest.raises(packer.PackError, match="src must be one path, URL, glob or brace pattern, not a list"):
        packer.pack([str(tmp_path / "a.tfrecord")], tmp_path / "out", format="wds")
