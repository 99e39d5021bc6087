"""packer.pack: the `pack` command from Python, with the CLI's options and one-line errors."""

from __future__ import annotations

import json

import pytest

import packer
import readers
from imagefolders import make_image_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("api") / "images"
    files = make_image_folder(root, classes=2, per_class=3)
    return root, files


def test_pack_takes_the_cli_options_and_returns_the_summary(folder, tmp_path):
    root, files = folder
    summary = packer.pack(root, tmp_path / "out", format="lmdb", shard_size=2, workers=2, on_error="fail",
                          split="val", shard_bytes="4GB")
    assert isinstance(summary, packer.Summary)
    assert summary.num_samples == len(files) and summary.num_shards == 3 and summary.published
    ds = readers.open_dataset(tmp_path / "out", decode="bytes", fields=("image", "path"))
    assert {path: bytes(image) for image, path in ds} == files
    options = json.loads((tmp_path / "out" / "index.json").read_text())["options"]
    assert options["shard_size"] == 2 and options["shard_bytes"] == 4 * 10**9


def test_pack_in_tasks_then_merge(folder, tmp_path):
    root, files = folder
    first = packer.pack(root, tmp_path / "out", format="wds", shard_size=3, task_index=0, task_count=2)
    assert not first.published and first.num_shards == 1 and not (tmp_path / "out" / "index.json").exists()
    with pytest.raises(packer.PackError, match="1 of 2 shards unfinished: shard-000001.tar"):
        packer.merge(tmp_path / "out")
    packer.pack(root, tmp_path / "out", format="wds", shard_size=3, task_index=1, task_count=2)
    assert packer.merge(tmp_path / "out", split="val").num_samples == len(files)
    assert len(readers.open_dataset(tmp_path / "out")) == len(files)


@pytest.mark.parametrize("options, message", [
    ({"shard_sise": 3}, "unknown option 'shard_sise'"),
    ({"store": "original", "resize": 8}, "--resize needs a store that decodes"),
    ({"task_index": 1}, "--task-index and --task-count go together"),
    ({"on_error": "ignore"}, "--on-error must be one of"),
    ({"shard_bytes": "lots"}, "--shard-bytes: "),
])
def test_bad_options_are_pack_errors_with_the_cli_message(folder, tmp_path, options, message):
    root, _ = folder
    with pytest.raises(packer.PackError, match=message):
        packer.pack(root, tmp_path / "out", format="hdf5", **options)


def test_a_missing_src_is_a_one_line_pack_error(tmp_path):
    with pytest.raises(packer.PackError, match=f"{tmp_path / 'nowhere'}: does not exist"):
        packer.pack(tmp_path / "nowhere", tmp_path / "out", format="lmdb")
