"""A rerun, a resume, a task and an append check SRC against the listing OUT's plan was made from
(names, sizes, modification times) and stop in one line when it changed (#35): one output never
holds two states of SRC, and a rerun never calls a stale dataset up to date."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from clirun import run
from conftest import S3_BUCKET
from imagefolders import image_bytes, make_image_folder

import random

import readers
from packer.errors import PackError
from packer.plan.partition import Partition
from packer.run.pipeline import merge, pack
from packer.plan.plan import PackOptions, load_plan, read_shard_entries

OPTIONS = ("--shard-size", 4, "--workers", 1, "-q")


def added(src: Path) -> None:
    (src / "class_01" / "img new.jpg").write_bytes(image_bytes(random.Random(9)))


def removed(src: Path) -> None:
    (src / "class_00" / "img 001.jpg").unlink()


def resized(src: Path) -> None:
    path = src / "class_02" / "img 002.jpg"
    path.write_bytes(path.read_bytes() + b"\0")


def rewritten(src: Path) -> None:
    """Other bytes of the same size: only the modification time tells."""
    path = src / "class_00" / "img 000.jpg"
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    os.utime(path, ns=(time.time_ns(), time.time_ns()))


def new_class(src: Path) -> None:
    (src / "class_09").mkdir()
    (src / "class_09" / "a.jpg").write_bytes(image_bytes(random.Random(8)))


CHANGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "added": (added, "1 added, 0 removed, 0 changed (class_01/img new.jpg); append them with --append, or pack "
                     "it again with --overwrite"),
    "class": (new_class, "1 added, 0 removed, 0 changed (class_09/a.jpg); append them with --append, or pack it "
                         "again with --overwrite"),
    "removed": (removed, "0 added, 1 removed, 0 changed (class_00/img 001.jpg); pack it again with --overwrite"),
    "resized": (resized, "0 added, 0 removed, 1 changed (class_02/img 002.jpg); pack it again with --overwrite"),
    "rewritten": (rewritten, "0 added, 0 removed, 1 changed (class_00/img 000.jpg); pack it again with --overwrite"),
}


def files_of(out: Path) -> dict[str, bytes]:
    return {path.relative_to(out).as_posix(): path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_rerun_of_a_finished_pack_after_src_changed_is_refused(change: str, tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    make_image_folder(src, classes=3, per_class=5, seed=1)
    code, output = run("lmdb", src, out, *OPTIONS)
    assert code == 0, output
    before = files_of(out)
    mutate, message = CHANGES[change]
    mutate(src)
    code, output = run("lmdb", src, out, *OPTIONS)
    assert (code, output) == (1, f"Error: {src}: SRC changed since {out}'s plan: {message}\n")
    assert files_of(out) == before
    code, output = run("lmdb", src, out, *OPTIONS, "--overwrite")
    assert code == 0, output
    assert readers.load_manifest(out).num_samples == sum(1 for _ in readers.open_dataset(out))
    code, output = run("lmdb", src, out, *OPTIONS)
    assert code == 0 and "up to date" in output


def test_an_unchanged_rerun_is_still_up_to_date(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    make_image_folder(src, classes=3, per_class=5, seed=1)
    assert run("lmdb", src, out, *OPTIONS)[0] == 0
    os.utime(src / "class_00" / "img 000.jpg", ns=(0, 0))  # an older time: restored, not changed since
    code, output = run("lmdb", src, out, *OPTIONS)
    assert code == 0 and "up to date" in output


def test_a_file_dated_in_the_future_does_not_stop_every_rerun(tmp_path: Path) -> None:
    """A file whose time is ahead of this clock (unzipped in another time zone, an NFS client's
    clock) was not modified after the plan: reruns stay up to date, and a later change still stops one."""
    src, out = tmp_path / "src", tmp_path / "out"
    make_image_folder(src, classes=3, per_class=5, seed=1)
    ahead = time.time_ns() + 3600 * 10**9
    os.utime(src / "class_01" / "img 000.jpg", ns=(ahead, ahead))
    assert run("lmdb", src, out, *OPTIONS)[0] == 0
    code, output = run("lmdb", src, out, *OPTIONS)
    assert code == 0 and "up to date" in output
    resized(src)
    assert run("lmdb", src, out, *OPTIONS)[0] == 1


def test_a_resume_after_src_changed_is_refused_and_keeps_the_finished_shards(tmp_path: Path) -> None:
    """An unfinished pack (half its shards, as a kill leaves it) is not finished from another SRC:
    its shards would hold the old files and the new ones."""
    src, out = tmp_path / "src", tmp_path / "out"
    make_image_folder(src, classes=3, per_class=5, seed=1)
    options = PackOptions(format="lmdb", shard_size=4)
    pack(src, out, options, partition=Partition(0, 2), workers=1)
    before = files_of(out)
    resized(src)
    added(src)
    with pytest.raises(PackError, match=r"SRC changed since .*: 1 added, 0 removed, 1 changed \(class_01/img new.jpg, "
                                        r"class_02/img 002.jpg\); pack it again with --overwrite$"):
        pack(src, out, options, workers=1)
    assert files_of(out) == before
    assert not (out / "index.json").exists()


def task_files(out: Path, task: int, count: int) -> list[str]:
    """The paths the shards of one task of `count` pack, from OUT's plan."""
    plan = load_plan(out)
    assert plan is not None
    shards = Partition(task, count).shards(plan.num_shards)
    return [entry.path for shard in shards for entry in read_shard_entries(out, plan, shard)]


def test_a_task_after_its_files_changed_is_refused_and_merge_publishes_nothing(tmp_path: Path) -> None:
    """A task stats the files of its own shards (not a walk of SRC: N tasks would walk it N times):
    one of them removed, another rewritten, stops it in one line naming them."""
    src, out = tmp_path / "src", tmp_path / "out"
    make_image_folder(src, classes=3, per_class=5, seed=1)
    options = PackOptions(format="lmdb", shard_size=4)
    pack(src, out, options, partition=Partition(0, 2), workers=1)
    gone, edited = task_files(out, 1, 2)[:2]
    (src / gone).unlink()
    os.utime(src / edited, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    first = re.escape(sorted([gone, edited])[0])
    with pytest.raises(PackError, match=rf"SRC changed since .*: 0 added, 1 removed, 1 changed \({first}, "):
        pack(src, out, options, partition=Partition(1, 2), workers=1)
    with pytest.raises(PackError, match="shards unfinished"):
        merge(out)
    assert not (out / "index.json").exists()


def test_files_added_while_tasks_run_are_found_by_merge(tmp_path: Path) -> None:
    """A task does not list SRC, so a file added after the plan is not its business: merge, which
    lists SRC once, stops before publishing."""
    src, out = tmp_path / "src", tmp_path / "out"
    make_image_folder(src, classes=3, per_class=5, seed=1)
    options = PackOptions(format="lmdb", shard_size=4)
    pack(src, out, options, partition=Partition(0, 2), workers=1)
    added(src)
    pack(src, out, options, partition=Partition(1, 2), workers=1)
    code, output = run("merge", out)
    assert (code, output) == (1, f"Error: {src}: SRC changed since {out}'s plan: 1 added, 0 removed, 0 changed "
                                 "(class_01/img new.jpg); nothing was published; pack it again with --overwrite\n")
    assert not (out / "index.json").exists()


def test_merge_publishes_nothing_when_src_changed_after_the_plan(tmp_path: Path) -> None:
    """A file changed while the tasks ran (after each one's check): the shards may hold either state
    of it, so merge, which lists SRC again, stops."""
    src, out = tmp_path / "src", tmp_path / "out"
    make_image_folder(src, classes=3, per_class=5, seed=1)
    options = PackOptions(format="lmdb", shard_size=4)
    pack(src, out, options, partition=Partition(0, 2), workers=1)
    pack(src, out, options, partition=Partition(1, 2), workers=1)
    rewritten(src)
    code, output = run("merge", out)
    assert (code, output) == (1, f"Error: {src}: SRC changed since {out}'s plan: 0 added, 0 removed, 1 changed "
                                 "(class_00/img 000.jpg); nothing was published; pack it again with --overwrite\n")
    assert not (out / "index.json").exists()


def test_a_changed_container_input_is_refused(tmp_path: Path) -> None:
    """Tar shards are not listed again (that reads them): their times and sizes are checked."""
    src, packed, out = tmp_path / "src", tmp_path / "packed", tmp_path / "out"
    make_image_folder(src, classes=2, per_class=3, seed=1)
    assert run("wds", src, packed, "--shard-size", 3, "-q")[0] == 0
    tars = tmp_path / "tars"
    tars.mkdir()
    for shard in sorted(packed.glob("shard-*.tar")):
        shutil.copy(shard, tars / shard.name)
    code, output = run("lmdb", tars, out, *OPTIONS)
    assert code == 0, output
    first = sorted(tars.glob("*.tar"))[0]
    os.utime(first, ns=(time.time_ns(), time.time_ns()))
    code, output = run("lmdb", tars, out, *OPTIONS)
    assert (code, output) == (1, f"Error: {tars}: SRC changed since {out}'s plan: 0 added, 0 removed, 1 changed "
                                 f"({first.name}); pack it again with --overwrite\n")


def test_a_changed_bucket_src_is_refused(tmp_path: Path, s3_options: dict[str, Any],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import fsspec.config
    import s3fs

    monkeypatch.setitem(fsspec.config.conf, "s3", s3_options)
    src, out = tmp_path / "src", tmp_path / "out"
    make_image_folder(src, classes=2, per_class=3, seed=1)
    fs = s3fs.S3FileSystem(**s3_options, skip_instance_cache=True)
    fs.put(str(src), f"{S3_BUCKET}/stale", recursive=True)
    url = f"s3://{S3_BUCKET}/stale"
    assert run("wds", url, out, *OPTIONS)[0] == 0
    assert "up to date" in run("wds", url, out, *OPTIONS)[1]
    fs.pipe_file(f"{S3_BUCKET}/stale/class_01/late.jpg", image_bytes(random.Random(7)))
    code, output = run("wds", url, out, *OPTIONS)
    assert (code, output) == (1, f"Error: {url}: SRC changed since {out}'s plan: 1 added, 0 removed, 0 changed "
                                 "(class_01/late.jpg); append them with --append, or pack it again with --overwrite\n")


def test_appending_the_same_folder_under_another_path_is_refused(tmp_path: Path) -> None:
    old, new, out = tmp_path / "old", tmp_path / "new", tmp_path / "o.lmdb"
    make_image_folder(old, classes=2, per_class=3, seed=1)
    make_image_folder(new, classes=2, per_class=2, seed=2)
    (tmp_path / "newlink").symlink_to(new)
    assert run("lmdb", old, out, *OPTIONS)[0] == 0
    packed = readers.load_manifest(out).num_samples
    assert run("lmdb", new, out, *OPTIONS, "--append")[0] == 0
    before = files_of(out)
    count = readers.load_manifest(out).num_samples
    code, output = run("lmdb", tmp_path / "newlink", out, *OPTIONS, "--append")
    assert (code, output) == (1, f"Error: {tmp_path / 'newlink'}: its samples are in {out} already: the part from "
                                 f"shard 2 was appended from {new} with the same listing and options; pass "
                                 "--append-again to add them a second time\n")
    assert files_of(out) == before
    code, output = run("lmdb", tmp_path / "newlink", out, *OPTIONS, "--append", "--append-again")
    assert code == 0, output
    assert readers.load_manifest(out).num_samples == 2 * count - packed


def test_appending_the_packed_folder_itself_under_another_path_is_refused(tmp_path: Path) -> None:
    old, out = tmp_path / "old", tmp_path / "o.lmdb"
    make_image_folder(old, classes=2, per_class=3, seed=1)
    (tmp_path / "oldlink").symlink_to(old)
    assert run("lmdb", old, out, *OPTIONS)[0] == 0
    code, output = run("lmdb", tmp_path / "oldlink", out, *OPTIONS, "--append")
    assert code == 1 and output.startswith(f"Error: {tmp_path / 'oldlink'}: its samples are in {out} already: the "
                                           f"part from shard 0 was packed from {old}")


def test_resuming_an_append_after_its_src_changed_is_refused(tmp_path: Path) -> None:
    old, new, out = tmp_path / "old", tmp_path / "new", tmp_path / "out"
    make_image_folder(old, classes=2, per_class=3, seed=1)
    make_image_folder(new, classes=3, per_class=5, seed=2)
    assert run("lmdb", old, out, *OPTIONS)[0] == 0
    code, output = run("lmdb", new, out, *OPTIONS, "--append", "--task-index", 0, "--task-count", 2)
    assert code == 0, output  # half the append's shards, as a kill leaves them
    before = files_of(out)
    removed(new)
    code, output = run("lmdb", new, out, *OPTIONS, "--append")
    assert (code, output) == (1, f"Error: {new}: SRC changed since {out}'s plan: 0 added, 1 removed, 0 changed "
                                 f"(class_00/img 001.jpg); remove {out}/.pack/parts/000002 to drop the unfinished append, "
                                 "then append SRC again\n")
    assert files_of(out) == before
