"""Where shard tasks run. An engine takes the shards still to pack and runs `run_shard` on each:
`local` in processes of this machine, `dask` on a Dask cluster; `slurm` writes the script of a
Slurm array whose tasks each pack their share of the shards, then merge.

Registered like the writers: name -> "module:function", imported when chosen (Dask only then).
"""

from __future__ import annotations

from typing import Callable, Protocol

from readers.formats import Registry

from ..errors import PackError
from ..stores.output import Output
from ..plan.plan import Plan
from ..write.validate import ErrorPolicy


class Engine(Protocol):
    def __call__(self, out: Output, plan: Plan, shards: list[int], *, workers: int, scheduler: str | None,
                 progress: Callable[[int], None] | None, policy: ErrorPolicy) -> None: ...


ENGINES: Registry[Engine] = Registry({
    "local": "packer.engines.local:run_local",
    "dask": "packer.engines.dask:run_dask",
})


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise PackError(f"unknown engine {name!r}; choose one of: {', '.join(ENGINES)}") from None
