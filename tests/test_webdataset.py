"""Tar shards: the header writer, streaming under DataLoader workers, damaged and hostile shards."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import tarfile
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest
from torch.utils.data import DataLoader

import readers
from packer.errors import PackError
from packer.run.pipeline import pack
from packer.plan.options import PackOptions
from readers.tar import (WALK_READ, Member, TarError, canonical_header, encode_header, encode_member, parse_header,
                         walk_samples)


@pytest.fixture
def wds_copy(packed_as: Callable[[str], tuple[Path, dict[str, bytes]]], tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """The test's own copy of the shared tar-shard dataset (19 samples, 5 shards of 4), to damage."""
    out, files = packed_as("wds")
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    return copy, files


def as_list(batch: list) -> list:
    return batch


@pytest.mark.parametrize("name, size", [("0000000000.jpg", 0), ("0000000042.json", 1234567), ("k.cls", 8**11 - 1)])
def test_header_equals_tarfiles(name: str, size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uname, info.gname = size, 0, 0o644, "", ""
    assert encode_header(name.encode(), size) == info.tobuf(tarfile.USTAR_FORMAT)
    assert parse_header(encode_header(name.encode(), size)) == Member(name, size)


@pytest.mark.parametrize("name, size", [("0000000000.jpg", 0), ("000001_0000000042.pack.json", 1234567),
                                        ("k.cls", 8**11 - 1)])
def test_canonical_header_reads_what_encode_header_writes_and_nothing_else(name: str, size: int) -> None:
    header = encode_header(name.encode(), size)
    assert canonical_header(header) == (name.encode(), size)

    def changed(start: int, value: bytes) -> bytes:
        """The header with `value` at `start`, its checksum made right again."""
        block = header[:start] + value + header[start + len(value):]
        return block[:148] + b"%06o\0 " % (sum(block[:148]) + sum(block[156:]) + 8 * ord(" ")) + block[156:]

    others = [
        header[:148] + b"%06o\0 " % (int(header[148:154], 8) + 1) + header[156:],  # checksum off by one
        changed(156, b"5"),  # a directory
        changed(345, b"dir"),  # a ustar prefix
        changed(136, b"%011o\0" % 1),  # an mtime
        changed(len(name) + 1, b"x"),  # a byte after the name's NUL
        changed(124, b"+" + b"%010o\0" % min(size, 8**10 - 1)),  # int() reads it; no tar writer writes it
        changed(124, b"00000000009\0"),  # not octal
        changed(124, b" 0000000001\0"),  # int() reads it too
        changed(124, b"000000000010"),  # no NUL after the 11 digits
        bytes(512),  # the end of the archive
    ]
    for other in others:
        assert canonical_header(other) is None  # parse_header decides


def test_header_limits() -> None:
    with pytest.raises(ValueError, match="longer than 100"):
        encode_header(b"x" * 101, 1)
    with pytest.raises(ValueError, match="larger"):
        encode_header(b"x.jpg", 8**11)


def test_alias_packs_wds(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    out = tmp_path / "out"
    pack(image_folder[0], out, PackOptions(format="webdataset"))
    assert readers.load_manifest(out).format == "wds"
    assert readers.load_manifest(out).options["format"] == "wds"
    assert isinstance(readers.open_dataset(out), readers.WdsDataset)
    with pytest.raises(PackError, match="unknown format 'zip'"):
        pack(tmp_path, tmp_path / "zip", PackOptions(format="zip"))


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_stream_gives_every_sample_once_across_workers(wds_copy: tuple[Path, dict[str, bytes]], start_method: str) -> None:
    out, files = wds_copy
    ds = readers.open_dataset(out, decode="bytes", fields=("image", "path", "index"))
    stream = ds.stream()
    assert isinstance(stream, readers.WdsStream) and len(stream) == len(files)
    loader = DataLoader(stream, batch_size=3, num_workers=2, collate_fn=as_list,
                        multiprocessing_context=multiprocessing.get_context(start_method))
    seen = [sample for batch in loader for sample in batch]
    assert sorted(index for _, _, index in seen) == list(range(len(files)))
    assert {path: data for data, path, _ in seen} == files
    assert sorted(seen, key=lambda sample: sample[2]) == [ds[i] for i in range(len(ds))]


def test_stream_splits_by_rank_then_worker(wds_copy: tuple[Path, dict[str, bytes]],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    out, files = wds_copy
    ds = readers.open_dataset(out, decode="bytes", fields=("index",))
    assert [index for (index,) in ds.stream()] == list(range(len(files)))  # one rank, no workers: everything

    def indexes(rank: int, worker: int, workers: int) -> list[int]:
        info = SimpleNamespace(id=worker, num_workers=workers)
        monkeypatch.setattr("readers.streaming.get_worker_info", lambda: info)
        return [index for (index,) in ds.stream(rank=rank, world_size=2)]

    # Two ranks stream equal contiguous shares of ceil(19 / 2) = 10, the last one filled up with
    # sample 0 (make_loader's train padding); the workers of a rank split its share in two.
    assert indexes(0, 0, 1) == list(range(10))
    assert indexes(1, 0, 1) == list(range(10, 19)) + [0]
    assert indexes(1, 0, 2) == list(range(10, 15))
    assert indexes(1, 1, 2) == list(range(15, 19)) + [0]


def write_tar(path: Path, members: list[tuple[bytes, bytes]]) -> None:
    path.write_bytes(b"".join(encode_member(name, data) for name, data in members) + bytes(1024))


@pytest.mark.parametrize("name", [b"../0000000000.jpg", b"/abs/0000000000.jpg", b"a/../../0000000000.jpg"])
def test_unsafe_member_names_are_refused(wds_copy: tuple[Path, dict[str, bytes]], name: bytes) -> None:
    out, _ = wds_copy
    shard = out / "shard-000000.tar"
    meta = json.dumps({"label": 0, "path": "x.jpg", "format": "jpeg"}).encode()
    write_tar(shard, [(name, b"\xff\xd8\xff"), (b"0000000000.json", meta)])
    ds = readers.open_dataset(out, decode="bytes")
    with pytest.raises(readers.DatasetError, match=f"{shard}: unsafe tar member name"):
        list(ds)


def test_damaged_shards_name_the_file(wds_copy: tuple[Path, dict[str, bytes]]) -> None:
    out, _ = wds_copy
    shard = out / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    data[0] ^= 0x01  # first header's name: checksum no longer matches
    shard.write_bytes(bytes(data))
    ds = readers.open_dataset(out, decode="bytes")  # opened after the damage (before: the file changed since)
    with pytest.raises(readers.DatasetError, match=f"{shard}: bad tar header"):
        list(ds.iter_shard(1))
    with pytest.raises(readers.DatasetError, match=f"{shard}: sample 0: tar index does not match"):
        ds[4]
    data[0] ^= 0x01
    data[124:136] = b"%011o\0" % 7  # first header's size field
    shard.write_bytes(bytes(data))
    ds = readers.open_dataset(out, decode="bytes")
    with pytest.raises(readers.DatasetError, match=f"{shard}: sample 0: tar index does not match"):
        ds[4]
    shard = out / "shard-000002.tar"
    shard.write_bytes(shard.read_bytes()[:2000])
    ds = readers.open_dataset(out, decode="bytes")
    with pytest.raises(readers.DatasetError, match=f"{shard}: tar shard is truncated"):
        list(ds.iter_shard(2))
    with pytest.raises(readers.DatasetError, match=f"{shard}: sample 3: tar shard is truncated"):
        ds[11]


def test_index_that_does_not_match_is_refused(wds_copy: tuple[Path, dict[str, bytes]]) -> None:
    out, _ = wds_copy
    index = out / "shard-000000.packidx"
    raw = bytearray(index.read_bytes())
    raw[16:48], raw[48:80] = raw[48:80], raw[16:48]  # swap the rows of samples 0 and 1
    index.write_bytes(bytes(raw))
    ds = readers.open_dataset(out, decode="bytes")
    with pytest.raises(readers.DatasetError, match=f"{out / 'shard-000000.tar'}: sample 0: tar index does not match"):
        ds[0]
    index.write_bytes(bytes(raw[:40]))
    with pytest.raises(readers.DatasetError, match=f"{index}: indexes 0 samples, index.json says 4"):
        readers.open_dataset(out)[0]
    assert len(list(ds.iter_shard(0))) == 4  # streaming does not need the index


def test_sample_count_must_match_manifest(wds_copy: tuple[Path, dict[str, bytes]]) -> None:
    out, _ = wds_copy
    first = (out / "shard-000000.tar").read_bytes()
    (out / "shard-000001.tar").write_bytes(first[: first.index(b"000000_0000000003.jpg")] + bytes(1024))
    ds = readers.open_dataset(out, decode="bytes")
    with pytest.raises(readers.DatasetError, match="holds 3 samples, index.json says 4"):
        list(ds.iter_shard(1))


def test_missing_index_is_repacked_on_resume(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, files = image_folder
    out = tmp_path / "out"
    pack(root, out, PackOptions(format="wds", shard_size=4))
    before = (out / "shard-000002.packidx").read_bytes()
    (out / "index.json").unlink()  # as if the run had stopped before merging
    (out / "shard-000002.packidx").unlink()
    summary = pack(root, out, PackOptions(format="wds", shard_size=4))
    assert summary.resumed_shards == summary.num_shards - 1
    assert (out / "shard-000002.packidx").read_bytes() == before
    ds = readers.open_dataset(out, decode="bytes", fields=("image", "path"))
    assert {path: data for data, path in (ds[i] for i in range(len(ds)))} == files


@pytest.mark.parametrize("damage", [b"x", b"\xff"])
def test_streaming_a_damaged_meta_member_names_the_shard(wds_copy: tuple[Path, dict[str, bytes]], damage: bytes) -> None:
    """A `.pack.json` that is not JSON (or not UTF-8) read front to back is a DatasetError naming
    the shard and the sample, as random access reports it, never a bare JSONDecodeError."""
    out, _ = wds_copy
    shard = out / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    with tarfile.open(shard) as tar:
        member = next(member for member in tar.getmembers() if member.name.endswith(".pack.json"))
    data[member.offset_data] = damage[0]  # the opening brace
    shard.write_bytes(bytes(data))
    ds = readers.open_dataset(out, decode="bytes")
    with pytest.raises(readers.DatasetError, match=rf"{shard}: sample '{member.name.split('.')[0]}': unreadable \.pack\.json"):
        list(ds)


def streamed(ds: readers.PackedDataset, shard: int) -> list:
    """The shard through `stream_records` (what streaming workers read), each sample loaded."""
    return [record.load() for _, record in ds.stream_records(shard, 0, ds.manifest.shards[shard].num_samples)]


def as_values(record: tuple) -> tuple:
    meta, payload, fields = record
    return meta, bytes(payload), fields


def test_a_local_tar_streams_through_its_index_and_is_walked_without_one(wds_copy: tuple[Path, dict[str, bytes]],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Streaming reads a local tar through its `.packidx` (a read per sample, no header walked) and
    gives what a front-to-back read gives; the shard whose index is gone is walked, as before, and
    so is the one whose rows point at each other's samples, once, for the two it does not match,
    and a tar whose first read waits (a round trip a sample on a mount read in place)."""
    out, _ = wds_copy
    ds = readers.open_dataset(out, decode="bytes", fields=("image", "label", "path"))
    whole = {shard: [as_values(record) for _, record in ds.read_records(shard, 0, info.num_samples)]
             for shard, info in enumerate(ds.manifest.shards)}
    (out / "shard-000002.packidx").unlink()
    index = out / "shard-000001.packidx"
    raw = bytearray(index.read_bytes())
    raw[16:48], raw[48:80] = raw[48:80], raw[16:48]  # the rows of samples 0 and 1 swapped: each is the other's
    index.write_bytes(bytes(raw))
    walked = []
    tar_samples = readers.wds_samples.tar_samples

    def counted(fd: int, *args: object, **kwargs: object):
        walked.append(fd)
        return tar_samples(fd, *args, **kwargs)

    monkeypatch.setattr(readers.wds, "tar_samples", counted)  # streaming's, and its samples' fallback:
    monkeypatch.setattr(readers.wds_samples, "tar_samples", counted)
    for shard in (0, 3):
        assert [as_values(record) for record in streamed(ds, shard)] == whole[shard]
        assert [as_values(record.load()) for _, record in ds.stream_records(shard, 1, 3)] == whole[shard][1:3]
    assert walked == []
    assert [as_values(record) for record in streamed(ds, 2)] == whole[2] and len(walked) == 1
    assert [as_values(record) for record in streamed(ds, 1)] == whole[1] and len(walked) == 2  # walked once
    monkeypatch.setattr(readers.tar, "read_waited", lambda *_: True)  # reads wait: storage="local" on a mount
    assert [as_values(record) for record in streamed(ds, 3)] == whole[3] and len(walked) == 3  # in large reads


def member_size_claims_8_gib(data: bytearray) -> None:
    data[124:136] = b"%011o\0" % (8**11 - 1)  # the first member
    data[148:156] = b" " * 8
    data[148:156] = b"%06o\0 " % sum(data[:512])


@pytest.mark.parametrize("damage", [
    lambda data: data.__setitem__(0, data[0] ^ 0x01),  # a header's checksum no longer matches
    lambda data: data.__delitem__(slice(2000, None)),  # truncated in the second member
    lambda data: data.__setitem__(slice(data.index(b"000001_0000000003."), None), bytes(1024)),  # 3 samples
    lambda data: data.__setitem__(data.index(b'{"', data.index(b"pack.json") + 400), ord("x")),  # meta not JSON
    member_size_claims_8_gib,
], ids=["checksum", "truncated", "count", "meta", "member-size"])
def test_the_streaming_walk_refuses_what_a_front_to_back_read_refuses(wds_copy: tuple[Path, dict[str, bytes]],
                                                                      damage: Callable[[bytearray], None]) -> None:
    """`stream_records` walks headers and reads images when handed out: the same damage is the same
    one-line error, naming the shard."""
    out, _ = wds_copy
    ds = readers.open_dataset(out, decode="bytes")
    assert [record[1].tobytes() for record in streamed(ds, 1)] == [bytes(ds[i][0]) for i in range(4, 8)]
    shard = out / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    damage(data)
    shard.write_bytes(bytes(data))
    with pytest.raises(readers.DatasetError) as front_to_back:
        list(ds.iter_shard(1))
    with pytest.raises(readers.DatasetError) as walked:
        streamed(ds, 1)
    assert str(walked.value) == str(front_to_back.value) and str(shard) in str(walked.value)


def test_one_walk_reads_a_shard_whole_or_leaves_its_images_for_later(tmp_path: Path) -> None:
    """`walk_samples` is the one walk of a shard: eager, every member's bytes; deferred, the same
    small members and, for the rest, where their bytes are (a member larger than one read of the
    walk included); the same damage is the same TarError either way."""
    members = [(b"a/k1.jpg", bytes(range(256)) * 40), (b"a/k1.cls", b"3"), (b"a/k1.json", b"{}"),
               (b"a/k2.png", b"\x89PNG" * 3), (b"a/k2.cls", b"4"), (b"a/k2.json", b'{"x": 1}')]
    data = b"".join(encode_member(name, value) for name, value in members) + bytes(1024)
    assert len(members[0][1]) > WALK_READ
    tar = tmp_path / "shard.tar"
    tar.write_bytes(data)
    small = {"cls", "json"}
    with open(tar, "rb") as file:
        eager = list(walk_samples(file.fileno(), small, eager=True))
        deferred = list(walk_samples(file.fileno(), small, eager=False))
    assert eager == [("a/k1", {"jpg": members[0][1], "cls": b"3", "json": b"{}"}),
                     ("a/k2", {"png": members[3][1], "cls": b"4", "json": b'{"x": 1}'})]
    assert [key for key, _ in deferred] == ["a/k1", "a/k2"]
    for (_, whole), (_, parts) in zip(eager, deferred):
        image = next(extension for extension in parts if extension not in small)
        offset, size = parts[image]
        assert data[offset:offset + size] == whole[image]
        assert {extension: value for extension, value in parts.items() if extension in small} == \
            {extension: value for extension, value in whole.items() if extension in small}
    tar.write_bytes(data[:1500])  # cut inside the first image
    for eager_walk in (True, False):
        with open(tar, "rb") as file, pytest.raises(TarError, match=r"^tar shard is truncated in 'a/k1.jpg' "
                                                                     r"\(10240 bytes, 988 left\)$"):
            list(walk_samples(file.fileno(), small, eager=eager_walk))

def test_a_walk_whose_reads_wait_keeps_several_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a mount a large pread is answered in 128 KB requests one after another: once a read of
    the walk has waited, its large reads go out several at once (two here must meet, which one
    read at a time never did), and the walk finds the same samples."""
    members = [(f"a/k{n:03d}.{extension}".encode(), data) for n in range(40)
               for extension, data in (("jpg", bytes([n]) * 3000), ("cls", str(n).encode()), ("json", b"{}"))]
    tar = tmp_path / "shard.tar"
    tar.write_bytes(b"".join(encode_member(name, value) for name, value in members) + bytes(1024))
    small = {"cls", "json"}
    with open(tar, "rb") as file:
        eager = list(walk_samples(file.fileno(), small, eager=True))
    monkeypatch.setattr(readers.tar, "read_waited", lambda *_: True)  # every read waits, as on a mount
    monkeypatch.setattr(readers.tar, "WALK_READ_WAITED", 8192)
    meeting = threading.Barrier(2, timeout=10)
    large_reads: list[int] = []
    pread = os.pread

    def meeting_pread(fd: int, size: int, offset: int) -> bytes:
        if size == 8192:
            large_reads.append(offset)
            if len(large_reads) <= 2:
                meeting.wait()  # the first two large reads return only once both are in flight
        return pread(fd, size, offset)

    monkeypatch.setattr(readers.tar.os, "pread", meeting_pread)
    with open(tar, "rb") as file:
        deferred = list(walk_samples(file.fileno(), small, eager=False))
    assert [key for key, _ in deferred] == [key for key, _ in eager] == [f"a/k{n:03d}" for n in range(40)]
    for (_, whole), (_, parts) in zip(eager, deferred):
        assert parts["cls"] == whole["cls"] and parts["json"] == b"{}"
        offset, size = parts["jpg"]
        assert tar.read_bytes()[offset:offset + size] == whole["jpg"]
    assert sorted(large_reads) == list(range(large_reads[0], tar.stat().st_size, 8192))  # each window read once
    descriptors = len(os.listdir("/proc/self/fd"))
    with open(tar, "rb") as file:
        walk = walk_samples(file.fileno(), small, eager=False)
        assert [key for _, (key, _) in zip(range(3), walk)] == ["a/k000", "a/k001", "a/k002"]
        walk.close()  # ended early: its reads ahead waited for, their descriptor closed
    assert len(os.listdir("/proc/self/fd")) == descriptors


def test_a_slow_read_of_cached_bytes_is_not_a_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a busy DataLoader worker a pread of cached bytes often takes 0.1 ms for want of the GIL:
    where the page cache holds the bytes after it (RWF_NOWAIT says so), the walk keeps its 4 KB
    reads; a warm epoch's walks went to 1 MiB reads, each image copied twice."""
    members = [(f"a/k{n:03d}.{extension}".encode(), data) for n in range(40)
               for extension, data in (("jpg", bytes([n]) * 3000), ("cls", str(n).encode()), ("json", b"{}"))]
    tar = tmp_path / "shard.tar"
    tar.write_bytes(b"".join(encode_member(name, value) for name, value in members) + bytes(1024))  # cached
    monkeypatch.setattr(readers.tar, "WALK_WAITED_S", 0.0)  # every read takes that long
    sizes: list[int] = []
    pread = os.pread

    def counted(fd: int, size: int, offset: int) -> bytes:
        sizes.append(size)
        return pread(fd, size, offset)

    monkeypatch.setattr(readers.tar.os, "pread", counted)
    with open(tar, "rb") as file:
        assert len(list(walk_samples(file.fileno(), {"cls", "json"}, eager=False))) == 40
    assert set(sizes) == {WALK_READ}


def test_a_batchs_samples_whose_reads_wait_are_read_several_at_once(
        packed_as: Callable[[str], tuple[Path, dict[str, bytes]]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Map-style on a mount each sample's pread is a round trip: once one has waited, the rest of
    the batch's samples of that shard are read on threads (two must meet, which one read at a time
    never did); the same samples come out."""
    out, _ = packed_as("wds")
    local = readers.open_dataset(out, decode="bytes")
    expected = [local[i] for i in range(4)]
    monkeypatch.setattr(readers.tar, "read_waited", lambda *_: True)  # every read waits, as on a mount
    ds = readers.open_dataset(out, decode="bytes")
    ds.handle(0)  # its index read
    meeting = threading.Barrier(2, timeout=10)
    sample_reads: list[int] = []
    pread = os.pread

    def meeting_pread(fd: int, size: int, offset: int) -> bytes:
        if size > 512:  # a sample's (an index row is 32 bytes)
            sample_reads.append(offset)
            if len(sample_reads) in (2, 3):
                meeting.wait()
        return pread(fd, size, offset)

    monkeypatch.setattr(readers.wds.os, "pread", meeting_pread)
    assert ds.__getitems__([0, 1, 2, 3]) == expected
    assert len(sample_reads) == 4  # one each
    ds.close()


def test_a_streamed_image_that_does_not_match_its_checksum_is_that_samples_error(
        wds_copy: tuple[Path, dict[str, bytes]]) -> None:
    out, _ = wds_copy
    ds = readers.open_dataset(out, decode="bytes")
    victim = bytes(ds[5][0])
    shard = out / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    data[data.index(victim) + len(victim) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    loaded = []
    damaged = readers.open_dataset(out, decode="bytes")
    for _, record in damaged.stream_records(1, 0, 4):  # loaded while the shard is open, as a stream does
        try:
            loaded.append(record.load()[1].tobytes())
        except readers.DatasetError as exc:
            loaded.append(str(exc))
    assert loaded == [bytes(ds[4][0]), f"{shard}: sample 1: damaged (checksum mismatch)", bytes(ds[6][0]),
                      bytes(ds[7][0])]
