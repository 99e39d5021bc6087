"""Partitioned packing: tasks from flags or scheduler variables, merge, Dask, Slurm scripts."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from packer.run import pipeline
from packer.stores import outdir
from packer.errors import PackError
from packer.stores.outdir import lock_path
from packer.plan.partition import Partition, resolve_partition
from packer.run.pipeline import merge, pack
from packer.plan.options import PackOptions

PACK = [sys.executable, "-m", "packer.cli"]
OPTIONS = ["--shard-size", "3", "-q"]


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(out.glob("shard-*"))}


def manifest(out: Path) -> dict:
    return json.loads((out / "index.json").read_text())


@pytest.fixture
def reference(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> Path:
    root, _ = image_folder
    out = tmp_path / "reference"
    pack(root, out, PackOptions(format="lmdb", shard_size=3))
    return out


@pytest.mark.parametrize(
    "flags, env, expected",
    [
        ((None, None), {}, Partition(0, 1)),
        ((2, 4), {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "9"}, Partition(2, 4)),
        ((None, None), {"PACK_TASK_INDEX": "1", "PACK_TASK_COUNT": "3"}, Partition(1, 3)),
        ((None, None), {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "3"}, Partition(2, 3)),
        ((None, None), {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_STEP": "2",
                        "SLURM_ARRAY_TASK_COUNT": "3"}, Partition(2, 3)),
        ((None, None), {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "4"},
         Partition(0, 4)),
        ((None, 5), {"JOB_COMPLETION_INDEX": "4"}, Partition(4, 5)),
    ],
)
def test_partition_sources(flags: tuple, env: dict[str, str], expected: Partition) -> None:
    assert resolve_partition(*flags, env=env) == expected


@pytest.mark.parametrize(
    "flags, env, message",
    [
        ((1, None), {}, "go together"),
        ((None, 3), {}, "go together"),
        ((None, None), {"PACK_TASK_INDEX": "1"}, "PACK_TASK_INDEX and \\$PACK_TASK_COUNT go together"),
        ((None, None), {"SLURM_ARRAY_TASK_ID": "1"}, "SLURM_ARRAY_TASK_COUNT is not"),
        ((None, None), {"JOB_COMPLETION_INDEX": "1"}, "--task-count"),
        ((3, 3), {}, "outside 0..2"),
        ((None, None), {"PACK_TASK_INDEX": "x", "PACK_TASK_COUNT": "2"}, "not an integer"),
    ],
)
def test_partition_errors(flags: tuple, env: dict[str, str], message: str) -> None:
    with pytest.raises(PackError, match=message):
        resolve_partition(*flags, env=env)


def test_shards_are_dealt_round_robin() -> None:
    assert Partition(1, 3).shards(8) == [1, 4, 7]
    assert sorted(k for i in range(3) for k in Partition(i, 3).shards(8)) == list(range(8))


def test_slurm_tasks_out_of_order_then_merge(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path,
                                              reference: Path) -> None:
    root, _ = image_folder
    out = tmp_path / "out"
    # A 3-task array with ids 1, 3, 5 (--array=1-5:2), run in the order 5, 1, 3.
    for task_id in ("5", "1", "3"):
        env = {**os.environ, "SLURM_ARRAY_TASK_ID": task_id, "SLURM_ARRAY_TASK_MIN": "1",
               "SLURM_ARRAY_TASK_STEP": "2", "SLURM_ARRAY_TASK_COUNT": "3"}
        result = subprocess.run([*PACK, "lmdb", str(root), str(out), *OPTIONS], env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert "this task's" in result.stdout and "pack merge" in result.stdout
        assert not (out / "index.json").exists()
    result = subprocess.run([*PACK, "merge", str(out)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert manifest(out)["shards"] == manifest(reference)["shards"]
    assert shard_bytes(out) == shard_bytes(reference)
    assert (out / "rejects.jsonl").read_bytes() == (reference / "rejects.jsonl").read_bytes()


def test_merge_names_missing_shards_and_publishes_nothing(image_folder: tuple[Path, dict[str, bytes]],
                                                          tmp_path: Path) -> None:
    root, _ = image_folder
    out = tmp_path / "out"
    pack(root, out, PackOptions(format="lmdb", shard_size=3), partition=Partition(0, 2))
    with pytest.raises(PackError, match=r"3 of 7 shards unfinished: shard-000001.lmdb, shard-000003.lmdb, shard-000005.lmdb"):
        merge(out)
    assert not (out / "index.json").exists()
    result = subprocess.run([*PACK, "merge", str(out)], capture_output=True, text=True)
    assert result.returncode == 1 and result.stderr.startswith(f"Error: {out}: 3 of 7 shards unfinished")


def test_task_run_twice_is_idempotent(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path,
                                      reference: Path) -> None:
    root, _ = image_folder
    out = tmp_path / "out"
    options = PackOptions(format="lmdb", shard_size=3)
    pack(root, out, options, partition=Partition(1, 2))
    first = shard_bytes(out)
    for marker in (out / ".pack" / "done").iterdir():  # a scheduler retry after a lost marker
        marker.unlink()
    pack(root, out, options, partition=Partition(1, 2))
    assert shard_bytes(out) == first
    pack(root, out, options, partition=Partition(0, 2))
    merge(out)
    assert shard_bytes(out) == shard_bytes(reference)


def test_plan_step_then_tasks_reuse_it(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path,
                                       reference: Path) -> None:
    root, _ = image_folder
    out = tmp_path / "out"
    result = subprocess.run([*PACK, "plan", str(root), str(out), "--format", "lmdb", "--shard-size", "3"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "into 7 shards" in result.stdout
    plan_file = out / ".pack" / "plan.json"
    before = plan_file.stat().st_mtime_ns
    for index in range(2):
        subprocess.run([*PACK, "lmdb", str(root), str(out), *OPTIONS, "--task-index", str(index), "--task-count", "2"],
                       check=True)
    assert plan_file.stat().st_mtime_ns == before  # nobody rescanned
    mismatch = subprocess.run([*PACK, "lmdb", str(root), str(out), "-q", "--shard-size", "4",
                               "--task-index", "0", "--task-count", "2"], capture_output=True, text=True)
    assert mismatch.returncode == 1 and "unfinished run" in mismatch.stderr
    subprocess.run([*PACK, "merge", str(out)], check=True, capture_output=True)
    assert shard_bytes(out) == shard_bytes(reference)


def test_dask_local_cluster_gives_the_same_result(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path,
                                                  reference: Path) -> None:
    pytest.importorskip("dask.distributed")
    root, _ = image_folder
    out = tmp_path / "out"
    result = subprocess.run([*PACK, "lmdb", str(root), str(out), *OPTIONS, "--engine", "dask", "--scheduler", "local",
                             "--workers", "2"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "INFO" not in result.stderr
    assert manifest(out)["shards"] == manifest(reference)["shards"]
    assert shard_bytes(out) == shard_bytes(reference)


FAKE_SBATCH = r'''#!/usr/bin/env python3
"""Stand-in for sbatch: runs an --array script once per task id with Slurm's variables, in reverse."""
import os, re, subprocess, sys
script = sys.stdin.read()
log = os.environ["FAKE_SBATCH_LOG"]
with open(log, "a") as handle:
    handle.write(" ".join(sys.argv[1:]) + "\n")
array = re.search(r"#SBATCH --array=(\d+)-(\d+)", script)
ids = list(range(int(array.group(1)), int(array.group(2)) + 1)) if array else [None]
for task in reversed(ids):
    env = dict(os.environ, SLURM_CPUS_PER_TASK="2")
    if task is not None:
        env.update(SLURM_ARRAY_TASK_ID=str(task), SLURM_ARRAY_TASK_MIN=str(ids[0]),
                   SLURM_ARRAY_TASK_STEP="1", SLURM_ARRAY_TASK_COUNT=str(len(ids)))
    subprocess.run(["bash", "-c", script], env=env, check=True, stdout=subprocess.DEVNULL)
print(4242 if array else 4343)
'''


def test_slurm_script_runs_end_to_end_with_a_fake_sbatch(image_folder: tuple[Path, dict[str, bytes]],
                                                          tmp_path: Path, reference: Path) -> None:
    root, _ = image_folder
    out = tmp_path / "out"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(FAKE_SBATCH)
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IEXEC)
    result = subprocess.run([*PACK, "slurm-script", "lmdb", str(root), str(out), "--tasks", "3", "--shard-size", "3",
                             "--cpus-per-task", "2", "--split", "val"], capture_output=True, text=True, check=True)
    script = tmp_path / "submit.sh"
    assert f"merge {out.resolve()} --on-error skip --split val" in result.stdout
    script.write_text(result.stdout)
    assert "#SBATCH --array=0-2" in result.stdout and "--dependency=afterok:${array_job}" in result.stdout
    log = tmp_path / "sbatch.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_SBATCH_LOG": str(log)}
    submitted = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert submitted.returncode == 0, submitted.stderr
    assert "submitted array job 4242 (3 tasks)" in submitted.stdout
    assert log.read_text().splitlines() == ["--parsable", "--parsable --dependency=afterok:4242"]
    assert shard_bytes(out) == shard_bytes(reference)
    assert manifest(out)["shards"] == manifest(reference)["shards"]


def test_available_cpus_is_bounded_by_slurm_and_the_affinity_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    from readers.cpus import available_cpus

    mask = len(os.sched_getaffinity(0))
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert available_cpus() == 1
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", str(mask + 64))
    assert available_cpus() == mask
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    assert available_cpus() == mask


def test_a_task_waits_for_the_plan_lock_but_not_forever(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another task planning (holding the lock) makes this one wait; a holder that never lets go is
    a one-line error naming the lock; once it is released the task goes on with the same plan."""
    root, _ = image_folder
    out = tmp_path / "out"
    pipeline.ensure_plan(root, out, PackOptions(format="lmdb", shard_size=3))
    monkeypatch.setattr(outdir, "LOCK_POLL_SECONDS", 0.01)
    with open(lock_path(out), "a") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with open(lock_path(out), "a") as waiter, pytest.raises(
                PackError, match=r"plan\.lock: another pack process has held this lock for over 0\.2 s"):
            outdir.wait_for_lock(waiter, lock_path(out), timeout=0.2)
        threading.Timer(0.2, fcntl.flock, (holder, fcntl.LOCK_UN)).start()
        plan = pipeline.ensure_plan(root, out, PackOptions(format="lmdb", shard_size=3))
    assert plan.num_shards == 7


def test_slurm_script_appends(tmp_path: Path) -> None:
    """`pack slurm-script ... --append`: the array's tasks append SRC to the packed OUT and the merge
    job publishes it, as one `pack --append` would (without it, every task refused the packed OUT)."""
    from imagefolders import make_image_folder

    make_image_folder(tmp_path / "old", classes=3, per_class=5, seed=1)
    make_image_folder(tmp_path / "new", classes=4, per_class=3, seed=2)
    out, reference = tmp_path / "out", tmp_path / "reference"
    for target in (out, reference):
        pack(tmp_path / "old", target, PackOptions(format="lmdb", shard_size=3))
    subprocess.run([*PACK, "lmdb", str(tmp_path / "new"), str(reference), "--shard-size", "3", "--append", "-q"],
                   check=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(FAKE_SBATCH)
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IEXEC)
    result = subprocess.run([*PACK, "slurm-script", "lmdb", str(tmp_path / "new"), str(out), "--tasks", "2",
                             "--shard-size", "3", "--append"], capture_output=True, text=True, check=True)
    script = tmp_path / "submit.sh"
    script.write_text(result.stdout)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_SBATCH_LOG": str(tmp_path / "sbatch.log")}
    submitted = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert submitted.returncode == 0, submitted.stderr
    assert shard_bytes(out) == shard_bytes(reference)
    assert manifest(out)["shards"] == manifest(reference)["shards"]
    assert [part["num_samples"] for part in manifest(out)["parts"]] == [18, 15]
