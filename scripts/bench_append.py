"""Appending costs what packing costs (issue 30): `pack FORMAT NEW OUT --append` against `pack FORMAT NEW
EMPTY_OUT` for the same N files, where OUT already holds 1x and 10x N samples, same run.

NEW is N small distinct JPEGs; OUT's existing samples are a hard-link farm of other JPEGs (so a
10x OUT costs little disk), packed once into a template; every round appends to a fresh copy of
the template made with hard links (`cp -al`: an append never writes an old file, it replaces
index.json, rejects.jsonl and the descriptors by rename). Rounds are interleaved (the order of the
three runs rotates), the page cache warm for all (each run reads the same NEW). Reported: medians
of wall seconds and of CPU seconds (the pack process and its workers), and append / pack ratios.
Goal: ~1.0, the same for 1x and 10x (the cost does not grow with what OUT holds).

    python scripts/bench_append.py                          # N=2000, lmdb and wds, 5 rounds
    python scripts/bench_append.py --files 5000 --formats lmdb --rounds 7 --pack-args "--workers 1"
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import benchlib
from bench_pack import copies, jpeg_pool

SIZES = (1, 10)


def small_source(root: Path, count: int, seed: int) -> Path:
    """`count` distinct 160x120 JPEGs (~10 KB) in 100 class folders."""
    return benchlib.make_source(root, count, copies(jpeg_pool(64, seed, width=160, height=120), seed), classes=100,
                                recipe={"images": "jpeg_pool 160x120", "seed": seed})


def link_farm(root: Path, pool: Path, copies_wanted: int) -> Path:
    """`copies_wanted` x the files of `pool`, as hard links under new names (other samples, no new bytes)."""
    marker = root / benchlib.SOURCE_MARKER
    if marker.exists() and marker.read_text() == f"{pool} x{copies_wanted}":
        return root
    shutil.rmtree(root, ignore_errors=True)
    files = sorted(path for path in pool.rglob("*.JPEG"))
    for copy in range(copies_wanted):
        for path in files:
            target = root / path.parent.name / f"c{copy:03d}_{path.name}"
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, target)
    marker.write_text(f"{pool} x{copies_wanted}")
    return root


def pack_args(fmt: str, src: Path, out: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "packer.cli", fmt, str(src), str(out), "--quiet", *extra]


def timed(command: list[str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system of the command and every process it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode:
        sys.exit(f"failed: {' '.join(command)}\n{result.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bench_format(fmt: str, work: Path, new: Path, bases: dict[int, Path], rounds: int, extra: list[str]) -> None:
    templates = {}
    for size, base in bases.items():
        templates[size] = work / f"template-{fmt}-{base.name}"  # base-N-Kx: one template per N and size
        if not (templates[size] / "index.json").exists():
            shutil.rmtree(templates[size], ignore_errors=True)
            subprocess.run(pack_args(fmt, base, templates[size], extra), check=True, stdout=subprocess.DEVNULL)
    runs: dict[str, list[tuple[float, float]]] = {"pack": [], **{f"append {size}x": [] for size in bases}}
    for round_number in range(rounds):
        names = list(runs)
        names = names[round_number % len(names):] + names[:round_number % len(names)]
        for name in names:
            out = work / f"out-{fmt}"
            shutil.rmtree(out, ignore_errors=True)
            if name == "pack":
                command = pack_args(fmt, new, out, extra)
            else:
                subprocess.run(["cp", "-al", str(templates[int(name.split()[1][:-1])]), str(out)], check=True)
                command = pack_args(fmt, new, out, [*extra, "--append"])
            runs[name].append(timed(command))
    wall = {name: statistics.median(w for w, _ in values) for name, values in runs.items()}
    cpu = {name: statistics.median(c for _, c in values) for name, values in runs.items()}
    for name in runs:
        ratio = "" if name == "pack" else \
            f"   append/pack: wall {wall[name] / wall['pack']:.2f}x, cpu {cpu[name] / cpu['pack']:.2f}x"
        print(f"{fmt:5} {name:11} wall {wall[name]:6.2f}s  cpu {cpu[name]:6.2f}s{ratio}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=2000, help="N, the files appended (and packed)")
    parser.add_argument("--formats", default="lmdb,wds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shard-size", type=int, default=100, help="so that OUT holds many shards (10x: 200)")
    parser.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "pack-bench-append")
    parser.add_argument("--pack-args", default="", help="extra arguments for every pack, e.g. '--workers 1'")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    new = small_source(args.work / f"new-{args.files}", args.files, seed=1)
    pool = small_source(args.work / f"pool-{args.files}", args.files, seed=2)
    bases = {size: link_farm(args.work / f"base-{args.files}-{size}x", pool, size) for size in SIZES}
    extra = ["--shard-size", str(args.shard_size), *args.pack_args.split()]
    print(f"N={args.files} files appended to OUT holding {', '.join(f'{s}x' for s in SIZES)} N; "
          f"{args.rounds} interleaved rounds, medians; pack args: {' '.join(extra)}", flush=True)
    for fmt in args.formats.split(","):
        bench_format(fmt, args.work, new, bases, args.rounds, extra)


if __name__ == "__main__":
    main()
