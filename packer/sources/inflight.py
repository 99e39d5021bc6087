"""Calls that wait on storage, many in flight once they are measured to wait.

On a networked filesystem (NFS, Lustre, GPFS, a FUSE mount) every stat, open, listing and read is
a round trip to a server, and a sequential walk of 100k files pays 100k of them one after
another. Those calls release the GIL, so threads overlap them: throughput is the number in
flight over the round trip. On a local disk with warm caches the same calls take microseconds
and a thread pool would only add its overhead, so the first calls run in the caller's thread and
are timed; calls that answer slower than ROUND_TRIP_SECONDS (the median) are waiting on storage,
and from then on they go to MOST_IN_FLIGHT threads. The measurement, not a guess at the
filesystem type, makes the choice, so it works wherever the mount is not recognised.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Sequence, TypeVar

log = logging.getLogger(__name__)

ROUND_TRIP_SECONDS = 100e-6
"""Calls slower than this on average wait on storage (a network round trip, a cold disk), not on
the CPU: a stat of a cached local file takes a few microseconds, one through FUSE or NFS 0.1-5 ms."""
PROBE_CALLS = 32
"""Calls timed in the caller's thread before deciding on their median: calls preempted on a busy
machine do not decide."""
MOST_IN_FLIGHT = 64
"""Threads, so calls in flight, once calls wait on storage: enough to cover a few milliseconds of
round trip at thousands of calls a second, and what NFS clients keep in flight per mount."""

T = TypeVar("T")
R = TypeVar("R")


class InFlight:
    """Runs batches of calls in order: in the caller's thread until PROBE_CALLS of them have been
    timed, then, if they waited on storage (`concurrent`), in chunks on up to `threads` threads.
    `concurrent=True` skips the measurement. Use it as a context manager (it owns the threads)."""

    def __init__(self, *, threads: int = MOST_IN_FLIGHT, concurrent: bool | None = None, what: str = "calls") -> None:
        self.threads = threads
        self.concurrent = concurrent
        self._what = what
        self._timings: list[float] = []
        self._pool: ThreadPoolExecutor | None = None

    @property
    def deciding(self) -> bool:
        return self.concurrent is None

    def timed(self, calls: int, seconds: float) -> None:
        """Count `calls` that took `seconds` together (each the same); decide once there are enough."""
        if self.concurrent is not None or not calls:
            return
        self._timings += [seconds / calls] * calls
        if len(self._timings) >= PROBE_CALLS:
            self.decide()

    def decide(self) -> None:
        """Decide now, on the calls timed so far (fewer than PROBE_CALLS where the caller cannot wait)."""
        if self.concurrent is not None or not self._timings:
            return
        each = statistics.median(self._timings)
        self.concurrent = each > ROUND_TRIP_SECONDS
        if self.concurrent:
            log.info("%s take %.2f ms each (storage latency): up to %d in flight", self._what, each * 1000,
                     self.threads)

    def submit(self, fn: Callable[..., T], *args: object) -> Future[T]:
        """Run `fn(*args)` on the pool (started on first use)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="pack-io")
        return self._pool.submit(fn, *args)

    def submit_chunks(self, call: Callable[[T], R], items: Sequence[T], parts: int | None = None
                      ) -> list[Future[list[R]]]:
        """`call` on every item, in up to `parts` (default: `threads`) tasks of consecutive items on
        the pool, each making its calls one after another; each future gives its chunk's results."""
        size = max(1, math.ceil(len(items) / (parts or self.threads)))
        return [self.submit(_call_each, call, items[start:start + size]) for start in range(0, len(items), size)]

    def probe(self, call: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """While deciding, `call` on the first items (as many as the decision still needs), here,
        timed; their results. None once decided."""
        if not self.deciding:
            return []
        results = []
        for item in items[:max(1, PROBE_CALLS - len(self._timings))]:
            started = time.perf_counter()
            results.append(call(item))
            self.timed(1, time.perf_counter() - started)
        return results

    def map(self, call: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """`call` on every item, results in order: the first in this thread while deciding (timed),
        the rest on the pool if the calls wait on storage."""
        results = self.probe(call, items)
        rest = items[len(results):]
        if not self.concurrent or len(rest) <= 1:
            return results + [call(item) for item in rest]
        for chunk in self.submit_chunks(call, rest):
            results += chunk.result()
        return results

    def close(self) -> None:
        """Wait for the calls still running and stop the threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> InFlight:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _call_each(call: Callable[[T], R], items: Sequence[T]) -> list[R]:
    return [call(item) for item in items]
