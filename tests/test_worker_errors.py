"""What a DataLoader worker's error and a spawn start look like from make_loader: a readers error
raised in a worker arrives as its own one line, a transform spawn cannot pickle is refused before a
worker starts, and RandomResizedCrop makes photos of many sizes one batch."""

from __future__ import annotations

import logging
import multiprocessing
import shutil
from pathlib import Path

import pytest
import torch
from conftest import PackedAs

import readers


def half(image: torch.Tensor) -> torch.Tensor:
    return image.float().div(2)


def test_a_batch_of_two_sizes_is_one_line_from_a_worker(packed_as: PackedAs, caplog: pytest.LogCaptureFixture) -> None:
    """The seeded JPEGs have sizes 16..64: with workers, torch would wrap check_one_size's message
    in "Caught ValueError in DataLoader worker process 0" and the worker's traceback."""
    ds = readers.open_dataset(packed_as("lmdb")[0], decode="tensor")
    loader = readers.make_loader(ds, batch_size=4, num_workers=2, persistent_workers=False)
    with caplog.at_level(logging.DEBUG, logger="readers.loader"), pytest.raises(ValueError) as raised:
        next(iter(loader))
    message = str(raised.value)
    assert type(raised.value) is ValueError and "\n" not in message, message
    assert message.startswith("images of shapes (3, ") and message.endswith("--center-crop N")
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    # the worker's traceback is in the log, at debug level
    logged = [record for record in caplog.records
              if record.levelno == logging.DEBUG and "Traceback" in record.getMessage()]
    assert len(logged) == 1 and 'readers/loader.py", line' in logged[0].getMessage()


def test_a_damaged_sample_is_one_line_from_a_worker(packed_as: PackedAs, tmp_path: Path) -> None:
    """A DatasetError raised reading a sample in a worker (a flipped byte: its CRC-32 fails)
    arrives as a DatasetError, one line naming the shard."""
    out, files = packed_as("hdf5")
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    (victim,) = readers.open_dataset(copy, fields=("path",))[1]
    shard = copy / readers.load_manifest(copy).shards[0].name
    data = bytearray(shard.read_bytes())
    start = data.find(files[victim])
    assert start > 0
    data[start + len(files[victim]) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    ds = readers.open_dataset(copy, decode="bytes", fields=("image",))
    loader = readers.make_loader(ds, batch_size=1, num_workers=1, shuffle=False, collate_fn=list,
                                 persistent_workers=False)
    with pytest.raises(readers.DatasetError) as raised:
        list(loader)
    assert "\n" not in str(raised.value) and shard.name in str(raised.value), str(raised.value)


def test_an_error_in_the_users_transform_keeps_the_workers_traceback(packed_as: PackedAs) -> None:
    """Only errors readers raises on purpose are shortened: a bug in a transform shows where."""

    ds = readers.open_dataset(packed_as("lmdb")[0], decode="tensor", transform=bad_transform)
    loader = readers.make_loader(ds, batch_size=2, num_workers=1, persistent_workers=False)
    with pytest.raises(KeyError, match=r"(?s)Caught KeyError in DataLoader worker.*in bad_transform"):
        next(iter(loader))


def bad_transform(image: torch.Tensor) -> torch.Tensor:
    return {"image": image}["no such key"]


def test_worker_error_reads_torchs_wrapped_message() -> None:
    """The one line and the type from the text torch's ExceptionWrapper sends, for a readers frame
    (a qualified exception name and a two-line source excerpt) and not for another one."""
    from readers.loader import worker_error

    readers_file = Path(readers.__file__).parent / "base.py"
    text = ("Caught DatasetError in DataLoader worker process 1.\nOriginal Traceback (most recent call last):\n"
            '  File "/x/torch/utils/data/_utils/worker.py", line 349, in _worker_loop\n    data = fetcher.fetch(index)\n'
            f'  File "{readers_file}", line 12, in read\n    raise DatasetError(f"{{path}}: bad")\n    ^^^^^^^^^^^^\n'
            "readers.manifest.DatasetError: out/shard-000001.lmdb: sample 7: CRC-32 mismatch\n")
    error = worker_error(readers.DatasetError(text))
    assert type(error) is readers.DatasetError and str(error) == "out/shard-000001.lmdb: sample 7: CRC-32 mismatch"
    assert worker_error(readers.DatasetError(text.replace(str(readers_file), "/home/me/train.py"))) is None
    assert worker_error(ValueError("not from a worker")) is None


def test_a_lambda_under_spawn_is_one_line_before_any_worker(packed_as: PackedAs) -> None:
    ds = readers.open_dataset(packed_as("lmdb")[0], decode="tensor", transform=lambda image: image)
    with pytest.raises(ValueError) as raised:
        readers.make_loader(ds, batch_size=2, num_workers=1, multiprocessing_context="spawn")
    here = "test_a_lambda_under_spawn_is_one_line_before_any_worker.<locals>"
    assert str(raised.value) == (
        f"transform {here}.<lambda> can't be pickled for multiprocessing_context='spawn': use a function defined at "
        "module top level (def ...) or readers.RandomResizedCrop")
    ds = readers.open_dataset(packed_as("lmdb")[0], decode="tensor", target_transform=lambda label: label)
    with pytest.raises(ValueError, match=rf"^target_transform {here}.<lambda> can't be pickled for "
                                         r"multiprocessing_context='forkserver': "):
        readers.make_loader(ds, batch_size=2, num_workers=1,
                            multiprocessing_context=multiprocessing.get_context("forkserver"))
    with pytest.raises(ValueError) as raised:  # a crop is no collate_fn: only a transform is offered one
        readers.make_loader(readers.open_dataset(packed_as("lmdb")[0], decode="tensor"), batch_size=2, num_workers=1,
                            multiprocessing_context="spawn", collate_fn=lambda batch: batch)
    assert str(raised.value) == (f"collate_fn {here}.<lambda> can't be pickled for multiprocessing_context='spawn': "
                                 "use a function defined at module top level (def ...)")
    # a mix: the second source's transform is checked too
    plain = readers.open_dataset(packed_as("lmdb")[0], decode="tensor", transform=readers.RandomResizedCrop(8))
    lambdas = readers.open_dataset(packed_as("wds")[0], decode="tensor", transform=lambda image: image)
    with pytest.raises(ValueError, match=rf"^transform {here}.<lambda> can't be pickled"):
        readers.make_loader(readers.mix([plain, lambdas]), batch_size=2, num_workers=1, multiprocessing_context="spawn")
    # fork copies the process: a lambda works there, and without workers anywhere
    for context, workers in (("fork", 1), ("spawn", 0)):
        ds = readers.open_dataset(packed_as("lmdb")[0], decode="tensor", transform=lambda image: image[:, :8, :8])
        images, _ = next(iter(readers.make_loader(ds, batch_size=2, num_workers=workers, persistent_workers=False,
                                                  multiprocessing_context=context)))
        assert images.shape == (2, 3, 8, 8)


def test_random_resized_crop_makes_one_size_under_spawn(packed_as: PackedAs) -> None:
    """Photos of 16..64 pixels, batches of one size, through spawned workers."""
    out, files = packed_as("wds")
    ds = readers.open_dataset(out, decode="tensor", transform=readers.RandomResizedCrop(24))
    loader = readers.make_loader(ds, batch_size=8, num_workers=2, seed=3, multiprocessing_context="spawn",
                                 persistent_workers=False)
    batches = list(loader)
    assert [tuple(images.shape) for images, _ in batches] == [(8, 3, 24, 24)] * 2 + [(3, 3, 24, 24)]
    assert all(images.dtype == torch.uint8 for images, _ in batches)
    assert sorted(label for _, labels in batches for label in labels.tolist()) == sorted(
        label for _, label in readers.open_dataset(out, fields=("image", "label"), decode="bytes"))
    assert sum(len(labels) for _, labels in batches) == len(files)


def test_random_resized_crop_draws_from_the_workers_seed(packed_as: PackedAs) -> None:
    """The same seed and epoch, the same crops (fork: cheap to start twice)."""
    ds = readers.open_dataset(packed_as("lmdb")[0], decode="tensor", transform=readers.RandomResizedCrop(12))
    loader = readers.make_loader(ds, batch_size=8, num_workers=1, seed=3, persistent_workers=False)
    first, again = list(loader), list(loader)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again))
    loader.set_epoch(1)
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(first, loader))


def test_random_resized_crop_boxes() -> None:
    crop = readers.RandomResizedCrop((10, 20), scale=(0.25, 0.25), ratio=(1.0, 1.0))
    torch.manual_seed(0)
    for _ in range(20):
        top, left, h, w = crop.box(40, 60)
        assert (h, w) == (24, 24) and 0 <= top <= 16 and 0 <= left <= 36  # a quarter of 2400 is 24 x 24 (rounded)
    # no square with 9/10 of a 10 x 100 strip's area fits: the central crop of the ratio's bound
    assert readers.RandomResizedCrop(8, scale=(0.9, 1.0), ratio=(1.0, 1.0)).box(10, 100) == (0, 45, 10, 10)
    image = torch.arange(2 * 40 * 60, dtype=torch.uint8).reshape(2, 40, 60)
    assert readers.RandomResizedCrop((10, 20))(image).shape == (2, 10, 20)
    assert readers.RandomResizedCrop(5)(image.float()).dtype == torch.float32
    with pytest.raises(TypeError, match="takes a CHW tensor"):
        readers.RandomResizedCrop(5)(image[0])
