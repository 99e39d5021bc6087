"""How many CPUs this process may use: shared by the packer's workers and the loader's."""

from __future__ import annotations

import os

MAX_DEFAULT_WORKERS = 16
"""More workers than this per rank rarely helps and multiplies open handles and memory."""
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
"""What OpenMP, MKL and OpenBLAS read for their thread count; loader workers set them to 1."""


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


def cpus_per_rank() -> int:
    """CPUs this process may use, shared out over the ranks on this node.

    Slurm's per-task allocation and the affinity mask both bound it (never the whole node's
    `os.cpu_count()`); torchrun's LOCAL_WORLD_SIZE ranks on one node split that between them.
    """
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    ranks_here = int(local) if local.isdigit() and int(local) > 0 else 1
    return max(1, available_cpus() // ranks_here)


def default_num_workers() -> int:
    """One worker per CPU of this rank, less one for the training loop itself, at most 16: the
    rule of make_loader's default and the top of `pack bench`'s climb."""
    cpus = cpus_per_rank()
    return min(MAX_DEFAULT_WORKERS, cpus - 1) if cpus > 1 else 0


def default_num_workers_reason() -> str:
    """Why `default_num_workers()` is what it is here, in words, for `pack bench` to say."""
    cpus = cpus_per_rank()
    if cpus == 1:
        return "this rank's one CPU runs the training loop"
    capped = f", at most {MAX_DEFAULT_WORKERS}" if cpus - 1 > MAX_DEFAULT_WORKERS else ""
    return f"this rank's {cpus} CPUs less one for the training loop{capped}"
