"""Run shard tasks on this machine: one process per shard in flight, reader threads inside each."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
from contextlib import contextmanager
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import PackError
from ..shard import run_shard, shard_file_name
from ..plan import Plan
from ..validate import ErrorPolicy

_counter: Synchronized | None = None
_started_by: Any = None  # shard number -> pid of the worker that started it (a shared int64 array)


def _init_worker(counter: Synchronized, started_by: Any) -> None:
    """Count progress in shared memory, and die with the parent (no orphans writing after kill -9)."""
    global _counter, _started_by
    _counter = counter
    _started_by = started_by
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops the pool
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG, Linux
    except (OSError, AttributeError):
        pass


@contextmanager
def few_malloc_arenas() -> Iterator[None]:
    """Start workers with MALLOC_ARENA_MAX=2 unless the user set it.

    glibc gives each reader thread its own malloc arena, and each arena keeps freed image
    buffers: with 8 readers that was ~80 MB per worker. Two arenas cut a worker's RSS by a third
    at no measured cost in speed. Only the spawned workers see the variable.
    """
    previous = os.environ.get("MALLOC_ARENA_MAX")
    if previous is None:
        os.environ["MALLOC_ARENA_MAX"] = "2"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["MALLOC_ARENA_MAX"]


def _count(samples: int) -> None:
    assert _counter is not None
    with _counter.get_lock():
        _counter.value += samples


def _run(out: Path, plan: Plan, shard: int, policy: ErrorPolicy) -> None:
    _started_by[shard] = os.getpid()
    run_shard(out, plan, shard, progress=_count, policy=policy)


def _is_dead(pid: int) -> bool:
    """Whether process `pid` has exited (a zombie the pool has not reaped yet counts as exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _check_alive(out: Path, plan: Plan, shards: list[int], started_by: Any) -> None:
    """multiprocessing.Pool replaces a worker that dies (OOM killer, a crash in a C library) but
    never finishes its task: without this check, pack would wait for that shard forever."""
    for shard in shards:
        pid = started_by[shard]
        if pid and _is_dead(pid):
            raise PackError(
                f"{out}: the worker packing {shard_file_name(plan, shard)} (pid {pid}) died before finishing it "
                "(killed, or out of memory?); finished shards are kept: rerun the same command to resume"
            )


def run_local(out: Path, plan: Plan, shards: list[int], *, workers: int, scheduler: str | None = None,
              progress: Callable[[int], None] | None = None, policy: ErrorPolicy = ErrorPolicy()) -> None:
    del scheduler
    if workers <= 1 or len(shards) <= 1:
        for shard in shards:
            run_shard(out, plan, shard, progress=progress, policy=policy)
        return
    context = multiprocessing.get_context("spawn")
    counter = context.Value("q", 0)
    started_by = context.Array("q", plan.num_shards, lock=False)
    reported = 0
    with few_malloc_arenas():
        pool = context.Pool(min(workers, len(shards)), initializer=_init_worker, initargs=(counter, started_by))
    try:
        tasks = {shard: pool.apply_async(_run, (out, plan, shard, policy)) for shard in shards}
        pool.close()
        while tasks:
            next(iter(tasks.values())).wait(timeout=0.2)
            for shard in [shard for shard, task in tasks.items() if task.ready()]:
                tasks.pop(shard).get()  # re-raises a worker's error here
            _check_alive(out, plan, list(tasks), started_by)
            if progress:
                current = counter.value
                progress(current - reported)
                reported = current
        pool.join()
    finally:
        pool.terminate()  # on error or Ctrl-C: stop the other shards now; their temp files are cleaned on rerun
