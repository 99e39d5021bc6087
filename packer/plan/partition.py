"""Which shards one task of a batch job owns: shard k belongs to task k mod N.

The task index and count come from flags, or from the scheduler's environment: PACK_TASK_INDEX /
PACK_TASK_COUNT, Slurm job arrays (SLURM_ARRAY_TASK_ID relative to _MIN in steps of _STEP, with
_COUNT tasks) or Kubernetes indexed jobs (JOB_COMPLETION_INDEX, count from --task-count).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from ..errors import PackError


@dataclass(frozen=True)
class Partition:
    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1:
            raise PackError(f"task count must be at least 1, not {self.count}")
        if not 0 <= self.index < self.count:
            raise PackError(f"task index {self.index} is outside 0..{self.count - 1}")

    @property
    def is_whole(self) -> bool:
        return self.count == 1

    def shards(self, num_shards: int) -> list[int]:
        return list(range(self.index, num_shards, self.count))


def _int(env: Mapping[str, str], name: str) -> int:
    value = env[name]
    try:
        return int(value)
    except ValueError:
        raise PackError(f"${name}={value!r} is not an integer") from None


def _slurm(env: Mapping[str, str]) -> tuple[int, int] | None:
    if "SLURM_ARRAY_TASK_ID" not in env:
        return None
    task_id = _int(env, "SLURM_ARRAY_TASK_ID")
    low = _int(env, "SLURM_ARRAY_TASK_MIN") if "SLURM_ARRAY_TASK_MIN" in env else 0
    step = _int(env, "SLURM_ARRAY_TASK_STEP") if "SLURM_ARRAY_TASK_STEP" in env else 1
    if "SLURM_ARRAY_TASK_COUNT" not in env:
        raise PackError("$SLURM_ARRAY_TASK_ID is set but $SLURM_ARRAY_TASK_COUNT is not")
    count = _int(env, "SLURM_ARRAY_TASK_COUNT")
    offset = task_id - low
    if step < 1 or offset % step:
        raise PackError(f"Slurm array task {task_id} is not on the grid {low}:{step}")
    return offset // step, count


def resolve_partition(index: int | None, count: int | None, env: Mapping[str, str] | None = None) -> Partition:
    """Flags win; then PACK_TASK_*, Slurm arrays, Kubernetes indexed jobs; else one task does all."""
    env = os.environ if env is None else env
    if (index is None) != (count is None) and "JOB_COMPLETION_INDEX" not in env:
        raise PackError("--task-index and --task-count go together: give both or neither")
    if index is not None and count is not None:
        return Partition(index, count)
    if ("PACK_TASK_INDEX" in env) != ("PACK_TASK_COUNT" in env):
        raise PackError("$PACK_TASK_INDEX and $PACK_TASK_COUNT go together: set both or neither")
    if "PACK_TASK_INDEX" in env:
        return Partition(_int(env, "PACK_TASK_INDEX"), _int(env, "PACK_TASK_COUNT"))
    slurm = _slurm(env)
    if slurm is not None:
        return Partition(*slurm)
    if "JOB_COMPLETION_INDEX" in env:
        if count is None:
            raise PackError("$JOB_COMPLETION_INDEX is set: give the job's completions as --task-count")
        return Partition(_int(env, "JOB_COMPLETION_INDEX"), count)
    return Partition()
