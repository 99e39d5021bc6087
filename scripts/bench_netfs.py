#!/usr/bin/env python3
"""Packing, planning and reading on network storage (issue 38), through scripts/latencyfs.py.

Every measurement gets a fresh latencyfs mount (cold: a new mount caches nothing) that adds
--latency-ms to every metadata call and read; latencies run side by side in one run, the names in
interleaved rounds, medians of --repeat. Needs /dev/fuse, fusermount3 and mfusepy
(apt-get install fuse3; pip install mfusepy).

1. Packing: `--files` ~33 KB JPEGs in `--classes` folders (generated under WORK once, reused), on
   the mount, packed to local disk by `pack FORMAT` (the CLI, its defaults) for every format,
   against `tar cf` and the parallel copy a user reaches for (`find | xargs -P 16 cp`).
2. Planning alone: `--plan-files` tiny files in 1,000 class folders (hard links, almost no disk;
   1000000 when asked), `pack plan` (listing, stat of every file, the shard plan) against
   `find -type f` (listing), `find -printf %s` (listing + stat of every file) and the list piped
   to 64 `stat`s at once (`xargs -P64 stat`: listing, then the stats 64 in flight, what the
   mount itself answers at pack's concurrency).
3. Reading: the same JPEGs packed (locally, `--read-shard-size` samples per shard, so streaming
   workers have shards of their own), placed on the mount; one shuffled epoch through a DataLoader
   of --workers workers, batches of --batch-size, decode="bytes" (no JPEG decoding), timed from
   opening the dataset to the last batch, and to the first batch: the loose files (a plain torch
   Dataset as torchvision's ImageFolder: listing, then open + read per sample; streaming them would
   be the same reads) against each format map-style (`make_loader`) and streaming
   (`make_loader(streaming=True)`), opened with each `--storage` (a row each). `--latency-ms 0`
   shows what the harness itself costs; `--latency-ms local` reads the local disk, no mount.

    python scripts/bench_netfs.py                                # 0.2, 1 and 5 ms; 4000 files
    python scripts/bench_netfs.py --latency-ms 1 --files 2000 --repeat 1 --json netfs.json
    python scripts/bench_netfs.py --parts read --latency-ms local,0.2,1 --storage local,auto
    python scripts/bench_netfs.py --parts plan --plan-files 1000000 --latency-ms 1
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import benchlib
import torch
from bench_pack import copies, jpeg_pool
from bench_scale import link_farm
from latencyfs import missing_requirements, mounted
from torch.utils.data import DataLoader

import readers
from packer.write.writers import WRITERS
from readers.bench import keep_list

PARTS = ("pack", "plan", "read")
STAT_JOBS = 64
"""stat processes of the planning baseline that stats in parallel, as many in flight as pack's walk
keeps (`packer.sources.inflight.MOST_IN_FLIGHT`): what the mount answers at that concurrency."""
DISTINCT_IMAGES = 256


def photo_source(work: Path, files: int, classes: int) -> Path:
    """`files` distinct ~33 KB JPEGs (296x222, downsampled-ImageNet sized) in `classes` folders."""
    def images() -> Iterable[bytes]:  # the pool is only made when the folder is
        yield from copies(jpeg_pool(DISTINCT_IMAGES, 0, 296, 222), 0)

    return benchlib.make_source(work / f"photos-{files}-{classes}", files, images(), classes=classes,
                                recipe={"images": "jpeg_pool-296x222", "seed": 0})


def run_command(cmd: list[str] | str, *, cwd: Path | None = None) -> float:
    """Wall seconds of a command; the benchmark stops with its error output if it fails."""
    started = time.perf_counter()
    done = subprocess.run(cmd, shell=isinstance(cmd, str), cwd=cwd, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {cmd}\n{done.stderr.decode(errors='replace')}")
    return elapsed


def pack_cli(*args: object) -> list[str]:
    return [sys.executable, "-m", "packer.cli", *(str(arg) for arg in args)]


def packing_commands(work: Path, jobs: int, pack_args: list[str]) -> dict[str, Callable[[Path], float]]:
    """name -> a run that reads the mounted folder and writes to local disk under `work`."""
    out = work / "pack-out"

    def fresh() -> Path:
        shutil.rmtree(out, ignore_errors=True)
        return out

    def tar(mount: Path) -> float:
        fresh().mkdir(parents=True)
        return run_command(["tar", "cf", os.fspath(out / "all.tar"), "-C", os.fspath(mount), "."])

    def parallel_copy(mount: Path) -> float:
        fresh().mkdir(parents=True)
        # The folders first: parallel `cp --parents` race to make them.
        return run_command(f"find . -type d -print0 | (cd '{out}' && xargs -0 mkdir -p) && "
                           f"find . -type f -print0 | xargs -0 -P {jobs} -n 64 cp --parents -t '{out}'", cwd=mount)

    def pack(fmt: str) -> Callable[[Path], float]:
        return lambda mount: run_command(pack_cli(fmt, mount, fresh(), "--quiet", *pack_args))

    return {"tar cf": tar, f"cp -P{jobs}": parallel_copy, **{f"pack {fmt}": pack(fmt) for fmt in WRITERS}}


def planning_commands(work: Path) -> dict[str, Callable[[Path], float]]:
    out = work / "plan-out"

    def pack_plan(mount: Path) -> float:
        shutil.rmtree(out, ignore_errors=True)
        return run_command(pack_cli("plan", mount, out, "--format", "wds"))

    return {"find -type f": lambda mount: run_command(f"find '{mount}' -type f > /dev/null"),
            "find -printf %s": lambda mount: run_command(f"find '{mount}' -type f -printf '%s\\n' > /dev/null"),
            f"xargs -P{STAT_JOBS} stat": lambda mount: run_command(
                f"find '{mount}' -type f -print0 | xargs -0 -P {STAT_JOBS} -n 250 stat -c %s > /dev/null"),
            "pack plan": pack_plan}


def epoch(make: Callable[[], tuple[Any, Iterable[Any]]]) -> tuple[float, float]:
    """Seconds to the first batch and to the last of one epoch; `make` opens the dataset and its loader."""
    started = time.perf_counter()
    dataset, loader = make()
    first = None
    for _ in loader:
        if first is None:
            first = time.perf_counter() - started
    total = time.perf_counter() - started
    close = getattr(dataset, "close", None)
    if close is not None:
        close()  # handles left open would keep the mount busy
    del loader, dataset
    gc.collect()
    return first or total, total


def read_cache(work: Path) -> Path:
    """Where a dataset on the mount is copied to (the readers see a network mount); emptied before each run."""
    return work / "read-cache"


def reading_cases(args: argparse.Namespace) -> dict[str, tuple[str, Callable[[Path], tuple[Any, Iterable[Any]]]]]:
    """name -> (what to mount: "loose" or "packed", the dataset and loader over that mount)."""
    def loose(mount: Path) -> tuple[Any, Iterable[Any]]:
        dataset = benchlib.LooseFiles(mount)
        return dataset, DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                                   collate_fn=keep_list, generator=torch.Generator().manual_seed(0))

    def packed(fmt: str, streaming: bool, storage: str | None) -> Callable[[Path], tuple[Any, Iterable[Any]]]:
        def make(mount: Path) -> tuple[Any, Iterable[Any]]:
            chosen = {} if storage is None else {"storage": storage}
            dataset = readers.open_dataset(mount / fmt, decode="bytes", fields=("image", "label"),
                                           cache_dir=read_cache(args.work), **chosen)
            return dataset, readers.make_loader(dataset, args.batch_size, num_workers=args.workers,
                                                collate_fn=keep_list, pin_memory=False, streaming=streaming)
        return make

    cases = {"loose files": ("loose", loose)}
    for fmt in WRITERS:
        for storage in args.storage:
            named = "" if storage is None else f" {storage}"
            cases[f"{fmt} map{named}"] = ("packed", packed(fmt, False, storage))
            cases[f"{fmt} stream{named}"] = ("packed", packed(fmt, True, storage))
    return cases


def pack_for_reading(work: Path, src: Path, shard_size: int) -> Path:
    """Every format packed locally from `src` into one folder, to be placed on the mount."""
    root = work / f"read-{src.name}-{shard_size}"
    for fmt in WRITERS:
        if not (root / fmt / "index.json").exists():
            run_command(pack_cli(fmt, src, root / fmt, "--overwrite", "--quiet", "--shard-size", shard_size))
    return root


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every part at every latency, names interleaved in each round; one row per (part, latency, name)."""
    work = args.work
    src = photo_source(work, args.files, args.classes)
    runs: dict[tuple[str, float, str], list[Any]] = {}
    jobs: list[tuple[str, str, Path, Callable[[Path], Any]]] = []
    if "pack" in args.parts:
        jobs += [("pack", name, src, run) for name, run in
                 packing_commands(work, args.copy_jobs, args.pack_args.split()).items()]
    if "plan" in args.parts:
        farm = link_farm(work, args.plan_files)
        jobs += [("plan", name, farm, run) for name, run in planning_commands(work).items()]
    if "read" in args.parts:
        packed_root = pack_for_reading(work, src, args.read_shard_size)
        for name, (where, make) in reading_cases(args).items():
            mount_src = src if where == "loose" else packed_root
            jobs.append(("read", name, mount_src, lambda mount, make=make: epoch(lambda: make(mount))))
    for round_number in range(args.repeat):
        for latency in args.latency_ms:
            for part, name, mount_src, run in jobs:
                shutil.rmtree(read_cache(work), ignore_errors=True)  # every run starts cold
                if latency is None:  # the local disk itself, no mount (its page cache as it is)
                    result = run(mount_src)
                else:
                    with mounted(mount_src, latency, read_cap_kb=args.read_cap, bandwidth_mbps=args.bandwidth) as mount:
                        result = run(mount)
                runs.setdefault((part, latency, name), []).append(result)
                print(f"  round {round_number + 1}, {column(latency)}, {part}: {name}: {result}", flush=True)
    rows = []
    for (part, latency, name), results in runs.items():
        row: dict[str, Any] = {"part": part, "latency_ms": latency, "name": name}
        if part == "read":
            row["runs"] = [total for _, total in results]
            row["first_batch_runs"] = [first for first, _ in results]
            row["first_batch_s"] = statistics.median(row["first_batch_runs"])
        else:
            row["runs"] = results
        row["seconds"] = statistics.median(row["runs"])
        rows.append(row)
    return rows


def column(latency: float | None) -> str:
    return "local disk" if latency is None else f"{latency:g} ms"


def table(rows: list[dict[str, Any]], latencies: list[float]) -> str:
    """One block per part: median seconds per latency, and the speed-up over the part's baseline."""
    baselines = {"pack": "tar cf", "plan": "find -printf %s", "read": "loose files"}
    titles = {"pack": "packing to local disk: seconds (speed-up over tar cf)",
              "plan": "planning alone: seconds (speed-up over find -printf %s)",
              "read": "one shuffled epoch: seconds, first batch (speed-up over loose files)"}
    cell = {(row["part"], row["latency_ms"], row["name"]): row for row in rows}
    lines = []
    for part in PARTS:
        names = list(dict.fromkeys(row["name"] for row in rows if row["part"] == part))
        if not names:
            continue
        lines += ["", titles[part], f"{'':22s}" + "".join(f"{column(latency):>26s}" for latency in latencies)]
        for name in names:
            texts = []
            for latency in latencies:
                row, base = cell[(part, latency, name)], cell[(part, latency, baselines[part])]
                text = f"{row['seconds']:.2f} s"
                if part == "read":
                    text += f", {row['first_batch_s']:.2f}"
                if name != baselines[part]:
                    text += f" ({base['seconds'] / row['seconds']:.1f}x)"
                texts.append(f"{text:>26s}")
            lines.append(f"{name:22s}" + "".join(texts))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency-ms", default="0.2,1,5",
                        help="comma-separated latencies, each a column; 'local': the local disk, no mount")
    parser.add_argument("--storage", default=None,
                        help="comma-separated open_dataset(storage=...) values, each its own rows (default: its default)")
    parser.add_argument("--files", type=int, default=4000, help="JPEGs for packing and reading")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--plan-files", type=int, default=100_000, help="tiny files of the planning tree")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each cell is their median")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers for reading")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--read-shard-size", type=int, default=500, help="samples per shard of the read datasets")
    parser.add_argument("--copy-jobs", type=int, default=16, help="parallel cp processes of the copy baseline")
    parser.add_argument("--read-cap", type=int, default=None, metavar="KB", help="latencyfs --read-cap")
    parser.add_argument("--bandwidth", type=float, default=None, metavar="MBps", help="latencyfs --bandwidth")
    parser.add_argument("--pack-args", default="", help="extra arguments for pack FORMAT, e.g. '--workers 4'")
    parser.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "pack-netfs")
    parser.add_argument("--json", type=Path, default=None, help="also save the rows, every run included")
    args = parser.parse_args()
    args.latency_ms = [None if value == "local" else float(value) for value in args.latency_ms.split(",")]
    args.storage = [None] if args.storage is None else args.storage.split(",")
    args.parts = args.parts.split(",")
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        sys.exit(f"--parts: unknown {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}")
    why = missing_requirements()
    if why:
        sys.exit(f"bench_netfs: {why}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("bench_netfs: terminated"))  # unmount on the way out
    args.work.mkdir(parents=True, exist_ok=True)
    cpus = len(os.sched_getaffinity(0))
    print(f"latencyfs at {', '.join(column(latency) for latency in args.latency_ms)} per call; {args.files} JPEGs "
          f"in {args.classes} folders; plan tree {args.plan_files} files; {cpus} CPUs, load {os.getloadavg()[0]:.1f}; "
          f"median of {args.repeat}; each run on a fresh (cold) mount", flush=True)
    rows = measure(args)
    print(table(rows, args.latency_ms))
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps({"args": {key: os.fspath(value) if isinstance(value, Path) else value
                                                  for key, value in vars(args).items()},
                                         "cpus": cpus, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
