"""The shard cache over a real HTTP server on loopback: whole-file downloads checked by sha256, one
download per file per node, LRU eviction under a limit that never touches a leased file, retries,
clear errors, and a killed download that nothing trusts afterwards."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Callable

import pytest
from loopback import LoopbackHTTP

import readers
import readers.cache
from readers.cache import MIN_CACHE_SHARDS, ShardCache, _lock, _unlock, parse_size
from readers.manifest import ShardInfo
from readers.remote import CachedFiles, RemoteStore, default_cache_dir
from readers.streaming import ShardPrefetcher


def store_and_shards(url: str) -> tuple[RemoteStore, list[ShardInfo]]:
    store = RemoteStore(url)
    return store, store.manifest().shards


def path_of(url: str, name: str) -> str:
    """The path the HTTP server sees for file `name` of the dataset at `url`."""
    return f"{urllib.parse.urlsplit(url).path}/{name}"


def test_parse_size() -> None:
    assert parse_size("200GB") == 200 * 10**9
    assert parse_size("1.5 GiB") == 3 * 2**29
    assert parse_size("512mb") == 512 * 10**6
    assert parse_size(1234) == 1234 and parse_size(None) is None and parse_size("4G") == 4 * 10**9
    with pytest.raises(ValueError, match="'lots' is not a size"):
        parse_size("lots")


def test_files_download_once_checked_and_named_by_sha256(serve: Callable[[str], str], http_server: LoopbackHTTP,
                                                          tmp_path: Path) -> None:
    url = serve("wds")
    store, shards = store_and_shards(url)
    cache = ShardCache(tmp_path / "cache")
    for shard in shards:
        with cache.lease(shard, store) as path:
            assert path.name == shard.sha256 + ".tar"
            assert hashlib.sha256(path.read_bytes()).hexdigest() == shard.sha256
        with cache.lease(shard, store) as again:
            assert again == path
    assert {http_server.gets[path_of(url, shard.name)] for shard in shards} == {1}
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


def test_corrupt_download_is_fetched_again_then_refused(serve: Callable[[str], str], http_server: LoopbackHTTP,
                                                         tmp_path: Path) -> None:
    url = serve("wds")
    store, shards = store_and_shards(url)
    cache = ShardCache(tmp_path / "cache")
    first, second = (path_of(url, shard.name) for shard in shards[:2])
    http_server.faults[first] = ["corrupt"]
    with cache.lease(shards[0], store) as path:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == shards[0].sha256
    assert http_server.gets[first] == 2
    http_server.faults[second] = ["corrupt", "corrupt"]
    with pytest.raises(readers.DatasetError, match=f"{url}/{shards[1].name}: sha256 [0-9a-f]{{64}} on two downloads, "
                                                    f"index.json says {shards[1].sha256}"):
        cache.lease(shards[1], store)
    assert not cache.object_path(shards[1]).exists() and list((tmp_path / "cache" / "tmp").iterdir()) == []


def test_transient_errors_are_retried_then_name_the_url(serve: Callable[[str], str], http_server: LoopbackHTTP,
                                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RemoteStore, "backoff_s", 0.01)
    monkeypatch.setattr(RemoteStore, "retries", 2)
    url = serve("lmdb")
    store, shards = store_and_shards(url)
    cache = ShardCache(tmp_path / "cache")
    first, second = (path_of(url, shard.name) for shard in shards[:2])
    http_server.faults[first] = [503, "truncate"]  # a server error, then a connection cut mid-body
    with cache.lease(shards[0], store) as path:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == shards[0].sha256
    assert http_server.gets[first] == 3
    http_server.faults[second] = [503, 503, 503]
    with pytest.raises(readers.DatasetError, match=f"{url}/{shards[1].name}: failed 3 times, last: .*503"):
        cache.lease(shards[1], store)


def test_missing_and_forbidden_are_one_clear_error(serve: Callable[[str], str], http_server: LoopbackHTTP,
                                                   s3_options: dict, tmp_path: Path) -> None:
    url = serve("hdf5")
    with pytest.raises(readers.DatasetError, match=f"^{url}-gone/index.json: not found \\(HTTP 404\\)$"):
        readers.open_dataset(url + "-gone", cache_dir=tmp_path)
    http_server.faults[path_of(url, "index.json")] = [403]
    with pytest.raises(readers.DatasetError, match=f"^{url}/index.json: access denied \\(HTTP 403\\)$"):
        readers.open_dataset(url, cache_dir=tmp_path)
    with pytest.raises(readers.DatasetError, match="^s3://pack-test/nothing/index.json: not found \\(HTTP 404\\)$"):
        readers.open_dataset("s3://pack-test/nothing", cache_dir=tmp_path, storage_options=s3_options)
    ds = readers.open_dataset(url, cache_dir=tmp_path, decode="bytes")
    http_server.faults[path_of(url, ds.manifest.shards[0].name)] = [404]
    with pytest.raises(readers.DatasetError, match=f"^{url}/{ds.manifest.shards[0].name}: not found \\(HTTP 404\\)$"):
        ds[0]


def test_limit_below_a_few_shards_names_both_sizes(serve: Callable[[str], str], tmp_path: Path) -> None:
    url = serve("lmdb")
    largest = max(shard.bytes for shard in RemoteStore(url).manifest().shards)
    need = MIN_CACHE_SHARDS * largest
    with pytest.raises(ValueError, match=f"cache_limit .*\\({need - 1} bytes\\) is too small: .* largest shard "
                                         f".*\\({largest} bytes\\).*\\({need} bytes\\)"):
        readers.open_dataset(url, cache_dir=tmp_path, cache_limit=need - 1)
    readers.open_dataset(url, cache_dir=tmp_path, cache_limit=need)


def test_eviction_is_lru_and_spares_leased_files(serve: Callable[[str], str], http_server: LoopbackHTTP,
                                                 tmp_path: Path) -> None:
    url = serve("lmdb")
    store, shards = store_and_shards(url)
    sizes = [shard.bytes for shard in shards]
    limit = sizes[0] + sizes[2] + sizes[3]  # shard 3 fits once shard 1 is gone
    cache = ShardCache(tmp_path / "cache", limit)
    held = cache.lease(shards[0], store)  # the oldest, but in use
    for shard in shards[1:3]:
        cache.lease(shard, store).release()
        time.sleep(0.01)  # distinct mtimes for the LRU order
    cache.lease(shards[3], store).release()  # needs room: shard 1 is the least recently used unleased file
    assert held.path.exists() and not cache.object_path(shards[1]).exists()
    assert cache.object_path(shards[2]).exists() and cache.object_path(shards[3]).exists()
    assert cache.disk_bytes() <= limit
    held.release()
    cache.lease(shards[4], store).release()
    assert not held.path.exists()  # released, it is the least recently used now
    assert cache.disk_bytes() <= limit and http_server.gets[path_of(url, shards[0].name)] == 1


def test_full_cache_waits_for_a_release_then_gives_up(serve: Callable[[str], str], tmp_path: Path) -> None:
    url = serve("lmdb")
    store, shards = store_and_shards(url)
    cache = ShardCache(tmp_path / "cache", sum(shard.bytes for shard in shards[:4]) - 1)  # not 4 at once
    leases = [cache.lease(shard, store) for shard in shards[:3]]
    threading.Timer(0.3, leases[0].release).start()
    started = time.monotonic()
    leases.append(cache.lease(shards[3], store))  # waits until shard 0 is released
    assert time.monotonic() - started >= 0.25 and not leases[0].path.exists()
    cache.room_timeout = 0.2  # shards 1, 2 and 3 are held now
    with pytest.raises(readers.DatasetError,
                       match="waited 0 s for room for .*; cache_limit .*, files held by readers: 3 "):
        cache.lease(shards[0], store)


def test_with_no_limit_the_cache_leaves_a_share_of_its_disk_free(serve: Callable[[str], str], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """With no cache_limit (the default, and a dataset on a mount is copied into the cache by
    default) the cache filled its disk; now it leaves FREE_SHARE_KEPT of it free, evicting as
    under a limit. A disk of 100 shards' size, all full but the cache and 8.5 shards, keeps 5 free."""
    url = serve("lmdb")
    store, shards = store_and_shards(url)
    size = max(shard.bytes for shard in shards)
    cache = ShardCache(tmp_path / "cache")
    monkeypatch.setattr(readers.cache, "FREE_BYTES_KEPT", 0)
    monkeypatch.setattr(readers.cache, "disk_space", lambda path: (100 * size, int(8.5 * size) - cache.disk_bytes()))
    for shard in shards[:4]:
        cache.lease(shard, store).release()
        time.sleep(0.01)  # distinct mtimes for the LRU order
    assert not cache.object_path(shards[0]).exists() and cache.disk_bytes() <= 3.5 * size
    assert all(cache.object_path(shard).exists() for shard in shards[1:4])
    leases = [cache.lease(shard, store) for shard in shards[1:4]]
    cache.room_timeout = 0.2
    with pytest.raises(readers.DatasetError, match="waited 0 s for room for .*; no cache_limit: the disk kept 5% free "
                                                   r"\(at least 0 bytes\), files held by readers: 3 "):
        cache.lease(shards[0], store)
    for lease in leases:
        lease.release()


def test_lock_file_that_vanishes_under_a_waiter(serve: Callable[[str], str], http_server: LoopbackHTTP,
                                                tmp_path: Path) -> None:
    """A waiter whose lock file is deleted must lock the new file, not download beside its holder."""
    url = serve("wds")
    store, shards = store_and_shards(url)
    cache = ShardCache(tmp_path / "cache")
    shard = shards[0]
    get_lock = cache.root / "locks" / f"{shard.sha256}.get"
    holder = _lock(get_lock, exclusive=True)  # as if another process were downloading it
    assert holder is not None
    http_server.delay_s = 0.5
    try:
        waiter = threading.Thread(target=lambda: cache.lease(shard, store).release())
        waiter.start()
        time.sleep(0.2)  # the waiter blocks on the lock file
        get_lock.unlink()  # ... which vanishes
        newcomer = threading.Thread(target=lambda: cache.lease(shard, store).release())
        newcomer.start()  # locks a new lock file and downloads (slowly)
        time.sleep(0.2)
        _unlock(holder)  # the waiter wakes on the deleted file and must wait for the newcomer
        waiter.join(10)
        newcomer.join(10)
    finally:
        http_server.delay_s = 0.0
    assert http_server.gets[path_of(url, shard.name)] == 1


def test_killed_download_is_never_trusted(serve: Callable[[str], str], http_server: LoopbackHTTP,
                                          packed_as: Callable, tmp_path: Path) -> None:
    url = serve("hdf5")
    cache_dir = tmp_path / "cache"
    shard = RemoteStore(url).manifest().shards[0]
    http_server.faults[path_of(url, shard.name)] = ["stall"]  # half the shard, then nothing
    code = f"import readers; readers.open_dataset({url!r}, cache_dir={str(cache_dir)!r})[0]"
    reader = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while not any(part.stat().st_size for part in (cache_dir / "tmp").glob("*.part")):
            assert reader.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        reader.send_signal(signal.SIGKILL)
        reader.wait()
    finally:
        reader.kill()
    assert not ShardCache(cache_dir).object_path(shard).exists()
    ds = readers.open_dataset(url, cache_dir=cache_dir, decode="bytes", fields=("image", "path"))
    local = readers.open_dataset(packed_as("hdf5")[0], decode="bytes", fields=("image", "path"))
    assert [ds[i] for i in range(len(ds))] == [local[i] for i in range(len(local))]
    assert list((cache_dir / "tmp").iterdir()) == []
    for path in (cache_dir / "objects").iterdir():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == path.name.split(".")[0]


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PACK_CACHE_DIR", str(tmp_path / "shared"))
    assert default_cache_dir("s3://bucket/a.wds") == tmp_path / "shared"
    monkeypatch.delenv("PACK_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    first, second = default_cache_dir("s3://bucket/a.wds"), default_cache_dir("s3://bucket/b.wds")
    assert first.parent == second.parent == tmp_path / ".cache" / "pack" and first != second
    assert first.name.startswith("bucket_a.wds-")


def test_cache_and_store_import_no_torch_and_no_fsspec() -> None:
    code = ("import sys, readers.cache, readers.remote; "
            "assert not {'torch', 'fsspec'} & set(sys.modules), 'imported torch or fsspec'")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})


def test_a_remote_wds_read_fetches_pack_index_not_dalis(serve: Callable[[str], str], http_server: LoopbackHTTP,
                                                        tmp_path: Path) -> None:
    """Random access needs each shard and its .packidx; the DALI .idx beside them is never downloaded."""
    url = serve("wds")
    ds = readers.open_dataset(url, decode="bytes", cache_dir=tmp_path / "cache")
    assert len([ds[index] for index in range(len(ds))]) == len(ds)
    sidecars = [sidecar.name for shard in ds.manifest.shards for sidecar in shard.sidecars]
    assert {http_server.gets[path_of(url, name)] for name in sidecars if name.endswith(".packidx")} == {1}
    assert {http_server.gets[path_of(url, name)] for name in sidecars if name.endswith(".idx")} == {0}


def test_limit_counts_only_the_sidecars_the_reader_reads(serve: Callable[[str], str], tmp_path: Path) -> None:
    """A wds shard's DALI `.idx` is never fetched, so it does not count against the limit."""
    url = serve("wds")
    shards = RemoteStore(url).manifest().shards
    read = max(shard.bytes + sum(s.bytes for s in shard.sidecars if s.name.endswith(".packidx")) for shard in shards)
    assert any(s.name.endswith(".idx") for s in shards[0].sidecars)
    readers.open_dataset(url, cache_dir=tmp_path, cache_limit=MIN_CACHE_SHARDS * read)
    with pytest.raises(ValueError, match="is too small"):
        readers.open_dataset(url, cache_dir=tmp_path, cache_limit=MIN_CACHE_SHARDS * read - 1)


def served_shards(http_server: LoopbackHTTP, name: str, count: int) -> tuple[str, list[ShardInfo]]:
    """`count` files of 4 KiB served under /NAME, and their ShardInfo: the URL and the shards."""
    folder = http_server.directory / name
    folder.mkdir()
    shards = []
    for number in range(count):
        data = bytes([number]) * 4096
        (folder / f"s{number}.tar").write_bytes(data)
        shards.append(ShardInfo(f"s{number}.tar", 1, len(data), hashlib.sha256(data).hexdigest()))
    return f"{http_server.url}/{name}", shards


def test_shards_fetched_ahead_never_cost_the_shard_being_read(http_server: LoopbackHTTP, tmp_path: Path) -> None:
    """A cache of 3 shards, readers fetching 2 ahead: one reader downloads every shard once (its
    shards fetched ahead do not evict each other); two readers slower than the cache's wait for
    room both finish (a shard fetched ahead never waits for room, so it cannot time out, nor hold
    the room or the download lock a shard being read needs)."""
    url, shards = served_shards(http_server, "prefetch-room", 8)

    def read(cache: ShardCache, mine: list[ShardInfo], seconds: float) -> None:
        prefetcher = ShardPrefetcher(CachedFiles(RemoteStore(url), cache, "test"), mine, 2)
        try:
            for number in range(len(mine)):
                lease = prefetcher.take(number)
                time.sleep(seconds)
                lease.release()
        finally:
            prefetcher.close()

    read(ShardCache(tmp_path / "one", 3 * 4096), shards, 0.05)
    assert [http_server.gets[path_of(url, shard.name)] for shard in shards] == [1] * 8
    shared = ShardCache(tmp_path / "two", 3 * 4096)
    shared.room_timeout = 0.5
    errors: list[BaseException] = []

    def reader(mine: list[ShardInfo]) -> None:
        try:
            read(shared, mine, 0.8)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(part,)) for part in (shards[:4], shards[4:])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and not any(thread.is_alive() for thread in threads)


def test_a_shard_already_in_the_cache_is_taken_without_waiting_for_its_thread(http_server: LoopbackHTTP,
                                                                              tmp_path: Path) -> None:
    """Shards 1 and 2 are fetched ahead by threads that cannot finish (their leases ahead block):
    taking shard 1, which the cache holds, does not wait for them; shard 2 downloads at its turn."""
    url, shards = served_shards(http_server, "present", 3)
    files = CachedFiles(RemoteStore(url), ShardCache(tmp_path), "test")
    files.lease(shards[1]).release()
    stuck = threading.Event()

    class StuckAhead(CachedFiles):
        def lease(self, file, *, make_room=None, ahead=None, sequential=False):  # type: ignore[no-untyped-def]
            if ahead is not None:
                stuck.wait(30)
            return super().lease(file, make_room=make_room, ahead=ahead, sequential=sequential)

    prefetcher = ShardPrefetcher(StuckAhead(files.store, files.cache, "test"), shards, 2)
    try:
        started = time.monotonic()
        for number in (0, 1):
            prefetcher.take(number).release()
        assert time.monotonic() - started < 10 and files.present(shards[1]) and not files.present(shards[2])
    finally:
        stuck.set()
        prefetcher.close()


@pytest.mark.timeout(60)
def test_a_reader_waiting_for_a_download_that_waits_for_room_gives_its_shards_back(
        serve: Callable[[str], str], http_server: LoopbackHTTP, tmp_path: Path) -> None:
    """Reader A holds the cache full and wants the shard reader B is downloading; B waits for room.
    A waited on B's download lock for good (two map-style workers, no output for 15 minutes); now A
    gives its own shards back, one per poll, while that download has no room, and both go on."""
    url = serve("lmdb")
    store, shards = store_and_shards(url)
    sizes = [shard.bytes for shard in shards]
    limit = sum(sizes[:3]) + sizes[3] - 1  # shard 3 fits once any of the three is given back
    held = [ShardCache(tmp_path, limit).lease(shard, store) for shard in shards[:3]]
    given_back = []

    def give_back() -> bool:
        if not held:
            return False
        given_back.append(held.pop(0))
        given_back[-1].release()
        return True

    downloader = ShardCache(tmp_path, limit)
    downloader.room_timeout = 20.0  # before: B gave up after this, A never moved
    results: dict[str, object] = {}

    def read(name: str, cache: ShardCache, make_room: Callable[[], bool] | None) -> None:
        try:
            with cache.lease(shards[3], store, make_room=make_room) as path:
                results[name] = path.read_bytes()
        except Exception as exc:  # noqa: BLE001 - the test reports it
            results[name] = exc

    b = threading.Thread(target=read, args=("b", downloader, None))
    b.start()
    get_path = tmp_path / "locks" / f"{shards[3].sha256}.get"
    deadline = time.monotonic() + 30
    while (probe := _lock(get_path, exclusive=True, wait=False)) is not None:  # until B holds it
        _unlock(probe)
        assert time.monotonic() < deadline
        time.sleep(0.01)
    a = threading.Thread(target=read, args=("a", ShardCache(tmp_path, limit), give_back))
    a.start()
    a.join(40)
    b.join(40)
    expected = (http_server.directory / urllib.parse.urlsplit(url).path.strip("/") / shards[3].name).read_bytes()
    assert results == {"a": expected, "b": expected}
    assert 1 <= len(given_back) <= 3 and http_server.gets[path_of(url, shards[3].name)] == 1
    for lease in held:
        lease.release()


@pytest.mark.timeout(60)
def test_a_wait_for_another_download_ends_in_one_line(serve: Callable[[str], str], tmp_path: Path) -> None:
    url = serve("lmdb")
    store, shards = store_and_shards(url)
    cache = ShardCache(tmp_path, 3 * max(shard.bytes for shard in shards))
    lease = cache.lease(shards[0], store)
    holder = _lock(tmp_path / "locks" / f"{shards[1].sha256}.get", exclusive=True)  # a download that never starts
    cache.room_timeout = 0.2
    try:
        with pytest.raises(readers.DatasetError) as error:
            cache.lease(shards[1], store)
    finally:
        assert holder is not None
        _unlock(holder)
        lease.release()
    assert str(error.value) == (
        f"{tmp_path}: waited 0 s for another process's download of {shards[1].name}, which waits for room; "
        f"cache_limit {readers.cache.format_size(cache.limit)}, files held by readers: 1 "
        f"({readers.cache.format_size(shards[0].bytes)}), not held: 0 (0 bytes), downloads under way: 0")


def test_a_download_published_but_not_yet_unlocked_is_taken_at_once(serve: Callable[[str], str], tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A downloader renames its part into place, then drops its lock: a reader looking in between
    saw the lock held and no part, took it for a download waiting for room, and slept ROOM_POLL_S
    (here a minute; a test of two copy threads failed so). It looks again every LANDING_POLL_S."""
    monkeypatch.setattr(readers.cache, "ROOM_POLL_S", 60.0)
    url = serve("lmdb")
    store, shards = store_and_shards(url)
    elsewhere = ShardCache(tmp_path / "elsewhere")
    with elsewhere.lease(shards[0], store) as copy:
        data = copy.read_bytes()
    cache = ShardCache(tmp_path / "cache")
    holder = _lock(cache.root / "locks" / f"{shards[0].sha256}.get", exclusive=True)  # another's download
    assert holder is not None
    part = cache.root / "tmp" / f"{shards[0].sha256}.{shards[0].bytes}.1.0.part"
    part.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes(data[:100])
    taken: list[Path] = []
    reader = threading.Thread(target=lambda: taken.append(cache.lease(shards[0], store).path))
    reader.start()
    reader.join(0.2)
    assert taken == []  # waits for the download under way
    cache.object_path(shards[0]).write_bytes(data)  # published...
    part.unlink()
    time.sleep(0.2)  # ...and the reader looks before the downloader drops its lock
    _unlock(holder)
    reader.join(30)
    assert taken == [cache.object_path(shards[0])]
