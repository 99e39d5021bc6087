"""A dataset folder on networked storage (issue 38, part 3): the mount is recognised from the mount
table (the default, storage="auto"), and such a folder is read map-style from whole copies of its
shards in the node cache, never in place (an LMDB shard is never mapped from the mount), with the
same samples as reading it in place; streaming reads in place; `storage=` says so where detection
cannot."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from latencyfs import missing_requirements, mounted

import readers
import readers.cache
import readers.mounts
import readers.tar
import readers.wds
from readers.mounts import filesystem_type, is_network_type, parse_mountinfo, reads_as_network
from readers.mounts import MountFiles
from readers.remote import LocalFiles
from readers.stores import ReadOptions, read_strategy

FIELDS = ("image", "label", "path", "index")
COPYING = ("each shard copied whole into the node cache when first read map-style (the others copied ahead), "
           "then read from the copy (wds read in place until its copy lands); streamed in place (LMDB from copies)")
NO_FUSE = missing_requirements()

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
23 22 0:21 / /proc rw,nosuid shared:2 - proc proc rw
40 22 0:35 / /data rw,relatime shared:20 - nfs4 fs1:/export/data rw,vers=4.2,rsize=1048576
41 40 0:36 / /data/scratch rw,relatime shared:21 - lustre 10.0.0.1@tcp:/scratch rw
42 22 0:37 / /mnt/my\\040photos rw,nosuid,nodev shared:22 master:3 - fuse.sshfs host:/photos rw,user_id=0
43 22 8:17 / /mnt/usb rw,relatime - fuseblk /dev/sdb1 rw,user_id=0
44 22 0:38 / /home/me rw - cifs //server/me rw
"""


def test_mountinfo_types_by_longest_mount_point() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    assert mounts["/mnt/my photos"] == "fuse.sshfs"  # octal-escaped space; optional fields skipped
    types = {path: filesystem_type(path, mounts) for path in
             ("/", "/datasets", "/data", "/data/imagenet/x.mdb", "/data/scratch/a", "/data/scratchpad",
              "/mnt/my photos/a", "/mnt/usb/a", "/home/me/ds", "/proc/self")}
    assert types == {"/": "ext4", "/datasets": "ext4", "/data": "nfs4", "/data/imagenet/x.mdb": "nfs4",
                     "/data/scratch/a": "lustre", "/data/scratchpad": "nfs4", "/mnt/my photos/a": "fuse.sshfs",
                     "/mnt/usb/a": "fuseblk", "/home/me/ds": "cifs", "/proc/self": "proc"}
    assert [t for t in ("ext4", "xfs", "overlay", "tmpfs", "fuseblk", "fuse.lxcfs", "zfs", "btrfs")
            if is_network_type(t)] == []
    assert all(is_network_type(t) for t in ("nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "9p", "fuse",
                                            "fuse.sshfs", "fuse.gcsfuse", "ceph"))


def test_storage_option_overrides_and_is_checked(tmp_path: Path) -> None:
    assert reads_as_network(tmp_path, "network") == (True, "storage='network'")
    assert reads_as_network(tmp_path, "local") == (False, "storage='local'")
    for path in (tmp_path, "http://127.0.0.1:9/ds"):  # said before anything is read
        with pytest.raises(ValueError, match="storage='nfs': expected one of auto, local, network"):
            readers.open_dataset(path, storage="nfs")


def test_auto_copies_from_a_networked_folder_into_a_local_cache_only(
        packed_as: Callable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache on networked storage too (a home directory on NFS) would gain nothing: read in place."""
    shutil.copytree(packed_as("hdf5")[0], tmp_path / "nfs" / "ds")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n40 22 0:35 / {tmp_path}/nfs rw - nfs4 fs:/e rw\n")
    monkeypatch.setattr(readers.mounts, "MOUNTINFO", mountinfo)
    local = readers.open_dataset(packed_as("hdf5")[0], decode="bytes", fields=FIELDS)
    nfs_cache = tmp_path / "nfs" / "cache"
    copying = COPYING
    for cache_dir, storage, kind, strategy in (
            (tmp_path / "cache", "auto", MountFiles, f"{copying} (networked storage: filesystem nfs4)"),
            (nfs_cache, "auto", LocalFiles, f"read in place (networked storage: filesystem nfs4, but so is the cache "
                                            f"{nfs_cache})"),
            (nfs_cache, "network", MountFiles, f"{copying} (networked storage: storage='network')")):
        ds = readers.open_dataset(tmp_path / "nfs" / "ds", decode="bytes", fields=FIELDS, cache_dir=cache_dir,
                                  storage=storage)
        assert type(ds.files) is kind
        assert ds.files.strategy == strategy
        assert read_strategy(tmp_path / "nfs" / "ds", ReadOptions(cache_dir=cache_dir, storage=storage)) == strategy
        assert read_all(ds) == read_all(local)
        ds.close()
        copies_landed()
        copied = list((cache_dir / "objects").iterdir()) if (cache_dir / "objects").exists() else []
        assert len(copied) == (len(local.manifest.shards) if kind is MountFiles else 0)


def copies_landed() -> None:
    """Wait for this process's copies ahead (`MountFiles`) to end."""
    for thread in threading.enumerate():
        if thread.name == "pack-mount-copy":
            thread.join()


def copy_names(ds: readers.PackedDataset) -> set[str]:
    """The names in the cache of the copies of `ds`'s shards and the sidecars its reader reads."""
    return {file.sha256 + Path(file.name).suffix for number, shard in enumerate(ds.manifest.shards)
            for file in (shard, *ds.read_sidecars(number))}


def mapped_files() -> list[str]:
    """The files this process maps into memory now (an LMDB environment maps its shard)."""
    fields = (line.split(maxsplit=5) for line in Path("/proc/self/maps").read_text().splitlines())
    return [parts[5] for parts in fields if len(parts) == 6 and parts[5].startswith("/")]


def read_all(ds: readers.PackedDataset) -> list[Any]:
    backwards = list(range(len(ds)))[::-1]
    return [ds[i] for i in backwards]


def loader_samples(ds: readers.PackedDataset, streaming: bool) -> list[Any]:
    """Every sample of one epoch through two workers, in a fixed order (the epoch's is shuffled)."""
    loader = readers.make_loader(ds, 4, num_workers=2, collate_fn=list, pin_memory=False, streaming=streaming)
    return sorted((sample for batch in loader for sample in batch), key=lambda sample: sample[3])


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "wds"])
def test_forced_network_storage_reads_through_the_cache(fmt: str, packed_as: Callable, tmp_path: Path) -> None:
    out = packed_as(fmt)[0]
    local = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    assert isinstance(local.files, LocalFiles)  # this machine's disk: read in place, as before
    cache_dir = tmp_path / "cache"
    copied = readers.open_dataset(out, decode="bytes", fields=FIELDS, storage="network", cache_dir=cache_dir)
    assert isinstance(copied.files, MountFiles)
    assert read_all(copied) == read_all(local)
    copied.close()
    copies_landed()
    assert {path.name for path in (cache_dir / "objects").iterdir()} == copy_names(local)


def test_network_storage_cache_limit_holds_as_for_urls(packed_as: Callable, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy ahead never evicts what this run read: once one finds no room, they stop, and a
    reader copies its own shards (evicting its oldest), as it did before reading in place (a wds
    reader read 3 of 5 shards from the mount for good)."""
    monkeypatch.setattr(readers.mounts, "LANDED_LOOK_S", 0.0)
    out = packed_as("wds")[0]
    local = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    largest = max(shard.bytes + sum(s.bytes for s in shard.sidecars) for shard in local.manifest.shards)
    with pytest.raises(ValueError, match="cache_limit .* is too small"):
        readers.open_dataset(out, storage="network", cache_dir=tmp_path, cache_limit=2 * largest)
    copied = readers.open_dataset(out, decode="bytes", fields=FIELDS, storage="network", cache_dir=tmp_path,
                                  cache_limit=3 * largest)
    order = [i for step in range(4) for i in range(step, len(local), 4)]  # every shard, again and again
    assert [copied[i] for i in order] == [local[i] for i in order]
    copies_landed()
    assert [copied[i] for i in order] == [local[i] for i in order]
    assert copied.files.cache.disk_bytes() <= 3 * largest  # type: ignore[attr-defined]
    last = copied.locate(order[-1])[0]
    assert str(copied.shard_path(last)).startswith(str(tmp_path))


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_a_shard_changed_on_the_mount_is_refused(fmt: str, packed_as: Callable, tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard rewritten since the dataset was opened is an error, never its samples; a copy is
    only used when its sha256 is index.json's, and a wds reader reading in place while the copy
    ahead failed its check gets that error too (it went on reading the mount's bytes)."""
    monkeypatch.setattr(readers.mounts, "LANDED_LOOK_S", 0.0)
    out = tmp_path / "out"
    shutil.copytree(packed_as(fmt)[0], out)
    ds = readers.open_dataset(out, decode="bytes", storage="network", cache_dir=tmp_path / "cache")
    shard = out / ds.manifest.shards[1].name
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(readers.DatasetChanged, match=f"{shard}: changed since the loader opened index.json "
                                                     r"\(same size, rewritten\)"):
        ds[4]
    shard.write_bytes(bytes(data[:-1]))
    with pytest.raises(readers.DatasetChanged, match=r"\(size \d+ -> \d+\)"):
        ds[5]
    shard.write_bytes(bytes(data))  # the same size as index.json says, other bytes: opened as it is
    reopened = readers.open_dataset(out, decode="bytes", storage="network", cache_dir=tmp_path / "cache")
    with caplog.at_level("WARNING"):
        if fmt == "wds":  # read in place (the changed byte is the tar's end padding) while its copy fails
            reopened[4]
            copies_landed()
            assert "not copied ahead into the cache" in caplog.text
        with pytest.raises(readers.DatasetError, match=f"{shard}: sha256 [0-9a-f]+ on two downloads, index.json "
                                                       f"says {reopened.manifest.shards[1].sha256}"):
            reopened[4]
        copies_landed()
    assert [shard.sha256 for shard in reopened.manifest.shards if not reopened.files.cache.has(shard)] == \
        [reopened.manifest.shards[1].sha256]  # type: ignore[union-attr]
    assert reopened[0] == readers.open_dataset(packed_as(fmt)[0], decode="bytes")[0]


@pytest.mark.skipif(NO_FUSE is not None, reason=str(NO_FUSE))
@pytest.mark.filterwarnings("ignore:.*shards hold 1 classes each")  # packed sorted, to compare in order
@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "wds"])
def test_a_dataset_on_a_fuse_mount_is_copied_and_equals_the_local_one(fmt: str, packed_as: Callable,
                                                                       tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readers.mounts, "LANDED_LOOK_S", 0.0)  # a reader reading in place looks at every read
    out = packed_as(fmt)[0]
    local = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    expected = {streaming: loader_samples(local, streaming) for streaming in (False, True)}
    assert [sample[3] for sample in expected[True]] == list(range(len(local)))
    with mounted(out, latency_ms=0.2) as mount:
        assert is_network_type(filesystem_type(mount))
        for storage in (None, "auto", "network"):  # None: the default
            for streaming in (False, True):
                cache_dir = tmp_path / f"cache-{storage}-{streaming}"
                chosen = {} if storage is None else {"storage": storage}
                ds = readers.open_dataset(mount, decode="bytes", fields=FIELDS, cache_dir=cache_dir, **chosen)
                assert isinstance(ds.files, MountFiles)
                assert loader_samples(ds, streaming) == expected[streaming]
                # Copies a worker had under way when it ended are not kept.
                assert {path.name for path in (cache_dir / "objects").iterdir()} <= copy_names(local)
                assert read_all(ds) == read_all(local)  # in this process: in place until the copies land
                assert not [path for path in mapped_files() if path.startswith(str(mount))]
                copies_landed()
                assert read_all(ds) == read_all(local)  # from the copies now
                assert all(str(ds.shard_path(shard)).startswith(str(cache_dir)) for shard in range(len(ds.shards)))
                assert {path.name for path in (cache_dir / "objects").iterdir()} == copy_names(local)
                ds.close()
        in_place = readers.open_dataset(mount, decode="bytes", fields=FIELDS, storage="local")
        assert isinstance(in_place.files, LocalFiles) and read_all(in_place) == read_all(local)
        in_place.close()


@pytest.mark.parametrize("streaming", [False, True])
def test_an_lmdb_shard_on_a_mount_is_never_mapped_in_place(streaming: bool, packed_as: Callable,
                                                           tmp_path: Path) -> None:
    """Mapped from a mount, a record is a page fault per round trip, and a server that stops
    answering is a SIGBUS that kills the worker: the shard is read from its copy from the first
    read, streamed too (py-lmdb reads through mmap only)."""
    out = packed_as("lmdb")[0]
    local = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    shard = local.manifest.shards[0]
    expected = [local.record(i) for i in range(shard.num_samples)] if streaming else [local[0]]
    local.close()  # its environment maps the shard in place
    ds = readers.open_dataset(out, decode="bytes", fields=FIELDS, storage="network", cache_dir=tmp_path / "cache")
    assert ds.files.strategy == f"{COPYING} (networked storage: storage='network')"
    if streaming:
        assert [(record[0], bytes(record[1])) for _, record in ds.stream_records(0, 0, shard.num_samples)] == \
            [(meta, bytes(payload)) for meta, payload in expected]
    else:
        assert [ds[0]] == expected
    copy = tmp_path / "cache" / "objects" / f"{shard.sha256}.lmdb"
    assert ds.shard_path(0) == copy
    mapped = mapped_files()
    assert str(copy) in mapped and str(out / shard.name) not in mapped
    ds.close()
    copies_landed()


def test_the_local_disk_is_read_in_place_by_default(packed_as: Callable, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """storage="auto", the default, reads a dataset on this machine's disk as storage="local" does:
    in place, no cache made, no copy thread."""
    monkeypatch.setenv("PACK_CACHE_DIR", str(tmp_path / "cache"))
    out = packed_as("lmdb")[0]
    ds = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    assert type(ds.files) is LocalFiles
    assert ds.files.strategy == f"read in place (filesystem {filesystem_type(out)})"
    assert ds[0] == readers.open_dataset(out, decode="bytes", fields=FIELDS, storage="local")[0]
    assert ds.shard_path(0) == out / ds.manifest.shards[0].name
    assert str(out / ds.manifest.shards[0].name) in mapped_files()
    assert not (tmp_path / "cache").exists()
    assert not [thread for thread in threading.enumerate() if thread.name == "pack-mount-copy"]
    ds.close()


def test_is_networked_names_the_filesystem_for_the_packer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n40 22 0:35 / {tmp_path}/nfs rw - nfs4 fs:/e rw\n")
    monkeypatch.setattr(readers.mounts, "MOUNTINFO", mountinfo)
    assert readers.mounts.is_networked(tmp_path / "nfs" / "photos") == (True, "filesystem nfs4")
    assert readers.mounts.is_networked(tmp_path / "photos") == (False, "filesystem ext4")


def counted_preads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the preads the readers make from now on (each a round trip on a mount); not
    those of copies an earlier test's dataset still makes on its thread (`os` is one module)."""
    reads: list[int] = []
    pread = readers.wds.os.pread

    def counted(fd: int, size: int, offset: int) -> bytes:
        if not threading.current_thread().name.startswith("pack-mount-copy"):
            reads.append(size)
        return pread(fd, size, offset)

    monkeypatch.setattr(readers.wds.os, "pread", counted)
    return reads


def test_streaming_a_wds_shard_reads_it_in_large_reads(packed_as: Callable, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    """In place on a mount, every pread is a round trip: once a read has waited, the walk reads
    headers and images together, one pread per MiB, not one per header and one per image."""
    monkeypatch.setattr(readers.tar, "read_waited", lambda *_: True)  # every read waits, as on a mount
    out = packed_as("wds")[0]
    ds = readers.open_dataset(out, decode="bytes", fields=FIELDS, storage="network", cache_dir=tmp_path)
    reads = counted_preads(monkeypatch)
    shard = ds.manifest.shards[0]
    samples = [record.load() for _, record in ds.stream_records(0, 0, shard.num_samples)]
    streamed = list(reads)
    assert [meta["path"] for meta, _, _ in samples] == [ds.record(i)[0]["path"] for i in range(shard.num_samples)]
    walk = [size for size in streamed if size >= 4096]  # the images here are smaller
    assert walk[0] == 4096 and walk[1] >= shard.bytes - 4096  # its first 4 KB waited: the rest in one read
    assert len(streamed) == len(walk) + shard.num_samples == 2 + shard.num_samples  # and each image's


def test_a_wds_sample_is_read_in_one_pread(packed_as: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    """Map-style, each sample of a tar is its index row and one pread of the tar (a round trip on a
    mount), not three."""
    out = packed_as("wds")[0]
    local = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    expected = [local[i] for i in range(len(local))]
    ds = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    ds.handle(0)  # its index read
    reads = counted_preads(monkeypatch)
    shard = ds.manifest.shards[0].num_samples
    assert [ds[i] for i in range(shard)] == expected[:shard]
    assert len(reads) == 2 * shard and len([size for size in reads if size > 512]) == shard


@pytest.mark.filterwarnings("ignore:.*shards hold 1 classes each")  # packed sorted
@pytest.mark.parametrize("fmt", ["hdf5", "wds"])
def test_streaming_a_networked_folder_reads_it_in_place_without_copies(fmt: str, packed_as: Callable,
                                                                       tmp_path: Path) -> None:
    """Read front to back in large reads, a shard on a mount is as fast in place as from a copy: a
    copy would only take the link from the reads."""
    out = packed_as(fmt)[0]
    local = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    ds = readers.open_dataset(out, decode="bytes", fields=FIELDS, storage="network", cache_dir=tmp_path / "cache")
    stream = readers.make_loader(ds, 4, num_workers=0, collate_fn=list, pin_memory=False, streaming=True)
    assert sorted((tuple(sample) for batch in stream for sample in batch), key=lambda sample: sample[3]) == \
        [local[i] for i in range(len(local))]
    copies_landed()
    assert list((tmp_path / "cache" / "objects").iterdir()) == []
    ds.close()


def test_a_copy_evicted_since_it_landed_is_copied_again(packed_as: Callable, tmp_path: Path) -> None:
    out = packed_as("lmdb")[0]
    local = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    ds = readers.open_dataset(out, decode="bytes", fields=FIELDS, storage="network", cache_dir=tmp_path / "cache")
    assert ds[0] == local[0]
    copies_landed()
    ds.close_shard(0)
    copy = tmp_path / "cache" / "objects" / f"{ds.manifest.shards[0].sha256}.lmdb"
    copy.unlink()  # evicted by another reader of the node
    assert ds[2] == local[2]  # copied again
    assert copy.exists() and ds.shard_path(0) == copy
    ds.close()


def test_a_copy_holds_every_byte_when_writes_come_up_short(packed_as: Callable, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """os.pwrite may write less than it is given (a disk filling while the cache evicts): the sha256
    is of the bytes read from the mount, so a piece not written on would be published, checked,
    with zeros in it, and the reader reopened on it."""
    real_pwrite = readers.mounts.os.pwrite
    monkeypatch.setattr(readers.mounts.os, "pwrite", lambda fd, data, offset: real_pwrite(fd, data[:7], offset))
    out = packed_as("lmdb")[0]
    ds = readers.open_dataset(out, decode="bytes", fields=FIELDS, storage="network", cache_dir=tmp_path / "cache")
    local = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    assert ds[0] == local[0]
    copies_landed()
    shard = ds.manifest.shards[0]
    copy = tmp_path / "cache" / "objects" / f"{shard.sha256}.lmdb"
    assert copy.read_bytes() == (out / shard.name).read_bytes()
    assert ds.shard_path(0) == copy
    ds.close()


def test_a_read_error_while_streaming_a_wds_shard_in_place_names_the_shard(packed_as: Callable,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard streamed from a mount is read in place, where a read may fail (EIO, ESTALE on NFS):
    one DatasetError naming the shard (and the sample), as on_error decides, not an OSError that
    names no file, out of the walk or of a sample's image read."""
    out = packed_as("wds")[0]
    ds = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    shard = ds.manifest.shards[0]
    pread = readers.wds.os.pread
    failing = {"now": False}

    def flaky(fd: int, size: int, offset: int) -> bytes:
        if failing["now"]:
            raise OSError(5, "Input/output error")
        return pread(fd, size, offset)

    monkeypatch.setattr(readers.wds.os, "pread", flaky)
    records = ds.stream_records(0, 0, shard.num_samples)
    _, first = next(records)
    failing["now"] = True
    with pytest.raises(readers.DatasetError, match=rf"^{out / shard.name}: sample 0: unreadable \(Input/output error\)"):
        first.load()
    records.close()
    with pytest.raises(readers.DatasetError, match=rf"^{out / shard.name}: read failed \(Input/output error\)"):
        list(ds.stream_records(0, 0, shard.num_samples))


def test_a_read_error_while_walking_a_wds_shard_whole_names_the_shard(packed_as: Callable,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The same for the walk that reads every member (iterating the dataset, `read_records`)."""
    out = packed_as("wds")[0]
    ds = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    shard = ds.manifest.shards[0]

    def failing_reads(fd: int) -> Callable[[int, int], bytes]:
        def read(offset: int, size: int) -> bytes:
            raise OSError(5, "Input/output error")
        return read

    monkeypatch.setattr(readers.tar, "sequential_reads", failing_reads)
    with pytest.raises(readers.DatasetError, match=rf"^{out / shard.name}: read failed \(Input/output error\)"):
        list(ds.read_records(0, 0, shard.num_samples))


def hold_copies_ahead(monkeypatch: pytest.MonkeyPatch, release: threading.Event, but: str = "") -> list[str]:
    """Copies ahead (`MountFiles`'s thread) wait for `release`, but those of the shard named `but`
    and its sidecars; the names of those held, in order."""
    copy = readers.mounts.copy_ranges
    held: list[str] = []

    def held_copy(source: int, dest: int, size: int, name: str) -> str:
        if threading.current_thread().name == "pack-mount-copy" and Path(name).stem != Path(but).stem:
            held.append(Path(name).name)
            release.wait(30)
        return copy(source, dest, size, name)

    monkeypatch.setattr(readers.mounts, "copy_ranges", held_copy)
    return held


def test_a_reader_takes_a_copy_another_thread_makes_once_it_lands(packed_as: Callable, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard the thread ahead (or another worker) is copying is waited for, not copied twice, and
    taken as soon as it lands: the cache looks every LANDING_POLL_S while a download is under way,
    not every ROOM_POLL_S, here a minute (and the fast looks last a minute too: on a loaded
    machine the held copy, released, took longer than their 2 s)."""
    monkeypatch.setattr(readers.cache, "ROOM_POLL_S", 60.0)
    monkeypatch.setattr(readers.cache, "LANDING_WAIT_S", 60.0)
    out = packed_as("lmdb")[0]
    local = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    release = threading.Event()
    held = hold_copies_ahead(monkeypatch, release, but=local.manifest.shards[0].name)
    ds = readers.open_dataset(out, decode="bytes", fields=FIELDS, storage="network", cache_dir=tmp_path / "cache")
    assert ds[0] == local[0]
    while not held:  # the thread ahead is copying another shard, held
        threading.Event().wait(0.01)
    shard = next(number for number, info in enumerate(ds.manifest.shards) if info.name == held[0])
    first = sum(info.num_samples for info in ds.manifest.shards[:shard])
    read: list[Any] = []
    reader = threading.Thread(target=lambda: read.append(ds[first]))
    reader.start()
    reader.join(0.3)  # waiting for the copy under way
    assert read == []
    release.set()
    reader.join(10)
    assert read == [local[first]]
    copies_landed()
    ds.close()


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_copy_threads_copy_every_other_shard_ahead(fmt: str, packed_as: Callable, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A shuffled epoch soon wants every shard: the first map-style read copies its own shard
    (LMDB waits for that copy; wds reads in place meanwhile) and starts COPIERS threads (not one
    per shard: a pid limit in a container) that copy the others in turn, with the sidecars of the
    kinds the reader read (a wds shard's .packidx, not its DALI .idx), and end when none is left."""
    out = packed_as(fmt)[0]
    local = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    release = threading.Event()
    hold_copies_ahead(monkeypatch, release, but=local.manifest.shards[0].name)
    ds = readers.open_dataset(out, decode="bytes", fields=FIELDS, storage="network", cache_dir=tmp_path / "cache")
    assert [ds[0], ds[1]] == [local[0], local[1]]  # shard 0
    waited = time.monotonic() + 30
    while not ds.files.cache.has(ds.manifest.shards[0]) and time.monotonic() < waited:  # type: ignore[attr-defined]
        time.sleep(0.01)
    assert ds.files.cache.has(ds.manifest.shards[0])  # type: ignore[attr-defined]
    copiers = [thread for thread in threading.enumerate() if thread.name == "pack-mount-copy"]
    assert len(copiers) == readers.mounts.COPIERS < len(ds.manifest.shards) == 5
    release.set()
    copies_landed()
    assert {path.name for path in (tmp_path / "cache" / "objects").iterdir()} == copy_names(ds)
    assert not [thread for thread in threading.enumerate() if thread.name == "pack-mount-copy"]
    assert read_all(ds) == read_all(local)
    ds.close()


def test_a_map_style_wds_read_reads_in_place_until_its_copy_lands(packed_as: Callable, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A shuffled batch touches a window of shards (32 by default): a reader that waited for each
    one's copy made the first batch wait for all of them. A wds sample is one read: it is read in
    place until the copy lands, then from the copy; the samples are the same either way."""
    monkeypatch.setattr(readers.mounts, "LANDED_LOOK_S", 0.0)
    out = packed_as("wds")[0]
    local = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    release = threading.Event()
    held = hold_copies_ahead(monkeypatch, release)
    cache_dir = tmp_path / "cache"
    ds = readers.open_dataset(out, decode="bytes", fields=FIELDS, storage="network", cache_dir=cache_dir)
    try:
        assert read_all(ds) == read_all(local)  # every copy held back: all read in place
        assert all(str(ds.shard_path(shard)).startswith(str(out)) for shard in range(len(ds.shards)))
        waited = time.monotonic() + 30
        while len(held) < readers.mounts.COPIERS and time.monotonic() < waited:
            time.sleep(0.01)
        assert ds.manifest.shards[-1].name in held[:readers.mounts.COPIERS]  # the first read's shard: copied first
    finally:
        release.set()
    copies_landed()
    assert read_all(ds) == read_all(local)
    assert all(str(ds.shard_path(shard)).startswith(str(cache_dir)) for shard in range(len(ds.shards)))
    ds.close()


def test_only_leases_read_in_place_are_asked_whether_a_copy_supersedes_them(
        packed_as: Callable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Asking every lease at every sample whether it was superseded cost a warm local LMDB read 4%
    of its time (0.3 us a sample), for leases that never are: only leases read in place are asked."""
    asked: list[type] = []
    for kind in (readers.cache.Lease, readers.mounts.InPlaceLease):
        def counted(self: Any, real: Callable = kind.superseded) -> bool:
            asked.append(type(self))
            return real(self)
        monkeypatch.setattr(kind, "superseded", counted)
    out = packed_as("wds")[0]
    local = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    read_all(local)
    assert asked == []
    release = threading.Event()
    hold_copies_ahead(monkeypatch, release)
    ds = readers.open_dataset(out, decode="bytes", fields=FIELDS, storage="network", cache_dir=tmp_path / "cache")
    try:
        read_all(ds)
    finally:
        release.set()
    copies_landed()
    ds.close()
    assert set(asked) == {readers.mounts.InPlaceLease}


def test_a_wds_index_read_in_place_moves_to_its_copy_too(packed_as: Callable, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard whose tar had landed when its reader opened it, and whose .packidx had not, read the
    index from the mount for as long as it stayed open: any of its leases superseded reopens it."""
    monkeypatch.setattr(readers.mounts, "LANDED_LOOK_S", 0.0)
    out = packed_as("wds")[0]
    local = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    release = threading.Event()
    copy = readers.mounts.copy_ranges

    def indexes_held(source: int, dest: int, size: int, name: str) -> str:
        if name.endswith(".packidx"):
            release.wait(30)
        return copy(source, dest, size, name)

    monkeypatch.setattr(readers.mounts, "copy_ranges", indexes_held)
    cache_dir = tmp_path / "cache"
    ds = readers.open_dataset(out, decode="bytes", fields=FIELDS, storage="network", cache_dir=cache_dir)
    shard = ds.manifest.shards[0]
    index = next(sidecar for sidecar in shard.sidecars if sidecar.name.endswith(".packidx"))
    try:
        assert ds[0] == local[0]
        waited = time.monotonic() + 30
        while not ds.files.cache.has(shard) and time.monotonic() < waited:  # type: ignore[attr-defined]
            time.sleep(0.01)
        assert ds[1] == local[1]  # reopened: the tar from its copy, the index still in place
        assert str(ds.shard_path(0)).startswith(str(cache_dir))
        assert not str(ds.files.path(index)).startswith(str(cache_dir))
    finally:
        release.set()
    copies_landed()
    assert ds[2] == local[2]
    assert str(ds.files.path(index)).startswith(str(cache_dir))
    ds.close()


def test_a_wds_dataset_read_front_to_back_on_a_mount_is_not_copied(packed_as: Callable, tmp_path: Path) -> None:
    """Iterating a wds dataset (and counting its samples) reads each tar front to back, in large
    reads: in place, as streaming does, with no copy behind it."""
    out = packed_as("wds")[0]
    local = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    ds = readers.open_dataset(out, decode="bytes", fields=FIELDS, storage="network", cache_dir=tmp_path / "cache")
    assert list(ds) == list(local)
    assert ds.stored_samples(0) == ds.manifest.shards[0].num_samples
    copies_landed()
    assert not (tmp_path / "cache" / "objects").exists() or not list((tmp_path / "cache" / "objects").iterdir())
    ds.close()
