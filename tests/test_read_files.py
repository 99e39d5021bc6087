"""The packer's file reading: whole files, in listing order, whatever their size did since the scan."""

from __future__ import annotations

import os
import random
import zlib
from pathlib import Path

import pytest

from imagefolders import image_bytes

from packer import load
from packer.encode import Encoded
from packer.errors import RejectedFile
from packer.plan import Entry, PackOptions


@pytest.mark.parametrize("scanned_size", [0, 5, 4095, 4096, 4097, 10_000])
def test_read_file_returns_the_whole_file_even_if_its_size_changed(tmp_path: Path, scanned_size: int) -> None:
    data = bytes(range(256)) * 16  # 4096 bytes
    path = tmp_path / "image.jpg"
    path.write_bytes(data)
    assert load.read_file(str(path), scanned_size) == data


@pytest.mark.parametrize("inline", [True, False], ids=["read-ahead in line", "reader threads"])
def test_load_samples_keeps_listing_order_across_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      inline: bool) -> None:
    monkeypatch.setattr(load, "READ_RUN_FILES", 3)
    monkeypatch.setattr(load, "READAHEAD_FILES", 6)
    monkeypatch.setattr(load, "OPEN_AHEAD_FILES", 4)
    monkeypatch.setattr(load, "INLINE_STORES", ("original",) if inline else ())
    entries, contents = [], []
    for index in range(20):
        name = f"{index:02d}.jpg"
        data = b"not an image" if index == 3 else b"" if index == 10 else image_bytes(random.Random(index), "JPEG")
        (tmp_path / name).write_bytes(data)
        entries.append(Entry(path=name, label=index % 2, size=len(data)))
        contents.append(data)
    (tmp_path / "05.jpg").unlink()  # vanished after the scan
    options = PackOptions(format="wds")
    loaded = list(load.load_samples(tmp_path, entries, options, threads=4))
    assert [entry.path for entry, _ in loaded] == [entry.path for entry in entries]
    results = [result for _, result in loaded]
    assert str(results[3]) == "not an image (unrecognised content)" and str(results[10]) == "empty file"
    assert isinstance(results[5], RejectedFile) and str(results[5]).startswith("cannot read: ")
    for index in set(range(20)) - {3, 5, 10}:
        assert not isinstance(results[index], RejectedFile)
        encoded, fields, _, _ = results[index]
        assert isinstance(encoded, Encoded) and encoded.payload == contents[index] and fields == {}
        assert encoded.crc32 == zlib.crc32(contents[index])


def test_read_ahead_closes_what_it_opened_when_abandoned(tmp_path: Path) -> None:
    entries = []
    for index in range(40):
        data = image_bytes(random.Random(index), "JPEG")
        (tmp_path / f"{index:02d}.jpg").write_bytes(data)
        entries.append(Entry(path=f"{index:02d}.jpg", label=0, size=len(data)))
    before = len(os.listdir("/proc/self/fd"))
    samples = load.load_samples(tmp_path, entries, PackOptions(format="wds"), threads=4)
    next(samples)
    assert len(os.listdir("/proc/self/fd")) > before  # the next files are open, ahead of their turn
    samples.close()
    assert len(os.listdir("/proc/self/fd")) == before
