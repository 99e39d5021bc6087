"""scripts/latencyfs.py, the network-storage stand-in of scripts/bench_netfs.py: a faithful, read-only
view of its source, and a pack through it that round-trips byte for byte."""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import random
import tarfile
from pathlib import Path

import pytest
from clirun import run
from imagefolders import image_bytes, make_image_folder
from PIL import Image
from latencyfs import Link, missing_requirements, mounted, operations

import readers

pytestmark = pytest.mark.skipif(missing_requirements() is not None, reason=str(missing_requirements()))


def tree(root: Path) -> dict[str, bytes | str]:
    """Every entry under root: file bytes, a symlink's target, or "dir"."""
    entries: dict[str, bytes | str] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            rel = path.relative_to(root).as_posix()
            entries[rel] = (os.readlink(path) if path.is_symlink() else "dir" if path.is_dir()
                            else path.read_bytes())
    return entries


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path_factory.mktemp("netfs-src")
    files = make_image_folder(root, classes=3, per_class=4)
    (root / "class_00" / "big.bin").write_bytes(os.urandom(300_000))  # several reads, each split by the cap
    (root / "latest").symlink_to("class_01")
    return root, files


def test_mount_shows_the_source_read_only_and_unmounts(source: tuple[Path, dict[str, bytes]]) -> None:
    root, _ = source
    with mounted(root, latency_ms=1, read_cap_kb=64) as mount:
        assert os.path.ismount(mount)
        assert tree(mount) == tree(root)
        assert sorted(os.listdir(mount / "class_01")) == sorted(os.listdir(root / "class_01"))
        with open(mount / "class_00" / "big.bin", "rb") as handle:
            handle.seek(100_000)
            assert handle.read(70_000) == (root / "class_00" / "big.bin").read_bytes()[100_000:170_000]
        for attempt in (lambda: open(mount / "class_00" / "new.jpg", "wb"),
                        lambda: open(mount / "class_00" / "pic.PNG", "r+b"),
                        lambda: os.mkdir(mount / "more"),
                        lambda: os.unlink(mount / "class_00" / "pic.PNG")):
            with pytest.raises(OSError) as raised:
                attempt()
            assert raised.value.errno == errno.EROFS
    assert not os.path.ismount(mount) and not mount.exists()
    assert tree(root)["class_00/pic.PNG"] == source[1]["class_00/pic.PNG"]


class CountingLink(Link):
    def __init__(self) -> None:
        super().__init__(latency_s=0.0, bandwidth_bps=None)
        self.trips: list[int] = []

    def round_trip(self, nbytes: int = 0) -> None:
        self.trips.append(nbytes)


def test_reads_over_the_cap_pay_a_round_trip_per_piece(source: tuple[Path, dict[str, bytes]]) -> None:
    root, _ = source
    link = CountingLink()
    ops = operations(root, link, read_cap=64 * 1024)
    handle = ops.open("/class_00/big.bin", os.O_RDONLY)
    assert link.trips == [0]
    assert ops.read("/class_00/big.bin", 200_000, 50_000, handle) == (root / "class_00" / "big.bin").read_bytes()[
        50_000:250_000]
    assert link.trips[1:] == [65536, 65536, 65536, 200_000 - 3 * 65536]
    del link.trips[:]
    assert ops.read("/class_00/big.bin", 131072, 250_000, handle) == (root / "class_00" / "big.bin").read_bytes()[
        250_000:]
    assert link.trips == [50_000]  # a short piece is the end of the file: no call past it
    ops.release("/class_00/big.bin", handle)
    assert len(link.trips) == 2


def test_unmounts_when_the_block_fails(source: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    where = tmp_path / "mnt"
    with pytest.raises(KeyError), mounted(source[0], latency_ms=1, mountpoint=where) as mount:
        handle = open(mount / "class_00" / "pic.PNG", "rb")  # still open when the block fails
        raise KeyError("boom")
    handle.close()
    assert where.is_dir() and not os.path.ismount(where) and os.listdir(where) == []


def test_pack_through_the_mount_round_trips(source: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, files = source
    (tmp_path / "src").mkdir()
    for rel, data in files.items():  # the images alone, without the test's extra files
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_bytes(data)
    with mounted(tmp_path / "src", latency_ms=1) as mount:
        code, output = run("wds", mount, tmp_path / "out", "--quiet")
    assert code == 0, output
    dataset = readers.open_dataset(tmp_path / "out", decode="bytes", fields=("image", "path"))
    assert {path: image for image, path in (dataset[i] for i in range(len(dataset)))} == files


@pytest.fixture(scope="module")
def many_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    """160 small JPEGs in 8 class folders: enough calls for pack to measure that they wait."""
    root = tmp_path_factory.mktemp("netfs-many")
    files = {}
    for index in range(160):
        rel = f"class_{index % 8}/img {index:03d}.jpg"
        files[rel] = image_bytes(random.Random(index), size=(24, 16))
        (root / rel).parent.mkdir(exist_ok=True)
        (root / rel).write_bytes(files[rel])
    return root, files


@pytest.mark.parametrize("pool", [False, True], ids=["small SRC", "large SRC"])
def test_the_walk_keeps_stats_in_flight_on_a_mount_where_each_waits(many_files: tuple[Path, dict[str, bytes]],
                                                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     pool: bool) -> None:
    """One stat after another, 160 files take 160 round trips; across the class folders, many at
    once. A SRC large enough for the walk's pool of processes (each would walk its classes one
    stat at a time, before it had timed enough calls to tell) is walked here on threads too."""
    import packer.sources.walk as walk_module
    from packer.sources.walk import walk

    if pool:
        monkeypatch.setattr(walk_module, "PARALLEL_ABOVE_SECONDS", -1.0)
        monkeypatch.setattr(walk_module, "available_cpus", lambda: 2)
    root, files = many_files
    report = tmp_path / "calls.json"
    with mounted(root, latency_ms=3, report=report) as mount:
        listing = walk(mount)
    local = walk(root)
    assert list(listing.paths) == list(local.paths) == sorted(files)
    assert list(listing.labels) == list(local.labels) and list(listing.sizes) == list(local.sizes)
    served = json.loads(report.read_text())
    assert served["calls"]["getattr"] >= 160
    assert served["most_in_flight"]["getattr"] >= 4, served


def test_the_walk_reads_the_first_class_folders_while_the_class_folders_are_stat_ed(tmp_path: Path) -> None:
    """FUSE answers one lookup at a time in a directory, so stat'ing 200 class folders takes 200
    round trips whatever the threads: the walk reads the first folders meanwhile, and those stats
    of their files overlap the class folders' (main: every class folder's stat alone in flight,
    then the walk's first directory)."""
    from packer.sources.walk import walk

    for index in range(200):
        for name in ("a.jpg", "b.jpg"):
            (tmp_path / "src" / f"c{index:03d}").mkdir(parents=True, exist_ok=True)
            (tmp_path / "src" / f"c{index:03d}" / name).write_bytes(b"x" * index)
    report = tmp_path / "calls.json"
    with mounted(tmp_path / "src", latency_ms=2, report=report) as mount:
        listing = walk(mount)
    local = walk(tmp_path / "src")
    assert list(listing.paths) == list(local.paths) and len(listing.paths) == 400
    assert list(listing.labels) == list(local.labels) and list(listing.sizes) == list(local.sizes)
    served = json.loads(report.read_text())
    assert served["alone"]["getattr"] < 100, served


def test_an_alias_met_before_the_class_folders_stats_come_back_is_listed_as_on_a_local_disk(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """While the class folders are stat'ed, the walk takes each directory as its own; meeting an
    alias of the last class folder in the first (and a folder twice, a warning) before those stats
    are in, it walks again knowing them: the same listing, aliases and warnings as on a local disk."""
    from packer.sources.walk import walk

    src = tmp_path / "src"
    for index in range(300):
        (src / f"c{index:03d}").mkdir(parents=True)
        (src / f"c{index:03d}" / "a.jpg").write_bytes(b"x" * (index + 1))
    (src / "c000" / "see_also").symlink_to(Path("..") / "c299")
    (src / "c001" / "x").mkdir()
    (src / "c001" / "x" / "b.jpg").write_bytes(b"y")
    (src / "c001" / "y").symlink_to("x")
    listings, said = [], []
    for where in ("mount", "local"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="packer.sources.walk"):
            if where == "mount":
                with mounted(src, latency_ms=2) as mount:
                    listings.append(walk(mount))
                    said.append(noted(caplog, mount))
            else:
                listings.append(walk(src))
                said.append(noted(caplog, src))
    on_mount, local = listings
    assert list(on_mount.paths) == list(local.paths) and len(local.paths) == 301
    assert list(on_mount.labels) == list(local.labels) and list(on_mount.sizes) == list(local.sizes)
    assert on_mount.aliases == local.aliases == [
        "c000/see_also -> c299: alias of class folder c299, packed once under c299"]
    assert said[0] == said[1] and len(said[1]) == 2, said


def noted(caplog: pytest.LogCaptureFixture, root: Path) -> list[str]:
    """The walk's alias notes and warnings, SRC's path written as SRC."""
    return [record.getMessage().replace(str(root), "SRC") for record in caplog.records
            if "alias of class folder" in record.getMessage() or record.levelno >= logging.WARNING]


def test_packing_keeps_opens_in_flight_on_a_mount_where_each_waits(many_files: tuple[Path, dict[str, bytes]],
                                                                   tmp_path: Path) -> None:
    """One packing process (one shard): its reads of the files, open to close, overlap, more of
    them than its 4 opener threads of a local disk (main: 4 at most)."""
    root, files = many_files
    report = tmp_path / "calls.json"
    with mounted(root, latency_ms=5, report=report) as mount:
        code, output = run("wds", mount, tmp_path / "out", "--quiet", "--workers", "1")
    assert code == 0, output
    dataset = readers.open_dataset(tmp_path / "out", decode="bytes", fields=("image", "path"))
    assert {path: image for image, path in (dataset[i] for i in range(len(dataset)))} == files
    served = json.loads(report.read_text())
    assert served["calls"]["open"] == 160
    assert served["most_in_flight"]["open"] >= 6, served


def test_telling_a_folder_of_class_folders_from_container_inputs_stats_none_of_them(tmp_path: Path) -> None:
    """SRC's top level is told apart by the listing's types, not a stat (a round trip) per entry."""
    from packer.sources.inputs import resolve_source

    for index in range(40):
        (tmp_path / "src" / f"class_{index:02d}").mkdir(parents=True)
    report = tmp_path / "calls.json"
    with mounted(tmp_path / "src", latency_ms=1, report=report) as mount:
        assert resolve_source(mount).kind == "folder"
    assert json.loads(report.read_text())["calls"].get("getattr", 0) < 10


CONTAINER_SAMPLES = 4000


@pytest.fixture(scope="module")
def containers(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[bytes, int]]]:
    """The same 4,000 small JPEGs (label: position % 10) as a WebDataset tar, a RecordIO .rec and a
    TFRecord file, each without an index (the scan walks its headers), one folder per kind."""
    from recordfiles import example, recordio_payload, write_recordio, write_tfrecord

    root = tmp_path_factory.mktemp("netfs-containers")
    samples = [(noise_jpeg(random.Random(index)), index % 10) for index in range(CONTAINER_SAMPLES)]
    (root / "tar").mkdir()
    with tarfile.open(root / "tar" / "data.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        for index, (image, label) in enumerate(samples):
            for name, data in ((f"s{index:05d}.jpg", image), (f"s{index:05d}.cls", str(label).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    (root / "rec").mkdir()
    write_recordio(root / "rec" / "data.rec", (recordio_payload(image, float(label), id=index)
                                               for index, (image, label) in enumerate(samples)), index=False)
    (root / "tfrecord").mkdir()
    write_tfrecord(root / "tfrecord" / "data.tfrecord",
                   (example({"image/encoded": image, "image/class/label": label}) for image, label in samples))
    return root, samples


def noise_jpeg(rng: random.Random) -> bytes:
    """A ~9 KB JPEG of noise: the scan skips each image's bytes, more than the kernel reads ahead
    of a small read, so reading header after header is a round trip each."""
    buffer = io.BytesIO()
    Image.frombytes("RGB", (96, 96), rng.randbytes(96 * 96 * 3)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(out.glob("*.tar"))}


@pytest.mark.parametrize("kind", ["tar", "rec", "tfrecord"])
def test_a_container_on_a_mount_where_each_read_waits_is_read_in_large_reads(
        containers: tuple[Path, list[tuple[bytes, int]]], tmp_path: Path, kind: str) -> None:
    """On a network mount the kernel reads ahead ~128 KB of a small read, so the scan's header
    reads and the packing's sample reads wait a round trip every few samples, one after another.
    Once reads wait, both go through 1 MiB blocks, several in flight: the reads that start with
    none in flight (round trips in sequence) are at most one per 12 samples, where reading in
    line made one per 5-10, and the shards are the same bytes as packed from local disk. A 1 MiB
    block is 8 FUSE reads of 128 KB, sent one after another: a scan faster than the mount keeps
    several blocks in flight, one slower (a busy machine) finds those ahead already read, and each
    next block is then read ahead alone (not waited for, but counted here): 157-182 of these 4,000
    on a quiet machine, 140-148 of them the scan's (57-87 with 2 MiB blocks, 64 kept per input
    file: memory without bound, `packer.sources.ranges`)."""
    root, samples = containers
    report = tmp_path / "calls.json"
    with mounted(root / kind, latency_ms=0.5, report=report) as mount:
        code, output = run("wds", mount, tmp_path / "net", "--quiet", "--workers", "1")
    assert code == 0, output
    code, output = run("wds", root / kind, tmp_path / "local", "--quiet", "--workers", "1")
    assert code == 0, output
    assert shard_bytes(tmp_path / "net") == shard_bytes(tmp_path / "local") != {}
    dataset = readers.open_dataset(tmp_path / "net", decode="bytes", fields=("image", "label"))
    assert sorted(dataset[index] for index in range(len(dataset))) == sorted(samples)  # in pack's order
    served = json.loads(report.read_text())
    assert served["alone"]["read"] * 12 <= CONTAINER_SAMPLES, served  # in line: 766 (tar), 380 (rec), 391 (tfrecord)
