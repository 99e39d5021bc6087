"""open_dataset on URLs: every format through a real S3 protocol (moto on loopback, s3fs) and plain
HTTP, read at random through the cache, equals reading the same dataset from local disk."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import fsspec.config
import pytest
from imagefolders import make_image_folder
from workers import children

import readers
from packer.run.pipeline import pack
from packer.plan.options import PackOptions
from packer.write.writers import WRITERS
from readers.cache import ShardCache, _in_use, _lock, _unlock
from readers.remote import RemoteStore

FIELDS = ("image", "label", "path", "index")


def samples(ds: readers.PackedDataset, order: list[int]) -> list[tuple[Any, ...]]:
    return [ds[i] for i in order]


@pytest.mark.parametrize("store", ["s3", "http"])
@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_remote_equals_local(fmt: str, store: str, packed_as: Callable, serve: Callable[[str], str],
                             s3_packed: Callable[[str], str], s3_options: dict, tmp_path: Path) -> None:
    local = readers.open_dataset(packed_as(fmt)[0], decode="bytes", fields=FIELDS)
    url, options = (s3_packed(fmt), s3_options) if store == "s3" else (serve(fmt), None)
    cache_dir = tmp_path / "cache"
    remote = readers.open_dataset(url, decode="bytes", fields=FIELDS, cache_dir=cache_dir, storage_options=options)
    assert type(remote) is type(local) and remote.manifest == local.manifest and remote.root == url
    backwards = list(range(len(local)))[::-1]  # shards fetched on demand, in any order
    assert samples(remote, backwards) == samples(local, backwards)
    assert list(remote) == list(local)  # sequential reading (tar shards: without their index) too
    remote.close()
    objects = sorted(path.name for path in (cache_dir / "objects").iterdir())
    wanted = [file.sha256 + Path(file.name).suffix for number, shard in enumerate(local.manifest.shards)
              for file in (shard, *local.read_sidecars(number))]  # what the reader reads: no DALI .idx
    assert objects == sorted(wanted)


def test_file_urls_and_plain_paths_are_read_in_place(packed_as: Callable, tmp_path: Path) -> None:
    out, _ = packed_as("lmdb")
    ds = readers.open_dataset(f"file://{out}", decode="bytes", cache_dir=tmp_path / "unused")
    assert ds.root == out and ds.shard_path(0) == out / ds.manifest.shards[0].name
    assert not (tmp_path / "unused").exists()


def test_another_dataset_with_the_same_shard_names_shares_the_cache(
        image_folder: tuple[Path, dict[str, bytes]], packed_as: Callable, serve: Callable[[str], str],
        http_server: Any, tmp_path: Path) -> None:
    """The cache is keyed by sha256: shard-000000.mdb of one dataset never stands in for another's."""
    other = http_server.directory / "other-lmdb"
    pack(image_folder[0], other, PackOptions(format="lmdb", shard_size=5))
    cache_dir = tmp_path / "cache"
    for url, local in ((serve("lmdb"), packed_as("lmdb")[0]), (f"{http_server.url}/other-lmdb", other)):
        remote = readers.open_dataset(url, decode="bytes", fields=FIELDS, cache_dir=cache_dir)
        expected = readers.open_dataset(local, decode="bytes", fields=FIELDS)
        assert samples(remote, list(range(len(remote)))) == samples(expected, list(range(len(expected))))
    assert len(list((cache_dir / "objects").iterdir())) == 5 + 4


def test_map_style_reads_stay_under_the_limit(packed_as: Callable, serve: Callable[[str], str], tmp_path: Path) -> None:
    """Random access through a cache smaller than the dataset: a full cache closes this process's
    oldest open shard instead of waiting for itself."""
    url = serve("wds")
    local = readers.open_dataset(packed_as("wds")[0], decode="bytes", fields=FIELDS)
    largest = max(shard.bytes + sum(s.bytes for s in shard.sidecars) for shard in local.manifest.shards)
    remote = readers.open_dataset(url, decode="bytes", fields=FIELDS, cache_dir=tmp_path, cache_limit=3 * largest)
    order = [i for step in range(4) for i in range(step, len(local), 4)]  # every shard, again and again
    assert samples(remote, order) == samples(local, order)
    assert remote.files.cache.disk_bytes() <= 3 * largest  # type: ignore[attr-defined]


def test_missing_back_end_names_the_extra(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['s3fs'] = None; import readers\n"
            "try:\n    readers.open_dataset('s3://bucket/data', cache_dir=sys.argv[1])\n"
            "except ImportError as exc:\n    print(exc)\n")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert result.stdout.startswith("s3://bucket/data: reading s3:// needs pip install 'pack[s3]'")


def test_s3_downloads_make_no_crc32_pass_of_their_own(s3_packed: Callable[[str], str], s3_options: dict,
                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache hashes every file it downloads (sha256, index.json's): botocore's CRC32 of each
    response was a second pass over every byte (12% of a download's CPU on loopback). index.json,
    which nothing else checks, keeps it. A checksum setting of the caller's own, or of fsspec's
    config, is kept."""
    from botocore.httpchecksum import Crc32Checksum

    url = s3_packed("wds")  # uploaded first: an upload's checksum is not the download's
    crc_bytes: list[int] = []
    update = Crc32Checksum.update

    def counted(self: Crc32Checksum, chunk: bytes) -> None:
        crc_bytes.append(len(chunk))
        update(self, chunk)

    monkeypatch.setattr(Crc32Checksum, "update", counted)
    store = RemoteStore(url, s3_options)
    shard = store.manifest().shards[0]
    manifest_bytes = sum(crc_bytes)
    store.fetch(shard.name, tmp_path / "shard", shard.bytes)
    assert manifest_bytes == fsspec.filesystem("s3", **s3_options).size(url.removeprefix("s3://") + "/index.json")
    assert sum(crc_bytes) == manifest_bytes and (tmp_path / "shard").stat().st_size == shard.bytes
    assert store.filesystem()[0].config_kwargs == {"response_checksum_validation": "when_required"}
    mine = {**s3_options, "config_kwargs": {"response_checksum_validation": "when_supported", "connect_timeout": 7}}
    assert RemoteStore(url, mine).filesystem()[0].config_kwargs == mine["config_kwargs"]
    monkeypatch.setitem(fsspec.config.conf, "s3", {"config_kwargs": {"connect_timeout": 9}})
    assert RemoteStore(url, s3_options).filesystem()[0].config_kwargs == {
        "connect_timeout": 9, "response_checksum_validation": "when_required"}


def test_a_forked_child_leaves_the_parents_pooled_connections_working(serve: Callable[[str], str]) -> None:
    """A DataLoader worker forked from a process that has read over HTTP makes its own filesystem;
    the parent's, inherited, must not be closed there: closing its pooled connections unregisters
    them from the epoll the two processes share, and the parent's next request hung forever."""
    url = serve("wds")
    RemoteStore(url).manifest()  # leaves a pooled keep-alive connection in this process
    child = os.fork()
    if child == 0:  # as a worker: a store of its own, and the inherited one's references dropped
        try:
            RemoteStore(url).manifest()
            gc.collect()
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    answered = threading.Event()
    threading.Thread(target=lambda: (RemoteStore(url).manifest(), answered.set()), daemon=True).start()
    assert answered.wait(30), "the parent's request after the fork never got its answer"


@pytest.fixture(scope="module")
def twelve_shards(http_server: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """36 images packed as lmdb in 12 shards of 3, served over HTTP: (URL, local copy)."""
    root = tmp_path_factory.mktemp("twelve")
    make_image_folder(root / "src", classes=3, per_class=12)
    out = http_server.directory / "twelve-lmdb"
    pack(root / "src", out, PackOptions(format="lmdb", shard_size=3))
    return f"{http_server.url}/twelve-lmdb", out


@pytest.mark.timeout(40)
def test_map_style_workers_in_a_three_shard_cache_never_wait_on_each_other(
        twelve_shards: tuple[str, Path], http_server: Any, tmp_path: Path) -> None:
    """Map-style over a URL, 2 workers, a cache that holds 3 shards, shuffled: one worker held 3
    shards and waited for the other's download of a 4th, which waited for room: a hang. A worker
    waiting for another's download gives its own idle shards back while that download waits for room."""
    url, out = twelve_shards
    local = readers.open_dataset(out, decode="bytes", fields=FIELDS)
    limit = 3 * local.largest_lease()
    remote = readers.open_dataset(url, decode="bytes", fields=FIELDS, cache_dir=tmp_path, cache_limit=limit)
    http_server.delay_s = 0.02  # downloads overlap
    try:
        for epoch in range(3):
            loader = readers.make_loader(remote, 4, seed=epoch, num_workers=2, shuffle_window=None)
            expected = [local[i] for i in loader.indices().tolist()]
            got = [sample for images, labels, paths, indexes in loader
                   for sample in zip(images, labels.tolist(), paths, indexes.tolist())]
            assert got == expected
    finally:
        http_server.delay_s = 0.0


@pytest.mark.timeout(120)
def test_a_worker_waiting_on_the_cache_ends_with_its_main_process(serve: Callable[[str], str],
                                                                    tmp_path: Path) -> None:
    """A DataLoader worker waiting for another process's download (here one that never starts) stops
    waiting once its main process is gone; orphaned workers stayed stuck on the lock for good."""
    url = serve("lmdb")
    shard = RemoteStore(url).manifest().shards[0]
    cache = ShardCache(tmp_path / "cache")
    holder = _lock(cache.root / "locks" / f"{shard.sha256}.get", exclusive=True)
    code = ("import sys, readers\n"
            "ds = readers.open_dataset(sys.argv[1], cache_dir=sys.argv[2], decode='bytes', fields=('index',))\n"
            "next(iter(readers.make_loader(ds, 4, num_workers=1, shuffle=False)))\n")
    main = subprocess.Popen([sys.executable, "-c", code, url, str(cache.root)])
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not _in_use(cache.root / "locks" / f"{shard.sha256}.use"):  # the worker's lease, waiting
            assert main.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        workers = [pid for pid in children(main.pid)
                   if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(workers) == 1
        main.kill()
        main.wait()
        while alive(workers[0]):
            assert time.monotonic() < deadline + 30, "the orphaned worker still waits"
            time.sleep(0.05)
    finally:
        main.kill()
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        assert holder is not None
        _unlock(holder)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
