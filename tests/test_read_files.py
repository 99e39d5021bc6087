"""The packer's file reading: whole files, in listing order, whatever their size did since the scan."""

from __future__ import annotations

import json
import os
import random
import zlib
from pathlib import Path

import pytest

from clirun import run
from imagefolders import image_bytes, make_image_folder

from packer.sources import inflight
from packer.write import load
from packer.write.encode import Encoded
from packer.errors import PackError, RejectedFile
from packer.stores.outdir import listing_path
from packer.plan.plan import Entry, PackOptions, load_plan, read_shard_entries


@pytest.mark.parametrize("scanned_size", [0, 5, 4095, 4096, 4097, 10_000])
def test_read_file_returns_the_whole_file_even_if_its_size_changed(tmp_path: Path, scanned_size: int) -> None:
    data = bytes(range(256)) * 16  # 4096 bytes
    path = tmp_path / "image.jpg"
    path.write_bytes(data)
    assert load.read_file(str(path), scanned_size) == data


@pytest.mark.parametrize("inline, waits", [(True, False), (True, True), (False, False)],
                         ids=["read-ahead in line", "read-ahead whole on threads", "reader threads"])
def test_load_samples_keeps_listing_order_across_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      inline: bool, waits: bool) -> None:
    monkeypatch.setattr(load, "READ_RUN_FILES", 3)
    monkeypatch.setattr(load, "READAHEAD_FILES", 6)
    monkeypatch.setattr(load, "OPEN_AHEAD_FILES", 4)
    monkeypatch.setattr(load, "INLINE_STORES", ("original",) if inline else ())
    if waits:  # as on a network mount: the opens are measured to wait, files are then read whole on threads
        monkeypatch.setattr(inflight, "ROUND_TRIP_SECONDS", -1.0)
        monkeypatch.setattr(inflight, "PROBE_CALLS", 3)
    read_whole: list[int] = []
    monkeypatch.setattr(load, "read_run", lambda paths, read_run=load.read_run: read_whole.append(len(paths)) or
                        read_run(paths))
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
    assert sum(read_whole) == (14 if waits else 0)  # all but the 2 runs of 3 opened before the measurement
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


def test_read_ahead_hands_out_every_entry_once_even_when_a_file_is_not_read(tmp_path: Path) -> None:
    entries = []
    for index in range(50):
        (tmp_path / f"{index:02d}.jpg").write_bytes(bytes([index]) * (index + 1))
        entries.append(Entry(path=f"{index:02d}.jpg", label=0, size=index + 1))
    before = len(os.listdir("/proc/self/fd"))
    ahead = load.ReadAhead(str(tmp_path), iter(entries), threads=2)
    seen = []
    for entry in ahead:
        seen.append(entry.path)
        if int(entry.path[:2]) % 3:  # every third file is skipped, as a reject before reading would
            assert ahead.read(str(tmp_path / entry.path), entry.size) == bytes([int(entry.path[:2])]) * entry.size
    ahead.close()
    assert seen == [entry.path for entry in entries]
    assert len(os.listdir("/proc/self/fd")) == before


def test_shard_entries_are_read_from_the_listing_each_time_and_checked_against_the_plan(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "src", classes=2, per_class=7)
    assert run("plan", tmp_path / "src", tmp_path / "out", "--format", "wds", "--shard-size", "4")[0] == 0
    plan = load_plan(tmp_path / "out")
    rows = [json.loads(line) for line in listing_path(tmp_path / "out").read_text().splitlines()]
    for shard in range(plan.num_shards):
        entries = read_shard_entries(tmp_path / "out", plan, shard)
        expected = rows[plan.bounds[shard]:plan.bounds[shard + 1]]
        assert len(entries) == len(expected) and entries.total_size == sum(row[2] for row in expected)
        assert [(entry.path, entry.label, entry.size) for entry in entries] == [tuple(row[:3]) for row in expected]
        assert [entry.path for entry in entries] == [row[0] for row in expected]  # iterable again
    lines = listing_path(tmp_path / "out").read_bytes().splitlines(keepends=True)
    listing_path(tmp_path / "out").write_bytes(b"".join(lines[:-1]))  # cut short
    with pytest.raises(PackError, match=f"shard {plan.num_shards - 1} lists 1 files, plan says 2"):
        read_shard_entries(tmp_path / "out", plan, plan.num_shards - 1)
