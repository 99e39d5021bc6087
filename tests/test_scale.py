"""What keeps listing and planning millions of files small and fast: the walk lists in sorted order
without a global sort, paths live in a compact PathList, shard bounds are found per shard, and
listing.jsonl lines are made without a json.dumps per row. Each must give what the simple way gives."""

from __future__ import annotations

import json
import os
import random
import tracemalloc
from array import array
from pathlib import Path

import numpy as np
import pytest

import packer.plan.pack_order as order_module
from packer.plan.pack_order import arrange, full_permutation, splitmix64
from packer.plan.options import PackOptions
from packer.plan.plan import listing_lines, shard_bounds, write_plan
from packer.sources.inputs import resolve_source
from packer.sources.listing import Listing, PathList, extended
from packer.sources.walk import walk

ODD_NAME = os.fsdecode(b"bad-\xff\xfe.jpg")


def make_tree(root: Path, names: list[str]) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * (len(name) % 7))


# "/" sorts after "-", "." and " " but before "0": a directory's files must come after a sibling
# file or folder named "a-b" or "a.jpg", and before "a0.jpg".
TRICKY = ["a.jpg", "a/b.jpg", "a/c.jpg", "a/c/d.jpg", "a/c-d.jpg", "a/c d/e.png", "a-b/x.jpg", "a0.jpg",
          "a 1.jpg", "b.JPEG", "Z.jpg", "é/x.jpg", "e/x.jpg", "a/c/e/f.jpg", f"a/{ODD_NAME}"]


def test_flat_walk_lists_in_sorted_path_order(tmp_path: Path) -> None:
    make_tree(tmp_path, TRICKY + ["a/notes.txt", "a/.hidden.jpg"])
    listing = walk(tmp_path, folders_are_classes=False)
    assert list(listing.paths) == sorted(TRICKY)
    assert list(listing.sizes) == [len(path) % 7 for path in sorted(TRICKY)]
    assert (listing.ignored_other, listing.ignored_hidden) == (1, 1)


def test_class_walk_sorts_paths_not_class_names(tmp_path: Path) -> None:
    nested = [name for name in TRICKY if "/" in name]
    make_tree(tmp_path, nested + ["top.jpg"])
    listing = walk(tmp_path)
    assert listing.classes == sorted({name.split("/")[0] for name in nested})  # "a" before "a-b"
    assert list(listing.paths) == sorted(nested)  # but "a-b/x.jpg" before "a/b.jpg"
    assert [listing.classes[label] for label in listing.labels] == [path.split("/")[0] for path in listing.paths]
    assert (listing.ignored_other, listing.unclassed, listing.unclassed_names) == (0, 1, ["top.jpg"])  # in no class


def test_companions_are_not_counted_as_ignored(tmp_path: Path) -> None:
    make_tree(tmp_path, ["c/a.jpg", "c/a.txt", "c/b.jpg", "c/b.json", "c/readme"])
    listing = walk(tmp_path, companions=frozenset({".txt"}))
    assert list(listing.paths) == ["c/a.jpg", "c/b.jpg"] and listing.ignored_other == 2


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PathList, "BLOCK", 3)


@pytest.mark.usefixtures("small_blocks")
def test_path_list_behaves_like_a_list() -> None:
    names = [f"d{k % 4}/{'é' if k % 5 == 0 else ''}f{k}.jpg" for k in range(17)] + [ODD_NAME]
    paths = PathList(names[:2])
    paths.append(names[2])
    paths.extend(iter(names[3:11]))
    paths.extend(names[11:])
    assert len(paths) == len(names) and list(paths) == names and paths == names and names == paths
    assert [paths[k] for k in range(len(names))] == names
    assert [paths[k] for k in reversed(range(len(names)))] == names[::-1]  # random access, not only in order
    assert paths[-1] == ODD_NAME and os.fsencode(paths[-1]) == b"bad-\xff\xfe.jpg"
    for start in range(len(names) + 1):
        for stop in range(start, len(names) + 2):
            assert paths[start:stop] == names[start:stop]
    assert paths[:5] == names[:5] and paths[::2] == names[::2] and paths[-4:] == names[-4:]
    assert names[7] in paths and "nope.jpg" not in paths
    assert paths != names[:-1] and paths != [*names[:-1], "other.jpg"]
    with pytest.raises(IndexError):
        paths[len(names)]


@pytest.mark.usefixtures("small_blocks")
def test_listing_keep_keeps_compact_paths() -> None:
    names = [f"c/{k:02d}.jpg" for k in range(10)]
    listing = Listing(root="/x", classes=["c"], paths=PathList(names), labels=array("q", range(10)),
                      sizes=array("q", range(100, 110)))
    listing.keep([1, 2, 6, 9])
    assert isinstance(listing.paths, PathList)
    assert listing.paths == [names[k] for k in (1, 2, 6, 9)]
    assert list(listing.labels) == [1, 2, 6, 9] and list(listing.sizes) == [101, 102, 106, 109]


def reference_bounds(sizes: list[int], shard_size: int, shard_bytes: int) -> list[int]:
    """The rule, one file at a time: a new shard starts when either limit would be passed."""
    bounds, count, total = [0], 0, 0
    for index, size in enumerate(sizes):
        if count and (count >= shard_size or total + size > shard_bytes):
            bounds.append(index)
            count = total = 0
        count += 1
        total += size
    return bounds + [len(sizes)] if count else bounds


def test_shard_bounds_follow_the_per_file_rule() -> None:
    rng = random.Random(5)
    for _ in range(2000):
        sizes = [rng.choice([0, 1, 7, 50, rng.randrange(300)]) for _ in range(rng.randrange(40))]
        shard_size, shard_bytes = rng.randrange(1, 9), rng.randrange(1, 200)
        assert shard_bounds(array("q", sizes), shard_size, shard_bytes) == reference_bounds(sizes, shard_size,
                                                                                           shard_bytes)


@pytest.mark.parametrize("odd", ["plain.jpg", 'quote".jpg', "back\\slash.jpg", "é.jpg", "tab\t.jpg", ODD_NAME])
def test_listing_lines_are_json_dumps(odd: str) -> None:
    paths = ["a/x.jpg", f"a/{odd}", "b/y.jpg"]
    listing = Listing(root="/x", classes=["a", "b"], paths=PathList(paths), labels=array("q", [0, 0, 1]),
                      sizes=array("q", [10, 0, 1 << 40]))
    expected = [json.dumps([path, label, size]) + "\n" for path, label, size in zip(paths, [0, 0, 1], [10, 0, 1 << 40])]
    assert list(listing_lines(listing, 0, 3)) == expected
    assert list(listing_lines(listing, 1, 2)) == expected[1:2]
    listing.values = [{"t": "x"}, {}, {"t": 'q"'}]
    assert list(listing_lines(listing, 0, 3)) == [json.dumps([p, lab, s, v]) + "\n" for p, lab, s, v in
                                                  zip(paths, [0, 0, 1], [10, 0, 1 << 40], listing.values)]


@pytest.fixture
def parallel_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hand every class folder after the first to the process pool, as a large SRC would."""
    import packer.sources.walk as walk_module

    monkeypatch.setattr(walk_module, "PARALLEL_ABOVE_SECONDS", -1.0)
    monkeypatch.setattr(walk_module, "available_cpus", lambda: 2)


def class_tree(root: Path) -> None:
    make_tree(root, [f"c{k}/{name}" for k in range(6) for name in ("b.jpg", "a/x.png", "a.jpg", "n.txt", ".h.jpg")])
    os.mkfifo(root / "c3" / "pipe.jpg")


@pytest.mark.usefixtures("parallel_walk")
def test_parallel_walk_lists_what_the_walk_lists(tmp_path: Path) -> None:
    class_tree(tmp_path / "src")
    listing = walk(tmp_path / "src")
    assert list(listing.paths) == sorted(f"c{k}/{name}" for k in range(6) for name in ("b.jpg", "a/x.png", "a.jpg"))
    assert [listing.classes[label] for label in listing.labels] == [path[:2] for path in listing.paths]
    assert list(listing.sizes) == [len(path) % 7 for path in listing.paths]
    assert (listing.ignored_hidden, listing.ignored_other) == (6, 6)
    assert listing.rejects == [("c3/pipe.jpg", "not a regular file")]


@pytest.mark.usefixtures("parallel_walk")
def test_parallel_walk_visits_an_aliased_directory_once(tmp_path: Path) -> None:
    """c4/alias is c1/a: the walk in order keeps c1/a's files and skips the alias, pool or not."""
    class_tree(tmp_path / "src")
    (tmp_path / "src" / "c4" / "alias").symlink_to(tmp_path / "src" / "c1" / "a", target_is_directory=True)
    (tmp_path / "src" / "c5" / "up").symlink_to(tmp_path / "src", target_is_directory=True)
    listing = walk(tmp_path / "src")
    assert list(listing.paths) == sorted(f"c{k}/{name}" for k in range(6) for name in ("b.jpg", "a/x.png", "a.jpg"))


FARM_NAMES = [f"n{k // 1000:08d}/img_{k:08d}.JPEG" for k in range(20_000)]  # bench_scale.py's link farm


def test_sorted_paths_keep_only_what_their_block_does_not_share() -> None:
    """28 bytes a path as plain NUL-ended bytes (280 MB at ten million); front-coded, ~11."""
    paths = PathList(FARM_NAMES)
    assert paths == FARM_NAMES and paths[12_345] == FARM_NAMES[12_345] and paths[256] == FARM_NAMES[256]
    assert (len(paths._data) + len(paths._shared)) / len(paths) < 12
    long_name = "d/" + "x" * 400 + ".jpg"  # shares more than one byte can say: the rest is its own
    assert PathList([long_name, long_name[:-4] + "y.jpg", "é/" + long_name]) == [long_name, long_name[:-4] + "y.jpg",
                                                                               "é/" + long_name]


@pytest.mark.usefixtures("small_blocks")
def test_taken_paths_are_a_view_of_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PathList, "VIEW_BLOCKS", 2)  # a view decodes 6 paths at a time
    names = [f"d{k % 3}/{'é' if k % 4 == 0 else ''}f{k}.jpg" for k in range(20)] + [ODD_NAME]
    paths = PathList(names)
    picked = [20, 3, 3, 0, 19, 7, 1, 2, 11, 5, 6, 18, 4]
    taken = paths.take(picked)
    expected = [names[k] for k in picked]
    assert taken == expected and len(taken._data) == 0 and taken._positions.dtype == np.int32
    assert [taken[k] for k in reversed(range(len(picked)))] == expected[::-1]
    assert all(taken[start:stop] == expected[start:stop] for start in range(14) for stop in range(start, 15))
    again = taken.take([5, 0, 1])  # positions of the original, not a view of a view
    assert again == [names[7], names[20], names[3]] and again._source is paths
    again.append("z.jpg")  # a view that grows holds its own paths
    assert again == [names[7], names[20], names[3], "z.jpg"] and again._source is None


def test_walk_keeps_labels_and_sizes_in_the_narrowest_type(tmp_path: Path) -> None:
    make_tree(tmp_path, [f"c{k}/{name}" for k in range(3) for name in ("a.jpg", "b.jpg")])
    listing = walk(tmp_path)
    assert (listing.labels.typecode, listing.sizes.typecode) == ("b", "b")
    assert list(listing.labels) == [0, 0, 1, 1, 2, 2] and list(listing.sizes) == [1, 1, 1, 1, 1, 1]
    with open(tmp_path / "c1" / "big.jpg", "wb") as handle:  # sparse: 5 GiB that take no disk
        handle.truncate(5 << 30)
    listing = walk(tmp_path)
    assert listing.sizes.typecode == "q" and list(listing.sizes) == [1, 1, 1, 1, 5 << 30, 1, 1]


def test_extended_widens_only_when_a_value_does_not_fit() -> None:
    table = array("b", [1, -2])
    assert extended(table, [3]) is table and list(table) == [1, -2, 3]
    wide = extended(table, [4, 300, 5])  # the list's first value went in before 300 overflowed: taken out again
    assert wide.typecode == "h" and list(wide) == [1, -2, 3, 4, 300, 5]
    assert extended(wide, array("q", [7])) is wide and list(wide) == [1, -2, 3, 4, 300, 5, 7]
    assert list(extended(wide, array("q", [-(1 << 40)]))) == [1, -2, 3, 4, 300, 5, 7, -(1 << 40)]


def test_a_shuffled_listing_is_todays_order_in_a_fraction_of_the_memory() -> None:
    """The permutation is argsort of the SplitMix64 keys (FORMAT.md), found holding 8 bytes a file
    at the peak; the paths are taken as a view. Before: a second buffer of paths, an index of
    their ends, the keys and argsort's int64 result, ~60 bytes a file."""
    count = 400_000
    names = [f"n{k // 1300:08d}/img_{k:08d}.JPEG" for k in range(count)]
    listing = Listing(root="/x", classes=[], paths=PathList(names), labels=array("h", [k // 1300 for k in range(count)]),
                      sizes=array("h", [k % 1000 for k in range(count)]))
    tracemalloc.start()
    arrange(listing, "shuffled", 3)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    expected = np.argsort(splitmix64(3, 0, count))
    assert listing.paths[:1000] == [names[k] for k in expected[:1000]] and listing.paths == [names[k] for k in expected]
    assert list(listing.labels) == [k // 1300 for k in expected] and list(listing.sizes) == [k % 1000 for k in expected]
    assert peak < 10 * count + (4 << 20)  # 4 MB: the keys' chunks, numpy's sort


@pytest.mark.parametrize("count", [0, 1, 2, 5000])
def test_the_packed_sort_breaks_ties_of_top_bits_by_the_whole_key(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """Keys whose top bits collide often (the real ones do a few dozen times at ten million) still
    give argsort's order."""
    def colliding(seed: int, steps: np.ndarray) -> np.ndarray:
        return ((steps % np.uint64(7)) << np.uint64(61)) | (np.uint64(8191) - steps)  # top bits: 7 values

    monkeypatch.setattr(order_module, "splitmix64_at", colliding)
    assert full_permutation(0, count).tolist() == np.argsort(splitmix64(0, 0, count), kind="stable").tolist()
    assert len(set(splitmix64(0, 0, count).tolist())) == count  # distinct, as SplitMix64's are


def test_writing_a_shuffled_plan_holds_4_bytes_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """listing.jsonl is written from the view a shard at a time; the paths' ends are found a MiB
    of the buffer at a time (16 MiB at once held ~30 bytes a file more at ten million)."""
    count = 400_000
    names = [f"n{k // 1300:08d}/img_{k:08d}.JPEG" for k in range(count)]
    listing = Listing(root=str(tmp_path), classes=["c"], paths=PathList(names), labels=array("b", [0]) * count,
                      sizes=array("h", [k % 1000 for k in range(count)]))
    arrange(listing, "shuffled", 0)
    monkeypatch.setattr(order_module, "arrange", lambda *args: None)  # arranged already: trace the writing alone
    tracemalloc.start()
    plan = write_plan(tmp_path / "out", listing, PackOptions(format="wds", order="shuffled"),
                      source=resolve_source(tmp_path))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    expected = np.argsort(splitmix64(0, 0, count))
    lines = (tmp_path / "out" / ".pack" / "listing.jsonl").read_text().splitlines()
    assert lines[:3] + lines[-1:] == [json.dumps([names[k], 0, int(k) % 1000]) for k in [*expected[:3], expected[-1]]]
    assert plan.num_listed == len(lines) == count
    assert peak < 5 * count + (3 << 20)  # 3 MB: a MiB of the buffer searched, a shard of lines
