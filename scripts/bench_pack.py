"""Packing speed and memory, against `tar cf` of the same folder in the same run.

For every format in the registry: time `pack FORMAT SRC OUT` (passthrough store) and `tar cf` on
the same folder, each from a cold page cache where this machine lets us drop it, and report the
ratio tar_seconds / pack_seconds plus each run's peak RSS. Goals (issue 5): >= 2x for wds and lmdb,
>= 1.5x for hdf5; peak RSS < 300 MB and not growing with the file count beyond the listing.

    python scripts/bench_pack.py                      # 20k ImageNet-sized JPEGs
    python scripts/bench_pack.py --files 2000 --rss-files 20000,200000
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import benchlib
import numpy as np
from PIL import Image

from packer.writers import WRITERS

GOALS = {"lmdb": 2.0, "wds": 2.0, "hdf5": 1.5}
DISTINCT_IMAGES = 256


def jpeg_pool(count: int, seed: int) -> list[bytes]:
    """Noisy 500x375 JPEGs around ImageNet's average file size (~100 KB)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:375, 0:500]
    pool = []
    for _ in range(count):
        base = np.stack([(x * rng.uniform(0.2, 1) + rng.integers(256)) % 256,
                         (y * rng.uniform(0.2, 1) + rng.integers(256)) % 256,
                         ((x + y) * rng.uniform(0.1, 0.5)) % 256], -1)
        pixels = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
        pool.append(buffer.getvalue())
    return pool


def copies(pool: list[bytes], seed: int) -> Iterator[bytes]:
    """Pool JPEGs in seeded random order, each copy distinct and valid (a COM segment naming its number)."""
    rng = random.Random(seed)
    for index in itertools.count():
        data = pool[rng.randrange(len(pool))]
        comment = b"pack-bench %d" % index
        yield data[:2] + b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment + data[2:]


def tiny_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "JPEG")
    return buffer.getvalue()


def make_source(root: Path, files: int, tiny: bool = False, seed: int = 0) -> Path:
    """A 100-class folder of `files` distinct, valid JPEGs: ImageNet-sized, or 8x8 with `tiny`."""
    def images() -> Iterator[bytes]:  # the pool is only made when the folder is
        yield from copies([tiny_jpeg()] if tiny else jpeg_pool(DISTINCT_IMAGES, seed), seed)

    return benchlib.make_source(root / (f"src-{files}-tiny" if tiny else f"src-{files}"), files, images(), classes=100,
                                recipe={"images": "tiny" if tiny else "jpeg_pool", "seed": seed})


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants, from /proc."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/statm") as handle:
                total += int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            continue
        stack += benchlib.children(current)
    return total


def timed(cmd: list[str], cold: bool) -> tuple[float, float]:
    """Seconds, and the peak RSS (MB) summed over the command's whole process tree."""
    if cold:
        benchlib.drop_page_cache()
    started = time.perf_counter()
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while process.poll() is None:
        peak = max(peak, tree_rss(process.pid))
        time.sleep(0.05)
    elapsed = time.perf_counter() - started
    if process.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{process.stderr.read().decode() if process.stderr else ''}")
    return elapsed, peak / 1e6


def pack_command(fmt: str, src: Path, out: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "packer.cli", fmt, str(src), str(out), "--overwrite", "--quiet", *extra]


def bench_speed(work: Path, files: int, repeats: int, extra: list[str]) -> bool:
    src = make_source(work, files)
    size = sum(f.stat().st_size for f in src.rglob("*.JPEG"))
    cold = benchlib.drop_page_cache()
    print(f"{files} files, {size / 1e9:.2f} GB; page cache {'dropped before each run' if cold else 'NOT dropped (no permission): warm runs'}")
    results: dict[str, list[float]] = {"tar": [], "tar+sync": []}
    rss: dict[str, float] = {}
    for _ in range(repeats):
        tar_out = work / "bench.tar"
        results["tar"].append(timed(["tar", "cf", str(tar_out), "-C", str(src), "."], cold)[0])
        seconds, _ = timed(["sh", "-c", f"tar cf {tar_out} -C {src} . && sync"], cold)
        results["tar+sync"].append(seconds)
        tar_out.unlink()
        for fmt in WRITERS:
            seconds, peak = timed(pack_command(fmt, src, work / f"out-{fmt}", extra), cold)
            results.setdefault(fmt, []).append(seconds)
            rss[fmt] = max(rss.get(fmt, 0.0), peak)
            shutil.rmtree(work / f"out-{fmt}")
    tar = min(results["tar"])
    tar_sync = min(results["tar+sync"])
    print(f"  {'tar cf':8s} {tar:6.2f} s  ({files / tar:7.0f} files/s)")
    print(f"  {'tar+sync':8s} {tar_sync:6.2f} s  ({files / tar_sync:7.0f} files/s)")
    ok = True
    for fmt in WRITERS:
        best = min(results[fmt])
        ratio = tar / best
        goal = GOALS.get(fmt, 1.0)
        ok &= ratio >= goal
        print(f"  {fmt:8s} {best:6.2f} s  ({files / best:7.0f} files/s)  {ratio:4.2f}x tar cf, "
              f"{tar_sync / best:4.2f}x tar+sync (goal {goal}x tar cf: {'met' if ratio >= goal else 'MISSED'}); "
              f"peak RSS {rss[fmt]:.0f} MB (all processes)")
    return ok


def bench_memory(work: Path, counts: list[int], extra: list[str]) -> None:
    """Peak RSS for tiny-file folders of several sizes: what grows is the listing alone."""
    print("peak RSS by file count (8x8 JPEGs, lmdb):")
    for count in counts:
        src = make_source(work, count, tiny=True)
        seconds, peak = timed(pack_command("lmdb", src, work / "out-rss", extra), cold=False)
        print(f"  {count:8d} files: {peak:6.0f} MB peak RSS, {seconds:.1f} s")
        shutil.rmtree(work / "out-rss")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "pack-bench")
    parser.add_argument("--rss-files", default="", help="comma-separated file counts for the memory check, e.g. 20000,200000")
    parser.add_argument("--pack-args", default="", help="extra arguments for pack, e.g. '--workers 4'")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    extra = args.pack_args.split()
    ok = bench_speed(args.work, args.files, args.repeats, extra)
    if args.rss_files:
        bench_memory(args.work, [int(n) for n in args.rss_files.split(",")], extra)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
