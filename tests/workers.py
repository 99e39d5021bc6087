"""Hold a `pack` process's shard workers still, to force an interleaving instead of waiting for it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def children(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def is_shard_worker(pid: int) -> bool:
    """A spawned shard worker (not the resource tracker that multiprocessing also starts)."""
    try:
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def stop_workers_as_they_start(process: subprocess.Popen, count: int, timeout: float = 60) -> list[int]:
    """SIGSTOP the first `count` shard workers of `process` as soon as each appears.

    A spawned worker spends a few hundred milliseconds starting Python and importing the
    packer before it can touch a shard; polling every millisecond stops it long before that.
    """
    stopped: list[int] = []
    deadline = time.monotonic() + timeout
    while len(stopped) < count:
        assert time.monotonic() < deadline and process.poll() is None, "the shard workers never started"
        for pid in children(process.pid):
            if pid not in stopped and is_shard_worker(pid):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        time.sleep(0.001)
    return stopped


def signal_all(pids: list[int], signum: int) -> None:
    """Send `signum` to each process still there (SIGSTOP / SIGCONT to hold and release, SIGKILL)."""
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
