"""make_loader(streaming=True): whole shards front to back, equal ranks, exact resume, background
prefetch; the same loader over a URL yields what it yields locally."""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import shutil
import time
import urllib.parse
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from clirun import run
from imagefolders import make_caption_folder, make_image_folder
from loopback import LoopbackHTTP

import readers
import readers.cache
import readers.handover
from packer.run.pipeline import pack
from packer.plan.options import PackOptions
from packer.write.writers import WRITERS
from readers.read_order import buffer_order, interleaved_order, shard_order, stream_order
from readers.streaming import batches_before, worker_spans

SIZES = [4, 4, 4, 4, 3]  # the shared packed dataset's shards


def streaming(ds: readers.PackedDataset, **kwargs: Any) -> readers.StreamingLoader:
    args: dict[str, Any] = {"batch_size": 3, "seed": 5, "num_workers": 0, "shuffle_buffer": 4, **kwargs}
    return readers.make_loader(ds, streaming=True, **args)  # type: ignore[return-value]


def flat(loader: readers.PackedLoader) -> list[int]:
    return [i for batch in loader for i in batch[0].tolist()]


def interrupted(loader: readers.PackedLoader, epoch: int, consumed: int) -> tuple[list[list[int]], dict[str, Any]]:
    """The indexes of the first `consumed` batches of `epoch`, then the loader's state (a run stopped there)."""
    loader.set_epoch(epoch)
    head = []
    for batch in loader:
        head.append(batch[0].tolist())
        if len(head) == consumed:
            break
    return head, loader.state_dict()


def open_indexed(path: str | Path, **kwargs: Any) -> readers.PackedDataset:
    return readers.open_dataset(path, decode="bytes", fields=("index", "image", "label"), **kwargs)


# The order, without data ------------------------------------------------------------------


def test_stream_order_reads_whole_shards_in_shard_order() -> None:
    order = stream_order(SIZES, seed=3, epoch=1)
    starts = np.concatenate(([0], np.cumsum(SIZES)))
    expected = [i for shard in shard_order(5, seed=3, epoch=1) for i in range(starts[shard], starts[shard + 1])]
    assert order.tolist() == expected
    assert stream_order(SIZES, seed=3, epoch=1, shuffle=False).tolist() == list(range(19))


def test_worker_spans_tile_the_share_and_end_with_the_last_batch() -> None:
    for share in range(0, 30):
        for batch in (1, 3, 4):
            for workers in (1, 2, 3):
                spans = worker_spans(share, batch, workers)
                bounds = [edge for span in sorted(spans) for edge in span]
                assert bounds[0] == 0 and bounds[-1] == share and bounds[1:-1:2] == bounds[2::2]  # no gap, no overlap
                batches = -(-share // batch)
                if batches:
                    assert spans[(batches - 1) % workers][1] == share  # the last batch yielded holds the end
                for worker, (a, b) in enumerate(spans):
                    assert -(-(b - a) // batch) == batches_before(batches, worker, workers)


def test_buffer_order_is_a_permutation_that_mixes_within_the_buffer() -> None:
    rng = np.random.default_rng(0)
    order = buffer_order(1000, 16, rng)
    assert sorted(order.tolist()) == list(range(1000)) and order.tolist() != list(range(1000))
    # An input comes out no earlier than 15 places before its arrival.
    assert all(order[i] <= i + 15 for i in range(1000))
    assert buffer_order(10, 1, rng).tolist() == list(range(10))


def test_interleaved_order_reads_each_run_front_to_back_with_at_most_width_open() -> None:
    lengths = [10, 10, 3, 10, 7, 10, 1, 10]
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    run_of = np.repeat(np.arange(len(lengths)), lengths)
    for width in (1, 2, 3, 4, 8, 20):
        order = interleaved_order(lengths, width, np.random.default_rng(width))
        assert sorted(order.tolist()) == list(range(sum(lengths)))
        assert order.tolist() == interleaved_order(lengths, width, np.random.default_rng(width)).tolist()
        runs = run_of[order]
        for run, start in enumerate(starts):
            assert order[runs == run].tolist() == list(range(start, start + lengths[run]))  # front to back
        first = {run: int(np.argmax(runs == run)) for run in range(len(lengths))}
        last = {run: len(runs) - 1 - int(np.argmax(runs[::-1] == run)) for run in range(len(lengths))}
        most_open = max(sum(first[run] <= i <= last[run] for run in first) for i in range(len(order)))
        assert most_open <= width and (width == 1 or most_open >= 2)
        if width == 1:
            assert order.tolist() == list(range(sum(lengths)))


# One process -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", sorted(WRITERS))
@pytest.mark.parametrize("workers", [0, 2])
def test_streaming_reads_every_sample_once_in_the_announced_order(fmt: str, workers: int, packed_as: Callable) -> None:
    out, files = packed_as(fmt)
    ds = open_indexed(out)
    loader = streaming(ds, num_workers=workers)
    assert isinstance(loader, readers.StreamingLoader) and len(loader) == 7
    seen = []
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        batches = list(loader)
        assert len(batches) == len(loader) and [len(b[0]) for b in batches] == [3] * 6 + [1]
        indexes = [i for b in batches for i in b[0].tolist()]
        assert indexes == loader.indices().tolist() and sorted(indexes) == list(range(len(files)))
        for batch in batches:
            for index, data, label in zip(batch[0].tolist(), batch[1], batch[2].tolist()):
                assert (data, label) == tuple(ds[index][1:])
        seen.append(indexes)
    assert seen[0] != seen[1]


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "map-style"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_workers_hand_over_tensors_as_one_process_makes_them(mode: str, stream: bool, packed_as: Callable) -> None:
    """Numbers leave the workers as lists (`Scalars`) and become the tensors default_collate makes."""
    ds = open_indexed(packed_as("wds")[0])
    for workers in (0, 2):
        loader = (streaming(ds, num_workers=workers, mode=mode) if stream
                  else readers.make_loader(ds, 3, num_workers=workers, mode=mode))
        for batch in loader:
            assert type(batch) is (tuple if mode == "eval" else list)  # eval items are (batch, mask)
            columns, mask = batch if mode == "eval" else (batch, torch.ones(len(batch[0]), dtype=torch.bool))
            assert [type(column) for column in columns] == [torch.Tensor, list, torch.Tensor]
            assert columns[0].dtype == columns[2].dtype == torch.int64 and mask.dtype == torch.bool
            assert len(mask) == len(columns[0]) and all(type(image) is bytes for image in columns[1])


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_custom_collate_sees_exactly_the_samples_the_default_one_reads(mode: str, packed_as: Callable,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """collate_fn=list (as detection and captioning loaders have): the workers hand its batches over
    through shared memory (readers.handover.RingPickle), and they come out as it made them: the
    same samples, in the same order, as the same types, as the default collate's columns, as they
    did through the pipe."""
    out, files = packed_as("wds")
    ds = open_indexed(out)
    monkeypatch.setattr(readers.handover, "MIN_RING_VALUE", 64)  # the test's small images through the ring
    assert min(len(data) for data in files.values()) >= readers.handover.MIN_RING_VALUE
    for workers in (0, 2):
        default, custom = streaming(ds, num_workers=workers, mode=mode), streaming(
            ds, num_workers=workers, mode=mode, collate_fn=list)
        for epoch in (0, 1):
            default.set_epoch(epoch)
            custom.set_epoch(epoch)
            pairs = list(zip(default, custom, strict=True))
            assert len(pairs) == len(default)
            for columns, samples in pairs:
                if mode == "eval":
                    (columns, mask), (samples, custom_mask) = columns, samples
                    assert mask.tolist() == custom_mask.tolist()
                # DataLoader's default_convert makes the samples' tuples lists, with workers or without
                assert type(samples) is list and {type(sample) for sample in samples} == {list}
                assert [tuple(map(type, sample)) for sample in samples] == [(int, bytes, int)] * len(samples)
                assert list(map(tuple, samples)) == list(zip(columns[0].tolist(), columns[1], columns[2].tolist()))



def test_streaming_ranks_get_equal_batches(packed_as: Callable) -> None:
    ds = open_indexed(packed_as("lmdb")[0])
    world = 3
    for mode, drop_last in (("train", False), ("train", True), ("eval", False)):
        loaders = [streaming(ds, rank=r, world_size=world, mode=mode, drop_last=drop_last) for r in range(world)]
        items = [list(loader) for loader in loaders]
        assert len({len(loader) for loader in loaders}) == 1 and [len(i) for i in items] == [len(loaders[0])] * world
        if mode == "eval":
            real = [i for rank in items for batch, mask in rank for i in batch[0][mask].tolist()]
            assert sorted(real) == list(range(19))
            assert sum(loader.num_padding for loader in loaders) == 21 - 19
        else:
            everything = [i for rank in items for batch in rank for i in batch[0].tolist()]
            assert set(everything) == set(range(19)) if not drop_last else len(set(everything)) == len(everything) == 18


@pytest.fixture(scope="module")
def one_shard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 images packed in one shard (the default shard size)."""
    root = tmp_path_factory.mktemp("one-shard")
    make_image_folder(root / "src", classes=2, per_class=150)
    pack(root / "src", root / "out", PackOptions(format="lmdb"))
    assert len(readers.load_manifest(root / "out").shards) == 1
    return root / "out"


@pytest.mark.filterwarnings("ignore:.*streaming workers share shard files")
def test_drop_last_drops_other_samples_every_epoch(one_shard: Path) -> None:
    """One shard streams front to back, and ranks took equal slices of it from its start: with
    drop_last the same tail (indexes 256-299 of 300, 4 ranks x batch 16) was never read in any
    epoch. The stream now starts at a point that moves on by the 44 dropped every epoch: ranks
    still get equal batches, each epoch drops other samples, and 7 epochs drop every sample once."""
    ds = open_indexed(one_shard)
    loaders = [streaming(ds, batch_size=16, rank=rank, world_size=4, drop_last=True) for rank in range(4)]
    assert {len(loader) for loader in loaders} == {4}
    seen: set[int] = set()
    dropped = []
    for epoch in range(20):
        read = []
        for loader in loaders:
            loader.set_epoch(epoch)
            read += loader.indices().tolist()
        assert len(read) == len(set(read)) == 256
        seen.update(read)
        dropped.append(frozenset(range(300)) - frozenset(read))
    assert seen == set(range(300)) and len(set(dropped)) == 20
    assert frozenset().union(*dropped[:7]) == frozenset(range(300))
    loaders[1].set_epoch(3)
    whole = [batch[0].tolist() for batch in loaders[1]]
    assert [i for batch in whole for i in batch] == loaders[1].indices().tolist()
    head, state = interrupted(streaming(ds, batch_size=16, rank=1, world_size=4, drop_last=True), 3, 2)
    resumed = streaming(ds, batch_size=16, rank=1, world_size=4, drop_last=True)
    resumed.load_state_dict(state)
    assert head + [batch[0].tolist() for batch in resumed] == whole


@pytest.mark.parametrize("workers", [0, 2])
def test_streaming_resume_mid_epoch_is_exact(workers: int, packed_as: Callable) -> None:
    ds = open_indexed(packed_as("wds")[0])
    whole = streaming(ds, num_workers=workers, batch_size=2)
    whole.set_epoch(1)
    expected = [batch[0].tolist() for batch in whole]
    for consumed in (1, 2, 5):
        head, state = interrupted(streaming(ds, num_workers=workers, batch_size=2), 1, consumed)
        assert state["batches"] == consumed and state["num_workers"] == workers
        resumed = streaming(ds, num_workers=workers, batch_size=2)
        resumed.load_state_dict(state)
        assert head + [batch[0].tolist() for batch in resumed] == expected
    with pytest.raises(ValueError, match="shuffle_buffer 4 \\(now 8\\)"):
        streaming(ds, num_workers=workers, batch_size=2, shuffle_buffer=8).load_state_dict(state)


def test_persistent_spawned_workers_follow_set_epoch(packed_as: Callable) -> None:
    ds = open_indexed(packed_as("lmdb")[0])
    loader = streaming(ds, num_workers=1, multiprocessing_context=multiprocessing.get_context("spawn"))
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        assert flat(loader) == loader.indices().tolist()


def test_breaking_out_of_an_epoch_does_not_hang_the_next(packed_as: Callable) -> None:
    ds = open_indexed(packed_as("hdf5")[0])
    loader = streaming(ds, num_workers=2, timeout=60)
    for _ in loader:
        break
    loader.set_epoch(1)
    assert sorted(flat(loader)) == list(range(19))


@pytest.mark.parametrize("fmt, name", [("lmdb", "shard-000001.lmdb"), ("wds", "shard-000001.tar")])
def test_damaged_sample_fails_or_is_skipped(fmt: str, name: str, packed_as: Callable, tmp_path: Path) -> None:
    out, files = packed_as(fmt)
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    shard = copy / name
    raw = bytearray(shard.read_bytes())
    victim = readers.open_dataset(out, decode="bytes", fields=("image",))[5][0]
    at = raw.index(victim) + len(victim) // 2
    raw[at] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(readers.DatasetError, match=f"{name}: sample 1: damaged"):
        list(streaming(open_indexed(copy)))
    ds = open_indexed(copy, on_error="skip")
    batches = list(streaming(ds))
    indexes = [i for batch in batches for i in batch[0].tolist()]
    assert len(indexes) == 19 and 5 not in indexes and indexes.count(6) == 2 and ds.skipped == 1


# Over HTTP ------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_remote_streaming_equals_local(fmt: str, packed_as: Callable, serve: Callable[[str], str],
                                       tmp_path: Path) -> None:
    """Also under a cache limit, where a wds run's images still in the shuffle buffer are read
    before its shard is closed (without one, when they are handed out)."""
    local = streaming(open_indexed(packed_as(fmt)[0]), num_workers=2)
    remote = streaming(open_indexed(serve(fmt), cache_dir=tmp_path), num_workers=2)
    room = 7 * open_indexed(packed_as(fmt)[0]).largest_lease()  # 2 workers x 3 + 1 (check_cache_room)
    limited = streaming(open_indexed(serve(fmt), cache_dir=tmp_path / "limited", cache_limit=room), num_workers=2)
    for loader in (local, remote, limited):
        loader.set_epoch(3)

    def digest(batches: list) -> list:
        return [(b[0].tolist(), [hashlib.sha256(x).hexdigest() for x in b[1]], b[2].tolist()) for b in batches]

    assert digest(list(remote)) == digest(list(local)) == digest(list(limited))


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_fields_stream_and_read_at_random_over_http(fmt: str, http_server: LoopbackHTTP, tmp_path: Path) -> None:
    """Per-sample fields through the cache: streamed by 2 workers (tars front to back, fields
    parsed per sample) and read at random, they equal the local random read of the same dataset."""
    samples = make_caption_folder(tmp_path / "src", folders=3)
    out = http_server.directory / f"fields-{fmt}"
    code, output = run(fmt, "--order", "sorted", tmp_path / "src", out, "--sidecars", "txt,json", "--shard-size", "4",
                       "-q")  # sorted: sample i is the i-th sorted path
    assert code == 0, output
    wanted = ("index", "path", "txt", "json")
    local = readers.open_dataset(out, decode="bytes", fields=wanted)
    expected = [local[i] for i in range(len(local))]
    assert [(txt, meta) for _, path, txt, meta in expected] == [samples[path][1:] for path in sorted(samples)]
    url = f"{http_server.url}/fields-{fmt}"
    remote = readers.open_dataset(url, decode="bytes", fields=wanted, cache_dir=tmp_path / "cache")
    assert [remote[i] for i in reversed(range(len(remote)))] == expected[::-1]
    loader = readers.make_loader(readers.open_dataset(url, decode="bytes", fields=wanted, cache_dir=tmp_path / "cache"),
                                 streaming=True, batch_size=3, seed=1, num_workers=2, shuffle_buffer=4)
    streamed = sorted((int(index), path, txt, meta) for indexes, paths, txts, metas in loader
                      for index, path, txt, meta in zip(indexes, paths, txts, metas))
    assert streamed == expected


def test_next_shards_download_while_the_first_is_read(serve: Callable[[str], str], http_server: LoopbackHTTP,
                                                     tmp_path: Path) -> None:
    url = serve("wds")
    path = urllib.parse.urlsplit(url).path
    for ahead in (0, 2):
        ds = open_indexed(url, cache_dir=tmp_path / str(ahead))
        names = [f"{path}/{shard.name}" for shard in ds.manifest.shards]
        before = sum(http_server.gets[name] for name in names)
        batches = iter(streaming(ds, batch_size=1, shuffle=False, prefetch_shards=ahead))
        next(batches)  # the first sample of shard 0; nothing more is asked for
        deadline = time.monotonic() + 60  # the loop ends as soon as they are there; a loaded CI machine is slow
        while sum(http_server.gets[name] for name in names) - before < 1 + ahead and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        assert sum(http_server.gets[name] for name in names) - before == 1 + ahead
        del batches


@pytest.mark.parametrize("interleave", [2, 3])
def test_a_worker_reading_shards_interleaved_fetches_ahead_past_each_of_them(
        interleave: int, serve: Callable[[str], str], http_server: LoopbackHTTP, tmp_path: Path) -> None:
    """Reading `interleave` shards at once, a worker wants the next `interleave` shards about as
    soon as the next one: at its first sample it has asked for its shard, the `interleave - 1`
    it opens next, and `prefetch_shards` past those (it asked for its shard and 1 past it)."""
    url = serve("wds")
    path = urllib.parse.urlsplit(url).path
    ds = open_indexed(url, cache_dir=tmp_path / "cache")
    names = [f"{path}/{shard.name}" for shard in ds.manifest.shards]
    before = sum(http_server.gets[name] for name in names)
    batches = iter(streaming(ds, batch_size=1, shuffle_buffer=1, interleave=interleave, prefetch_shards=1))
    next(batches)  # the first sample read; nothing more is asked for
    wanted = 1 + (interleave - 1) + 1
    deadline = time.monotonic() + 60
    while sum(http_server.gets[name] for name in names) - before < wanted and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert sum(http_server.gets[name] for name in names) - before == wanted
    del batches


def test_workers_whose_shards_fetched_ahead_fill_a_tight_cache_go_on(http_server: LoopbackHTTP, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The smallest cache_limit open_dataset accepts (3 shards), 2 workers fetching 2 shards ahead
    each: the shard being read comes first, so no worker waits for room for good (it did: each
    worker's shards fetched ahead held the room the other's current shard needed)."""
    monkeypatch.setattr(readers.cache, "ROOM_TIMEOUT_S", 30.0)  # a stall fails in 30 s, not 10 minutes
    make_image_folder(tmp_path / "src", classes=3, per_class=12)
    assert run("wds", tmp_path / "src", http_server.directory / "tight", "--shard-size", "2", "-q")[0] == 0
    url = f"{http_server.url}/tight"
    manifest = readers.load_manifest(http_server.directory / "tight")
    limit = 3 * max(shard.bytes + sum(sidecar.bytes for sidecar in shard.sidecars) for shard in manifest.shards)
    ds = open_indexed(url, cache_dir=tmp_path / "cache", cache_limit=limit)
    loader = streaming(ds, batch_size=4, num_workers=2, prefetch_shards=2, interleave=1)  # the least room it takes
    for epoch in range(3):
        loader.set_epoch(epoch)
        assert set(flat(loader)) == set(range(len(ds)))


def classes_per_batch(loader: readers.PackedLoader) -> float:
    return float(np.mean([len(set(batch[2].tolist())) for batch in loader if len(batch[2]) == loader.batch_size]))


@pytest.fixture(scope="module")
def class_sorted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 class folders of 12 packed in sorted order in shards of 6: about one class per shard."""
    root = tmp_path_factory.mktemp("class-sorted")
    make_image_folder(root / "src", classes=8, per_class=12)
    assert run("lmdb", root / "src", root / "out", "--shard-size", "6", "--order", "sorted", "-q")[0] == 0
    return root / "out"


@pytest.mark.filterwarnings("ignore:.*shuffled pack")
def test_interleaving_shards_mixes_the_classes_of_a_class_sorted_pack(class_sorted: Path) -> None:
    """About one class per shard (a sorted pack of class folders): batches read one shard at a time
    hold two or three classes; read from 4 or 8 shards at once, more (a global shuffle: 5.3);
    every sample still once an epoch."""
    ds = open_indexed(class_sorted)
    mixed = {}
    for width in (1, 4, 8):
        loader = streaming(ds, batch_size=8, shuffle_buffer=2, interleave=width)
        assert sorted(flat(loader)) == list(range(len(ds)))
        mixed[width] = classes_per_batch(loader)
    assert mixed[1] < 3 and mixed[1] * 1.3 < mixed[4] < mixed[8], mixed


def test_interleaved_streaming_resumes_exactly_and_downloads_each_shard_once(http_server: LoopbackHTTP,
                                                                       tmp_path: Path) -> None:
    make_image_folder(tmp_path / "src", classes=4, per_class=15)
    assert run("wds", tmp_path / "src", http_server.directory / "mixed", "--shard-size", "4", "-q")[0] == 0
    shards = [shard.name for shard in readers.load_manifest(http_server.directory / "mixed").shards]
    url = f"{http_server.url}/mixed"
    ds = open_indexed(url, cache_dir=tmp_path / "cache")
    whole = streaming(ds, batch_size=4, num_workers=2, interleave=3)
    whole.set_epoch(2)
    expected = [batch[0].tolist() for batch in whole]
    assert sorted(i for batch in expected for i in batch) == list(range(len(ds)))
    assert {http_server.gets[f"/mixed/{name}"] for name in shards} == {1}  # bytes fetched = the dataset's
    for consumed in (1, 6):
        head, state = interrupted(streaming(ds, batch_size=4, num_workers=2, interleave=3), 2, consumed)
        resumed = streaming(ds, batch_size=4, num_workers=2, interleave=3)
        resumed.load_state_dict(state)
        assert head + [batch[0].tolist() for batch in resumed] == expected
    with pytest.raises(ValueError, match=r"interleave 3 \(now 2\)"):
        streaming(ds, batch_size=4, num_workers=2, interleave=2).load_state_dict(state)


def test_the_old_name_mix_shards_still_works_with_a_deprecation_warning(packed_as: Callable) -> None:
    """`interleave` was `mix_shards` ("mix" is readers.mix): the old keyword of make_loader and of
    ShardStream reads the same batches, with a DeprecationWarning; a state saved under the old key
    resumes exactly; both names at once are refused."""
    ds = open_indexed(packed_as("wds")[0])
    expected = flat(streaming(ds, interleave=3))
    with pytest.warns(DeprecationWarning, match=r"^mix_shards= is now called interleave=") as said:
        old = streaming(ds, mix_shards=3)
    assert said[0].filename == __file__
    assert old.sampler.interleave == 3 and flat(old) == expected
    with pytest.warns(DeprecationWarning, match=r"^mix_shards= is now called interleave="):
        stream = readers.ShardStream(ds, batch_size=3, seed=5, shuffle_buffer=4, mix_shards=2)
    assert stream.interleave == 2
    with pytest.raises(TypeError, match=r"make_loader\(\) got mix_shards= and interleave="):
        streaming(ds, mix_shards=3, interleave=3)
    head, state = interrupted(streaming(ds, interleave=3), 0, 2)
    state["mix_shards"] = state.pop("interleave")  # as a state saved before the rename
    resumed = streaming(ds, interleave=3)
    resumed.load_state_dict(state)
    assert [i for batch in head for i in batch] + flat(resumed) == expected

def test_a_cache_too_small_for_the_shards_interleaved_is_refused_in_one_line(serve: Callable[[str], str],
                                                                       packed_as: Callable, tmp_path: Path) -> None:
    manifest = readers.load_manifest(packed_as("wds")[0])
    largest = max(shard.bytes + sum(s.bytes for s in shard.sidecars if s.name.endswith(".packidx"))
                  for shard in manifest.shards)
    ds = open_indexed(serve("wds"), cache_dir=tmp_path, cache_limit=4 * largest)
    with pytest.raises(ValueError, match=r"^cache_limit .* too small for streaming: 2 workers reading interleave=4 "
                                         r"shards at once need room for 5 of this dataset's largest shard"):
        streaming(ds, num_workers=2, interleave=4)  # 2 x 3 + 1 = 7, but the dataset has 5 shards
    assert len(streaming(ds, num_workers=2, interleave=2)) == 7  # 2 x 1 + 1 = 3 fit
    whole = open_indexed(serve("wds"), cache_dir=tmp_path / "whole", cache_limit=5 * largest)
    assert len(streaming(whole, num_workers=2, interleave=4)) == 7  # room for every shard: none waits


@pytest.mark.filterwarnings("ignore:.*shuffled pack")
def test_the_default_interleave_is_the_widest_a_capped_cache_holds_and_resumes_exactly(
        serve: Callable[[str], str], packed_as: Callable, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A cache of 4 shards, 2 workers: the default interleave of 4 needs room for 5 (2 x 3 + 1, the
    dataset's 5), 3 as many, 2 needs 3: it reads 2 at once, says so in one line, streams every
    sample once an epoch and resumes exactly (the width is part of the state). It was refused
    ("too small for streaming"), though the same call streamed before the interleave existed."""
    largest = open_indexed(packed_as("wds")[0]).largest_lease()
    url = serve("wds")
    ds = open_indexed(url, cache_dir=tmp_path / "capped", cache_limit=4 * largest)
    with caplog.at_level(logging.INFO, logger="readers"):
        whole = streaming(ds, batch_size=2, num_workers=2)
    said = [record.getMessage() for record in caplog.records if "interleave" in record.getMessage()]
    assert len(said) == 1 and "\n" not in said[0] and said[0].startswith(f"{url}: cache_limit ")
    assert "reads interleave=2 shards at once, not 4" in said[0] and whole.sampler.interleave == 2
    whole.set_epoch(1)
    expected = [batch[0].tolist() for batch in whole]
    assert sorted(i for batch in expected for i in batch) == list(range(len(ds)))
    head, state = interrupted(streaming(ds, batch_size=2, num_workers=2), 1, 3)
    assert state["interleave"] == 2
    roomy = open_indexed(url, cache_dir=tmp_path / "roomy")  # no limit: it would read 4 at once
    assert streaming(roomy, batch_size=2, num_workers=2).sampler.interleave == 4
    for resumed in (streaming(ds, batch_size=2, num_workers=2), streaming(roomy, batch_size=2, num_workers=2)):
        resumed.load_state_dict(state)  # the roomy loader reads the 2 at once that the state says
        assert head + [batch[0].tolist() for batch in resumed] == expected
    wide = streaming(roomy, batch_size=2, num_workers=2)
    _, wide_state = interrupted(wide, 1, 3)
    with pytest.raises(ValueError, match=r"^loader state was saved reading interleave=4 shards at once; cache_limit "
                                         r".* holds 2 for 2 workers"):
        streaming(ds, batch_size=2, num_workers=2).load_state_dict(wide_state)
    with pytest.raises(ValueError, match=r"interleave 2 \(now 3\)"):  # given explicitly: no other width taken
        streaming(roomy, batch_size=2, num_workers=2, interleave=3).load_state_dict(state)


def test_streaming_a_class_sorted_pack_warns_once_and_pack_info_says_so(class_sorted: Path) -> None:
    manifest = readers.load_manifest(class_sorted)
    labels = [label for _, label in readers.open_dataset(class_sorted, fields=("index", "label"))]
    starts = np.cumsum([0] + [shard.num_samples for shard in manifest.shards])
    assert [shard.num_classes for shard in manifest.shards] == [len(set(labels[a:b])) for a, b in zip(starts, starts[1:])]
    assert manifest.class_mixing() == (1, pytest.approx(4.4, abs=0.1)) and manifest.class_sorted()
    ds = open_indexed(class_sorted)
    for quiet in ({"mode": "eval"}, {"shuffle": False}):  # stored order asked for: nothing to say
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            streaming(ds, **quiet)
            readers.make_loader(ds, 4)  # map-style mixes over shard windows
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # as Python shows them: once per line that makes such a loader
        for _ in range(2):
            streaming(ds)
    assert len(caught) == 1 and caught[0].filename == __file__  # the line that made the loader
    assert str(caught[0].message) == (
        f"{class_sorted}: its shards hold 1 classes each where a shuffled pack's would hold 4, so streamed batches "
        f"hold few classes (a worse model, with no error); pack it again, shuffled: pack lmdb {class_sorted} NEW_OUT")
    code, output = run("info", class_sorted)
    assert code == 0 and (f"mixing       shards hold 1 classes (median), a shuffled pack's 4: class-sorted: "
                          f"streamed batches hold few classes; `pack lmdb {class_sorted} NEW_OUT` packs it shuffled") in output
