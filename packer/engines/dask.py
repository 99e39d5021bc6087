"""Run shard tasks on a Dask distributed cluster: one task per shard, retried on failure.

Every worker must see SRC and OUT at the same paths (a shared filesystem, or URLs) and have `pack`
installed. Shard tasks are idempotent, so a retry or a duplicate run writes the same files.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from ..errors import PackError
from ..write.shard import run_shard
from ..plan.plan import Plan
from ..stores.output import Output
from ..write.validate import ErrorPolicy

log = logging.getLogger(__name__)
RETRIES = 2


def _run(out: Output, plan: Plan, shard: int, policy: ErrorPolicy) -> int:
    result = run_shard(out, plan, shard, policy=policy)
    return result.num_samples + len(result.rejects)


def _client(scheduler: str | None, workers: int) -> tuple[Any, Any]:
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise PackError("--engine dask needs Dask: pip install 'pack[dask]'") from None
    if scheduler in (None, "local"):
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               dashboard_address=":0", silence_logs=logging.WARNING)
        return Client(cluster), cluster
    try:
        return Client(scheduler, timeout="30s"), None
    except OSError as exc:
        raise PackError(f"{scheduler}: cannot reach the Dask scheduler ({exc})") from None


def run_dask(out: Output, plan: Plan, shards: list[int], *, workers: int, scheduler: str | None,
             progress: Callable[[int], None] | None = None, policy: ErrorPolicy = ErrorPolicy()) -> None:
    if not shards:
        return
    from dask.distributed import as_completed

    client, cluster = _client(scheduler, min(workers, len(shards)))
    try:
        futures = [
            client.submit(_run, out.portable(), plan, shard, policy,
                          retries=RETRIES, pure=False,
                          key=f"pack-{plan.fingerprint[:12]}-shard-{shard:06d}")
            for shard in shards
        ]
        for future in as_completed(futures):
            done = future.result()
            if progress:
                progress(done)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
