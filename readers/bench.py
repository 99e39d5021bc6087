"""Loader throughput on this machine, for `pack bench`: which num_workers to train with.

For each batch size, num_workers climbs 0, 1, 2, 4, ... up to make_loader's default (this rank's
CPUs less one for the training loop: `default_num_workers`, one rule for both) while throughput
keeps rising by at least `min_gain`; the first step that does not gain ends the climb and the best
setting so far is the recommendation. The bench runs no training loop, so it may find fewer
workers fastest than the default; `default_note` says so. Numbers reflect this machine's page
cache as it is: the first settings may pay for cold reads that later ones do not.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .cpus import default_num_workers, default_num_workers_reason
from .datasets import open_dataset
from .loader import make_loader

log = logging.getLogger(__name__)

MIN_GAIN = 0.05


@dataclass(frozen=True)
class BenchResult:
    batch_size: int
    num_workers: int
    samples: int
    seconds: float

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


@dataclass
class BenchReport:
    dataset: str
    decode: str
    results: list[BenchResult]
    recommended: dict[int, BenchResult]
    """Per batch size, the setting the climb stopped at."""
    untried: dict[int, list[int]]
    """Per batch size, the worker counts the climb stopped before (the last one measured gained too little)."""
    read: str
    """How the dataset was read, and why (`ShardFiles.strategy`)."""

    @property
    def best(self) -> BenchResult:
        return max(self.recommended.values(), key=lambda result: result.samples_per_second)


def worker_ladder(max_workers: int) -> list[int]:
    """0, 1, 2, 4, 8, ... up to and including max_workers."""
    counts = [0]
    step = 1
    while step < max_workers:
        counts.append(step)
        step *= 2
    if max_workers > 0:
        counts.append(max_workers)
    return counts


def climb(measure: Callable[[int], BenchResult], counts: Sequence[int], min_gain: float = MIN_GAIN
          ) -> tuple[list[BenchResult], BenchResult]:
    """Measure worker counts in order until one fails to beat the best by `min_gain`."""
    results: list[BenchResult] = []
    best: BenchResult | None = None
    for count in counts:
        result = measure(count)
        results.append(result)
        if best is not None and result.samples_per_second < best.samples_per_second * (1 + min_gain):
            break
        best = result
    if best is None:
        raise ValueError("no worker counts to measure")
    return results, best


def keep_list(batch: list[Any]) -> list[Any]:
    """Collate that keeps samples as a list: images of different sizes cannot be stacked."""
    return batch


def measure_loader(dataset: Any, batch_size: int, num_workers: int, *, seconds: float, max_samples: int
                   ) -> BenchResult:
    """Samples/s of a shuffled make_loader pass, after the first batch (worker start-up) is out."""
    loader = make_loader(dataset, batch_size, num_workers=num_workers, collate_fn=keep_list,
                         pin_memory=False, persistent_workers=False)
    samples = 0
    started = 0.0
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        for batch in loader:
            if not started:
                started = time.perf_counter()
                continue
            samples += len(batch)
            if samples >= max_samples or time.perf_counter() - started >= seconds:
                return BenchResult(batch_size, num_workers, samples, time.perf_counter() - started)
        epoch += 1
        if epoch > 1 and samples == 0:  # fewer than two batches in the whole dataset
            return BenchResult(batch_size, num_workers, samples, time.perf_counter() - started)


def bench_loader(
    path: str | os.PathLike[str],
    *,
    batch_sizes: Sequence[int] = (32, 128),
    max_workers: int | None = None,
    decode: str = "tensor",
    seconds: float = 3.0,
    max_samples: int = 20_000,
    on_result: Callable[[BenchResult], None] | None = None,
) -> BenchReport:
    """Measure the packed dataset at `path` and recommend num_workers per batch size; the climb
    goes up to make_loader's default unless `max_workers` says otherwise."""
    dataset = open_dataset(path, decode=decode, fields=("image", "label"))
    counts = worker_ladder(default_num_workers() if max_workers is None else max_workers)
    results: list[BenchResult] = []
    recommended: dict[int, BenchResult] = {}
    untried: dict[int, list[int]] = {}

    def measure(batch_size: int, count: int) -> BenchResult:
        result = measure_loader(dataset, batch_size, count, seconds=seconds, max_samples=max_samples)
        log.info("batch %d, %d workers: %.0f samples/s", batch_size, count, result.samples_per_second)
        if on_result is not None:
            on_result(result)
        return result

    for batch_size in batch_sizes:
        measured, best = climb(lambda count: measure(batch_size, count), counts)
        results += measured
        recommended[batch_size] = best
        untried[batch_size] = counts[len(measured):]
    return BenchReport(dataset=str(path), decode=decode, results=results, recommended=recommended, untried=untried,
                       read=dataset.files.strategy)


def default_note(recommended: int) -> str:
    """How a recommended num_workers stands to make_loader's default here, and why they differ."""
    default = default_num_workers()
    reason = default_num_workers_reason()
    if recommended == default:
        return f"make_loader's default here is the same: num_workers={default} ({reason})"
    if recommended < default:
        return (f"make_loader's default here is num_workers={default} ({reason}); bench ran no training loop: "
                f"measured alone, reading was fastest with {recommended}, so pass num_workers={recommended} if your "
                "loop leaves the CPU idle")
    return (f"make_loader's default here is num_workers={default} ({reason}); --max-workers let bench climb past it: "
            f"pass num_workers={recommended} to make_loader if your loop leaves CPUs idle")
