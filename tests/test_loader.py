"""make_loader: equal ranks, exact coverage, deterministic windowed shuffle, mid-epoch resume.

Every packed-data test runs for each format in the writer registry (the shared `packed` fixture:
19 samples in 5 shards of 4, the last one short), read back through whichever reader class the
manifest names, so new formats are covered when they register.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Callable

import ddp_ranks
import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from imagefolders import make_image_folder

import readers
import readers.prefetch
import readers.stores
from packer.run.pipeline import pack
from packer.plan.options import PackOptions
from packer.write.writers import WRITERS
from readers.loader import RESULT_PIPE_BYTES
from readers.read_order import epoch_order, shard_order, split_for_rank

def open_indexed(out: Path) -> readers.PackedDataset:
    dataset = readers.open_dataset(out, decode="bytes", fields=("index",))
    assert type(dataset) is readers.DATASETS[dataset.manifest.format]
    return dataset


def flat(loader: readers.PackedLoader) -> list[list[int]]:
    return [batch[0].tolist() for batch in loader]


# The order and the split, without data ------------------------------------------------------


@pytest.mark.parametrize("window", [1, 2, 3, None])
def test_epoch_order_is_a_permutation_mixed_within_shard_windows(window: int | None) -> None:
    sizes = [3, 5, 1, 4, 7, 2, 6]
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    order = epoch_order(sizes, seed=3, epoch=0, shuffle_window=window)
    assert sorted(order.tolist()) == list(range(sum(sizes)))
    shard_of = np.searchsorted(offsets, order, side="right") - 1
    step = len(sizes) if window is None else window
    # Where the k-th distinct shard first shows up, a window starts every `step` shards: all
    # samples before that point are the complete samples of exactly k shards.
    first_seen: dict[int, int] = {}
    for position, shard in enumerate(shard_of.tolist()):
        first_seen.setdefault(shard, position)
    starts = sorted(first_seen.values())
    for k in range(step, len(sizes), step):
        before = set(shard_of[: starts[k]].tolist())
        assert len(before) == k and starts[k] == sum(sizes[shard] for shard in before)
    if window == 1:
        assert list(first_seen) != sorted(first_seen)  # the shard order itself is shuffled


def test_epoch_order_depends_on_seed_and_epoch_only() -> None:
    sizes = [10] * 20
    first = epoch_order(sizes, seed=1, epoch=0, shuffle_window=4)
    assert np.array_equal(first, epoch_order(sizes, seed=1, epoch=0, shuffle_window=4))
    assert not np.array_equal(first, epoch_order(sizes, seed=1, epoch=1, shuffle_window=4))
    assert not np.array_equal(first, epoch_order(sizes, seed=2, epoch=0, shuffle_window=4))
    assert np.array_equal(epoch_order(sizes, seed=1, epoch=0, shuffle=False), np.arange(200))


def test_shard_order_is_the_shard_order_of_epoch_order() -> None:
    sizes = [3, 5, 1, 4, 7, 2, 6]
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    for seed, epoch in ((0, 0), (3, 1), (9, 4)):
        order = epoch_order(sizes, seed=seed, epoch=epoch, shuffle_window=1)
        visited = list(dict.fromkeys((np.searchsorted(offsets, order, side="right") - 1).tolist()))
        assert shard_order(len(sizes), seed=seed, epoch=epoch).tolist() == visited
    assert shard_order(4, seed=1, epoch=0, shuffle=False).tolist() == [0, 1, 2, 3]


def test_order_and_cpu_defaults_import_no_torch() -> None:
    code = "import sys, readers.read_order, readers.cpus; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("mode,drop_last", [("train", False), ("train", True), ("eval", False)])
def test_split_gives_every_rank_the_same_count(mode: str, drop_last: bool) -> None:
    for total in range(1, 24):
        order = np.random.default_rng(total).permutation(total)
        for world in range(1, 5):
            for batch in (1, 3):
                shares = [split_for_rank(order, rank=r, world_size=world, batch_size=batch,
                                         drop_last=drop_last, mode=mode) for r in range(world)]  # type: ignore[arg-type]
                assert len({len(share) for share, _ in shares}) == 1
                everything = np.concatenate([share for share, _ in shares]).tolist()
                if mode == "eval":
                    real = np.concatenate([share[:n] for share, n in shares]).tolist()
                    assert sorted(real) == list(range(total))
                elif drop_last:
                    assert len(everything) == len(set(everything))
                    assert len(shares[0][0]) % batch == 0
                    assert total - len(everything) < world * batch
                else:
                    assert set(everything) == set(range(total))
                    assert len(everything) - total < world


# Two DDP ranks with gloo -------------------------------------------------------------------


def test_two_gloo_ranks(packed: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    out, files = packed
    results_dir = tmp_path / "ranks"
    results_dir.mkdir()
    world = 2
    mp.spawn(ddp_ranks.run_rank, args=(world, str(tmp_path / "rendezvous"), str(out), str(results_dir)),
             nprocs=world, join=True)
    ranks = [json.loads((results_dir / f"rank{r}.json").read_text()) for r in range(world)]
    total = len(files)

    assert [r["rank"] for r in ranks] == [0, 1] and {r["world_size"] for r in ranks} == {world}
    assert {r["len"] for r in ranks} == {len(r["epochs"][0]) for r in ranks} == {len(r["epochs"][1]) for r in ranks}
    for epoch in (0, 1):
        per_rank = [[i for batch in r["epochs"][epoch] for i in batch] for r in ranks]
        assert len(per_rank[0]) == len(per_rank[1]) == -(-total // world)
        assert set(per_rank[0]) | set(per_rank[1]) == set(range(total))
    # Each rank read real bytes for real paths.
    read = [tuple(sample) for r in ranks for sample in r["samples"]]
    assert {path for path, _ in read} == set(files)
    for path, digest in read:
        assert hashlib.sha256(files[path]).hexdigest() == digest
    # Same order as a loader told its rank explicitly: it depends on (seed, epoch, world size).
    dataset = open_indexed(out)
    for r in ranks:
        for epoch in (0, 1):
            local = readers.make_loader(dataset, ddp_ranks.BATCH, seed=ddp_ranks.SEED, num_workers=0,
                                        rank=r["rank"], world_size=world)
            local.set_epoch(epoch)
            assert flat(local) == r["epochs"][epoch]
        assert r["epochs"][0] != r["epochs"][1]
        assert r["resumed"] == r["epochs"][1]
        assert r["state"]["batches"] == ddp_ranks.RESUME_AFTER and r["state"]["epoch"] == 1
    assert sorted(ranks[0]["eval_real"] + ranks[1]["eval_real"]) == list(range(total))
    assert sum(r["eval_padding"] for r in ranks) == -(-total // world) * world - total


# One process: workers, resume, eval, defaults --------------------------------------------


def test_order_and_resume_do_not_depend_on_workers(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, _ = packed
    dataset = open_indexed(out)

    def loader(workers: int) -> readers.PackedLoader:
        made = readers.make_loader(dataset, 2, seed=5, num_workers=workers, rank=1, world_size=2, shuffle_window=2)
        made.set_epoch(3)
        return made

    serial = flat(loader(0))
    assert flat(loader(2)) == serial
    for workers_before, workers_after in ((2, 0), (0, 2)):
        first = loader(workers_before)
        head = []
        for batch in first:
            head.append(batch[0].tolist())
            if len(head) == 3:
                break
        state = first.state_dict()
        resumed = loader(workers_after)
        resumed.load_state_dict(state)
        assert head + flat(resumed) == serial
        # The next pass over the same epoch starts from the beginning again.
        assert flat(resumed) == serial


@pytest.mark.parametrize("streaming", [False, True])
def test_two_passes_at_once_over_persistent_workers_fail_instead_of_sharing_batches(
        streaming: bool, packed_as: Callable) -> None:
    """DataLoader's persistent workers serve one pass: a second one restarts them, and the first,
    taking batches on, took half of the second's (silently, each pass lost half the epoch)."""
    make = functools.partial(readers.make_loader, open_indexed(packed_as("wds")[0]), 3, seed=2, num_workers=2,
                             streaming=streaming)
    loader = make()
    whole = flat(loader)
    with pytest.raises(RuntimeError, match="another pass over this loader began while this one was under way"):
        list(zip(loader, loader))
    first = iter(loader)
    next(first)
    assert flat(loader) == whole  # the newer pass is whole
    with pytest.raises(RuntimeError, match="another pass"):
        next(first)  # was: StopIteration, the rest of its epoch silently gone
    done = iter(loader)
    assert len(list(done)) == len(whole) and flat(loader) == whole


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_pass_taken_on_after_a_newer_one_began_fails_without_persistent_workers(
        streaming: bool, workers: int, packed_as: Callable) -> None:
    """The loader's position (state_dict) follows one pass. A peek (`next(iter(loader))`) in the
    middle of an epoch restarted it; the first pass went on, and its position said 11 after 20
    batches (a resume repeated 9). As with persistent workers, the older pass now refuses to go on;
    a pass broken out of, then a new one, still reads whole epochs."""
    loader = readers.make_loader(open_indexed(packed_as("wds")[0]), 2, seed=2, num_workers=workers,
                                 persistent_workers=False if workers else None, streaming=streaming)
    whole = flat(loader)
    first = iter(loader)
    head = [next(first)[0].tolist() for _ in range(4)]
    assert head == whole[:4] and loader.state_dict()["batches"] == 4
    assert next(iter(loader))[0].tolist() == whole[0] and loader.state_dict()["batches"] == 1
    with pytest.raises(RuntimeError, match="another pass over this loader began while this one was under way"):
        next(first)
    assert loader.state_dict()["batches"] == 1
    for number, _ in enumerate(loader, start=1):
        if number == 3:
            break
    assert flat(loader) == whole
    loader.set_epoch(1)
    assert sorted(i for batch in flat(loader) for i in batch) == list(range(19))


def test_a_timeout_without_workers_reads(packed_as: Callable) -> None:
    """`timeout` is how long to wait for a worker's batch; with none (num_workers=0, the default
    on a machine of one CPU) DataLoader failed at iteration on an assert."""
    dataset = open_indexed(packed_as("wds")[0])
    for streaming in (False, True):
        loader = readers.make_loader(dataset, 4, num_workers=0, timeout=30, streaming=streaming)
        assert sorted(i for batch in flat(loader) for i in batch) == list(range(len(dataset)))
    with pytest.raises(ValueError, match="timeout must be >= 0, not -1"):
        readers.make_loader(dataset, 4, num_workers=0, timeout=-1)


@pytest.mark.parametrize("streaming", [False, True])
def test_the_dataloader_itself_gives_tensors_and_bytes(streaming: bool, packed_as: Callable) -> None:
    """`loader.dataloader` (for a trainer that wants a DataLoader) yields what the loader yields:
    workers' `Scalars` and shared-memory `RingColumn`s are settled as batches leave it."""
    dataset = readers.open_dataset(packed_as("wds")[0], decode="bytes", fields=("index", "image", "label"))
    loader = readers.make_loader(dataset, 3, seed=1, num_workers=2, streaming=streaming)
    through_loader = [(b[0].tolist(), b[1], b[2].tolist()) for b in loader]
    batches = list(loader.dataloader)
    for batch in batches:
        assert [type(column) for column in batch] == [torch.Tensor, list, torch.Tensor]
        assert all(type(image) is bytes for image in batch[1])
    assert [(b[0].tolist(), b[1], b[2].tolist()) for b in batches] == through_loader


class _RecordFrozen:
    """A worker_init_fn that writes how many objects the worker started with frozen out of gc's reach."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __call__(self, worker_id: int) -> None:
        import gc
        (self.folder / f"worker-{worker_id}").write_text(str(gc.get_freeze_count()))


@pytest.mark.parametrize("streaming", [False, True])
def test_forked_workers_start_with_the_parents_objects_out_of_gcs_reach(
        streaming: bool, packed_as: Callable, tmp_path: Path) -> None:
    """A forked worker inherits every object of the parent (torch's ~170k): its first full
    collection walked them all, 75-90 ms and a copy of every page it touched, while the first
    batch waited. The loader freezes them for the fork; the parent's own collector is as before."""
    import gc
    dataset = readers.open_dataset(packed_as("wds")[0], decode="bytes", fields=("index", "image"))
    loader = readers.make_loader(dataset, 3, shuffle=False, num_workers=2, streaming=streaming,
                                 multiprocessing_context="fork", worker_init_fn=_RecordFrozen(tmp_path))
    assert sorted(i for batch in flat(loader) for i in batch) == list(range(len(dataset)))
    frozen = [int((tmp_path / f"worker-{worker}").read_text()) for worker in range(2)]
    assert min(frozen) > 10_000, frozen
    assert gc.get_freeze_count() == 0


def test_samples_are_the_packed_bytes(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, files = packed
    dataset = readers.open_dataset(out, decode="bytes", fields=("image", "label", "path"))
    seen = {}
    for images, labels, paths in readers.make_loader(dataset, 4, num_workers=2, drop_last=False):
        assert isinstance(labels, torch.Tensor)
        seen.update(zip(paths, images))
    assert seen == files


def test_drop_last_drops_what_does_not_fill_a_batch_on_every_rank(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, files = packed
    dataset = open_indexed(out)
    shares = [flat(readers.make_loader(dataset, 4, drop_last=True, num_workers=0, rank=r, world_size=2))
              for r in range(2)]
    assert [len(share) for share in shares] == [len(files) // 8] * 2
    everything = [i for share in shares for batch in share for i in batch]
    assert all(len(batch) == 4 for share in shares for batch in share)
    assert len(set(everything)) == len(everything) == len(files) // 8 * 8


def test_eval_mode_marks_padding_and_covers_each_sample_once(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, files = packed
    dataset = open_indexed(out)
    world = 3
    real = []
    lengths = set()
    padding = 0
    for rank in range(world):
        loader = readers.make_loader(dataset, 4, mode="eval", num_workers=0, rank=rank, world_size=world)
        assert np.array_equal(np.sort(loader.indices()[: 7 - loader.num_padding]), loader.indices()[: 7 - loader.num_padding])
        lengths.add(len(loader))
        padding += loader.num_padding
        for (index,), mask in loader:
            assert mask.dtype == torch.bool and mask.shape == index.shape
            real += index[mask].tolist()
    assert len(lengths) == 1
    assert sorted(real) == list(range(len(files)))
    assert padding == 7 * world - len(files)


def test_state_dict_round_trip_rules(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, _ = packed
    dataset = open_indexed(out)
    loader = readers.make_loader(dataset, 2, seed=1, num_workers=0)
    loader.set_epoch(2)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    assert state["epoch"] == 2 and state["batches"] == 1 and state["seed"] == 1 and state["world_size"] == 1
    fresh = readers.make_loader(dataset, 2, seed=1, num_workers=0)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    fresh.set_epoch(3)  # moving to another epoch drops the saved position
    assert fresh.state_dict()["batches"] == 0 and len(flat(fresh)) == len(fresh)
    with pytest.raises(ValueError, match="seed 1 \\(now 2\\)"):
        readers.make_loader(dataset, 2, seed=2, num_workers=0).load_state_dict(state)
    with pytest.raises(ValueError, match="world_size"):
        readers.make_loader(dataset, 2, seed=1, num_workers=0, rank=0, world_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match="outside"):
        readers.make_loader(dataset, 2, seed=1, num_workers=0).load_state_dict({**state, "batches": 99})
    finished = readers.make_loader(dataset, 2, seed=1, num_workers=0)
    finished.load_state_dict({**state, "batches": len(finished)})
    assert flat(finished) == []


@pytest.fixture(scope="module")
def packed_twice(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One image folder packed as WebDataset in shards of 4 and in shards of 6: the same 15
    samples, other shards."""
    root = tmp_path_factory.mktemp("packed-twice")
    make_image_folder(root / "src", classes=3, per_class=4)
    for size in (4, 6):
        pack(root / "src", root / f"by{size}", PackOptions(format="wds", shard_size=size))
    return root / "by4", root / "by6"


def test_a_state_names_the_dataset_and_the_reading_it_was_taken_on(packed_twice: tuple[Path, Path]) -> None:
    """A state saved on a dataset loaded into the same samples packed with another shard size
    (300 samples read, 240 distinct), and a streaming state into a map-style loader with
    shuffle_window=None (219 of 300): both were taken, neither can resume exactly. A state now
    names its datasets (their manifest's identity) and whether it streamed."""
    by4, by6 = (open_indexed(path) for path in packed_twice)
    assert len(by4) == len(by6) == 15 and by4.manifest.identity != by6.manifest.identity
    loader = readers.make_loader(by4, 2, seed=1, num_workers=0)
    next(iter(loader))
    state = loader.state_dict()
    assert state["datasets"] == [by4.manifest.identity] and state["streaming"] is False
    assert state["version"] == 2
    assert state["datasets"] == [open_indexed(packed_twice[0]).manifest.identity]  # the same dataset opened again
    with pytest.raises(ValueError, match=r"^loader state was saved with a different setup, cannot resume exactly: "
                                         r"the dataset [0-9a-f]{12} \(now [0-9a-f]{12}: another dataset"):
        readers.make_loader(by6, 2, seed=1, num_workers=0).load_state_dict(state)
    streamed = readers.make_loader(by4, 2, seed=1, num_workers=0, streaming=True)
    next(iter(streamed))
    with pytest.raises(ValueError, match=r"streaming True \(now False\)"):
        readers.make_loader(by4, 2, seed=1, num_workers=0, shuffle_window=None).load_state_dict(streamed.state_dict())
    with pytest.raises(ValueError, match=r"streaming False \(now True\)"):
        readers.make_loader(by4, 2, seed=1, num_workers=0, streaming=True).load_state_dict(state)


def test_a_state_saved_before_states_named_their_dataset_loads_with_a_warning(packed_twice: tuple[Path, Path]) -> None:
    """Version 1 states name no dataset: they load where they did, with a warning; whether one
    streamed is told by its keys, and a streamed drop_last epoch (whose order changed since) is refused."""
    by4 = open_indexed(packed_twice[0])

    def old(state: dict) -> dict:
        return {key: value for key, value in state.items() if key not in ("datasets", "streaming")} | {"version": 1}

    loader = readers.make_loader(by4, 2, seed=1, num_workers=0)
    loader.set_epoch(1)
    next(iter(loader))
    fresh = readers.make_loader(by4, 2, seed=1, num_workers=0)
    with pytest.warns(UserWarning, match="names no dataset"):
        fresh.load_state_dict(old(loader.state_dict()))
    assert fresh.state_dict() == loader.state_dict()
    streamed = readers.make_loader(by4, 2, seed=1, num_workers=0, streaming=True)
    next(iter(streamed))
    with pytest.raises(ValueError, match=r"streaming True \(now False\)"):
        readers.make_loader(by4, 2, seed=1, num_workers=0, shuffle_window=None).load_state_dict(
            old(streamed.state_dict()))
    dropping = readers.make_loader(by4, 2, seed=1, num_workers=0, streaming=True, drop_last=True)
    next(iter(dropping))
    with pytest.raises(ValueError, match="drop_last"):
        readers.make_loader(by4, 2, seed=1, num_workers=0, streaming=True, drop_last=True).load_state_dict(
            old(dropping.state_dict()))
    with pytest.raises(ValueError, match=r"loader state version 3 is newer than this loader's \(2\)"):
        fresh.load_state_dict({**loader.state_dict(), "version": 3})


def test_one_dataset_and_a_mix_are_both_a_dataset_the_loaders_read(packed: tuple[Path, dict[str, bytes]]) -> None:
    """`readers.Dataset` is what make_loader, the streaming loader and bench need of a dataset:
    every format's and a mix of them qualify, with the same shard sizes the loaders split."""
    dataset = open_indexed(packed[0])
    both = readers.mix([dataset, open_indexed(packed[0])])
    assert isinstance(dataset, readers.Dataset) and isinstance(both, readers.Dataset)
    assert not isinstance(list(range(4)), readers.Dataset)
    assert [shard.num_samples for shard in both.shards] == 2 * [shard.num_samples for shard in dataset.shards]
    assert len(readers.make_loader(both, 2, num_workers=0)) == len(both) // 2

def test_bad_arguments(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, _ = packed
    dataset = open_indexed(out)
    with pytest.raises(TypeError, match="open_dataset"):
        readers.make_loader(list(range(4)), 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="both rank and world_size"):
        readers.make_loader(dataset, 2, rank=0)
    with pytest.raises(ValueError, match="rank must be in"):
        readers.make_loader(dataset, 2, rank=2, world_size=2)
    with pytest.raises(ValueError, match="mode"):
        readers.make_loader(dataset, 2, mode="test")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shuffle_window"):
        readers.make_loader(dataset, 2, shuffle_window=0)
    with pytest.warns(UserWarning, match="fill no batch") as said:
        readers.make_loader(dataset, 64, drop_last=True, num_workers=0)
    assert said[0].filename == __file__  # the caller's line, past the wrapper that takes old argument names


def test_warns_when_shards_are_fewer_than_ranks_times_streaming_workers(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, _ = packed
    dataset = open_indexed(out)
    with pytest.warns(UserWarning, match="5 shards for 3 ranks x 2 workers: streaming workers share") as said:
        readers.make_loader(dataset, 2, num_workers=2, rank=0, world_size=3, streaming=True)
    assert said[0].filename == __file__
    with warnings.catch_warnings():  # map-style reads samples, not shards; eval needs no mixing
        warnings.simplefilter("error")
        readers.make_loader(dataset, 2, num_workers=2, rank=0, world_size=3)
        readers.make_loader(dataset, 2, num_workers=2, rank=0, world_size=3, streaming=True, mode="eval")


def test_pil_images_without_a_transform_are_refused_at_make_loader(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, _ = packed
    with pytest.raises(ValueError, match='^PIL images \\(decode="pil", the default\\) cannot be stacked into a '
                                         'batch: open the dataset with decode="tensor"'):
        readers.make_loader(readers.open_dataset(out), 2)
    loader = readers.make_loader(readers.open_dataset(out, transform=lambda image: torch.zeros(3, 2, 2)), 2,
                                 num_workers=0)
    assert next(iter(loader))[0].shape == (2, 3, 2, 2)


def test_images_of_two_sizes_in_a_batch_name_the_sizes_and_the_fix(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, _ = packed
    loader = readers.make_loader(readers.open_dataset(out, decode="tensor"), 19, num_workers=0, shuffle=False)
    with pytest.raises(ValueError, match=r"images of shapes \(3, \d+, \d+\) and \(3, \d+, \d+\) in one batch "
                                         r"cannot be stacked: resize them to one size in transform="):
        next(iter(loader))


def probe_worker(batch: list[tuple[int]]) -> tuple[int, str, int]:
    return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS", ""), int(torch.initial_seed())


def test_workers_get_one_thread_and_seeds_from_seed_and_rank(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, _ = packed
    dataset = open_indexed(out)

    def probes(seed: int, rank: int) -> list[tuple[int, str, int]]:
        loader = readers.make_loader(dataset, 2, seed=seed, num_workers=2, rank=rank, world_size=2,
                                     collate_fn=probe_worker, persistent_workers=False)
        return list(loader)

    first = probes(0, 0)
    assert {(threads, omp) for threads, omp, _ in first} == {(1, "1")}
    assert len({seed for _, _, seed in first}) == 2  # one seed per worker
    assert probes(0, 0) == first
    assert {s for *_, s in probes(0, 1)}.isdisjoint({s for *_, s in first})


def test_defaults(monkeypatch: pytest.MonkeyPatch, packed: tuple[Path, dict[str, bytes]]) -> None:
    out, _ = packed
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert readers.default_num_workers() == 16
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert readers.default_num_workers() == 7
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
    assert readers.default_num_workers() == 0
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert readers.default_num_workers() == 3
    loader = readers.make_loader(open_indexed(out), 2)
    assert loader.num_workers == 3
    assert loader.dataloader.persistent_workers and loader.dataloader.pin_memory == torch.cuda.is_available()


def test_cuda_prefetcher_without_cuda_passes_batches_through(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, _ = packed
    dataset = open_indexed(out)
    loader = readers.make_loader(dataset, 3, num_workers=0)
    device = "cpu" if torch.cuda.is_available() else "cuda"
    prefetcher = readers.CudaPrefetcher(loader, device)
    assert not prefetcher.enabled and len(prefetcher) == len(loader)
    expected = flat(loader)
    got = []
    for number, batch in enumerate(prefetcher, start=1):
        got.append(batch[0].tolist())
        if number == 2:
            assert prefetcher.state_dict()["batches"] == 2
    assert got == expected


@pytest.mark.skipif(not hasattr(fcntl, "F_GETPIPE_SZ"), reason="pipe sizes are Linux's")
@pytest.mark.parametrize("streaming", [False, True])
def test_batches_leave_the_workers_through_a_widened_pipe(packed: tuple[Path, dict[str, bytes]],
                                                          streaming: bool) -> None:
    loader = readers.make_loader(readers.open_dataset(packed[0], decode="bytes"), 4, num_workers=1,
                                 streaming=streaming)
    assert sum(len(batch[0]) for batch in loader) == len(loader.indices())
    pipe = loader.dataloader._iterator._worker_result_queue._reader  # torch's, as widen_result_pipe finds it
    assert fcntl.fcntl(pipe.fileno(), fcntl.F_GETPIPE_SZ) >= RESULT_PIPE_BYTES


class _FakeStream:
    """What CudaPrefetcher asks of a CUDA stream, for running its fetch-ahead path on the CPU."""

    def wait_stream(self, stream: object) -> None:
        pass


def test_cuda_prefetcher_counts_no_batch_ahead_after_a_pass_stopped_early(
        monkeypatch: pytest.MonkeyPatch, packed: tuple[Path, dict[str, bytes]]) -> None:
    """The prefetcher fetches one batch ahead; a pass stopped early leaves that batch unhanded.
    A new epoch, or a loaded state, starts from the loader's position, with nothing ahead."""
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: _FakeStream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: _FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(readers.prefetch, "_record_stream", lambda data, stream: None)
    loader = readers.make_loader(open_indexed(packed[0]), 2, num_workers=0)
    prefetcher = readers.CudaPrefetcher(loader, "cpu")
    prefetcher.enabled = True  # the fetch-ahead path, copying to the CPU
    for number, _ in enumerate(prefetcher, start=1):
        if number == 3:
            break
    assert prefetcher.state_dict()["batches"] == 3  # the loader handed out 4
    prefetcher.set_epoch(1)
    assert prefetcher.state_dict()["batches"] == 0
    state = prefetcher.state_dict()
    state["batches"] = 7
    prefetcher.load_state_dict(state)
    assert prefetcher.state_dict()["batches"] == 7
    resumed = [batch[0].tolist() for batch in prefetcher]
    assert resumed == flat(loader)[7:] and prefetcher.state_dict()["batches"] == len(loader)


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_a_dataset_packed_again_in_place_stops_its_loader_with_one_line(
        fmt: str, streaming: bool, image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    """`pack --overwrite` under a running loader: its workers opened the new shards with the old
    manifest (map-style mixed old and new samples, streaming gave every label of a renamed class
    folder another class's name). Every sample handed out is the old dataset's, then one error."""
    src, files = image_folder
    out = tmp_path / "out"
    options = PackOptions(format=fmt, shard_size=4, order="sorted")
    pack(src, out, options)
    dataset = readers.open_dataset(out, decode="bytes", fields=("image", "label", "path"))
    classes = list(dataset.classes)
    loader = readers.make_loader(dataset, 2, shuffle=False, num_workers=1, persistent_workers=True,
                                 streaming=streaming, shuffle_buffer=2, interleave=1, prefetch_shards=1)
    batches = iter(loader)
    seen = [next(batches)]
    (src / "class_00").rename(src / "class_000")  # another dataset: each label one class further
    pack(src, out, options, overwrite=True)
    with pytest.raises(readers.DatasetError, match=r"shard-0000\d\d\.\w+: changed since the loader opened "
                                                   r"index.json \((size \d+ -> \d+|same size, rewritten|removed)\); "
                                                   r"re-open the dataset"):
        seen += list(batches)
    handed = [(bytes(image), classes[int(label)], path) for images, labels, paths in seen
              for image, label, path in zip(images, labels, paths)]
    assert handed and all(image == files[path] and path.startswith(name + "/") for image, name, path in handed)


def test_a_shard_replaced_by_a_file_of_its_size_is_no_sample_to_skip(packed_as: Callable, tmp_path: Path) -> None:
    """The identity is the file's, not its size: a copy put in place (same bytes even) stops the
    reads of a dataset opened before, and on_error="skip" does not step over it to other shards."""
    out = tmp_path / "out"
    shutil.copytree(packed_as("lmdb")[0], out)
    dataset = readers.open_dataset(out, decode="bytes", on_error="skip")
    dataset[0]
    name = dataset.shards[1].name
    shutil.copy(out / name, tmp_path / name)
    os.replace(tmp_path / name, out / name)
    dataset[1]  # shard 0, opened before: still the file it opened
    with pytest.raises(readers.DatasetChanged, match=rf"{name}: changed since the loader opened index.json "
                                                     r"\(same size, rewritten\); re-open the dataset"):
        dataset[4]
    assert dataset.skipped == 0
    assert len(readers.open_dataset(out, decode="bytes")[4]) == 2  # opened again: read


def test_index_json_replaced_while_a_dataset_is_opened_is_refused(packed_as: Callable, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The shards' identities are noted after index.json is read: a dataset packed again in between
    would pair the old manifest with the new files."""
    out = tmp_path / "out"
    shutil.copytree(packed_as("wds")[0], out)
    read = readers.stores.load_manifest

    def read_then_replace(root: Path) -> readers.Manifest:
        manifest = read(root)
        shutil.copy(out / "index.json", tmp_path / "index.json")
        os.replace(tmp_path / "index.json", out / "index.json")
        return manifest

    monkeypatch.setattr(readers.stores, "load_manifest", read_then_replace)
    with pytest.raises(readers.DatasetChanged, match=f"{out / 'index.json'}: replaced while the dataset was opened; "
                                                     "open it again"):
        readers.open_dataset(out)
