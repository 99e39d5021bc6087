"""`pack FORMAT NEW_SRC OUT --append`: old files untouched, old indexes stable, new samples and
classes published last, crash-safe, on a folder and on a bucket, by one run or by tasks."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from clirun import run
from conftest import S3_BUCKET
from imagefolders import image_bytes, make_image_folder
from test_remote_pack import bucket_files, local_files, s3fs_of

import readers
from packer.api import merge as api_merge
from packer.api import pack as api_pack
from packer.api import pack_samples
from packer.errors import PackError
from packer.plan.options import PackOptions
from packer.run.pipeline import RunOptions, merge, pack_run
from packer.write.writers import WRITERS

PACK = [sys.executable, "-m", "packer.cli"]
PUBLISHED = {"index.json", "rejects.jsonl", "README.md", "_info.json", "wids.json"}
"""What an append replaces; every other file of OUT must keep its bytes."""


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """OLD: classes 00..02; NEW: classes 00..03 (class_03 new to OLD), other images."""
    root = tmp_path_factory.mktemp("append-src")
    make_image_folder(root / "old", classes=3, per_class=5, seed=1)
    make_image_folder(root / "new", classes=4, per_class=3, seed=2)
    return root / "old", root / "new"


def digests(out: Path) -> dict[str, str]:
    """sha256 of every file of OUT but the work folder."""
    return {path.relative_to(out).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(out.rglob("*")) if path.is_file() and ".pack" not in path.relative_to(out).parts}


def samples(out: Path | str, **options: Any) -> list[tuple[bytes, str, str]]:
    """(image bytes, class name, path) of every sample, in order."""
    dataset = readers.open_dataset(out, decode="bytes", fields=("image", "label", "path"), **options)
    try:
        return [(bytes(image), dataset.classes[label], path) for image, label, path in dataset]
    finally:
        dataset.close()


def expected(files: dict[str, bytes]) -> list[tuple[bytes, str, str]]:
    return sorted((data, path.split("/")[0], path) for path, data in files.items() if "/" in path)


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_append_keeps_old_bytes_and_publishes_new_samples(fmt: str, tmp_path: Path) -> None:
    old_files = make_image_folder(tmp_path / "old", classes=3, per_class=5, seed=1)
    new_files = make_image_folder(tmp_path / "new", classes=4, per_class=3, seed=2)
    out = tmp_path / "out"
    api_pack(tmp_path / "old", out, fmt, shard_size=4)
    before = digests(out)
    old_classes = readers.load_manifest(out).classes
    opened = readers.open_dataset(out, decode="bytes", fields=("image", "label", "path"))
    first_read = [(bytes(image), label, path) for image, label, path in opened]

    summary = api_pack(tmp_path / "new", out, fmt, shard_size=4, append=True)
    assert [(bytes(image), label, path) for image, label, path in opened] == first_read  # opened before: unharmed
    opened.close()  # (py-lmdb opens a path once per process)

    after = digests(out)
    assert {name: digest for name, digest in after.items() if name in before and name not in PUBLISHED} == \
        {name: digest for name, digest in before.items() if name not in PUBLISHED}
    manifest = readers.load_manifest(out)
    assert manifest.classes[:len(old_classes)] == old_classes and manifest.classes == old_classes + ["class_03"]
    assert summary.num_samples == len(expected(new_files)) and summary.dataset == (manifest.num_samples,
                                                                                    len(manifest.shards), 4)
    assert [part["first_shard"] for part in manifest.parts] == [0, 5]
    assert [shard.name.split(".")[0] for shard in manifest.shards] == [f"shard-{k:06d}" for k in range(9)]
    assert sorted(samples(out)) == sorted(expected(old_files) + expected(new_files))
    assert run("verify", out, "-q") == (0, f"{out}: OK, {manifest.num_samples} samples\n")


def test_rerun_after_success_is_a_no_op_and_merge_keeps_it(sources: tuple[Path, Path], tmp_path: Path) -> None:
    old, new = sources
    out = tmp_path / "out"
    assert run("wds", old, out, "--shard-size", "4", "-q")[0] == 0
    code, output = run("wds", new, out, "--shard-size", "4", "--append", "-q")
    assert code == 0 and output.startswith("appended 15 samples") and "now holds 33 samples in 9 shards, 4 classes" \
        in output, output
    published = digests(out)
    code, output = run("wds", new, out, "--shard-size", "4", "--append", "-q")
    assert code == 0 and "already appended, 15 samples in 4 shards" in output, output
    assert run("merge", out)[0] == 0 and digests(out) == published
    assert run("wds", old, out, "--shard-size", "4", "--append", "-q")[1].startswith(f"{out}: already appended")
    assert digests(out) == published and not (out / ".pack" / "parts" / "000009").exists()
    assert "part         shard 5 on: 15 samples in 4 shards from " in run("info", out)[1]
    code, output = run("info", out, "--json")
    assert code == 0 and [part["num_samples"] for part in json.loads(output)["parts"]] == [18, 15]
    wids = json.loads((out / "wids.json").read_text())
    assert [entry["nsamples"] for entry in wids["shardlist"]] == [4, 4, 4, 4, 2, 4, 4, 4, 3]


def test_classes_option_and_no_classes(tmp_path: Path) -> None:
    old_files = make_image_folder(tmp_path / "old", classes=3, per_class=5, seed=1)
    new_files = make_image_folder(tmp_path / "new", classes=4, per_class=3, seed=2)
    out = tmp_path / "out"
    api_pack(tmp_path / "old", out, "lmdb")
    class_list = tmp_path / "classes.txt"
    class_list.write_text("zebra\nclass_03\nclass_02\nclass_01\nclass_00\n")
    api_pack(tmp_path / "new", out, "lmdb", classes=class_list, append=True)
    manifest = readers.load_manifest(out)
    assert manifest.classes == ["class_00", "class_01", "class_02", "zebra", "class_03"]  # OUT's first, as they were
    both = expected(old_files) + expected(new_files)
    assert manifest.class_counts == [sum(1 for _, name, _ in both if name == wanted) for wanted in manifest.classes]
    assert sorted(samples(out)) == sorted(both)
    make_image_folder(tmp_path / "flat", classes=1, per_class=2, seed=5)
    api_pack(tmp_path / "flat", out, "lmdb", no_classes=True, append=True)
    grown = readers.load_manifest(out)
    assert (grown.classes, grown.class_counts) == (manifest.classes, manifest.class_counts)
    dataset = readers.open_dataset(out, fields=("label",))
    assert [label for (label,) in dataset].count(-1) == grown.num_samples - manifest.num_samples > 0
    dataset.close()


def wait_for(out: Path, process: subprocess.Popen, markers: int) -> None:
    """Until the append has written its plan and `markers` shard markers of its own."""
    deadline = time.monotonic() + 60
    done = out / ".pack" / "done"
    markers += len(os.listdir(done))  # OUT's
    while time.monotonic() < deadline and process.poll() is None:
        if list((out / ".pack" / "parts").glob("*/plan.json")) and len(os.listdir(done)) >= markers:
            return
        time.sleep(0.005)


@pytest.fixture(scope="module")
def appended_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, list[str]]:
    """A small OUT, a larger NEW_SRC, and OUT with NEW_SRC appended by an uninterrupted run."""
    root = tmp_path_factory.mktemp("killed")
    make_image_folder(root / "old", classes=2, per_class=10, seed=3)
    make_image_folder(root / "new", classes=4, per_class=60, seed=4)
    base = root / "base"
    subprocess.run([*PACK, "lmdb", str(root / "old"), str(base), "--shard-size", "10", "-q"], check=True)
    command = ["--shard-size", "10", "--append", "-q"]
    reference = root / "reference"
    subprocess.run(["cp", "-a", str(base), str(reference)], check=True)
    subprocess.run([*PACK, "lmdb", str(root / "new"), str(reference), *command], check=True)
    return root / "new", base, reference, command


@pytest.mark.parametrize("markers", [0, 3, 12])
def test_kill_9_during_append_then_rerun_gives_the_same_bytes(appended_reference: tuple[Path, Path, Path, list[str]],
                                                              tmp_path: Path, markers: int) -> None:
    new, base, reference, options = appended_reference
    out = tmp_path / "out"
    subprocess.run(["cp", "-a", str(base), str(out)], check=True)
    old = digests(out)
    command = [*PACK, "lmdb", str(new), str(out), *options, "--workers", "2"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(out, process, markers)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert (out / "index.json").read_bytes() == (base / "index.json").read_bytes()  # killed before publishing
    assert samples(out) == samples(base)  # the previous manifest is still whole and readable
    assert {name: digest for name, digest in digests(out).items() if name in old} == old
    rerun = subprocess.run(command, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert digests(out) == digests(reference)
    assert not (out / ".pack" / "tmp").exists() or not os.listdir(out / ".pack" / "tmp")


def appended_by_tasks(old: Path, new: Path, out: Path) -> None:
    """OLD packed into OUT, then NEW appended by two tasks: every shard packed, nothing published."""
    api_pack(old, out, "wds", shard_size=4)
    for task in (0, 1):
        assert not api_pack(new, out, "wds", shard_size=4, append=True, task_index=task, task_count=2).published
    assert readers.load_manifest(out).num_samples == 18


def test_killed_just_before_index_json_the_rerun_publishes(sources: tuple[Path, Path], tmp_path: Path) -> None:
    """The last window: every shard done, rejects.jsonl and the descriptors replaced, index.json not yet."""
    old, new = sources
    done, killed = tmp_path / "done", tmp_path / "killed"
    api_pack(old, done, "wds", shard_size=4)
    api_pack(new, done, "wds", shard_size=4, append=True)
    appended_by_tasks(old, new, killed)
    for name in PUBLISHED - {"index.json"}:
        (killed / name).write_bytes((done / name).read_bytes())
    assert readers.load_manifest(killed).num_samples == 18  # the old manifest still rules
    assert api_pack(new, killed, "wds", shard_size=4, append=True).resumed_shards == 4
    assert digests(killed) == digests(done)


def test_tasks_then_merge_equal_one_run(sources: tuple[Path, Path], tmp_path: Path) -> None:
    old, new = sources
    one, tasks = tmp_path / "one", tmp_path / "tasks"
    for out in (one, tasks):
        api_pack(old, out, "hdf5", shard_size=3)
    api_pack(new, one, "hdf5", shard_size=3, append=True)
    for task in (1, 0):
        code, output = run("hdf5", new, tasks, "--shard-size", 3, "--append", "--task-index", task,
                           "--task-count", 2, "-q")
        assert code == 0 and f"pack merge {tasks}" in output, output
        assert readers.load_manifest(tasks).num_samples == 18  # nothing published by a task
    code, output = run("merge", tasks)
    assert code == 0 and output.startswith("merged 11 shards, 33 samples"), output
    assert digests(tasks) == digests(one)


def test_an_append_of_classes_out_indexes_otherwise_resumes_and_merges(tmp_path: Path) -> None:
    """NEW's classes [a, c] index otherwise in OUT ([a, b] + c: c is 1 in NEW, 2 in OUT), so the
    part's plan holds NEW's labels re-indexed. A resume, and `pack merge` after tasks, compared
    SRC's listing as scanned, in NEW's own indexes, with the plan's, and stopped: "SRC changed
    since OUT's plan: its labels or fields differ"."""
    rng = random.Random(5)
    for name in ("old/a/1.jpg", "old/b/2.jpg", "new/a/3.jpg", "new/c/4.jpg", "new/c/5.jpg", "new/c/6.jpg"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(image_bytes(rng))
    old, new = tmp_path / "old", tmp_path / "new"
    one, resumed, merged = tmp_path / "one", tmp_path / "resumed", tmp_path / "merged"
    for out in (one, resumed, merged):
        api_pack(old, out, "wds", shard_size=1)
    api_pack(new, one, "wds", append=True)
    api_pack(new, resumed, "wds", append=True, task_index=0, task_count=2)
    assert api_pack(new, resumed, "wds", append=True).resumed_shards == 2
    for task in (0, 1):
        api_pack(new, merged, "wds", append=True, task_index=task, task_count=2)
    assert api_merge(merged).num_samples == 6
    assert digests(resumed) == digests(one) == digests(merged)
    assert sorted((name, path) for _, name, path in samples(one)) == [
        ("a", "a/1.jpg"), ("a", "a/3.jpg"), ("b", "b/2.jpg"), ("c", "c/4.jpg"), ("c", "c/5.jpg"), ("c", "c/6.jpg")]


def test_the_librarys_merge_knows_parts(sources: tuple[Path, Path], tmp_path: Path) -> None:
    """packer.run.pipeline.merge (which `pack merge` and api.merge call) publishes an append its tasks
    packed and keeps an appended dataset: never republished from the first pack's plan alone."""
    old, new = sources
    out = tmp_path / "out"
    appended_by_tasks(old, new, out)
    manifest = merge(out)
    assert (manifest.num_samples, len(manifest.shards), [part["first_shard"] for part in manifest.parts]) == \
        (33, 9, [0, 5])
    published = digests(out)
    assert merge(out).num_samples == 33 and digests(out) == published
    with pytest.raises(PackError, match="an append goes through packer.run.append.append_run"):  # never a silent pack
        pack_run(new, out, PackOptions(format="wds", shard_size=4), RunOptions(append=True))
    assert len(samples(out)) == 33 and run("verify", out, "-q")[0] == 0


@pytest.mark.parametrize("fmt", ["wds"])
def test_append_on_the_bucket_equals_a_local_append(fmt: str, sources: tuple[Path, Path], s3_options: dict,
                                                    tmp_path: Path) -> None:
    old, new = sources
    url = f"s3://{S3_BUCKET}/append-{fmt}"
    api_pack(old, tmp_path / "local", fmt, shard_size=4)
    api_pack(new, tmp_path / "local", fmt, shard_size=4, append=True)
    api_pack(old, url, fmt, shard_size=4, storage_options=s3_options)
    before = bucket_files(s3_options, f"append-{fmt}")
    opened = readers.open_dataset(url, decode="bytes", fields=("image", "label", "path"), storage_options=s3_options,
                                  cache_dir=tmp_path / "cache")
    api_pack(new, url, fmt, shard_size=4, append=True, storage_options=s3_options)
    after = bucket_files(s3_options, f"append-{fmt}")
    assert after == local_files(tmp_path / "local")
    assert {name: data for name, data in after.items() if name in before and name not in PUBLISHED} == \
        {name: data for name, data in before.items() if name not in PUBLISHED}
    assert len(list(opened)) == 18  # opened before the append: still reads the old manifest's samples
    opened.close()
    again = api_pack(new, url, fmt, shard_size=4, append=True, storage_options=s3_options)
    assert again.up_to_date and bucket_files(s3_options, f"append-{fmt}") == after
    assert not s3fs_of(s3_options).find(f"{S3_BUCKET}/append-{fmt}/.pack/tmp")


def test_tasks_then_merge_on_the_bucket(sources: tuple[Path, Path], s3_options: dict, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import fsspec

    monkeypatch.setitem(fsspec.config.conf, "s3", s3_options)
    old, new = sources
    url = f"s3://{S3_BUCKET}/append-tasks"
    api_pack(old, tmp_path / "local", "lmdb", shard_size=4)
    api_pack(new, tmp_path / "local", "lmdb", shard_size=4, append=True)
    api_pack(old, url, "lmdb", shard_size=4)
    for task in (0, 1):
        code, output = run("lmdb", new, url, "--shard-size", 4, "--append", "--task-index", task, "--task-count", 2,
                           "--staging", tmp_path / f"staging-{task}", "-q")
        assert code == 0, output
    code, output = run("merge", url)
    assert code == 0 and output.startswith("merged 9 shards, 33 samples"), output
    assert bucket_files(s3_options, "append-tasks") == local_files(tmp_path / "local")
    assert run("verify", url, "-q") == (0, f"{url}: OK, 33 samples\n")


def test_bad_cases_are_one_line_and_change_nothing(sources: tuple[Path, Path], tmp_path: Path) -> None:
    old, new = sources
    out = tmp_path / "out"
    assert run("lmdb", old, out, "--shard-size", "4", "-q")[0] == 0
    published = digests(out)
    cases = [
        (["wds", new, out, "--append"], "holds lmdb shards; append to it with `pack lmdb ... --append`"),
        (["lmdb", new, out, "--append", "--store", "raw"], "--store original in OUT, raw now"),
        (["lmdb", new, out, "--append", "--overwrite"], "--append adds to OUT and --overwrite replaces it"),
        (["lmdb", new, out, "--append", "--sidecars", "txt", "--sidecars-optional"],
         "its samples' fields (txt) are not OUT's (none)"),
        (["lmdb", new, tmp_path / "nothing", "--append"], "index.json: not found; --append adds to a packed dataset"),
        (["lmdb", new, old, "--append"], "index.json: not found; --append adds to a packed dataset"),
    ]
    for args, message in cases:
        code, output = run(*args)
        assert code == 1 and message in output and len(output.strip().splitlines()) == 1, (args, output)
        assert digests(out) == published
    assert not (tmp_path / "nothing").exists() and not (out / ".pack" / "parts").exists()
    index = out / "index.json"
    sound = index.read_text()
    index.write_text(sound.replace('"num_samples": 18', '"num_samples": 19', 1))
    code, output = run("lmdb", new, out, "--append")
    assert code == 1 and "num_samples: 19, but the shards hold 18; nothing was appended" in output, output
    index.write_text(sound)
    appended = tmp_path / "appended"
    api_pack(old, appended, "lmdb", shard_size=4)
    api_pack(new, appended, "lmdb", shard_size=4, append=True)
    (appended / "index.json").write_text("{")
    code, output = run("merge", appended)
    assert code == 1 and "OUT has appended parts (.pack/parts), so merge cannot rebuild it" in output, output
    code, output = run("lmdb", new, out, "--append", "--task-index", 0, "--task-count", 2, "-q")
    assert code == 0 and {name: digest for name, digest in digests(out).items() if name in published} == published
    code, output = run("lmdb", old, out, "--append")
    assert code == 1 and "an unfinished append of another SRC" in output and "parts/000005 to drop it" in output, output
    with pytest.raises(PackError, match="append is not supported"):
        pack_samples(len, [b""], tmp_path / "samples", "lmdb", append=True)


@pytest.mark.parametrize(("damage", "message"), [
    (lambda parts: parts[1].update(first_shard=10**12), "parts[1].first_shard: 1000000000000 is more than"),
    (lambda parts: parts[1].update(num_shards="4"), "parts[1].num_shards: a string where an integer"),
    (lambda parts: parts[1].update(extensions="jpg/../x"), "parts[1].extensions: a string where a list"),
    (lambda parts: parts[1].update(extensions=["jpg", "a b"]), "parts[1].extensions[1]: 'a b' is not an image"),
    (lambda parts: parts[1].update(first_shard=3), "parts[1].first_shard: 3 is inside an earlier part"),
    (lambda parts: parts[0].update(num_samples=17), "parts[0].num_samples: 17, but its shards (0 to 4) hold 18"),
    (lambda parts: parts.pop(), "shards[5].name: 'shard-000005.tar' is in no part"),
    (lambda parts: parts[0].update(options=[]), "parts[0].options: a list where an object"),
])
def test_a_damaged_parts_entry_is_one_line_and_nothing_is_appended(damage: Any, message: str,
                                                                   sources: tuple[Path, Path], tmp_path: Path) -> None:
    """index.json is untrusted: an append numbers its shards from `parts` and names descriptor columns
    after its extensions, so a damaged entry is refused by every command, before anything is written."""
    old, new = sources
    out = tmp_path / "out"
    assert run("wds", old, out, "--shard-size", "4", "-q")[0] == 0
    assert run("wds", new, out, "--shard-size", "4", "--append", "-q")[0] == 0
    index = out / "index.json"
    data = json.loads(index.read_text())
    damage(data["parts"])
    index.write_text(json.dumps(data))
    published = digests(out)
    for args in (["info", out], ["verify", out], ["wds", old, out, "--shard-size", "4", "--append"], ["merge", out]):
        code, output = run(*args)
        assert code == 1 and message in output and len(output.strip().splitlines()) == 1, (args, output)
    assert digests(out) == published
    with pytest.raises(readers.DatasetError, match=re.escape(message)):
        readers.load_manifest(out)


@pytest.mark.parametrize("first_shard", [0, 2, "5"])
def test_a_part_plan_whose_first_shard_is_not_its_folders_is_one_line(first_shard: Any, sources: tuple[Path, Path],
                                                                      tmp_path: Path) -> None:
    """An unfinished append's plan.json names its shards and finds its listing from first_shard: one
    that is not its folder's (0: the pack's listing, shard names of OUT's own shards) is refused."""
    old, new = sources
    out = tmp_path / "out"
    assert run("wds", old, out, "--shard-size", "4", "-q")[0] == 0
    assert run("wds", new, out, "--shard-size", "4", "--append", "--task-count", "2", "--task-index", "0",
               "-q")[0] == 0
    plan = out / ".pack" / "parts" / "000005" / "plan.json"
    plan.write_text(json.dumps({**json.loads(plan.read_text()), "first_shard": first_shard}))
    published = digests(out)
    for args in (["wds", new, out, "--shard-size", "4", "--append"], ["merge", out]):
        code, output = run(*args)
        assert code == 1 and f"plan.json: unreadable plan (first_shard {first_shard!r} where its folder says 5)" \
            in output and len(output.strip().splitlines()) == 1, (args, output)
    assert digests(out) == published


def test_appending_a_changed_src_again_warns_of_duplicates(sources: tuple[Path, Path], tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A folder appended once, then grown and appended again, is packed again whole: its earlier
    samples are then twice in OUT, which the user is told (a rerun of an unchanged SRC is a no-op)."""
    old, new = sources
    grown = tmp_path / "new"
    make_image_folder(grown, classes=2, per_class=2, seed=4)
    out = tmp_path / "out"
    api_pack(old, out, "wds", shard_size=4)
    api_pack(grown, out, "wds", shard_size=4, append=True)
    with caplog.at_level("WARNING", logger="packer.run.append"):
        assert api_pack(grown, out, "wds", shard_size=4, append=True).up_to_date
    assert "twice" not in caplog.text
    make_image_folder(tmp_path / "more", classes=1, per_class=1, seed=5)
    (tmp_path / "more" / "class_00" / "img 000.jpg").rename(grown / "class_00" / "img added.jpg")
    with caplog.at_level("WARNING", logger="packer.run.append"):
        api_pack(grown, out, "wds", shard_size=4, append=True)
    assert f"{grown} was packed into {out} before (the part from shard 5, 4 samples)" in caplog.text
    assert "those it held then are in" in caplog.text and "twice" in caplog.text
    assert readers.load_manifest(out).num_samples == 18 + 4 + 5


def test_append_to_a_copy_without_its_work_folder_keeps_the_old_image_columns(tmp_path: Path) -> None:
    """OUT copied without `.pack` (its markers): the old shards' image types come from the dataset
    card index.json lists, so the rewritten descriptors still describe every shard."""
    from PIL import Image
    (tmp_path / "pngs" / "a").mkdir(parents=True)
    for i in range(5):
        Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(tmp_path / "pngs" / "a" / f"p{i}.png")
    make_image_folder(tmp_path / "jpgs", classes=1, per_class=2, seed=3)
    out = tmp_path / "out"
    api_pack(tmp_path / "pngs", out, "wds", shard_size=4)
    assert '- name: "png"\n      dtype: "image"' in (out / "README.md").read_text()
    shutil.rmtree(out / ".pack")
    api_pack(tmp_path / "jpgs", out, "wds", shard_size=4, append=True)
    card = (out / "README.md").read_text()
    assert '- name: "png"\n      dtype: "image"' in card and '- name: "jpg"\n      dtype: "image"' in card
    assert readers.load_manifest(out).parts[0]["extensions"] == ["png"]


def test_labelled_samples_appended_to_an_unlabelled_pack_are_not_called_class_sorted(
        sources: tuple[Path, Path], tmp_path: Path) -> None:
    """A --no-classes pack's shards hold 0 classes; appended shuffled labelled shards mix their
    classes, so neither `pack info` nor the streaming loader's warning calls the dataset class-sorted."""
    old, new = sources
    out = tmp_path / "out"
    api_pack(old, out, "lmdb", shard_size=4, no_classes=True)
    api_pack(new, out, "lmdb", shard_size=4, append=True)
    manifest = readers.load_manifest(out)
    assert [shard.num_classes for shard in manifest.shards][:5] == [0] * 5
    assert not manifest.class_sorted()
    code, output = run("info", out)
    assert code == 0 and "class-sorted" not in output, output


def test_an_append_takes_outs_shard_size_and_store_options_unless_given(sources: tuple[Path, Path],
                                                                        tmp_path: Path) -> None:
    old, new = sources
    out = tmp_path / "out"
    assert run("lmdb", old, out, "--shard-size", 4, "--store", "jpeg", "--quality", 80, "--resize", 24, "-q")[0] == 0
    code, output = run("lmdb", new, out, "--append", "-q")  # no options: OUT's
    assert code == 0 and "appended 15 samples" in output and "in 4 shards" in output, output
    manifest = readers.load_manifest(out)
    assert [shard.num_samples for shard in manifest.shards][5:] == [4, 4, 4, 3]
    assert manifest.parts[1]["options"]["shard_size"] == 4
    assert {name: manifest.parts[1]["options"][name] for name in ("store", "quality", "resize")} == \
        {"store": "jpeg", "quality": 80, "resize": 24}
    dataset = readers.open_dataset(out)
    assert all(min(dataset[index][0].size) == 24 for index in range(len(dataset)))  # PIL images
    dataset.close()
    again = tmp_path / "again"
    assert run("lmdb", old, again, "--shard-size", 4, "-q")[0] == 0
    code, output = run("lmdb", new, again, "--append", "--shard-size", 6, "-q")  # given: a part's own shard size
    assert code == 0 and "in 3 shards" in output, output
    assert [shard.num_samples for shard in readers.load_manifest(again).shards][5:] == [6, 6, 3]


def test_an_appends_store_options_given_without_store_are_held_to_outs(sources: tuple[Path, Path],
                                                                        tmp_path: Path) -> None:
    """Without --store an append takes OUT's store, so a --resize or --quality given alone is
    OUT's or named against OUT's; it was checked against the default store first ('--resize needs
    a store that decodes ... original keeps file bytes', of a jpeg OUT). An explicit --store
    original is not OUT's jpeg: it was taken for no --store and packed jpeg. --store jpeg alone
    takes OUT's quality: '--quality 80 in OUT, 90 now' named a quality never given."""
    old, new = sources
    out = tmp_path / "out"
    assert run("lmdb", old, out, "--shard-size", 4, "--store", "jpeg", "--quality", 80, "--resize", 24, "-q")[0] == 0
    code, output = run("lmdb", new, out, "--append", "--store", "original", "-q")
    assert code == 1 and output == f"Error: {out}: an append stores samples as OUT does; --store jpeg in OUT, " \
                                   "original now; --resize 24 in OUT, not set now\n", output
    code, output = run("lmdb", new, out, "--append", "--resize", 32, "-q")
    assert code == 1, output
    assert output == f"Error: {out}: an append stores samples as OUT does; --resize 24 in OUT, 32 now\n", output
    assert readers.load_manifest(out).num_samples == 18  # OLD's alone
    code, output = run("lmdb", new, out, "--append", "--store", "jpeg", "-q")  # was '--quality 80 in OUT, 90 now'
    assert code == 0 and "appended 15 samples" in output, output
    again = tmp_path / "again"
    assert run("lmdb", old, again, "--store", "jpeg", "--quality", 80, "--resize", 24, "-q")[0] == 0
    code, output = run("lmdb", new, again, "--append", "--resize", 24, "--quality", 80, "-q")  # OUT's own: taken
    assert code == 0 and "appended 15 samples" in output, output
    for dataset in out, again:
        manifest = readers.load_manifest(dataset)
        assert {name: manifest.parts[1]["options"][name] for name in ("store", "quality", "resize", "mode")} == \
            {"store": "jpeg", "quality": 80, "resize": 24, "mode": "RGB"}
    raw = tmp_path / "raw"
    assert run("lmdb", old, raw, "--store", "raw", "-q")[0] == 0
    code, output = run("lmdb", new, raw, "--append", "--quality", 80, "-q")  # OUT's store takes no quality
    assert code == 1, output
    assert output == f"Error: {raw}: --quality applies only to --store jpeg (OUT's store is raw)\n", output


def test_appended_paths_that_outs_samples_have_are_counted_in_a_warning(sources: tuple[Path, Path], tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """NEW's class_00..02 repeat OLD's names with other images: 12 samples would share a path
    with another image of OUT; class_03 is new."""
    old, new = sources
    out = tmp_path / "out"
    assert run("wds", old, out, "--shard-size", 4, "-q")[0] == 0
    with caplog.at_level("WARNING", logger="packer.run.append"):
        code, output = run("wds", new, out, "--append", "-q")
    assert code == 0, output
    assert f"{out}: 12 appended samples share a path with samples already in OUT (class_00/img 000.jpg, " \
           "class_00/img 001.jpg, class_00/img 002.jpg, ...)" in caplog.text
    shared = [path for _, _, path in samples(out)]
    assert len(shared) - len(set(shared)) == 12
    caplog.clear()
    with caplog.at_level("WARNING", logger="packer.run.append"):
        code, output = run("wds", old / "class_02", out, "--append", "-q")  # sub/deeper/img 003.jpg: not OUT's
    assert code == 0 and "share a path" not in caplog.text, output
    (out / ".pack" / "listing.jsonl").unlink()  # a listing gone: its paths are not compared, the append goes on
    code, output = run("wds", new / "class_03", out, "--append", "-q")
    assert code == 0 and output.startswith("appended 3 samples"), output
