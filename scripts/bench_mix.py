#!/usr/bin/env python3
"""What reading a mix costs (issue 30): the same images packed as one dataset and as two halves,
read by the same loader, one dataset against `readers.mix` of the halves.

    .venv/bin/python scripts/bench_mix.py [--images 10000] [--formats lmdb,hdf5,wds] [--work DIR]

1. The source: --images seeded small photo-like JPEGs (285x214, ~33 KB; bench_read.py's
   `small_jpeg`) in WORK/src (kept and reused when --work is given).
2. Each format packs it into WORK/one-FMT in shards of --shard-size (1,000) samples, and splits
   that into two datasets of half its shards each, WORK/half-a-FMT and WORK/half-b-FMT (copies of
   its shard files, an index.json each): the mix reads the very bytes one dataset reads. (Packing each half of the folder instead gave halves that read 4-7% slower than the
   one pack in one process (HDF5, wds), HDF5's 5% slower even read without the mix: a difference
   of layout that would hide what mixing itself costs.)
3. Cases per format, map-style and streaming: "one" (the whole dataset), "mix" (`readers.mix` of
   the halves, no weights: every sample once per epoch, the same data) and "mix+source" (the same
   with the `source` field). Each reads decode="bytes", fields image and label, batches of
   --batch-size, --workers workers: one epoch to start the workers and warm the page cache, then
   --epochs (2) timed epochs. Rates are samples per second and samples per CPU-second (user +
   system of this process and its DataLoader workers, from /proc), which other load on the
   machine changes less. The cases run in --rounds (7) rounds, the three cases of a format and
   loader one after another, each going first in turn; a case's ratio is the median over rounds
   of its rate / the one dataset's rate in the same round (the range of them follows). Goal: mix /
   one >= 0.95 in samples per CPU-second.
4. The per-sample cost of mixing alone: `__getitems__` of the one dataset and of the mix (what a
   map-style worker calls per batch) on the same random batches, read in turn batch by batch
   in one thread, CPU time of that thread (`time.thread_time`): drift in the machine's load,
   which moves the loader rates above by +-20% from round to round here, hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import benchlib
import numpy as np
from bench_read import cpu_seconds, make_source, small_jpeg

import readers
from packer.run.pipeline import pack
from packer.plan.options import PackOptions
from packer.write.writers import WRITERS

GOAL = 0.95
FIELDS = ("image", "label")


def split(one: Path, halves: tuple[Path, Path]) -> tuple[Path, Path]:
    """The packed dataset `one` as two datasets of half its shards each: copies of its shard files
    (and sidecars; not hard links, which py-lmdb would refuse to open beside the originals in one
    process), each half's index.json listing its shards. The halves read the same bytes `one`
    reads, so whatever differs is the mix's cost, not two packs' layouts."""
    manifest = json.loads((one / "index.json").read_text())
    shards = manifest["shards"]
    parts = (shards[:len(shards) // 2], shards[len(shards) // 2:])
    for half, part in zip(halves, parts):
        if (half / "index.json").exists():
            continue
        half.mkdir(parents=True, exist_ok=True)
        for shard in part:
            for name in (shard["name"], *(sidecar["name"] for sidecar in shard.get("sidecars", []))):
                shutil.copyfile(one / name, half / name)
        subset = {**manifest, "shards": part, "num_samples": sum(shard["num_samples"] for shard in part),
                  "class_counts": [], "descriptors": []}
        (half / "index.json").write_text(json.dumps(subset))
    return halves


def packed(src: Path, out: Path, fmt: str, shard_size: int) -> Path:
    if not (out / "index.json").exists():
        pack(src, out, PackOptions(format=fmt, shard_size=shard_size))
    return out


def timed_epochs(dataset: Any, args: argparse.Namespace, streaming: bool) -> tuple[float, float]:
    """(samples per second, samples per CPU-second) of epochs 1..--epochs of a fresh loader."""
    before = set(benchlib.children(os.getpid()))
    loader = readers.make_loader(dataset, args.batch_size, num_workers=args.workers, seed=0, streaming=streaming)
    for _ in loader:  # starts the (persistent) workers, warms the page cache
        pass
    pids = sorted(set(benchlib.children(os.getpid())) - before)
    cpu = time.process_time() + cpu_seconds(pids)
    started = time.perf_counter()
    count = 0
    for epoch in range(1, args.epochs + 1):
        loader.set_epoch(epoch)
        count += sum(len(batch[1]) for batch in loader)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() + cpu_seconds(pids) - cpu
    del loader
    dataset.close()  # with --workers 0 this process opened the shards: py-lmdb opens a file once per process
    return count / elapsed, count / cpu


def batch_costs(one: Any, mixed: Any, args: argparse.Namespace) -> tuple[float, float]:
    """Microseconds of CPU per sample of `one.__getitems__` and `mixed.__getitems__` (what a
    map-style worker calls per batch), the same random batches of both read in turn, batch by
    batch, each first every other time, in this thread: the load on the machine hits both alike."""
    rng = np.random.default_rng(0)
    spent = [0.0, 0.0]
    count = 0
    for epoch in range(args.epochs + 1):  # the first warms up
        order = rng.permutation(len(one))
        for number, first in enumerate(range(0, len(order), args.batch_size)):
            batch = order[first:first + args.batch_size].tolist()
            for which in ((0, 1) if number % 2 else (1, 0)):
                started = time.thread_time()
                (one, mixed)[which].__getitems__(batch)
                if epoch:
                    spent[which] += time.thread_time() - started
            count += len(batch) if epoch else 0
    return spent[0] / count * 1e6, spent[1] / count * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--formats", default=",".join(WRITERS), help="comma-separated, from the writer registry")
    parser.add_argument("--work", type=Path, help="where to keep generated and packed data (default: a temp dir)")
    parser.add_argument("--shard-size", type=int, default=1000, help="samples per shard (both packs)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds of every case; medians reported")
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per case and round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        work = args.work or Path(temporary)
        src = work / "src"
        make_source(src, args.images, classes=args.classes, image=small_jpeg)
        groups: dict[tuple[str, str], dict[str, Callable[[], Any]]] = {}
        for fmt in args.formats.split(","):
            one = packed(src, work / f"one-{fmt}", fmt, args.shard_size)
            a, b = split(one, (work / f"half-a-{fmt}", work / f"half-b-{fmt}"))

            def opened(path: Path) -> readers.PackedDataset:
                return readers.open_dataset(path, decode="bytes", fields=FIELDS)

            for loader in ("map-style", "streaming"):
                groups[fmt, loader] = {
                    "one": lambda one=one: opened(one),
                    "mix": lambda a=a, b=b: readers.mix([opened(a), opened(b)]),
                    "mix+source": lambda a=a, b=b: readers.mix([opened(a), opened(b)], fields=(*FIELDS, "source")),
                }
        rates: dict[tuple[str, str, str], list[tuple[float, float]]] = {
            (*group, name): [] for group, cases in groups.items() for name in cases}
        for number in range(args.rounds):
            for (fmt, loader), cases in groups.items():
                names = list(cases)
                for name in names[number % len(names):] + names[:number % len(names)]:  # each goes first in turn
                    rates[fmt, loader, name].append(timed_epochs(cases[name](), args, loader == "streaming"))
            print(f"round {number + 1}/{args.rounds} done", file=sys.stderr)
        costs = {}
        for fmt in args.formats.split(","):
            one_pack, halves = work / f"one-{fmt}", (work / f"half-a-{fmt}", work / f"half-b-{fmt}")
            costs[fmt] = batch_costs(readers.open_dataset(one_pack, decode="bytes", fields=FIELDS),
                                     readers.mix([readers.open_dataset(half, decode="bytes", fields=FIELDS)
                                                  for half in halves]), args)
    print(f"{args.images} JPEGs of ~33 KB in shards of {args.shard_size}, split in two datasets of half the shards; "
          f"{args.workers} workers, batches of {args.batch_size}, decode=bytes; {args.epochs} timed epochs per "
          f"case and round; medians of {args.rounds} rounds")
    print(f"{'format':7s} {'loader':10s} {'case':11s} {'samples/s':>10s} {'samples/CPU-s':>14s} "
          f"{'vs one (CPU)':>13s} {'rounds':>12s}")
    passed = True
    for (fmt, loader, name), values in rates.items():
        wall = statistics.median(value[0] for value in values)
        cpu = statistics.median(value[1] for value in values)
        # Each round's rate against the one dataset's in the same round: drift in the machine's load cancels.
        ratios = [value[1] / base[1] for value, base in zip(values, rates[fmt, loader, "one"])]
        ratio = statistics.median(ratios)
        verdict = "" if name == "one" else ("  ok" if ratio >= GOAL else f"  below {GOAL}")
        passed &= name == "one" or ratio >= GOAL
        print(f"{fmt:7s} {loader:10s} {name:11s} {wall:10.0f} {cpu:14.0f} {ratio:13.3f} "
              f"{min(ratios):5.2f}-{max(ratios):4.2f}{verdict}")
    print(f"\nCPU per sample of a batch read (__getitems__, one process, the same batches in turn, "
          f"{args.epochs} epochs):")
    print(f"{'format':7s} {'one (us)':>9s} {'mix (us)':>9s} {'one / mix':>10s}")
    for fmt, (one_cost, mix_cost) in costs.items():
        print(f"{fmt:7s} {one_cost:9.2f} {mix_cost:9.2f} {one_cost / mix_cost:10.3f}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
