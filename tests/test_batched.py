"""`PackedDataset.__getitems__`: DataLoader batches give what per-sample reads give, errors included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

import readers
from packer.pipeline import pack
from packer.plan import PackOptions
from packer.writers import WRITERS

FIELDS = ("image", "label", "path", "index")


def packed_raw(src: Path, out: Path, fmt: str, **options: object) -> Path:
    pack(src, out, PackOptions(format=fmt, store="raw", shard_size=5, **options))  # type: ignore[arg-type]
    return out


def assert_same_samples(batched: list[tuple], single: list[tuple]) -> None:
    assert len(batched) == len(single)
    for got, want in zip(batched, single):
        assert got[1:] == want[1:]
        assert got[0].dtype == want[0].dtype and got[0].shape == want[0].shape
        assert torch.equal(got[0], want[0])


def storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


@pytest.mark.parametrize("fmt", sorted(WRITERS))
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_fixed_shape_raw_batch_is_one_tensor_equal_to_per_sample_reads(
    fmt: str, mode: str, image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    src, _ = image_folder
    ds = readers.open_dataset(packed_raw(src, tmp_path / "out", fmt, mode=mode, resize=20, center_crop=16),
                              decode="tensor", fields=FIELDS)
    indices = [7, 0, 13, -1, 7, 3]
    batch = ds.__getitems__(indices)
    assert_same_samples(batch, [ds[i] for i in indices])
    assert batch[0][0].shape == (1 if mode == "L" else 3, 16, 16) and batch[0][0].is_contiguous()
    assert len({storage(image) for image, *_ in batch}) == 1  # copied straight into one batch tensor


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_mixed_shapes_and_other_decodes_fall_back_to_per_sample_reads(
    fmt: str, image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    src, _ = image_folder
    out = packed_raw(src, tmp_path / "out", fmt)  # original sizes: shapes differ
    indices = list(range(8))
    tensors = readers.open_dataset(out, decode="tensor", fields=FIELDS)
    assert len({tuple(tensors[i][0].shape) for i in indices}) > 1
    assert_same_samples(tensors.__getitems__(indices), [tensors[i] for i in indices])
    arrays = readers.open_dataset(out, decode="numpy", fields=FIELDS)
    for got, want in zip(arrays.__getitems__(indices), [arrays[i] for i in indices]):
        assert np.array_equal(got[0], want[0]) and got[1:] == want[1:]


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_dataloader_batches_equal_collated_per_sample_reads(
    fmt: str, image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    src, _ = image_folder
    ds = readers.open_dataset(packed_raw(src, tmp_path / "out", fmt, center_crop=16), decode="tensor")
    order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(0)).tolist()
    loader = DataLoader(ds, batch_size=6, sampler=order, num_workers=1)
    for start, (images, labels) in zip(range(0, len(ds), 6), loader):
        want_images, want_labels = default_collate([ds[i] for i in order[start:start + 6]])
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


def flip_pixel_byte(out: Path, shard: int, local: int) -> None:
    """Flip one byte in the middle of a stored raw sample (pixels are stored as they are)."""
    ds = readers.open_dataset(out, decode="bytes")
    first = sum(s.num_samples for s in ds.manifest.shards[:shard])
    (payload, _) = ds[first + local]
    path = out / ds.manifest.shards[shard].name
    data = bytearray(path.read_bytes())
    start = data.find(payload)
    assert start >= 0 and data.find(payload, start + 1) < 0
    data[start + len(payload) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_damaged_sample_in_a_batch_raises_or_is_stood_in_for_as_per_sample(
    fmt: str, image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    src, _ = image_folder
    out = packed_raw(src, tmp_path / "out", fmt, center_crop=16)
    flip_pixel_byte(out, 1, 2)
    name = readers.load_manifest(out).shards[1].name
    strict = readers.open_dataset(out, decode="tensor")
    with pytest.raises(readers.DatasetError, match=f"{name}: sample 2: damaged \\(checksum mismatch\\)"):
        strict.__getitems__([0, 7, 3])
    indices = [0, 7, 3, 6]
    batched = readers.open_dataset(out, decode="tensor", fields=FIELDS, on_error="skip")
    single = readers.open_dataset(out, decode="tensor", fields=FIELDS, on_error="skip")
    assert_same_samples(batched.__getitems__(indices), [single[i] for i in indices])
    assert batched.skipped == single.skipped == 1
