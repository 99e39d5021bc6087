"""Where shard tasks run. An engine takes the shards still to pack and runs `run_shard` on each."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

from ..errors import PackError
from ..plan import Plan
from ..validate import ErrorPolicy


class Engine(Protocol):
    def __call__(self, out: Path, plan: Plan, shards: list[int], *, workers: int, scheduler: str | None,
                 progress: Callable[[int], None] | None, policy: ErrorPolicy) -> None: ...


def get_engine(name: str) -> Engine:
    if name == "local":
        from .local import run_local

        return run_local
    if name == "dask":
        from .dask import run_dask

        return run_dask
    raise PackError(f"unknown engine {name!r}; choose one of: {', '.join(ENGINES)}")


ENGINES = ("local", "dask")
