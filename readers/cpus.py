"""How many CPUs this process may use: shared by the packer's workers and the loader's."""

from __future__ import annotations

import os


def available_cpus() -> int:
    """The affinity mask, bounded by Slurm's per-task allocation; never just `os.cpu_count()`,
    which on a cluster node counts cores the job does not own."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        cpus = min(cpus, int(slurm))
    return cpus
