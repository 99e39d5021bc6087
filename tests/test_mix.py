"""readers.mix: several datasets in one loader, with a share of every epoch per source; map-style
and streaming, equal ranks, eval once, exact resume, labels that never collide silently."""

from __future__ import annotations

import collections
import multiprocessing
import random
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest
from imagefolders import image_bytes

import readers
from packer.run.pipeline import pack
from packer.plan.options import PackOptions
from readers.mixed import apportion, epoch_counts
from readers.read_order import MixOrders

FIELDS = ("index", "image", "label")
SIZES = [4, 4, 4, 4, 3]  # the shared packed dataset's shards (19 samples, classes class_00..class_02)


OPENED: list[readers.PackedDataset] = []


def opened(path: str | Path, **kwargs: Any) -> readers.PackedDataset:
    OPENED.append(readers.open_dataset(path, decode="bytes", fields=FIELDS, **kwargs))
    return OPENED[-1]


@pytest.fixture(autouse=True)
def close_opened() -> Iterator[None]:
    """Datasets read in this process hold shard handles (one LMDB environment per path and
    process, shared): each test closes its own, so a later test opens them afresh."""
    yield
    while OPENED:
        OPENED.pop().close()


@pytest.fixture(scope="module")
def other_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 images in classes `class_02` (also in the shared dataset) and `zebra` (not), as HDF5 in
    shards of 3."""
    src = tmp_path_factory.mktemp("other") / "src"
    rng = random.Random(7)
    for name in ("class_02", "zebra"):
        (src / name).mkdir(parents=True)
        for i in range(4):
            (src / name / f"{i}.jpg").write_bytes(image_bytes(rng))
    out = src.parent / "out"
    pack(src, out, PackOptions(format="hdf5", shard_size=3, order="sorted"))
    return out


@pytest.fixture
def two(packed_as: Callable) -> tuple[readers.PackedDataset, readers.PackedDataset]:
    """The shared dataset as LMDB and as WebDataset: one class list, formats mixed."""
    return opened(packed_as("lmdb")[0]), opened(packed_as("wds")[0])


def source_counts(loader: readers.PackedLoader) -> collections.Counter:
    return collections.Counter(s for batch in loader for s in batch[3].tolist())


def keys(loader: readers.PackedLoader) -> list[list[tuple[int, int]]]:
    """Each batch as (source, index in the source) pairs (the index field is the mix's)."""
    return [[loader.dataset.locate_source(index) for index in batch[0].tolist()] for batch in loader]


# Counts and orders, without data -----------------------------------------------------------


def test_epoch_counts_from_weights_repeat_choose_or_nothing() -> None:
    assert epoch_counts([100, 50], weights=[0.3, 0.7], epoch_size=1000) == [300, 700]
    assert epoch_counts([100, 50], weights=[1, 1]) == [75, 75]  # epoch_size: the sources together
    assert epoch_counts([100, 50]) == [100, 50]
    assert epoch_counts([100, 50], epoch_size=30) == [20, 10]  # in proportion to the sizes
    assert epoch_counts([100, 50], repeat=[0.5, 3]) == [50, 150]
    assert epoch_counts([100, 50], choose=[7, 0]) == [7, 0]
    assert sum(apportion(np.array([1.0, 1.0, 1.0]), 100)) == 100


def test_counts_given_as_numpy_arrays_are_numbers() -> None:
    assert epoch_counts([100, 50], choose=np.array([7, 0])) == [7, 0]
    assert epoch_counts([100, 50], weights=np.array([1, 1]), epoch_size=np.int64(30)) == [15, 15]
    assert epoch_counts([100, 50], weights=np.array([0.25, 0.75], dtype=np.float32), epoch_size=100) == [25, 75]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"weights": [1, -1]}, "weights must be non-negative numbers"),
    ({"weights": [0, 0]}, "weights are all zero"),
    ({"weights": [1]}, "weights has 1 values for 2 datasets"),
    ({"weights": [1, float("nan")]}, "non-negative numbers"),
    ({"weights": [1, 1], "epoch_size": 0}, "epoch_size must be an integer of at least 1, not 0"),
    ({"weights": [1, 1], "repeat": [1, 1]}, "pass one of weights, repeat and choose, not weights and repeat"),
    ({"repeat": [1, 1], "epoch_size": 10}, "epoch_size is the sum of the repeat counts"),
    ({"choose": [1.5, 1]}, "choose must be whole numbers"),
    ({"weights": 5}, "weights must be one number per dataset"),
])
def test_bad_counts_are_one_line_value_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as error:
        epoch_counts([10, 5], **kwargs)
    assert "\n" not in str(error.value)


def test_a_source_short_of_its_share_is_used_up_before_any_sample_repeats() -> None:
    orders = MixOrders([[4, 4, 2], [3, 3]], [4, 9])  # source 0: 10 samples, 4 an epoch; source 1: 6, 9 an epoch
    seen = []
    for epoch in range(5):
        order = orders.stream_order(seed=3, epoch=epoch, shuffle=True, mode="train")
        assert len(order) == 13 and orders.epoch_order(seed=3, epoch=epoch, shuffle=True, shuffle_window=2,
                                                       mode="train").tolist() != order.tolist()
        first = order[order < 10]
        assert len(first) == 4 and collections.Counter((order[order >= 10] - 10).tolist()).most_common(1)[0][1] <= 2
        seen += first.tolist()
    assert sorted(seen[:10]) == sorted(seen[10:20]) == list(range(10))  # without replacement, pass after pass
    assert orders.stream_order(seed=3, epoch=1, shuffle=True, mode="train").tolist() == \
        MixOrders([[4, 4, 2], [3, 3]], [4, 9]).stream_order(seed=3, epoch=1, shuffle=True, mode="train").tolist()
    everything = orders.epoch_order(seed=3, epoch=2, shuffle=True, shuffle_window=None, mode="eval")
    assert sorted(everything.tolist()) == list(range(16))  # eval: every sample once, counts ignored


def test_every_stretch_of_an_epoch_holds_the_sources_in_proportion() -> None:
    orders = MixOrders([[100] * 30, [100] * 30], [900, 2100])  # 30% / 70% in runs of up to 100
    order = orders.stream_order(seed=0, epoch=0, shuffle=True, mode="train")
    for part in np.array_split(order, 6):  # 500 samples: 150 of source 0, give or take a run
        assert abs(int((part < 3000).sum()) - 150) <= 100


# Loaders -----------------------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True])
def test_proportions_over_an_epoch_are_the_weights(streaming: bool, two: tuple) -> None:
    mixed = readers.mix(two, weights=[0.25, 0.75], epoch_size=40, fields=(*FIELDS, "source"))
    loader = readers.make_loader(mixed, 8, seed=1, num_workers=0, streaming=streaming)
    assert len(loader) == 5 and mixed.epoch_size == 40 and len(mixed) == 38
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        assert source_counts(loader) == {0: 10, 1: 30}
    # Per rank, a contiguous share of the epoch: the proportions within sampling error.
    many = readers.mix(two, weights=[0.3, 0.7], epoch_size=1000, fields=(*FIELDS, "source"))
    for rank in range(2):
        counts = source_counts(readers.make_loader(many, 50, seed=2, num_workers=0, streaming=streaming,
                                                   rank=rank, world_size=2))
        assert sum(counts.values()) == 500 and abs(counts[0] - 150) <= 4 * (500 * 0.3 * 0.7) ** 0.5


@pytest.mark.parametrize("streaming", [False, True])
def test_samples_are_their_sources_with_the_source_field(streaming: bool, two: tuple) -> None:
    mixed = readers.mix(two, repeat=[1, 2], fields=("index", "image", "source", "label", "source_index"),
                        names=["a", "b"])
    assert mixed.names == ["a", "b"] and mixed.epoch_size == 57 and mixed.classes == two[0].classes
    batches = list(readers.make_loader(mixed, 5, seed=0, num_workers=0, streaming=streaming))
    seen = collections.Counter()
    for batch in batches:
        for index, image, source, label, local in zip(batch[0].tolist(), batch[1], batch[2].tolist(),
                                                      batch[3].tolist(), batch[4].tolist()):
            assert (local, image, label) == two[source][local] and index == 19 * source + local
            seen[source, local] += 1
    assert {n for (source, _), n in seen.items() if source == 1} == {2} and len(seen) == 38
    assert mixed[20] == (20, two[1][1][1], 1, two[1][1][2], 1)  # ds[i]: source 1 starts at 19
    assert mixed.__getitems__([20, 0, -1]) == [mixed[20], mixed[0], mixed[37]]  # a batch, as DataLoader asks
    with pytest.raises(IndexError, match="sample index 38 out of range for 38 samples"):
        mixed.__getitems__([0, 38])


@pytest.mark.parametrize("streaming", [False, True])
def test_the_index_field_is_the_mixes_and_source_index_the_sources(streaming: bool, two: tuple) -> None:
    """`index` in a mix was the index inside its source: m[2] and m[21] both said 2, while
    loader.indices() counts the mix's samples; now it is the mix's, the source's is `source_index`."""
    mixed = readers.mix(two, fields=("source_index", *FIELDS))
    assert (mixed[2][:2], mixed[21][:2]) == ((2, 2), (2, 21))
    loader = readers.make_loader(mixed, 4, seed=1, num_workers=0, streaming=streaming)
    batches = list(loader)
    assert [i for batch in batches for i in batch[1].tolist()] == loader.indices().tolist()
    assert [mixed.locate_source(i)[1] for batch in batches for i in batch[1].tolist()] == \
        [i for batch in batches for i in batch[0].tolist()]


def test_ranks_get_equal_batches_and_eval_reads_every_sample_once(two: tuple) -> None:
    mixed = readers.mix(two, weights=[0.9, 0.1], epoch_size=50, fields=(*FIELDS, "source"))
    for streaming in (False, True):
        for mode, drop_last in (("train", False), ("train", True), ("eval", False)):
            loaders = [readers.make_loader(mixed, 4, rank=r, world_size=3, mode=mode, drop_last=drop_last,
                                           num_workers=0, streaming=streaming) for r in range(3)]
            items = [list(loader) for loader in loaders]
            assert len({len(loader) for loader in loaders}) == 1 and [len(i) for i in items] == [len(loaders[0])] * 3
            if mode == "eval":  # weights ignored: every sample of every source exactly once
                real = [mixed.locate_source(i) for rank in items for batch, mask in rank
                        for i in batch[0][mask].tolist()]
                assert sorted(real) == [(s, i) for s in (0, 1) for i in range(19)]
            else:
                total = sum(len(batch[0]) for rank in items for batch in rank)
                assert total == (48 if drop_last else 51)


@pytest.mark.parametrize(("streaming", "workers"), [(False, 0), (False, 2), (True, 0), (True, 2)])
def test_resume_mid_epoch_is_exact_across_sources(streaming: bool, workers: int, two: tuple) -> None:
    mixed = readers.mix(two, weights=[1, 2], epoch_size=30, fields=(*FIELDS, "source"))

    def loader() -> readers.PackedLoader:
        return readers.make_loader(mixed, 4, seed=9, num_workers=workers, streaming=streaming, shuffle_buffer=4)

    whole = loader()
    whole.set_epoch(1)
    expected = keys(whole)
    interrupted = loader()
    interrupted.set_epoch(1)
    head = []
    for batch in interrupted:
        head.append([mixed.locate_source(index) for index in batch[0].tolist()])
        if len(head) == 3:
            break
    state = interrupted.state_dict()
    assert state["sources"] == [[19, 10], [19, 20]] and state["num_samples"] == 30
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + keys(resumed) == expected
    other = readers.mix(two, weights=[2, 1], epoch_size=30, fields=(*FIELDS, "source"))
    with pytest.raises(ValueError, match=r"sources \[\[19, 20\], \[19, 10\]\] \(now \[\[19, 10\], \[19, 20\]\]\)"):
        readers.make_loader(mixed, 4, seed=9, num_workers=0, streaming=streaming).load_state_dict(
            readers.make_loader(other, 4, seed=9, num_workers=0, streaming=streaming).state_dict())


@pytest.mark.parametrize("streaming", [False, True])
def test_a_state_is_refused_by_the_sources_in_another_order_or_another_source(streaming: bool, two: tuple,
                                                                               packed_as: Callable) -> None:
    """A mix's state loaded into the same datasets in another order, or with one replaced by
    another of the same size (600 samples read, 440 distinct): the sizes and counts matched.
    The state now names each source (its manifest's identity), in order."""
    lmdb, wds = two
    hdf5 = opened(packed_as("hdf5")[0])

    def state_of(sources: list) -> dict:
        loader = readers.make_loader(readers.mix(sources, fields=(*FIELDS, "source")), 4, seed=9, num_workers=0,
                                     streaming=streaming)
        next(iter(loader))
        return loader.state_dict()

    state = state_of([lmdb, wds])
    assert state["datasets"] == [lmdb.manifest.identity, wds.manifest.identity]
    assert state_of([wds, lmdb])["sources"] == state["sources"]  # what was checked before: it matched
    for sources, message in (([wds, lmdb], r"the datasets in another order"),
                             ([lmdb, hdf5], r"datasets\[1\] [0-9a-f]{12} \(now [0-9a-f]{12}: another dataset")):
        loader = readers.make_loader(readers.mix(sources, fields=(*FIELDS, "source")), 4, seed=9, num_workers=0,
                                     streaming=streaming)
        with pytest.raises(ValueError, match=message):
            loader.load_state_dict(state)


def test_spawned_workers_read_a_mix(two: tuple) -> None:
    mixed = readers.mix(two, weights=[1, 1], fields=(*FIELDS, "source"))
    loader = readers.make_loader(mixed, 5, num_workers=1, streaming=True,
                                 multiprocessing_context=multiprocessing.get_context("spawn"))
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        assert [pair for batch in keys(loader) for pair in batch] == \
            [(int(i >= 19), int(i) - 19 * int(i >= 19)) for i in loader.indices().tolist()]


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "wds"])
def test_a_dataset_mixed_with_itself_opened_twice(fmt: str, packed_as: Callable) -> None:
    """Two datasets of one path in one process (say, two transforms): each closes its own shards
    (LMDB shares one environment per path and process) and the other reads on."""
    root = packed_as(fmt)[0]
    mixed = readers.mix([opened(root), opened(root)], fields=(*FIELDS, "source"))
    for streaming in (True, False):
        pairs = [pair for batch in keys(readers.make_loader(mixed, 4, num_workers=0, streaming=streaming))
                 for pair in batch]
        assert sorted(pairs) == [(s, i) for s in (0, 1) for i in range(19)]


# Labels ------------------------------------------------------------------------------------


def test_class_lists_that_differ_are_refused_merged_or_kept_per_source(packed_as: Callable, other_classes: Path) -> None:
    first, second = opened(packed_as("lmdb")[0]), opened(other_classes)
    assert first.classes == ["class_00", "class_01", "class_02"] and second.classes == ["class_02", "zebra"]
    with pytest.raises(ValueError, match="datasets\\[1\\] .* has other classes than datasets\\[0\\]") as error:
        readers.mix([first, second])
    assert "\n" not in str(error.value) and 'labels="merged"' in str(error.value)

    merged = readers.mix([first, second], labels="merged", fields=(*FIELDS, "source"))
    assert merged.classes == ["class_00", "class_01", "class_02", "zebra"]
    for batch in readers.make_loader(merged, 6, num_workers=0):
        for index, label, source in zip(batch[0].tolist(), batch[2].tolist(), batch[3].tolist()):
            original = [first, second][source]
            assert merged.classes[label] == original.classes[original[merged.locate_source(index)[1]][2]]

    per_source = readers.mix([first, second], labels="per_source", fields=(*FIELDS, "source"))
    assert per_source.source_classes == [first.classes, second.classes]
    with pytest.raises(ValueError, match="per_source"):
        per_source.classes
    assert [per_source[19 + i][2] for i in range(8)] == [second[i][2] for i in range(8)]


def test_bad_mixes_are_one_line_errors(two: tuple, packed_as: Callable) -> None:
    lmdb, wds = two
    cases: list[tuple[Callable[[], Any], str]] = [
        (lambda: readers.mix([lmdb, readers.open_dataset(packed_as("wds")[0], decode="tensor", fields=FIELDS)]),
         "datasets\\[1\\] was opened with decode='tensor', datasets\\[0\\] with 'bytes'"),
        (lambda: readers.mix([lmdb, readers.open_dataset(packed_as("wds")[0], decode="bytes", fields=("image", "label"))]),
         "was opened with fields="),
        (lambda: readers.mix([lmdb, wds], weights=[-1, 2]), "weights must be non-negative"),
        (lambda: readers.mix([lmdb, wds], weights=[0, 0]), "weights are all zero"),
        (lambda: readers.mix([lmdb, wds], weights=[1, 2, 3]), "weights has 3 values for 2 datasets"),
        (lambda: readers.mix([lmdb, wds], weights=[1, 1], epoch_size=0), "epoch_size must be"),
        (lambda: readers.mix([lmdb, wds], fields=("image", "index", "label", "source")), "must be the datasets' fields"),
        (lambda: readers.mix([lmdb, wds], fields=(*FIELDS, "source_index", "source_index")),
         "must be the datasets' fields"),
        (lambda: readers.mix([lmdb, wds], labels="union"), "labels must be one of"),
        (lambda: readers.mix([lmdb, wds], labels="per_source"), "add it to fields"),
        (lambda: readers.mix([lmdb, wds], names=["a"]), "names has 1 names for 2 datasets"),
        (lambda: readers.mix([lmdb, wds], names="ab"), "names must be one name per dataset, not the string 'ab'"),
        (lambda: readers.mix([]), "at least one dataset"),
    ]
    for make, message in cases:
        with pytest.raises(ValueError, match=message) as error:
            make()
        assert "\n" not in str(error.value)
    with pytest.raises(TypeError, match="datasets\\[1\\] is a str"):
        readers.mix([lmdb, "out.lmdb"])  # type: ignore[list-item]


# Remote sources ----------------------------------------------------------------------------


def test_a_local_and_an_http_source_stream_as_two_local_ones(two: tuple, packed_as: Callable,
                                                             serve: Callable[[str], str], tmp_path: Path) -> None:
    remote = opened(serve("wds"), cache_dir=tmp_path / "cache")
    capped = opened(serve("wds"), cache_dir=tmp_path / "capped", cache_limit=8 * remote.largest_lease())
    mixes = [readers.mix([two[0], source], weights=[1, 3], epoch_size=30, fields=(*FIELDS, "source"))
             for source in (two[1], remote, capped)]  # capped: images read before a shard is released
    batches = []
    for mixed in mixes:
        loader = readers.make_loader(mixed, 4, seed=3, num_workers=2, streaming=True)
        batches.append([(batch[0].tolist(), batch[1], batch[3].tolist()) for batch in loader])
    assert batches[0] == batches[1] == batches[2] and sum(len(b[0]) for b in batches[1]) == 30
    tight = opened(serve("wds"), cache_dir=tmp_path / "tight", cache_limit=3 * remote.largest_lease())
    with pytest.raises(ValueError, match="cache_limit .* is too small for streaming"):
        readers.make_loader(readers.mix([two[0], tight]), 4, num_workers=2, streaming=True, interleave=4)
    narrow = readers.make_loader(readers.mix([two[0], tight]), 4, num_workers=2, streaming=True)
    assert narrow.sampler.interleave == 2  # 2 workers x 1 + 1: the widest the tight cache holds

