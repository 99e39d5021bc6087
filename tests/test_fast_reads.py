"""Random reads by batch (`__getitems__`) and the HDF5 reader's direct path past h5py."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import h5py
import numpy as np
import pytest

import readers
import readers.base as readers_base
from readers.hdf5 import DirectBytes


@pytest.mark.parametrize("span_bytes", [1 << 20, 0], ids=["rows read as one span", "rows read one by one"])
def test_a_batch_equals_its_samples_read_one_by_one(packed: tuple[Path, dict[str, bytes]], span_bytes: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readers_base, "SPAN_READ_BYTES", span_bytes)
    out, _ = packed
    ds = readers.open_dataset(out, decode="bytes", fields=("image", "label", "path", "index"))
    batch = [17, 0, 5, 5, 18, 3, 9]  # across shards, a repeat, out of order
    assert ds.__getitems__(batch) == [ds[index] for index in batch]
    assert ds.__getitems__([-1]) == [ds[len(ds) - 1]]
    with pytest.raises(IndexError):
        ds.__getitems__([0, len(ds)])
    ds.close()


def test_a_batch_with_a_damaged_sample_fails_or_skips_like_single_reads(
        packed_copy: tuple[Path, dict[str, bytes]]) -> None:
    out, _ = packed_copy
    clean = readers.open_dataset(out, decode="bytes")
    expected = [clean[index] for index in range(len(clean))]
    clean.close()
    shard = out / readers.load_manifest(out).shards[1].name
    data = bytearray(shard.read_bytes())
    position = data.index(expected[5][0][-60:-20])  # inside the second sample's entropy-coded bytes
    data[position] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(readers.DatasetError, match="sample 1: damaged"):
        readers.open_dataset(out, decode="bytes").__getitems__([4, 5, 6])
    skipping = readers.open_dataset(out, decode="bytes", on_error="skip")
    assert skipping.__getitems__([4, 5, 6]) == [expected[4], expected[6], expected[6]]
    assert skipping.skipped == 1


@pytest.fixture
def h5(tmp_path: Path) -> Callable[..., h5py.Dataset]:
    """A dataset in a fresh file, made with `create_dataset`'s arguments; closed after the test."""
    files: list[h5py.File] = []

    def make(data: np.ndarray, **options: object) -> h5py.Dataset:
        files.append(h5py.File(tmp_path / f"{len(files)}.h5", "w"))
        return files[-1].create_dataset("data", data=data, **options)

    yield make
    for file in files:
        file.close()


def read_with_pread(dataset: h5py.Dataset, direct: DirectBytes, first: int, stop: int) -> bytes:
    dataset.file.flush()
    with open(dataset.file.filename, "rb") as handle:
        return direct.read_rows(handle.fileno(), first, stop)


def test_direct_reads_equal_h5py_when_chunks_lie_out_of_order(tmp_path: Path) -> None:
    data = np.random.default_rng(0).integers(0, 256, 10_000, dtype=np.uint8)
    with h5py.File(tmp_path / "a.h5", "w") as file:
        dataset = file.create_dataset("data", shape=data.shape, dtype=np.uint8, chunks=(1024,))
        for start in (4096, 0, 9216, 2048, 1024, 8192, 3072, 5120, 7168, 6144):  # chunks allocated in this order
            dataset[start:start + 1024] = data[start:start + 1024]
    with h5py.File(tmp_path / "a.h5", "r") as file:
        direct = DirectBytes.locate(file["data"])
    assert direct is not None
    assert not (np.diff(direct.chunk_offsets) == 1024).all()  # really out of order
    with open(tmp_path / "a.h5", "rb") as handle:
        for first, stop in ((0, 10), (1000, 1030), (1020, 5000), (9990, 10_000), (0, 10_000), (5, 5)):
            assert direct.read_rows(handle.fileno(), first, stop) == data[first:stop].tobytes()


def test_direct_reads_of_rows_and_contiguous_data(h5: Callable[..., h5py.Dataset]) -> None:
    rows = np.random.default_rng(1).integers(0, 256, (7, 4, 5, 3), dtype=np.uint8)
    for options in ({"chunks": (1, 4, 5, 3)}, {"chunks": (3, 4, 5, 3)}, {}):
        dataset = h5(rows, **options)
        direct = DirectBytes.locate(dataset)
        assert direct is not None and direct.shape == rows.shape
        assert read_with_pread(dataset, direct, 2, 6) == rows[2:6].tobytes()


def test_no_direct_reads_where_hdf5_transforms_or_lacks_the_bytes(h5: Callable[..., h5py.Dataset]) -> None:
    data = np.arange(4096, dtype=np.uint8)
    assert DirectBytes.locate(h5(data, chunks=(512,), compression="gzip")) is None
    assert DirectBytes.locate(h5(data.reshape(64, 64), chunks=(8, 8))) is None  # chunks split rows
    vlen = np.empty(2, dtype=object)
    vlen[0], vlen[1] = np.zeros(1, dtype=np.uint8), np.ones(2, dtype=np.uint8)
    assert DirectBytes.locate(h5(vlen, dtype=h5py.vlen_dtype(np.uint8))) is None
    sparse = h5(np.zeros(0, dtype=np.uint8), maxshape=(None,), chunks=(512,))
    sparse.resize((4096,))
    sparse[1024:1536] = 1  # one chunk written, the others never allocated
    assert DirectBytes.locate(sparse) is None


def test_hdf5_shards_hdf5_compresses_are_read_through_h5py(tmp_path: Path,
                                                           packed_as: Callable[[str], tuple[Path, dict]]) -> None:
    out, _ = packed_as("hdf5")
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    shard = copy / "shard-000000.h5"
    with h5py.File(shard, "r+") as file:
        images = file["images"][:]
        del file["images"]
        file.create_dataset("images", data=images, chunks=(512,), compression="gzip")
    expected = readers.open_dataset(out, decode="bytes")
    ds = readers.open_dataset(copy, decode="bytes")
    assert ds.handle(0).direct is None and ds.handle(1).direct is not None
    assert ds.__getitems__(list(range(8))) == [expected[index] for index in range(8)]


def test_open_shards_hold_no_per_sample_arrays(packed_as: Callable[[str], tuple[Path, dict]]) -> None:
    """A worker that reads from every shard keeps each open: per-sample state would add up to
    the whole dataset's (the 5M-sample check in scripts/bench_read.py --suite scale)."""
    hdf5 = readers.open_dataset(packed_as("hdf5")[0], decode="bytes")
    handle = hdf5.handle(1)
    assert handle.file is None and handle.fd >= 0  # all read with pread: no h5py file held open
    assert all(column.values is None for column in (handle.offsets, handle.labels, handle.codecs, handle.crcs))
    with_paths = readers.open_dataset(packed_as("hdf5")[0], decode="bytes", fields=("image", "path"))
    assert with_paths.handle(1).file is not None  # paths are read through h5py
    assert [with_paths[i][0] for i in range(8)] == [hdf5[i][0] for i in range(8)]
    assert hdf5.stored_samples(1) == 4
    wds = readers.open_dataset(packed_as("wds")[0], decode="bytes")
    table = np.fromfile(wds.files.path(wds.index_file(1)), dtype="<i8", offset=16).reshape(4, 4)
    assert wds.handle(1).index[2] == tuple(table[2].tolist())  # a row read from the file when needed
    for ds in (hdf5, with_paths, wds):
        ds.close()


def test_a_batch_over_damaged_hdf5_offsets_skips_like_single_reads(packed_as: Callable, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(packed_as("hdf5")[0], out)
    shard = out / readers.load_manifest(out).shards[0].name
    with h5py.File(shard, "r+") as file:
        offsets = file["offsets"][:]
        offsets[2] = 10**12  # sample 1's end and sample 2's start: far outside the file
        file["offsets"][:] = offsets
    single = readers.open_dataset(out, decode="bytes", fields=("index",), on_error="skip")
    expected = [single[index] for index in range(4)]
    batched = readers.open_dataset(out, decode="bytes", fields=("index",), on_error="skip")
    assert batched.__getitems__([0, 1, 2, 3]) == expected and single.skipped == batched.skipped > 0
