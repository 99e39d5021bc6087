"""Packing at millions of files, and packing small files, against baselines in the same run.

`--suite scale` (issue 15): a link farm of `--counts` files (a few tiny JPEGs hard-linked into
ImageNet-style class folders, so it needs no real data and almost no disk), made once under
`--work` and reused. For each count: `find SRC -type f | sort` against `pack plan` (goal: within
2x) and against `pack plan` again (which lists SRC and checks it against the plan, #35), then
`pack FORMAT` with its wall time, CPU seconds and peak RSS of the whole process tree (parent and
workers sampled together). Goals (#38): peak RSS <= 400 MB at 10M files in the default
(shuffled) order (issue 15 asked it at 5M), and per-file time at the largest count within 1.3x
of the smallest. A 10M-file farm takes ~5 minutes to make; `pack wds` of it writes ~37 GB.

`--suite small` (issue 15): `--files` distinct ~33 KB JPEGs (downsampled-ImageNet sized), every
format against `tar cf`, with each source file's pages evicted before every run
(`posix_fadvise(DONTNEED)`, which needs no root, or /proc/sys/vm/drop_caches where allowed).
Rounds are interleaved; medians of wall and CPU seconds (user + sys of the process tree).
Goals: >= 1.5x `tar cf` for wds and lmdb, >= 1.3x for hdf5; CPU per file at most 2x tar's.

    python scripts/bench_scale.py --suite scale --counts 200000,1000000
    python scripts/bench_scale.py --suite scale --counts 1000000,10000000 --format hdf5
    python scripts/bench_scale.py --suite scale --counts 200000,5000000 --format lmdb
    python scripts/bench_scale.py --suite small --files 20000 --repeats 3
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import benchlib
from bench_pack import copies, jpeg_pool, tree_rss
from PIL import Image

from packer.write.writers import WRITERS

SMALL_GOALS = {"wds": 1.5, "lmdb": 1.5, "hdf5": 1.3}
CPU_GOAL = 2.0
RSS_GOAL_MB = 400.0
PER_FILE_GOAL = 1.3
PLAN_GOAL = 2.0
CLASSES = 1000
LINKS_PER_FILE = 50_000  # ext4 allows 65,000 links to one inode
DISTINCT_IMAGES = 256


def run_measured(cmd: list[str], *, shell: bool = False) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + sys of the command and every descendant it waited for)
    and peak RSS in MB summed over its whole process tree, sampled every 50 ms."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    process = subprocess.Popen(cmd, shell=shell, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while process.poll() is None:
        peak = max(peak, tree_rss(process.pid))
        time.sleep(0.05)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0:
        sys.exit(f"failed: {cmd}\n{process.stderr.read().decode() if process.stderr else ''}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, peak / 1e6


def pack_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "packer.cli", *args]


def tiny_jpegs(count: int) -> list[bytes]:
    images = []
    for number in range(count):
        buffer = io.BytesIO()
        Image.new("RGB", (8, 8), (number % 256, number // 256 % 256, 200)).save(buffer, "JPEG")
        images.append(buffer.getvalue())
    return images


def link_farm(work: Path, count: int) -> Path:
    """`count` hard links to a few tiny JPEGs (one per LINKS_PER_FILE links), n########/img_########.JPEG
    over CLASSES folders (consecutive numbers in one folder, as ImageNet); reused when its marker says
    it is complete."""
    root = work / f"farm-{count}"
    marker = root / benchlib.SOURCE_MARKER
    if marker.exists() and json.loads(marker.read_text()) == {"count": count, "classes": CLASSES}:
        return root
    shutil.rmtree(root, ignore_errors=True)
    seeds = work / f"seeds-{count}"
    seeds.mkdir(parents=True, exist_ok=True)
    seed_paths = []
    for number, data in enumerate(tiny_jpegs(-(-count // LINKS_PER_FILE))):
        path = seeds / f"seed{number}.jpg"
        path.write_bytes(data)
        seed_paths.append(os.fspath(path))
    per_class = -(-count // CLASSES)
    started = time.perf_counter()
    for label in range(CLASSES):
        first = label * per_class
        if first >= count:
            break
        folder = root / f"n{label:08d}"
        folder.mkdir(parents=True)
        base = os.fspath(folder)
        for index in range(first, min(count, first + per_class)):
            os.link(seed_paths[index % len(seed_paths)], f"{base}/img_{index:08d}.JPEG")
    marker.write_text(json.dumps({"count": count, "classes": CLASSES}))
    print(f"  made {root} ({count} links) in {time.perf_counter() - started:.0f} s")
    return root


def bench_scale(work: Path, counts: list[int], fmt: str, repeats: int, extra: list[str]) -> bool:
    print(f"link farms of tiny JPEGs, {CLASSES} class folders, warm page cache; pack {fmt} {' '.join(extra)}; "
          f"best of {repeats}")
    rows = []
    for count in counts:
        src = link_farm(work, count)
        out = work / "scale-out"
        find = min(run_measured(f"find {src} -type f | LC_ALL=C sort > /dev/null", shell=True)[0]
                   for _ in range(repeats))
        plans = []
        for _ in range(repeats):
            shutil.rmtree(out, ignore_errors=True)
            plans.append(run_measured(pack_cmd("plan", str(src), str(out), "--format", fmt)))
        checks = [run_measured(pack_cmd("plan", str(src), str(out), "--format", fmt))  # reuses it: SRC's check
                  for _ in range(repeats)]
        packs = []
        for _ in range(repeats):
            shutil.rmtree(out, ignore_errors=True)
            packs.append(run_measured(pack_cmd(fmt, str(src), str(out), "--quiet", *extra)))
        shutil.rmtree(out, ignore_errors=True)
        plan_wall = min(wall for wall, _, _ in plans)
        plan_rss = max(rss for _, _, rss in plans)
        check_wall = min(wall for wall, _, _ in checks)
        wall, cpu, _ = min(packs)
        rss = max(rss for _, _, rss in packs)
        rows.append((count, wall, cpu, rss))
        print(f"  {count:9d} files: find|sort {find:6.2f} s, pack plan {plan_wall:6.2f} s "
              f"({plan_wall / find:4.2f}x find|sort, goal <= {PLAN_GOAL}x), plan peak RSS {plan_rss:5.0f} MB, "
              f"pack plan again (SRC checked against the plan) {check_wall:6.2f} s; "
              f"pack {wall:7.1f} s ({wall / count * 1e6:5.1f} us/file, {cpu / count * 1e6:5.1f} CPU-us/file), "
              f"peak RSS {rss:5.0f} MB", flush=True)
    ok = True
    first, last = rows[0], rows[-1]
    if len(rows) > 1:
        ratio = (last[1] / last[0]) / (first[1] / first[0])
        ok &= ratio <= PER_FILE_GOAL
        print(f"  per-file time at {last[0]} is {ratio:.2f}x that at {first[0]} (goal <= {PER_FILE_GOAL}x)")
    if last[0] >= 5_000_000:
        ok &= last[3] <= RSS_GOAL_MB
        print(f"  peak RSS at {last[0]}: {last[3]:.0f} MB (goal <= {RSS_GOAL_MB:.0f} MB)")
    return ok


def small_pool(count: int, seed: int) -> list[bytes]:
    """Noisy 296x222 JPEGs, ~33 KB each: downsampled-ImageNet-sized files."""
    return jpeg_pool(count, seed, 296, 222)


def small_source(work: Path, files: int) -> Path:
    def images() -> Iterator[bytes]:
        yield from copies(small_pool(DISTINCT_IMAGES, 0), 0)

    return benchlib.make_source(work / f"small-{files}", files, images(), classes=100,
                                recipe={"images": "small_pool-296x222", "seed": 0})


def bench_small(work: Path, files: int, repeats: int, extra: list[str]) -> bool:
    src = small_source(work, files)
    paths = sorted(src.rglob("*.JPEG"))
    size = sum(path.stat().st_size for path in paths)
    how = benchlib.drop_cache(paths)
    print(f"{files} files, {size / 1e6:.0f} MB ({size / files / 1e3:.1f} KB each); page cache {how}, before every "
          f"run; {repeats} interleaved rounds, medians; 2-core machine shared with other jobs")
    names = ["tar", *WRITERS]
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    for _ in range(repeats):
        for name in names:
            benchlib.drop_cache(paths)
            if name == "tar":
                tar_out = work / "small.tar"
                runs[name].append(run_measured(["tar", "cf", str(tar_out), "-C", str(src), "."]))
                tar_out.unlink()
            else:
                out = work / f"small-out-{name}"
                runs[name].append(run_measured(pack_cmd(name, str(src), str(out), "--overwrite", "--quiet", *extra)))
                shutil.rmtree(out)
    medians = {name: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs),
                      max(r[2] for r in rs)) for name, rs in runs.items()}
    tar_wall, tar_cpu, _ = medians["tar"]
    print(f"  {'tar cf':8s} {tar_wall:6.2f} s  {tar_cpu:5.2f} CPU-s  ({files / tar_wall:6.0f} files/s)")
    ok = True
    for name in WRITERS:
        wall, cpu, rss = medians[name]
        goal = SMALL_GOALS.get(name, 1.0)
        speed, cpu_ratio = tar_wall / wall, cpu / tar_cpu
        ok &= speed >= goal and cpu_ratio <= CPU_GOAL
        print(f"  {name:8s} {wall:6.2f} s  {cpu:5.2f} CPU-s  ({files / wall:6.0f} files/s)  {speed:4.2f}x tar cf "
              f"(goal {goal}x), {cpu_ratio:4.2f}x tar's CPU (goal <= {CPU_GOAL}x), peak RSS {rss:.0f} MB")
    print("  all runs (wall s / CPU s): " + "; ".join(
        f"{name} " + " ".join(f"{w:.2f}/{c:.2f}" for w, c, _ in rs) for name, rs in runs.items()))
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=("scale", "small"), default="scale")
    parser.add_argument("--counts", default="200000,1000000", help="file counts for --suite scale")
    parser.add_argument("--format", default="wds", choices=sorted(WRITERS), help="format for --suite scale")
    parser.add_argument("--files", type=int, default=20_000, help="files for --suite small")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "pack-scale")
    parser.add_argument("--pack-args", default="", help="extra arguments for pack, e.g. '--workers 4'")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    extra = args.pack_args.split()
    if args.suite == "small":
        ok = bench_small(args.work, args.files, args.repeats, extra)
    else:
        ok = bench_scale(args.work, [int(n) for n in args.counts.split(",")], args.format, args.repeats, extra)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
