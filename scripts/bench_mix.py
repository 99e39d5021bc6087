#!/usr/bin/env python3
"""What reading a mix costs (issue 30): the same images packed as one dataset and as two halves,
read by the same loader, one dataset against `readers.mix` of the halves.

    .venv/bin/python scripts/bench_mix.py [--images 10000] [--formats lmdb,hdf5,wds] [--work DIR]

1. The source: --images seeded small photo-like JPEGs (285x214, ~33 KB; bench_read.py's
   `small_jpeg`) in WORK/src (kept and reused when --work is given); WORK/half-a and WORK/half-b
   hold every other image of it (hard links), in the same classes.
2. Each format packs the whole folder into WORK/one-FMT and each half into WORK/a-FMT, WORK/b-FMT,
   in shards of --shard-size (1,000) samples: 10 shards against 5 + 5.
3. Cases per format, map-style and streaming: "one" (the whole dataset), "mix" (`readers.mix` of
   the halves, no weights: every sample once per epoch, the same data) and "mix+source" (the same
   with the `source` field). Each reads decode="bytes", fields image and label, batches of
   --batch-size, --workers workers: one epoch to start the workers and warm the page cache, then
   one timed epoch. Rates are samples per second and samples per CPU-second (user + system of this
   process and its DataLoader workers, from /proc), which other load on the machine changes less.
   The cases run in --rounds interleaved rounds; the medians are reported. Goal: mix / one >= 0.95
   in samples per CPU-second.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import benchlib
from bench_read import cpu_seconds, make_source, small_jpeg

import readers
from packer.pipeline import pack
from packer.plan import PackOptions
from packer.writers import WRITERS

GOAL = 0.95
FIELDS = ("image", "label")


def halves(src: Path, work: Path) -> tuple[Path, Path]:
    """Every other image of `src` (sorted), hard-linked into two folders of the same classes."""
    images = sorted(path for path in src.rglob("*.JPEG"))
    folders = (work / "half-a", work / "half-b")
    for number, path in enumerate(images):
        target = folders[number % 2] / path.relative_to(src)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, target)
    return folders


def packed(src: Path, out: Path, fmt: str, shard_size: int) -> Path:
    if not (out / "index.json").exists():
        pack(src, out, PackOptions(format=fmt, shard_size=shard_size))
    return out


def timed_epoch(dataset: Any, args: argparse.Namespace, streaming: bool) -> tuple[float, float]:
    """(samples per second, samples per CPU-second) of the second epoch of a fresh loader."""
    before = set(benchlib.children(os.getpid()))
    loader = readers.make_loader(dataset, args.batch_size, num_workers=args.workers, seed=0, streaming=streaming)
    for _ in loader:  # starts the (persistent) workers, warms the page cache
        pass
    loader.set_epoch(1)
    pids = sorted(set(benchlib.children(os.getpid())) - before)
    cpu = time.process_time() + cpu_seconds(pids)
    started = time.perf_counter()
    count = sum(len(batch[1]) for batch in loader)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() + cpu_seconds(pids) - cpu
    del loader
    return count / elapsed, count / cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--formats", default=",".join(WRITERS), help="comma-separated, from the writer registry")
    parser.add_argument("--work", type=Path, help="where to keep generated and packed data (default: a temp dir)")
    parser.add_argument("--shard-size", type=int, default=1000, help="samples per shard (both packs)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of every case; medians reported")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        work = args.work or Path(temporary)
        src = work / "src"
        make_source(src, args.images, classes=args.classes, image=small_jpeg)
        half_a, half_b = halves(src, work)
        cases: dict[tuple[str, str, str], Callable[[], Any]] = {}
        for fmt in args.formats.split(","):
            one, a, b = (packed(folder, work / f"{name}-{fmt}", fmt, args.shard_size)
                         for folder, name in ((src, "one"), (half_a, "a"), (half_b, "b")))

            def opened(path: Path) -> readers.PackedDataset:
                return readers.open_dataset(path, decode="bytes", fields=FIELDS)

            for loader in ("map-style", "streaming"):
                cases[fmt, loader, "one"] = lambda one=one: opened(one)
                cases[fmt, loader, "mix"] = lambda a=a, b=b: readers.mix([opened(a), opened(b)])
                cases[fmt, loader, "mix+source"] = lambda a=a, b=b: readers.mix(
                    [opened(a), opened(b)], fields=(*FIELDS, "source"))
        rates: dict[tuple[str, str, str], list[tuple[float, float]]] = {case: [] for case in cases}
        for number in range(args.rounds):
            for case, make in cases.items():
                rates[case].append(timed_epoch(make(), args, case[1] == "streaming"))
            print(f"round {number + 1}/{args.rounds} done", file=sys.stderr)
    print(f"{args.images} JPEGs of ~33 KB in shards of {args.shard_size}, halves of {args.images // 2}; "
          f"{args.workers} workers, batches of "
          f"{args.batch_size}, decode=bytes; medians of {args.rounds} interleaved rounds")
    print(f"{'format':7s} {'loader':10s} {'case':11s} {'samples/s':>10s} {'samples/CPU-s':>14s} {'vs one (CPU)':>13s}")
    passed = True
    for (fmt, loader, name), values in rates.items():
        wall = statistics.median(value[0] for value in values)
        cpu = statistics.median(value[1] for value in values)
        base = statistics.median(value[1] for value in rates[fmt, loader, "one"])
        ratio = cpu / base
        verdict = "" if name == "one" else ("  ok" if ratio >= GOAL else f"  below {GOAL}")
        passed &= name == "one" or ratio >= GOAL
        print(f"{fmt:7s} {loader:10s} {name:11s} {wall:10.0f} {cpu:14.0f} {ratio:13.3f}{verdict}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
