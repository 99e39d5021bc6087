"""Run shard tasks on this machine: spawned worker processes, one shard each at a time.

Not multiprocessing.Pool: its terminate() joins workers with no time limit and its workers share
locks with the parent (task queue, result queue, a progress counter). A worker that was stopped,
stuck in uninterruptible I/O, or that survived SIGTERM hung `pack` forever; so did one killed
while holding one of those locks; and Pool never finishes the task of a worker that died. Here
each worker has a pipe of its own, the parent waits on the pipes and on the workers' exit
sentinels together (a death is seen at once), progress is a lock-free array in which each
worker writes only its own slot, and stopping is SIGKILL with a bounded wait.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import time
import traceback
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Callable, Iterator

from ..errors import PackError
from ..plan.plan import Plan
from ..stores.output import Commits, Output
from ..write.shard import ShardResult, run_shard, shard_file_name
from ..write.validate import ErrorPolicy

log = logging.getLogger(__name__)

POLL_SECONDS = 0.2
"""How often progress is reported while waiting on the workers."""
STOP_SECONDS = 10.0
"""The longest `pack` waits for its workers to exit once it has told them, or killed them."""
PR_SET_PDEATHSIG = 1
START_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class RemoteTraceback(Exception):
    """A worker's traceback, chained to the error re-raised in the parent."""

    def __str__(self) -> str:
        return str(self.args[0])


def _serve(conn: Connection, progress: Any, slot: int, parent: int) -> None:
    """A worker: run each shard the parent sends, answer (error, traceback) or (None, ""), until None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent handles it
    signal.pthread_sigmask(signal.SIG_UNBLOCK, START_SIGNALS)  # blocked by the parent while it started us
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # die with the parent: no orphans after kill -9
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        return

    def count(samples: int) -> None:
        progress[slot] += samples

    while True:
        try:
            task = conn.recv()
        except EOFError:  # the parent is gone
            return
        if task is None:
            return
        out, plan, shard, policy = task
        try:
            result = run_shard(out, plan, shard, progress=count, policy=policy, upload=False)
        except Exception as exc:  # noqa: BLE001 - every error goes back to the parent, which decides
            _reply(conn, exc, traceback.format_exc())
        else:
            _reply(conn, None, "", result)


def _reply(conn: Connection, error: BaseException | None, trace: str, result: ShardResult | None = None) -> None:
    try:
        conn.send((error, trace, result))
    except Exception:  # noqa: BLE001 - an error that cannot be pickled still gets home as text
        conn.send((PackError(f"{type(error).__name__}: {error}"), trace, None))


@dataclass
class Worker:
    process: BaseProcess
    conn: Connection
    shard: int | None = None


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


@contextmanager
def signals_blocked() -> Iterator[None]:
    """Block Ctrl-C and SIGTERM while workers start: they inherit the mask, so neither can kill a
    worker half-way through start-up (a traceback on the terminal) or be swallowed by the parent's
    handlers that a child keeps between fork and exec. Signals that arrive meanwhile wait, not vanish."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, START_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def start_workers(count: int, progress: Any) -> list[Worker]:
    context = multiprocessing.get_context("spawn")
    workers: list[Worker] = []
    resource_tracker.ensure_running()  # started later, it would unblock the signals below for itself
    with few_malloc_arenas(), signals_blocked():
        for slot in range(count):
            conn, child_conn = context.Pipe()
            process = context.Process(target=_serve, args=(child_conn, progress, slot, os.getpid()),
                                      name=f"pack-worker-{slot}", daemon=True)
            process.start()
            child_conn.close()
            workers.append(Worker(process, conn))
    return workers


def died(out: Output, plan: Plan, worker: Worker) -> PackError:
    """The error for a busy worker that exited (or closed its pipe) without answering."""
    assert worker.shard is not None
    worker.process.join(0)
    code = worker.process.exitcode
    how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
           else f"exit code {code}" if code is not None else "pipe closed")
    return PackError(
        f"{out}: the worker packing {shard_file_name(plan, worker.shard)} (pid {worker.process.pid}) died "
        f"before finishing it ({how}; out of memory?); finished shards are kept: rerun the same command to resume"
    )


def collect(out: Output, plan: Plan, worker: Worker) -> ShardResult:
    """Take a busy worker's answer: the shard is packed (staged, for a remote OUT), or its error is raised here."""
    try:
        error, trace, result = worker.conn.recv()
    except (EOFError, OSError):
        raise died(out, plan, worker) from None
    worker.shard = None
    if error is not None:
        if isinstance(error, PackError):
            raise error
        raise error from RemoteTraceback(trace)
    return result


def stop_workers(workers: list[Worker]) -> None:
    """Idle workers are told to exit, busy ones killed (their shard is packed again on rerun).

    SIGKILL, not SIGTERM: it also ends a stopped worker, and one whose SIGTERM is caught or blocked.
    Nothing here waits longer than STOP_SECONDS, even for a process the kernel cannot kill yet.
    """
    for worker in workers:
        if worker.shard is None:
            try:
                worker.conn.send(None)
            except OSError:
                worker.process.kill()
        else:
            worker.process.kill()
    deadline = time.monotonic() + STOP_SECONDS
    for worker in workers:
        worker.process.join(max(0.0, deadline - time.monotonic()))
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(1.0)
            if worker.process.is_alive():
                log.warning("worker pid %d did not exit after SIGKILL (uninterruptible I/O?); not waiting for it",
                            worker.process.pid)
        worker.conn.close()


def run_local(out: Output, plan: Plan, shards: list[int], *, workers: int, scheduler: str | None = None,
              progress: Callable[[int], None] | None = None, policy: ErrorPolicy = ErrorPolicy()) -> None:
    """Pack `shards` in `workers` processes (in this one for a single worker or shard).

    Where the output can (a bucket), the workers only stage their shards: this process commits
    them in the background (`out.commits()`, uploads) while the workers go on packing, and holds
    back new shards while its budget of commits in flight is full.
    """
    del scheduler
    uploads = out.commits()
    try:
        if workers <= 1 or len(shards) <= 1:
            for shard in shards:
                result = run_shard(out, plan, shard, progress=progress, policy=policy, upload=False)
                if uploads.full():
                    uploads.reap(block=True)
                uploads.submit(result)
        else:
            run_workers(out, plan, shards, workers, progress, policy, uploads)
        uploads.finish()
    finally:
        uploads.close()


def run_workers(out: Output, plan: Plan, shards: list[int], workers: int,
                progress: Callable[[int], None] | None, policy: ErrorPolicy, uploads: Commits) -> None:
    count = min(workers, len(shards))
    done_samples = multiprocessing.get_context("spawn").Array("q", count, lock=False)
    pool = start_workers(count, done_samples)
    pending = deque(shards)
    reported = 0
    try:
        while True:
            for worker in pool:
                if worker.shard is None and pending and not uploads.full():
                    worker.shard = pending.popleft()
                    try:
                        worker.conn.send((out, plan, worker.shard, policy))
                    except OSError:
                        raise died(out, plan, worker) from None
            busy = [worker for worker in pool if worker.shard is not None]
            if not busy and not uploads.running:
                break
            waited: list[Any] = [worker.conn for worker in busy] + [worker.process.sentinel for worker in busy]
            ready = wait(waited + uploads.waits(), timeout=POLL_SECONDS)
            for worker in busy:
                if worker.conn in ready or worker.conn.poll():
                    uploads.submit(collect(out, plan, worker))
                elif worker.process.sentinel in ready:
                    raise died(out, plan, worker)
            uploads.reap()
            if progress:
                current = sum(done_samples)
                progress(current - reported)
                reported = current
    finally:
        stop_workers(pool)
