"""Sample order (issue 28): a seeded shuffle by default, the same on every run, task count and
resume; `--order sorted` packs the listing as it is. The rule docs/FORMAT.md states ("Sample
order") is checked here against a plain-Python reading of it."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from clirun import run
from imagefolders import image_bytes, make_caption_folder
from recordfiles import example, recordio_payload, write_recordio, write_tfrecord
from test_inputs import write_tars

import packer
import readers
from packer.plan import pack_order as order
from packer.errors import PackError
from packer.plan.partition import Partition
from packer.run.pipeline import merge, pack
from packer.plan.options import PackOptions
from packer.plan.scan import scan

MASK = 2**64 - 1


def x(seed: int, k: int) -> int:
    """FORMAT.md's SplitMix64 output x(k)."""
    z = (seed + k * 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def documented_full_order(count: int, seed: int) -> list[int]:
    return sorted(range(count), key=lambda j: x(seed, j + 1))


def documented_windowed_order(inputs: list[int], lengths: list[int], seed: int) -> list[int]:
    """FORMAT.md's steps 1-4 for container inputs, one sample at a time."""
    runs: list[list[int]] = []
    run_of: list[int] = []
    run_bytes = min(order.RUN_BYTES, -(-sum(lengths) // order.WINDOW_RUNS))
    for j, (input, length) in enumerate(zip(inputs, lengths)):
        if j == 0 or input != inputs[j - 1]:
            before, span = 0, None
        if before // run_bytes != span:
            span = before // run_bytes
            runs.append([])
        runs[-1].append(j)
        run_of.append(len(runs) - 1)
        before += length
    by_key = sorted(range(len(runs)), key=lambda r: x(seed, r + 1))
    packed: list[int] = []
    for first in range(0, len(runs), order.WINDOW_RUNS):
        window = by_key[first:first + order.WINDOW_RUNS]
        slots = sorted((j for r in window for j in runs[r]), key=lambda j: x(seed, len(runs) + j + 1))
        queues = {r: iter(runs[r]) for r in window}
        packed += [next(queues[run_of[j]]) for j in slots]
    return packed


@pytest.mark.parametrize("seed", [0, 7, 2**64 - 1])
def test_the_documented_rule_is_the_packers(seed: int) -> None:
    assert order.splitmix64(seed, 0, 3).tolist() == [x(seed, 1), x(seed, 2), x(seed, 3)]
    assert order.splitmix64(seed, 5, 2).tolist() == [x(seed, 6), x(seed, 7)]
    assert order.windowed_permutation(np.zeros(0, np.int64), np.zeros(0, np.int64), seed).tolist() == []
    rng = random.Random(seed % 1000)
    for top in (4 << 20, 4 << 10):  # > 64 runs of 16 MiB: several windows; a small source: smaller runs
        inputs = [input for input in range(12) for _ in range(rng.randint(1, 60))]
        lengths = [rng.randint(1, top) for _ in inputs]
        expected = documented_windowed_order(inputs, lengths, seed)
        assert order.windowed_permutation(np.array(inputs), np.array(lengths), seed).tolist() == expected
        assert sorted(expected) == list(range(len(inputs)))


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(out.glob("shard-*"))}


def manifest(out: Path) -> dict:
    return json.loads((out / "index.json").read_text())


def read_paths(out: Path) -> list[str]:
    return [path for (path,) in readers.open_dataset(out, fields=("path",))]


def test_shuffled_packs_are_the_same_bytes_on_every_run_and_task_count(image_folder: tuple[Path, dict[str, bytes]],
                                                                      tmp_path: Path) -> None:
    """(kill -9 and resume: tests/test_resume.py, whose reference run is shuffled too.)"""
    root, files = image_folder
    options = PackOptions(format="wds", shard_size=3)
    pack(root, tmp_path / "one", options)
    pack(root, tmp_path / "again", options)
    assert shard_bytes(tmp_path / "again") == shard_bytes(tmp_path / "one")
    for tasks in (2, 3):
        out = tmp_path / f"tasks-{tasks}"
        for task in reversed(range(tasks)):
            pack(root, out, options, partition=Partition(task, tasks))
        merge(out)
        assert shard_bytes(out) == shard_bytes(tmp_path / "one")
        assert manifest(out) == manifest(tmp_path / "one")
    paths = read_paths(tmp_path / "one")
    assert sorted(paths) == sorted(files) and paths != list(scan(root).paths)
    options = manifest(tmp_path / "one")["options"]
    assert (options["order"], options["seed"]) == ("shuffled", 0)


def test_order_sorted_packs_the_listing_as_it_is_and_seeds_differ(image_folder: tuple[Path, dict[str, bytes]],
                                                                  tmp_path: Path) -> None:
    root, _ = image_folder
    listed = list(scan(root).paths)
    pack(root, tmp_path / "sorted", PackOptions(format="lmdb", shard_size=4, order="sorted"))
    assert read_paths(tmp_path / "sorted") == listed == sorted(listed)
    orders = {}
    for seed in (0, 1):
        pack(root, tmp_path / f"seed-{seed}", PackOptions(format="lmdb", shard_size=4, seed=seed))
        orders[seed] = read_paths(tmp_path / f"seed-{seed}")
        assert orders[seed] == [listed[j] for j in documented_full_order(len(listed), seed)]
    assert orders[0] != orders[1]
    index = json.loads((tmp_path / "sorted" / "index.json").read_text())
    assert (index["options"]["order"], index["options"]["seed"]) == ("sorted", 0)


def test_every_sample_once_with_its_own_label_path_and_fields(tmp_path: Path) -> None:
    samples = make_caption_folder(tmp_path / "src", folders=3, per_folder=4)
    pack(tmp_path / "src", tmp_path / "out", PackOptions(format="hdf5", shard_size=5, sidecars=("txt", "json")))
    ds = readers.open_dataset(tmp_path / "out", decode="bytes", fields=("image", "label", "path", "txt", "json"))
    seen = {}
    for image, label, path, caption, meta in ds:
        seen[path] = (bytes(image), label, caption, meta)
    assert len(ds) == len(seen) == len(samples)
    assert seen == {path: (data, int(path[:5]), caption, meta) for path, (data, caption, meta) in samples.items()}
    assert read_paths(tmp_path / "out") != sorted(samples)


def test_a_shuffled_class_sorted_folder_mixes_classes_in_every_shard(tmp_path: Path) -> None:
    rng = random.Random(1)
    for label in range(5):
        for number in range(10):
            path = tmp_path / "src" / f"class_{label}" / f"{number:02d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(image_bytes(rng, size=(8, 8)))
    classes_per_shard = {}
    for mode in ("shuffled", "sorted"):
        out = tmp_path / mode
        pack(tmp_path / "src", out, PackOptions(format="wds", shard_size=10, order=mode))
        labels = [label for (label,) in readers.open_dataset(out, fields=("label",))]
        classes_per_shard[mode] = [len(set(labels[first:first + 10])) for first in range(0, len(labels), 10)]
    assert classes_per_shard["sorted"] == [1] * 5
    assert len(classes_per_shard["shuffled"]) == 5 and min(classes_per_shard["shuffled"]) >= 3, classes_per_shard


def test_container_inputs_are_shuffled_in_windows_of_runs_each_read_front_to_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of about two samples, interleaved three at a time: every shard's reads are a few
    byte ranges, each front to back; every sample still comes back once, with its own members."""
    samples = write_tars(tmp_path / "shards", shards=4, per_shard=6)
    sample_bytes = (tmp_path / "shards" / "data-000000.tar").stat().st_size // 6
    monkeypatch.setattr(order, "RUN_BYTES", 2 * sample_bytes)
    monkeypatch.setattr(order, "WINDOW_RUNS", 3)
    out = tmp_path / "out"
    pack(tmp_path / "shards", out, PackOptions(format="wds", shard_size=5))
    rows = [json.loads(line) for line in (out / ".pack" / "listing.jsonl").read_text().splitlines()]
    listing = scan(tmp_path / "shards", PackOptions(format="wds"))
    locations = np.frombuffer(listing.locations, dtype=np.int64).reshape(-1, 3)
    expected = documented_windowed_order(locations[:, 0].tolist(), locations[:, 2].tolist(), 0)
    assert [row[4] for row in rows] == [locations[j].tolist() for j in expected]
    runs = order.run_numbers(locations[:, 0], locations[:, 2])
    run_of = {tuple(location): run for location, run in zip(locations.tolist(), runs.tolist())}
    assert max(runs) + 1 >= 3 * 3  # several windows of several runs
    packed_runs = [run_of[tuple(row[4])] for row in rows]
    for run in set(packed_runs):  # each run is read front to back
        offsets = [row[4][1] for row in rows if run_of[tuple(row[4])] == run]
        assert offsets == sorted(offsets)
    assert packed_runs != sorted(packed_runs)
    sizes, position = Counter(packed_runs), 0
    while position < len(packed_runs):  # windows: consecutive samples of three whole runs each
        window: list[int] = []
        for run in packed_runs[position:]:
            window += [run] if run not in window else []
            if len(window) == 3:
                break
        length = sum(sizes[run] for run in window)
        assert set(packed_runs[position:position + length]) == set(window)
        position += length
    back = readers.open_dataset(out, decode="bytes", fields=("image", "label", "txt", "json"))
    by_caption = {caption: (bytes(image), label, meta) for image, label, caption, meta in back}
    assert by_caption == {sample["txt"]: (sample["jpg"], sample["cls"], sample["json"]) for sample in samples}


def records(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [image_bytes(rng, size=(8, 8)) for _ in range(count)]


def make_sources(root: Path) -> dict[str, tuple[str, dict]]:
    """One small SRC of every CLI input kind: name -> (SRC, extra options)."""
    folder = root / "images"
    captions = make_caption_folder(folder, folders=2, per_folder=5)
    (root / "list.txt").write_text("".join(path + "\n" for path in captions))
    (root / "meta.jsonl").write_text("".join(json.dumps({"file_name": path, "label": n % 2}) + "\n"
                                             for n, path in enumerate(captions)))
    write_tars(root / "tars", shards=2, per_shard=5)
    write_recordio(root / "train.rec", [recordio_payload(image, label=n % 3) for n, image in enumerate(records(10, 1))])
    write_tfrecord(root / "train.tfrecord", [example({"image/encoded": image, "image/class/label": n % 3})
                                             for n, image in enumerate(records(10, 2))])
    pack(folder, root / "packed", PackOptions(format="lmdb", order="sorted"))
    return {"folder": (str(folder), {}), "files-from": (str(folder), {"files_from": str(root / "list.txt")}),
            "metadata": (str(folder), {"metadata": str(root / "meta.jsonl")}), "tar": (str(root / "tars"), {}),
            "recordio": (str(root / "train.rec"), {}), "tfrecord": (str(root / "train.tfrecord"), {}),
            "packed": (str(root / "packed"), {})}


def test_every_input_kind_is_shuffled_by_default(tmp_path: Path) -> None:
    for kind, (src, extra) in make_sources(tmp_path).items():
        listed = {}
        for mode in ("sorted", "shuffled"):
            out = tmp_path / f"{kind}-{mode}"
            ensure = packer.run.pipeline.ensure_plan(src, out, PackOptions(format="lmdb", order=mode, **extra))
            listed[mode] = (out / ".pack" / "listing.jsonl").read_text().splitlines()
            assert ensure.num_listed == 10, kind
        assert listed["shuffled"] != listed["sorted"] and sorted(listed["shuffled"]) == sorted(listed["sorted"]), kind


def test_pack_samples_shuffles_its_inputs_keeping_each_inputs_samples_together(tmp_path: Path) -> None:
    from samplefns import frames

    packer.pack_samples(frames, list(range(1, 7)), tmp_path / "out", format="wds", shard_size=4, workers=1)
    ds = readers.open_dataset(tmp_path / "out", decode="numpy", fields=("label", "frame"))
    got = [(int(label), frame.tolist()) for label, frame in ds]
    inputs = [label for label, _ in got]
    assert Counter(inputs) == {item: item for item in range(1, 7)}
    assert sorted(got) == [(item, [item, frame]) for item in range(1, 7) for frame in range(item)]
    grouped = [item for n, item in enumerate(inputs) if n == 0 or item != inputs[n - 1]]
    assert len(grouped) == 6 and grouped != sorted(grouped)
    assert all(got[n][1][1] < got[n + 1][1][1] for n in range(len(got) - 1) if got[n][0] == got[n + 1][0])


def test_order_and_seed_are_options_checked_like_any_other(image_folder: tuple[Path, dict[str, bytes]],
                                                           tmp_path: Path) -> None:
    root, _ = image_folder
    out = tmp_path / "out"
    assert run("plan", root, out, "--format", "lmdb", "--seed", "5")[0] == 0  # a run that stopped after planning
    code, output = run("lmdb", root, out, "-q")
    assert code == 1 and "holds an unfinished run of other options (--seed: 5 before, 0 now);" in output
    code, output = run("lmdb", root, out, "-q", "--seed", "5", "--order", "sorted")
    assert code == 1 and "holds an unfinished run" in output
    assert run("lmdb", root, out, "-q", "--seed", "5")[0] == 0
    assert json.loads((out / "index.json").read_text())["options"]["seed"] == 5
    assert run("lmdb", root, tmp_path / "x", "--seed", "-1")[0] == 2
    assert run("lmdb", root, tmp_path / "x", "--order", "random")[0] == 2
    with pytest.raises(PackError, match="--seed must be an integer from 0 to"):
        packer.pack(root, tmp_path / "y", "lmdb", seed=2**64)
    with pytest.raises(PackError, match="--order must be one of shuffled, sorted"):
        packer.pack(root, tmp_path / "y", "lmdb", order="random")


def test_a_plan_made_before_order_existed_resumes_in_its_sorted_order(image_folder: tuple[Path, dict[str, bytes]],
                                                                      tmp_path: Path) -> None:
    root, _ = image_folder
    out = tmp_path / "out"
    assert run("plan", root, out, "--format", "lmdb", "--order", "sorted")[0] == 0
    plan_file = out / ".pack" / "plan.json"
    plan = json.loads(plan_file.read_text())
    del plan["options"]["order"], plan["options"]["seed"]
    plan_file.write_text(json.dumps(plan))
    code, output = run("lmdb", root, out, "-q")
    assert code == 1 and "(--order: sorted before, shuffled now)" in output
    assert run("lmdb", root, out, "-q", "--order", "sorted")[0] == 0
    assert read_paths(out) == list(scan(root).paths)
