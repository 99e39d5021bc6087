"""Datasets written by older pack versions still open: tests/data/v1 was packed by pack at 118573d
(format version 1: per-shard keys, `.raw` tar members, the PKX1 index under `.idx`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from clirun import run

import readers
from readers.manifest import FORMAT_VERSION
from packer.run.pipeline import pack
from packer.plan.options import PackOptions

V1 = Path(__file__).parent / "data" / "v1"
V1_DATASETS = sorted(path.name for path in V1.iterdir() if (path / "index.json").is_file())


def samples(out: Path, decode: str) -> list[tuple]:
    dataset = readers.open_dataset(out, decode=decode, fields=("image", "label", "path"))
    loaded = [dataset[index] for index in range(len(dataset))]
    if decode == "bytes":  # streaming (tars front to back) agrees with random access
        assert list(iter(dataset)) == loaded
    return loaded


@pytest.mark.parametrize("name", V1_DATASETS)
def test_version_1_datasets_read_like_the_current_version(name: str, tmp_path: Path) -> None:
    old = V1 / name
    manifest = readers.load_manifest(old)
    assert manifest.version == 1
    current = tmp_path / "current"
    options = {"order": "sorted", **manifest.options}  # version 1 predates --order: its order was sorted
    pack(V1 / "src", current, PackOptions(**options))
    assert readers.load_manifest(current).version == FORMAT_VERSION > 1
    decode = "numpy" if manifest.store == "raw" else "bytes"
    old_samples, current_samples = samples(old, decode), samples(current, decode)
    assert len(old_samples) == len(current_samples) == 6
    for (old_image, *old_rest), (image, *rest) in zip(old_samples, current_samples):
        assert old_rest == rest
        if decode == "bytes":
            assert old_image == image == (V1 / "src" / rest[1]).read_bytes()
        else:
            np.testing.assert_array_equal(old_image, image)
    copy = tmp_path / "old"
    shutil.copytree(old, copy)
    code, output = run("verify", copy, "--full", "-q")
    assert code == 0, output
