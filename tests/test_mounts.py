"""A dataset folder on networked storage (issue 38, part 3): the mount is recognised from the mount
table, and such a folder is read as a URL is, each shard copied whole into the cache, with the same
samples as reading it in place; `storage=` says so where detection cannot."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
from latencyfs import missing_requirements, mounted

import readers
import readers.mounts
from readers.mounts import filesystem_type, is_network_type, parse_mountinfo, reads_as_network
from readers.remote import CachedFiles, LocalFiles

FIELDS = ("image", "label", "path", "index")
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
    for cache_dir, storage, kind in ((tmp_path / "cache", "auto", CachedFiles), (nfs_cache, "auto", LocalFiles),
                                     (nfs_cache, "network", CachedFiles)):
        ds = readers.open_dataset(tmp_path / "nfs" / "ds", decode="bytes", fields=FIELDS, cache_dir=cache_dir,
                                  storage=storage)
        assert type(ds.files) is kind
        assert read_all(ds) == read_all(local)
        ds.close()
        copied = list((cache_dir / "objects").iterdir()) if (cache_dir / "objects").exists() else []
        assert len(copied) == (len(local.manifest.shards) if kind is CachedFiles else 0)


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
    assert isinstance(copied.files, CachedFiles)
    assert read_all(copied) == read_all(local)
    copied.close()
    objects = sorted(path.name for path in (cache_dir / "objects").iterdir())
    wanted = [file.sha256 + Path(file.name).suffix for number, shard in enumerate(local.manifest.shards)
              for file in (shard, *local.read_sidecars(number))]
    assert objects == sorted(wanted)


def test_network_storage_cache_limit_holds_as_for_urls(packed_as: Callable, tmp_path: Path) -> None:
    out = packed_as("wds")[0]
    local = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    largest = max(shard.bytes + sum(s.bytes for s in shard.sidecars) for shard in local.manifest.shards)
    with pytest.raises(ValueError, match="cache_limit .* is too small"):
        readers.open_dataset(out, storage="network", cache_dir=tmp_path, cache_limit=2 * largest)
    copied = readers.open_dataset(out, decode="bytes", fields=FIELDS, storage="network", cache_dir=tmp_path,
                                  cache_limit=3 * largest)
    order = [i for step in range(4) for i in range(step, len(local), 4)]  # every shard, again and again
    assert [copied[i] for i in order] == [local[i] for i in order]
    assert copied.files.cache.disk_bytes() <= 3 * largest  # type: ignore[attr-defined]


def test_a_shard_changed_on_the_mount_is_refused(packed_as: Callable, tmp_path: Path) -> None:
    """A copy is only used when its sha256 is index.json's: a shard rewritten since is an error, never its samples."""
    out = tmp_path / "out"
    shutil.copytree(packed_as("lmdb")[0], out)
    ds = readers.open_dataset(out, decode="bytes", storage="network", cache_dir=tmp_path / "cache")
    shard = out / ds.manifest.shards[1].name
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert ds[0][1] == readers.open_dataset(packed_as("lmdb")[0], decode="bytes")[0][1]
    with pytest.raises(readers.DatasetError, match="sha256"):
        ds[4]
    shard.write_bytes(bytes(data[:-1]))
    with pytest.raises(readers.DatasetError, match="index.json says"):
        ds[5]


@pytest.mark.skipif(NO_FUSE is not None, reason=str(NO_FUSE))
@pytest.mark.filterwarnings("ignore:.*shards hold 1 classes each")  # packed sorted, to compare in order
@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "wds"])
def test_a_dataset_on_a_fuse_mount_is_copied_and_equals_the_local_one(fmt: str, packed_as: Callable,
                                                                       tmp_path: Path) -> None:
    out = packed_as(fmt)[0]
    local = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    expected = {streaming: loader_samples(local, streaming) for streaming in (False, True)}
    assert [sample[3] for sample in expected[True]] == list(range(len(local)))
    with mounted(out, latency_ms=0.2) as mount:
        assert is_network_type(filesystem_type(mount))
        for storage in ("auto", "network"):
            for streaming in (False, True):
                cache_dir = tmp_path / f"cache-{storage}-{streaming}"
                ds = readers.open_dataset(mount, decode="bytes", fields=FIELDS, storage=storage, cache_dir=cache_dir)
                assert isinstance(ds.files, CachedFiles)
                assert loader_samples(ds, streaming) == expected[streaming]
                ds.close()
                assert len(list((cache_dir / "objects").iterdir())) >= len(local.manifest.shards)
        in_place = readers.open_dataset(mount, decode="bytes", fields=FIELDS, storage="local")
        assert isinstance(in_place.files, LocalFiles) and read_all(in_place) == read_all(local)
        in_place.close()
