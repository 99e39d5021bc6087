"""Every format end to end: pack a folder, read it back through every path a user would take.

Parametrised over the writer registry, so a new format is tested here by registering it.
"""

from __future__ import annotations

import dataclasses
import io
import json
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

import readers
from packer.stores.fsutil import sha256_file
from packer.write.writers import WRITERS
from readers.lmdb import READAHEAD_MIN_BYTES


def as_list(batch: list) -> list:
    return batch


def expected_label(path: str) -> int:
    return ["class_00", "class_01", "class_02"].index(path.split("/")[0])


def test_manifest_contract(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, files = packed
    index = json.loads((out / "index.json").read_text())
    writer = WRITERS[index["format"]]
    assert index["version"] == 2 and index["store"] == "original" and index["fields"] == []
    assert index["num_samples"] == len(files)
    assert index["classes"] == ["class_00", "class_01", "class_02"]
    assert sum(shard["num_samples"] for shard in index["shards"]) == len(files)
    assert [shard["name"] for shard in index["shards"]] == [
        f"shard-{i:06d}{writer.extension}" for i in range(len(index["shards"]))
    ]
    for i, shard in enumerate(index["shards"]):
        assert (out / shard["name"]).stat().st_size == shard["bytes"]
        assert sha256_file(out / shard["name"]) == shard["sha256"]
        assert [sidecar["name"] for sidecar in shard["sidecars"]] == [f"shard-{i:06d}{ext}" for ext in writer.sidecars]
        for sidecar in shard["sidecars"]:
            assert (out / sidecar["name"]).stat().st_size == sidecar["bytes"]
            assert sha256_file(out / sidecar["name"]) == sidecar["sha256"]
    on_disk = sorted(name for name in os.listdir(out) if name.startswith("shard-"))
    assert on_disk == sorted(
        [shard["name"] for shard in index["shards"]]
        + [sidecar["name"] for shard in index["shards"] for sidecar in shard["sidecars"]]
    )
    assert index["options"]["shard_size"] == 4 and index["tool_version"].startswith("pack ")
    assert (out / "rejects.jsonl").read_text() == ""


def test_every_sample_round_trips_in_order(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, files = packed
    ds = readers.open_dataset(out, decode="bytes", fields=("image", "label", "path", "index"))
    assert type(ds) is readers.DATASETS[ds.manifest.format]
    assert len(ds) == len(files)
    samples = [ds[i] for i in range(len(ds))]
    assert list(ds) == samples  # iteration (tar shards: streamed front to back) agrees with ds[i]
    assert [path for _, _, path, _ in samples] == sorted(files)
    for position, (data, label, path, index) in enumerate(samples):
        assert data == files[path]
        assert label == expected_label(path)
        assert index == position
    assert ds[-1] == ds[len(ds) - 1]
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_decode_modes(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, files = packed
    path = sorted(files)[0]
    reference = np.asarray(Image.open(io.BytesIO(files[path])).convert("RGB"))
    (pil,) = readers.open_dataset(out, decode="pil", fields=("image",))[0]
    assert pil.mode == "RGB" and np.array_equal(np.asarray(pil), reference)
    (array,) = readers.open_dataset(out, decode="numpy", fields=("image",))[0]
    assert array.dtype == np.uint8 and np.array_equal(array, reference)
    (tensor,) = readers.open_dataset(out, decode="tensor", fields=("image",))[0]
    assert tensor.dtype == torch.uint8 and tensor.shape == (3, *reference.shape[:2])
    assert np.array_equal(tensor.permute(1, 2, 0).numpy(), reference)


def test_transforms_apply(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, _ = packed
    ds = readers.open_dataset(out, transform=lambda image: image.size, target_transform=lambda label: label + 100)
    size, label = ds[0]
    assert isinstance(size, tuple) and label == 100


def test_bad_arguments(packed: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    out, _ = packed
    with pytest.raises(ValueError, match="decode"):
        readers.open_dataset(out, decode="jpeg")
    with pytest.raises(readers.DatasetError, match="no field 'pixels'; available: image, label, path, index$"):
        readers.open_dataset(out, fields=("pixels",))
    with pytest.raises(ValueError, match="fields"):
        readers.open_dataset(out, fields=())
    with pytest.raises(readers.DatasetError, match="no manifest"):
        readers.open_dataset(tmp_path)


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_dataloader_workers_see_every_sample_once(packed: tuple[Path, dict[str, bytes]], start_method: str) -> None:
    out, files = packed
    ds = readers.open_dataset(out, decode="bytes", fields=("image", "path", "label"))
    ds[0]  # the parent has a handle open before the fork: workers must cope
    loader = DataLoader(
        ds,
        batch_size=3,
        num_workers=2,
        collate_fn=as_list,
        multiprocessing_context=multiprocessing.get_context(start_method),
    )
    seen = [sample for batch in loader for sample in batch]
    assert sorted(path for _, path, _ in seen) == sorted(files)
    for data, path, label in seen:
        assert data == files[path] and label == expected_label(path)


def test_readahead_only_for_shards_of_large_records(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, _ = packed
    if readers.load_manifest(out).format != "lmdb":
        pytest.skip("an LMDB reader setting")
    small = readers.open_dataset(out, decode="bytes")
    assert small.handle(0).flags()["readahead"] is False
    small.close()
    manifest = readers.load_manifest(out)
    info = manifest.shards[0]
    manifest.shards[0] = dataclasses.replace(info, bytes=READAHEAD_MIN_BYTES * info.num_samples)
    large = readers.LMDBDataset(out, manifest=manifest, decode="bytes")
    assert large.handle(0).flags()["readahead"] is True
    assert large.handle(1).flags()["readahead"] is False
    large.close()
