"""OUT, the output folder: every name the packer uses in it, and the checks before writing there.

    OUT/index.json, rejects.jsonl, shard-*        what readers see (names from readers.manifest)
    OUT/_info.json, wids.json, README.md          descriptors for other loaders (packer.run.descriptors)
    OUT/.pack/plan.json, listing.jsonl            the plan every task shares
    OUT/.pack/plan.lock                           held while one task scans SRC and writes the plan
    OUT/.pack/tmp/<shard file>.tmp-<host>-<pid>   a shard being written, renamed into OUT when complete
    OUT/.pack/done/<shard file>.json              a finished shard's marker, written last
    OUT/.pack/logs/                               batch-job logs (pack slurm-script)
    OUT/.pack/parts/<first shard>/plan.json, ...  an append's plan and listing (packer.run.append)
"""

from __future__ import annotations

import os
import re
import fcntl
import shutil
import socket
import time
from pathlib import Path
from typing import IO

from readers.manifest import DESCRIPTOR_NAMES, MANIFEST_NAME, REJECTS_NAME, SHARD_PREFIX

from ..errors import FinishedOutput, PackError

WORK_DIR = ".pack"
PLAN_NAME = "plan.json"
LISTING_NAME = "listing.jsonl"
LOCK_NAME = "plan.lock"
TMP_DIR = "tmp"
DONE_DIR = "done"
LOGS_DIR = "logs"
PARTS_DIR = "parts"
TEMP_MARK = ".tmp-"
PLAN_LOCK_SECONDS = 6 * 3600.0
"""The longest a task waits for another to finish planning: past it, an error instead of a hang."""
LOCK_POLL_SECONDS = 0.5


def work_dir(out: Path) -> Path:
    return out / WORK_DIR


def part_dir(out: Path, first_shard: int = 0) -> Path:
    """Where a plan and its listing live: `.pack` for a pack, `.pack/parts/<first shard>` for an
    append (packer.run.append), whose shards are numbered from `first_shard` on."""
    return work_dir(out) / PARTS_DIR / f"{first_shard:06d}" if first_shard else work_dir(out)


def plan_path(out: Path, first_shard: int = 0) -> Path:
    return part_dir(out, first_shard) / PLAN_NAME


def listing_path(out: Path, first_shard: int = 0) -> Path:
    return part_dir(out, first_shard) / LISTING_NAME


def lock_path(out: Path) -> Path:
    return work_dir(out) / LOCK_NAME


def tmp_dir(out: Path) -> Path:
    return work_dir(out) / TMP_DIR


def marker_path(out: Path, shard_file: str) -> Path:
    return work_dir(out) / DONE_DIR / (shard_file + ".json")


def temp_name(name: str) -> str:
    """A file's name while one process on one host writes it; `final_name` gives `name` back."""
    return f"{name}{TEMP_MARK}{socket.gethostname()}-{os.getpid()}"


def final_name(temp: str) -> str:
    return temp.split(TEMP_MARK)[0]


def pack_outputs(names: list[str]) -> set[str]:
    """Which of these entries of OUT are pack's: shards, the manifest, rejects and the work folder;
    the loader descriptors (README.md, _info.json, wids.json) only where pack has written before,
    so a user's own README.md is never taken for ours; and the temp sibling a run killed while
    publishing left of one of those (`.index.json.tmp-PID`, see fsutil.atomic_write_text)."""
    written_before = WORK_DIR in names or MANIFEST_NAME in names
    ours = {MANIFEST_NAME, REJECTS_NAME, WORK_DIR, *(DESCRIPTOR_NAMES if written_before else ())}

    def is_ours(name: str) -> bool:
        leftover = re.fullmatch(r"\.(.+)\.tmp-\d+", name)
        return name in ours or name.startswith(SHARD_PREFIX) or bool(leftover and is_ours(leftover.group(1)))

    return {name for name in names if is_ours(name)}


def check_paths(src: Path, out: Path) -> None:
    if src.is_dir():
        src_real, out_real = src.resolve(), out.resolve()
        if out_real == src_real or src_real in out_real.parents:
            raise PackError(f"{out}: OUT must not be inside SRC ({src}); the packer would scan its own output")
    check_out(out)


def check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise PackError(f"{out}: exists and is not a directory")


def prepare_output(out: Path, *, overwrite: bool) -> None:
    """Refuse to clobber a finished dataset or foreign files; with overwrite, remove our files only."""
    if not out.exists():
        out.mkdir(parents=True, exist_ok=True)
        return
    names = os.listdir(out)
    ours = pack_outputs(names)
    foreign = sorted(set(names) - ours)
    if overwrite:
        for name in ours:
            target = out / name
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        return
    if (out / MANIFEST_NAME).exists():
        raise FinishedOutput(f"{out}: already holds a packed dataset; pass --overwrite to replace it")
    if foreign:
        raise PackError(f"{out}: not empty and not a pack output (found {foreign[0]!r}); choose another OUT")


def wait_for_lock(lock: IO[str], path: Path, timeout: float = PLAN_LOCK_SECONDS) -> None:
    """Take the plan lock, waiting while another task scans SRC (an hour for ten million files on a
    cluster filesystem), but not forever: a holder that is alive and stuck becomes an error. A dead
    holder's flock is released by the kernel, so a killed task never blocks the next one."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise PackError(f"{path}: another pack process has held this lock for over {timeout:g} s "
                                "(still scanning SRC, or stuck?); rerun once it has finished or been stopped") from None
            time.sleep(LOCK_POLL_SECONDS)
