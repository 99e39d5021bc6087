#!/usr/bin/env python3
"""Read speed of every packed format against the loose files it was packed from, in one run.

    .venv/bin/python scripts/bench_read.py [--images 3000] [--src DIR] [--work DIR] [--workers 2]

1. The source: --src, or --images seeded ImageNet-sized JPEGs (500x375 or 375x500, ~100 KB)
   generated with Pillow into WORK/src (kept there and reused when --work is given).
2. Packs it with every format in packer.writers.WRITERS into WORK/<format>.
3. Each case drops the page cache (/proc/sys/vm/drop_caches as root, else posix_fadvise
   DONTNEED on each of its files), reads every sample once, shuffled, through a DataLoader with
   --workers workers and decode="bytes" (container only: no JPEG decoding), then reads again
   warm. Ratios are against the plain torch Dataset over the loose files; the goal is >= 2x cold.
4. Worker memory: RSS of each loader worker for 20k- and 1M-sample manifests (shards copied from
   one real 10k-sample shard of tiny images), against an ImageFolder-style list of 1M paths.

Each format is also read with 0 workers (rows "/0w"), to show the readers' own speed apart from
the cost of shipping samples from workers to the main process.

5. Decoding (issue 4): --decode-images JPEGs packed with every format as `original` and as
   224x224 `raw`, `bmp` and `jpeg` (--resize 224 --center-crop 224). Every pipeline yields uint8
   3x224x224 tensors through a shuffled DataLoader (--workers workers): the loose files opened,
   decoded, resized and cropped by a plain Dataset ("loose+decode"); the packed originals the same
   way ("FMT/original"), and with decode_size=(224, 224) ("FMT/draft": JPEG DCT scaling before the
   resize); the pre-decoded stores with decode="tensor" and no transform. Goals: raw224 >= 10x
   loose+decode, draft >= 1.5x original. This part is CPU-bound, so the cache stays warm: rates
   are steady state (timed from the first batch, whole epochs for at least --decode-seconds), the
   pipelines run in --decode-rounds interleaved rounds and each keeps its best (other load on a
   shared machine only ever slows a round down). A no-work Dataset shows the DataLoader's own
   transport ceiling, and a single-process decode-only rate compares plain and draft decoding.
   `--skip-container --skip-memory` runs this part alone (about 2 minutes on 2 cores).

To add a case, append a `Case` to the list `cases()` returns: a name, the files whose cache it
drops, a function returning an iterable of batches, and the baseline and goal it is judged by.
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import benchlib
import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

import readers
from packer.pipeline import pack
from packer.pixels import center_crop, resized_size
from packer.plan import PackOptions
from packer.scan import scan
from packer.writers import WRITERS
from readers.bench import keep_list
from readers.decode import reduction
from readers.manifest import MANIFEST_NAME, ShardInfo, load_manifest, shard_name

BASELINE = "loose"


# The source folder ---------------------------------------------------------------------------


def jpeg(rng: np.random.Generator) -> bytes:
    """A photo-like JPEG: smooth colour fields plus sensor-like noise, ImageNet-sized."""
    width, height = (500, 375) if rng.random() < 0.75 else (375, 500)
    base = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((width, height), Image.BICUBIC)
    noisy = np.asarray(base, dtype=np.int16) + rng.normal(0, 20, (height, width, 3)).astype(np.int16)
    buffer = io.BytesIO()
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def make_source(root: Path, count: int, *, classes: int = 10, seed: int = 0,
                image: Callable[[np.random.Generator], bytes] = jpeg) -> None:
    """count seeded images in `classes` ImageFolder classes; skipped if root already has them."""
    rng = np.random.default_rng(seed)
    benchlib.make_source(root, count, (image(rng) for _ in range(count)), classes=classes,
                         recipe={"seed": seed, "image": image.__name__})


class LooseFiles(Dataset):
    """The baseline: a plain Dataset over a list of file paths, like torchvision's ImageFolder."""

    def __init__(self, root: Path) -> None:
        listing = scan(root)
        self.samples = [(str(root / path), int(label)) for path, label in zip(listing.paths, listing.labels)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        path, label = self.samples[index]
        with open(path, "rb") as handle:
            return handle.read(), label


# Page cache ------------------------------------------------------------------------------


def files_under(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file()]


def sequential_read_rate(files: list[Path]) -> float:
    """Bytes/s reading these files start to end from a cold cache: what the disk gives at best."""
    benchlib.drop_cache(files)
    total = 0
    started = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as handle:
            while chunk := handle.read(8 << 20):
                total += len(chunk)
    return total / (time.perf_counter() - started)


# Cases -----------------------------------------------------------------------------------


@dataclass
class Context:
    args: argparse.Namespace
    src: Path
    packed: dict[str, Path] = field(default_factory=dict)


@dataclass
class Case:
    name: str
    files: Callable[[Context], list[Path]]
    batches: Callable[[Context], Iterable[Any]]
    baseline: str | None = BASELINE
    goal: float | None = 2.0
    samples: Callable[[Any], int] = len


def loose_case(workers: int, name: str, goal: float | None) -> Case:
    def batches(ctx: Context) -> Iterable[Any]:
        return DataLoader(LooseFiles(ctx.src), batch_size=ctx.args.batch_size, shuffle=True, num_workers=workers,
                          collate_fn=keep_list, generator=torch.Generator().manual_seed(0))

    return Case(name, lambda ctx: files_under(ctx.src), batches, baseline=None, goal=goal)


def packed_case(fmt: str, workers: int, name: str, baseline: str, goal: float | None) -> Case:
    def batches(ctx: Context) -> Iterable[Any]:
        dataset = readers.open_dataset(ctx.packed[fmt], decode="bytes", fields=("image", "label"))
        return readers.make_loader(dataset, ctx.args.batch_size, num_workers=workers,
                                   collate_fn=keep_list, pin_memory=False, persistent_workers=False)

    return Case(name, lambda ctx: files_under(ctx.packed[fmt]), batches, baseline=baseline, goal=goal)


def cases(formats: list[str], workers: int) -> list[Case]:
    """The goal cases (`workers` workers), then the same reads in the main process (0 workers):
    those show the readers' own speed apart from DataLoader's worker-to-main transfer."""
    inline = f"{BASELINE}/0w"
    return [
        loose_case(workers, BASELINE, None),
        *(packed_case(fmt, workers, fmt, BASELINE, 2.0) for fmt in formats),
        loose_case(0, inline, None),
        *(packed_case(fmt, 0, f"{fmt}/0w", inline, None) for fmt in formats),
    ]


def timed_pass(batches: Iterable[Any], count: Callable[[Any], int]) -> tuple[int, float]:
    started = time.perf_counter()
    samples = sum(count(batch) for batch in batches)
    elapsed = time.perf_counter() - started
    # Shards left mapped in this process would keep their pages through the next cache drop.
    close = getattr(getattr(batches, "dataset", None), "close", None)
    if close is not None:
        close()
    return samples, elapsed


# Worker memory ---------------------------------------------------------------------------


def tiny_jpeg(rng: np.random.Generator) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (2, 2), tuple(int(c) for c in rng.integers(0, 256, 3))).save(buffer, "JPEG")
    return buffer.getvalue()


def synthetic_dataset(one_shard: Path, out: Path, shards: int) -> Path:
    """`shards` copies of the single shard in `one_shard` (with any files named after it), one manifest."""
    manifest = load_manifest(one_shard)
    (info,) = manifest.shards
    stem = shard_name(0, "")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for k in range(shards):
        for path in one_shard.iterdir():
            if path.name.startswith(stem):
                shutil.copyfile(path, out / (shard_name(k, "") + path.name[len(stem):]))
    manifest.shards = [ShardInfo(shard_name(k, info.name[len(stem):]), info.num_samples, info.bytes, info.sha256)
                       for k in range(shards)]
    manifest.num_samples = info.num_samples * shards
    (out / MANIFEST_NAME).write_text(manifest.to_json())
    os.sync()  # mapped pages of freshly written files would count as the worker's dirty memory
    return out


def memory_kb(pid: int) -> dict[str, int]:
    """Rss, Pss, Private_Dirty (what the process wrote itself: its own heap and copy-on-write
    copies) and the file-backed part of Rss (mapped shard pages: page cache, reclaimable), in KB."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, value = line.partition(":")
        values[key] = int(value.split()[0])
    return {"Rss": values["Rss"], "Pss": values["Pss"], "Private_Dirty": values["Private_Dirty"],
            "File": values["Rss"] - values["Anonymous"]}


def worker_memory(batches: Iterable[Any], steps: int) -> list[dict[str, int]]:
    """Read `steps` batches, then measure the workers while they are alive."""
    iterator = iter(batches)
    for _ in range(steps):
        next(iterator)
    before = set(benchlib.children(os.getpid()))
    usage = [memory_kb(pid) for pid in sorted(before)]
    del iterator
    gc.collect()
    return usage


class PathsOnly(Dataset):
    """ImageFolder-style: one Python tuple per sample; reading touches (and copies) its page."""

    def __init__(self, count: int) -> None:
        self.samples = [(f"/data/train/n{i % 1000:08d}/img_{i:08d}.JPEG", i % 1000) for i in range(count)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[str, int]:
        return self.samples[index]


def memory_report(work: Path, fmt: str, args: argparse.Namespace) -> None:
    src = work / "tiny-src"
    make_source(src, 10_000, classes=10, seed=1, image=tiny_jpeg)
    one = work / f"tiny-{fmt}"
    if not (one / MANIFEST_NAME).exists():
        pack(src, one, PackOptions(format=fmt), overwrite=True)
    steps = 200
    print(f"\nworker memory: {fmt}, {args.workers} workers, decode='bytes', batch 64, after {steps} batches. "
          "KB per worker; Rss includes pages shared with the parent after fork, Private_Dirty is the worker's "
          "own, File the mapped shard pages")
    print(f"{'dataset':<28} {'shards':>7} {'samples':>9} {'Rss':>9} {'Pss':>9} {'Private_Dirty':>13} {'File':>9}")
    rows: list[tuple[str, int, int, Callable[[], Iterable[Any]]]] = []
    for shards in (2, 100):
        root = synthetic_dataset(one, work / f"synthetic-{fmt}-{shards}", shards)
        dataset = readers.open_dataset(root, decode="bytes", fields=("image", "label"))
        rows.append((f"{fmt} manifest", shards, len(dataset),
                     lambda d=dataset: readers.make_loader(d, 64, num_workers=args.workers, collate_fn=keep_list,
                                                           pin_memory=False)))
    for count in (20_000, 1_000_000):
        paths = PathsOnly(count)
        rows.append(("list of paths (contrast)", 0, count,
                     lambda p=paths: DataLoader(p, batch_size=64, shuffle=True, num_workers=args.workers,
                                                collate_fn=keep_list)))
    for name, shards, count, make in rows:
        for usage in worker_memory(make(), steps):
            print(f"{name:<28} {shards:>7} {count:>9} {usage['Rss']:>9} {usage['Pss']:>9} {usage['Private_Dirty']:>13} {usage['File']:>9}")
        gc.collect()


# Decoding: pre-decoded stores and decode_size --------------------------------------------

SIDE = 224
RAW_GOAL = 10.0
DRAFT_GOAL = 1.5
DECODE_BASELINE = "loose+decode"
# Pack variants of the decoding part: name -> store and geometry options.
VARIANTS: dict[str, dict[str, Any]] = {
    "original": {"store": "original"},
    "raw224": {"store": "raw", "resize": SIDE, "center_crop": SIDE},
    "bmp224": {"store": "bmp", "resize": SIDE, "center_crop": SIDE},
    "jpeg224": {"store": "jpeg", "resize": SIDE, "center_crop": SIDE},
}


def to_tensor_224(image: Image.Image) -> torch.Tensor:
    """The usual eval transform without torchvision: shorter side to 224 (bilinear), center crop 224."""
    size = resized_size(*image.size, SIDE, None)
    if size != image.size:
        image = image.resize(size, Image.Resampling.BILINEAR)
    array = np.asarray(center_crop(image, SIDE))
    return torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))


class LooseDecoded(LooseFiles):
    """The decoding baseline: what an ImageFolder pipeline does per sample, from the loose files."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:  # type: ignore[override]
        data, label = super().__getitem__(index)
        return to_tensor_224(Image.open(io.BytesIO(data)).convert("RGB")), label


class Blank(Dataset):
    """No work at all: what the DataLoader itself moves from workers to the main process per second."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.image = torch.zeros((3, SIDE, SIDE), dtype=torch.uint8)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.image.clone(), 0


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far (from /proc/PID/stat)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def steady_rate(dataset: Dataset, seconds: float, workers: int, batch_size: int) -> tuple[float, float]:
    """Samples per second after the first batch, over whole epochs lasting at least `seconds`; and
    samples per CPU-second spent meanwhile by the workers and this process, which load from other
    jobs on the machine does not change."""
    before = set(benchlib.children(os.getpid()))
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                        persistent_workers=workers > 0, prefetch_factor=4 if workers else None)
    started = None
    count = 0
    pids: list[int] = []
    cpu = 0.0
    while started is None or time.perf_counter() - started < seconds:
        for images, _ in loader:
            assert images.shape[1:] == (3, SIDE, SIDE), images.shape
            if started is None:
                pids = sorted(set(benchlib.children(os.getpid())) - before)
                cpu = time.process_time() + cpu_seconds(pids)
                started = time.perf_counter()
                continue
            count += len(images)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() + cpu_seconds(pids) - cpu
    return count / elapsed, count / cpu


def decode_only(pool: list[bytes], draft: bool, seconds: float) -> float:
    """Single-process JPEG decodes per second, full size or DCT-scaled towards 224x224."""
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for data in pool:
            image = Image.open(io.BytesIO(data))
            if draft:
                scale = reduction(*image.size, (SIDE, SIDE))
                image.draft("RGB", (image.size[0] // scale, image.size[1] // scale))
            image.load()
        count += len(pool)
    return count / (time.perf_counter() - started)


def decode_report(work: Path, formats: list[str], args: argparse.Namespace) -> bool:
    """The decoding part: prints rates, ratios and stored sizes; True when every goal is met."""
    src = args.src or work / "decode-src"
    if not args.src:
        make_source(src, args.decode_images)
    files = [path for path in files_under(src) if not path.name.startswith(".")]
    source_bytes = sum(path.stat().st_size for path in files)
    print(f"\ndecoding: {len(files)} images, {source_bytes / 1e6:.1f} MB, in {src}")
    rng = np.random.default_rng(1)
    pool = [jpeg(rng) for _ in range(32)]
    plain = draft = 0.0
    for _ in range(args.decode_rounds):
        plain = max(plain, decode_only(pool, draft=False, seconds=args.decode_seconds / 2))
        draft = max(draft, decode_only(pool, draft=True, seconds=args.decode_seconds / 2))
    print(f"decode only, 1 process: plain {plain:.0f}/s, draft towards 224 {draft:.0f}/s ({draft / plain:.2f}x)")

    pipelines: list[tuple[str, Callable[[], Dataset], int]] = [
        ("(no-work ceiling)", lambda: Blank(args.decode_images), 0),
        (DECODE_BASELINE, lambda: LooseDecoded(src), source_bytes),
    ]
    for fmt in formats:
        for variant, options in VARIANTS.items():
            out = work / f"decode-{fmt}-{variant}"
            if not (out / MANIFEST_NAME).exists():
                started = time.perf_counter()
                pack(src, out, PackOptions(format=fmt, **options), overwrite=True)
                print(f"packed {fmt}/{variant} ({time.perf_counter() - started:.1f}s)", flush=True)
            stored = sum(shard.bytes for shard in load_manifest(out).shards)
            if variant == "original":
                pipelines.append((f"{fmt}/original", lambda out=out: readers.open_dataset(
                    out, transform=to_tensor_224), stored))
                pipelines.append((f"{fmt}/draft", lambda out=out: readers.open_dataset(
                    out, transform=to_tensor_224, decode_size=(SIDE, SIDE)), stored))
            else:
                pipelines.append((f"{fmt}/{variant}", lambda out=out: readers.open_dataset(out, decode="tensor"), stored))

    print(f"uint8 3x{SIDE}x{SIDE} batches of {args.batch_size}, shuffled, {args.workers} workers, "
          f">= {args.decode_seconds:g}s per pipeline and round, best of {args.decode_rounds} interleaved rounds")
    rates: dict[str, float] = {}
    per_cpu: dict[str, float] = {}
    for _ in range(args.decode_rounds):
        for name, make, _ in pipelines:
            rate, efficiency = steady_rate(make(), args.decode_seconds, args.workers, args.batch_size)
            rates[name] = max(rates.get(name, 0.0), rate)
            per_cpu[name] = max(per_cpu.get(name, 0.0), efficiency)
    base, base_cpu = rates[DECODE_BASELINE], per_cpu[DECODE_BASELINE]
    print(f"  {'':18s} {'samples/s':>9} {'ratio':>7}   {'per CPU-s':>9} {'ratio':>7}   stored")
    for name, _, stored in pipelines:
        size = (f"{stored / 1e6:7.1f} MB = {stored / source_bytes:5.2f}x the source" if stored
                else "the DataLoader's transport limit")
        print(f"  {name:18s} {rates[name]:9.0f} {rates[name] / base:6.2f}x   {per_cpu[name]:9.0f} "
              f"{per_cpu[name] / base_cpu:6.2f}x   {size}")
    print(f"ratios against {DECODE_BASELINE}; 'per CPU-s' counts the CPU time of the workers and the main "
          "process, a cross-check that load from other jobs does not move")
    ok = True
    for fmt in formats:
        raw = rates[f"{fmt}/raw224"] / base
        fast = rates[f"{fmt}/draft"] / rates[f"{fmt}/original"]
        fast_cpu = per_cpu[f"{fmt}/draft"] / per_cpu[f"{fmt}/original"]
        ok &= raw >= RAW_GOAL and fast >= DRAFT_GOAL
        print(f"{fmt}: raw224 {raw:.1f}x {DECODE_BASELINE} (goal {RAW_GOAL:g}x: {'met' if raw >= RAW_GOAL else 'MISSED'}; "
              f"per CPU-s {per_cpu[f'{fmt}/raw224'] / base_cpu:.1f}x); draft {fast:.2f}x original "
              f"(goal {DRAFT_GOAL:g}x: {'met' if fast >= DRAFT_GOAL else 'MISSED'}; per CPU-s {fast_cpu:.2f}x)")
    return ok


# Main ------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=3000, help="JPEGs to generate when --src is not given")
    parser.add_argument("--src", type=Path, help="an existing ImageFolder to use instead")
    parser.add_argument("--work", type=Path, help="where to keep generated and packed data (default: a temp dir)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--formats", default=",".join(WRITERS), help="comma-separated, from the writer registry")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every case; the median is reported")
    parser.add_argument("--skip-memory", action="store_true", help="leave out the worker memory part")
    parser.add_argument("--skip-container", action="store_true", help="leave out the container-only part")
    parser.add_argument("--skip-decode", action="store_true", help="leave out the decoding part")
    parser.add_argument("--decode-images", type=int, default=1000, help="JPEGs for the decoding part (without --src)")
    parser.add_argument("--decode-seconds", type=float, default=2.0, help="least timed seconds per pipeline and round")
    parser.add_argument("--decode-rounds", type=int, default=2, help="interleaved rounds; each pipeline keeps its best")
    args = parser.parse_args()
    formats = [name for name in args.formats.split(",") if name]
    unknown = sorted(set(formats) - set(WRITERS))
    if not formats:
        parser.error("--formats names no format")
    if unknown:
        parser.error(f"unknown formats {unknown}; known: {sorted(WRITERS)}")

    temporary = None if args.work else tempfile.mkdtemp(prefix="bench-read-")
    work = args.work or Path(temporary)  # type: ignore[arg-type]
    try:
        ok = True
        if not args.skip_container:
            src = args.src or work / "src"
            if not args.src:
                started = time.perf_counter()
                make_source(src, args.images)
                print(f"source: {args.images} generated JPEGs in {src} ({time.perf_counter() - started:.1f}s)")
            sizes = [path.stat().st_size for path in files_under(src) if not path.name.startswith(".")]
            print(f"source: {len(sizes)} files, {sum(sizes) / 1e6:.1f} MB, mean {np.mean(sizes) / 1e3:.0f} KB")
            ctx = Context(args=args, src=src)
            for fmt in formats:
                out = work / fmt
                started = time.perf_counter()
                summary = pack(src, out, PackOptions(format=fmt), overwrite=True)
                ctx.packed[fmt] = out
                print(f"packed {fmt}: {summary.num_samples} samples in {summary.num_shards} shards "
                      f"({time.perf_counter() - started:.1f}s)")

            print(f"\nreading every sample once, shuffled, {args.workers} workers, batch {args.batch_size}, "
                  f"decode='bytes'; median samples/s of {args.repeat} rounds, cases interleaved")
            results: dict[str, list[tuple[float, float]]] = {case.name: [] for case in cases(formats, args.workers)}
            how = ""
            for _ in range(args.repeat):
                for case in cases(formats, args.workers):
                    how = benchlib.drop_cache(case.files(ctx))
                    samples, cold = timed_pass(case.batches(ctx), case.samples)
                    _, warm = timed_pass(case.batches(ctx), case.samples)
                    results[case.name].append((samples / cold, samples / warm))
            median = {name: np.median(np.array(runs), axis=0) for name, runs in results.items()}
            print(f"page cache: {how}")
            mean_bytes = float(np.mean(sizes))
            ceiling = sequential_read_rate(files_under(ctx.packed[formats[0]]))
            print(f"disk ceiling: {ceiling / 1e6:.0f} MB/s reading {formats[0]} sequentially cold "
                  f"= {ceiling / mean_bytes:.0f} samples/s of {mean_bytes / 1e3:.0f} KB; "
                  f"2x the loose files' cold rate would need {2 * median[BASELINE][0] * mean_bytes / 1e6:.0f} MB/s")
            print(f"{'case':<12} {'cold/s':>9} {'warm/s':>9} {'cold x':>7} {'warm x':>7}  cold range/s   goal")
            for case in cases(formats, args.workers):
                cold, warm = median[case.name]
                colds = [run[0] for run in results[case.name]]
                line = f"{case.name:<12} {cold:>9.0f} {warm:>9.0f}"
                if case.baseline:
                    ratio = cold / median[case.baseline][0]
                    line += f" {ratio:>6.2f}x {warm / median[case.baseline][1]:>6.2f}x"
                else:
                    line += " " * 16
                line += f"  {min(colds):>5.0f}-{max(colds):<6.0f}"
                if case.baseline and case.goal is not None:
                    line += f"  >= {case.goal:g}x cold vs {case.baseline}: " + ("met" if ratio >= case.goal else "MISSED")
                print(line)
        if not args.skip_decode:
            ok &= decode_report(work, formats, args)
        if not args.skip_memory:
            for fmt in formats:
                memory_report(work, fmt, args)
    finally:
        if temporary:
            shutil.rmtree(temporary, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
