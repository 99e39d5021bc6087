#!/usr/bin/env python3
"""Read speed of every packed format against the loose files it was packed from, in one run.

    .venv/bin/python scripts/bench_read.py [--images 3000] [--src DIR] [--work DIR] [--workers 2]
    .venv/bin/python scripts/bench_read.py --suite small-files   # issue 15: 20k photos of ~33 KB
    .venv/bin/python scripts/bench_read.py --suite scale         # issue 15: 5M samples

1. The source: --src, or --images seeded photo-like JPEGs generated with Pillow into WORK/src
   (kept there and reused when --work is given): ImageNet-sized (500x375 or 375x500, ~97 KB), or
   with --image-kind small 285x214 (~33 KB, as downsampled datasets are; in WORK/src-small).
2. Packs it with every format in packer.write.writers.WRITERS into WORK/<format>.
3. Each case drops the page cache (/proc/sys/vm/drop_caches as root, else posix_fadvise
   DONTNEED on each of its files), reads every sample once, shuffled, through a DataLoader with
   --workers workers and decode="bytes" (container only: no JPEG decoding), then reads again
   warm. Ratios are against the plain torch Dataset over the loose files; the goal is >= 2x cold.
4. Scale: datasets of --scale-samples (5M) tiny samples in shards of 10k (hard links or copies
   of one real shard): seconds `open_dataset` takes in a fresh process (torch already imported),
   and the Rss of each DataLoader worker (fork and spawn) after 200 globally shuffled batches,
   against the worker of an empty Dataset under the same DataLoader. Goals: < 2 s, < 100 MB.

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
import subprocess
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
from packer.run.pipeline import pack
from packer.write.pixels import center_crop, resized_size
from packer.plan.options import PackOptions
from packer.write.writers import WRITERS
from readers.bench import keep_list
from readers.decode import reduction
from readers.manifest import MANIFEST_NAME, FileInfo, ShardInfo, load_manifest, shard_name

BASELINE = "loose"


# The source folder ---------------------------------------------------------------------------


def jpeg(rng: np.random.Generator, size: tuple[int, int] = (500, 375)) -> bytes:
    """A photo-like JPEG: smooth colour fields plus sensor-like noise, ImageNet-sized (~97 KB)."""
    width, height = size if rng.random() < 0.75 else size[::-1]
    base = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((width, height), Image.BICUBIC)
    noisy = np.asarray(base, dtype=np.int16) + rng.normal(0, 20, (height, width, 3)).astype(np.int16)
    buffer = io.BytesIO()
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def small_jpeg(rng: np.random.Generator) -> bytes:
    """The same kind of photo at 285x214 (~33 KB): downsampled datasets (ImageNet at 256 px)."""
    return jpeg(rng, (285, 214))


IMAGE_KINDS: dict[str, Callable[[np.random.Generator], bytes]] = {"imagenet": jpeg, "small": small_jpeg}


def make_source(root: Path, count: int, *, classes: int = 10, seed: int = 0,
                image: Callable[[np.random.Generator], bytes] = jpeg) -> None:
    """count seeded images in `classes` ImageFolder classes; skipped if root already has them."""
    rng = np.random.default_rng(seed)
    benchlib.make_source(root, count, (image(rng) for _ in range(count)), classes=classes,
                         recipe={"seed": seed, "image": image.__name__})


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
        return DataLoader(benchlib.LooseFiles(ctx.src), batch_size=ctx.args.batch_size, shuffle=True, num_workers=workers,
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


# Scale: open_dataset and worker memory at 5M samples ----------------------------------------

SCALE_SHARD = 10_000  # samples per shard: pack's default
OPEN_GOAL_S = 2.0
WORKER_GOAL_MB = 100.0


def tiny_png(rng: np.random.Generator) -> bytes:
    """A one-pixel PNG (~70 bytes): samples whose bytes cost nothing, so the per-sample state shows."""
    buffer = io.BytesIO()
    Image.new("RGB", (1, 1), tuple(int(c) for c in rng.integers(0, 256, 3))).save(buffer, "PNG")
    return buffer.getvalue()


def one_shard(work: Path, fmt: str) -> Path:
    """A real one-shard dataset of SCALE_SHARD tiny images in `fmt`, the seed of the scaled datasets.

    Shards of the current format name their samples by shard number (LMDB keys, tar member names),
    so one shard cannot stand in for another; format version 1 named them by row alone. LMDB and
    wds shards are therefore rewritten as version 1 (the same records, renamed; readers take both
    versions through the same code). HDF5 shards name no samples: they stay version 2.
    """
    out = work / f"scale-{fmt}-one"
    if (out / MANIFEST_NAME).exists():
        return out
    src = work / "tiny-src"
    make_source(src, SCALE_SHARD, classes=10, seed=1, image=tiny_png)
    packed = work / f"scale-{fmt}-packed"
    pack(src, packed, PackOptions(format=fmt, shard_size=SCALE_SHARD), overwrite=True)
    if fmt == "hdf5":
        shutil.rmtree(out, ignore_errors=True)
        packed.rename(out)
        return out
    manifest = load_manifest(packed)
    (info,) = manifest.shards
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    if fmt == "lmdb":
        sidecars: list[tuple[str, Path]] = []
        version1_lmdb(packed / info.name, out / info.name)
    elif fmt == "wds":
        version1_tar(packed / info.name, out / info.name)
        index = next(sidecar.name for sidecar in info.sidecars if sidecar.name.endswith(".packidx"))
        sidecars = [(info.name.replace(".tar", ".idx"), packed / index)]
        shutil.copyfile(sidecars[0][1], out / sidecars[0][0])
    else:
        raise SystemExit(f"--suite scale: no version-1 rewrite for format {fmt!r}")
    manifest.version = 1
    manifest.descriptors = []
    manifest.shards = [ShardInfo(info.name, info.num_samples, (out / info.name).stat().st_size, info.sha256,
                                 tuple(FileInfo(name, (out / name).stat().st_size, "") for name, _ in sidecars))]
    (out / MANIFEST_NAME).write_text(manifest.to_json())
    shutil.rmtree(packed)
    return out


def version1_lmdb(source: Path, target: Path) -> None:
    """The LMDB shard with version 1 keys: the row alone ("0000000005", not "000000_0000000005")."""
    import lmdb

    with lmdb.open(str(source), subdir=False, readonly=True, lock=False) as old, \
            lmdb.open(str(target), subdir=False, map_size=4 * source.stat().st_size, lock=False) as new:
        with old.begin() as reading, new.begin(write=True) as writing:
            for key, value in reading.cursor():
                writing.put(key.split(b"_", 1)[1], value, append=True)


def version1_tar(source: Path, target: Path) -> None:
    """The tar shard with version 1 member names (`<row>.<ext>`, meta as `.json`); headers keep
    their size, so every offset in the `.packidx` still holds."""
    from readers.layouts.wds import encode_header, padding, parse_header, split_name

    with open(source, "rb") as old, open(target, "wb") as new:
        while member := parse_header(block := old.read(512)):
            key, extension = split_name(member.name)
            name = f"{key.split('_', 1)[1]}.{'json' if extension == 'pack.json' else extension}"
            new.write(encode_header(name.encode(), member.size))
            new.write(old.read(member.size + padding(member.size)))
        new.write(block + old.read())


def scaled_dataset(one: Path, out: Path, shards: int, *, link: bool = True) -> Path:
    """`shards` hard links of the single shard in `one` (and its sidecars) under one manifest: a
    dataset of shards x SCALE_SHARD samples that costs no disk space. Copies without `link`
    (py-lmdb refuses to open one file twice in a process, under any name)."""
    manifest = load_manifest(one)
    if (out / MANIFEST_NAME).exists() and load_manifest(out).num_samples == manifest.num_samples * shards:
        return out
    (info,) = manifest.shards
    stem = shard_name(0, "")

    def renamed(name: str, k: int) -> str:
        return shard_name(k, name[len(stem):])

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for k in range(shards):
        for name in (info.name, *(sidecar.name for sidecar in info.sidecars)):
            (os.link if link else shutil.copyfile)(one / name, out / renamed(name, k))
    manifest.shards = [ShardInfo(renamed(info.name, k), info.num_samples, info.bytes, info.sha256,
                                 tuple(FileInfo(renamed(s.name, k), s.bytes, s.sha256) for s in info.sidecars))
                       for k in range(shards)]
    manifest.num_samples = info.num_samples * shards
    (out / MANIFEST_NAME).write_text(manifest.to_json())
    return out


def open_seconds(root: Path) -> float:
    """Seconds `readers.open_dataset(root)` takes in a fresh interpreter that has imported torch and
    readers, as training code has (torch's import alone takes 1-3 s here)."""
    code = ("import sys, time, torch, readers; started = time.perf_counter(); ds = readers.open_dataset(sys.argv[1]); "
            "elapsed = time.perf_counter() - started; assert len(ds) > 0; print(elapsed)")
    result = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, check=True)
    return float(result.stdout.split()[-1])


def memory_kb(pid: int) -> dict[str, int]:
    """Rss, Anonymous (the process's own memory, copy-on-write pages shared with the parent
    included) and the file-backed rest of Rss (mapped shard pages: page cache), in KB."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, value = line.partition(":")
        values[key] = int(value.split()[0])
    return {"Rss": values["Rss"], "Anonymous": values["Anonymous"], "File": values["Rss"] - values["Anonymous"]}


class Empty(Dataset):
    """The baseline worker: the same DataLoader, samples of no bytes, no dataset state at all."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        return b"", 0


def worker_memory(loader: Any, steps: int) -> list[dict[str, int]]:
    """Read `steps` batches, then measure each worker while it is alive."""
    before = set(benchlib.children(os.getpid()))
    iterator = iter(loader)
    for _ in range(steps):
        next(iterator)
    workers = [pid for pid in sorted(set(benchlib.children(os.getpid())) - before)  # not spawn's resource tracker
               if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()]
    usage = [memory_kb(pid) for pid in workers]
    del iterator
    gc.collect()
    return usage


def scale_report(work: Path, formats: list[str], args: argparse.Namespace) -> bool:
    """open_dataset time and worker memory for --scale-samples samples per format; True if the goals hold."""
    shards = max(1, args.scale_samples // SCALE_SHARD)
    steps, batch = 200, 64
    print(f"\nscale: {shards} shards x {SCALE_SHARD} tiny samples = {shards * SCALE_SHARD} per dataset (copies, for "
          f"hdf5 and wds hard links, of one real shard); worker memory after {steps} batches of {batch}, {args.workers} workers, globally "
          f"shuffled (shuffle_window=None: every worker reads from every shard), decode='bytes'. Goals: open_dataset "
          f"< {OPEN_GOAL_S:g} s, each worker < {WORKER_GOAL_MB:g} MB Rss above an empty worker's")
    print(f"{'format':<7} {'context':<7} {'open s':>7} {'worker Rss MB':>14} {'Anonymous':>10} {'File':>7} "
          f"{'empty Rss':>10} {'above empty':>12}")
    ok = True
    for fmt in formats:
        root = scaled_dataset(one_shard(work, fmt), work / f"scale-{fmt}-{shards}", shards, link=fmt != "lmdb")
        opened = float(np.median([open_seconds(root) for _ in range(3)]))
        ok &= opened < OPEN_GOAL_S
        for context in ("fork", "spawn"):
            common = {"num_workers": args.workers, "collate_fn": keep_list, "multiprocessing_context": context}
            empty = worker_memory(DataLoader(Empty(shards * SCALE_SHARD), batch_size=batch, shuffle=True,
                                             persistent_workers=True, **common), steps)
            dataset = readers.open_dataset(root, decode="bytes")
            used = worker_memory(readers.make_loader(dataset, batch, shuffle_window=None, pin_memory=False, **common),
                                 steps)
            base = float(np.median([usage["Rss"] for usage in empty])) / 1024
            for usage in used:
                above = usage["Rss"] / 1024 - base
                ok &= above < WORKER_GOAL_MB
                print(f"{fmt:<7} {context:<7} {opened:>7.2f} {usage['Rss'] / 1024:>14.0f} "
                      f"{usage['Anonymous'] / 1024:>10.0f} {usage['File'] / 1024:>7.0f} {base:>10.0f} {above:>12.0f}")
            dataset.close()
    print("Rss counts pages a forked worker shares with the parent, Anonymous its heap (copy-on-write included), "
          "File the mapped shard pages (page cache)")
    return ok


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


class LooseDecoded(benchlib.LooseFiles):
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

SUITES: dict[str, list[str]] = {
    # issue 15: random reads of 20k downsampled-size photos, ratios against the loose files
    "small-files": ["--images", "20000", "--image-kind", "small", "--skip-decode", "--skip-memory"],
    # issue 15: open_dataset and DataLoader worker memory at 5M samples, fork and spawn
    "scale": ["--skip-container", "--skip-decode"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=3000, help="JPEGs to generate when --src is not given")
    parser.add_argument("--image-kind", choices=IMAGE_KINDS, default="imagenet",
                        help="generated JPEGs: imagenet (500x375, ~97 KB) or small (285x214, ~33 KB)")
    parser.add_argument("--src", type=Path, help="an existing ImageFolder to use instead")
    parser.add_argument("--work", type=Path, help="where to keep generated and packed data (default: a temp dir)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--formats", default=",".join(WRITERS), help="comma-separated, from the writer registry")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every case; the median is reported")
    parser.add_argument("--skip-memory", action="store_true", help="leave out the scale part (open time, worker memory)")
    parser.add_argument("--scale-samples", type=int, default=5_000_000, help="samples of the scale part's datasets")
    parser.add_argument("--suite", choices=SUITES, help="one part with its settings: " + "; ".join(
        f"{name}: {' '.join(flags)}" for name, flags in SUITES.items()))
    parser.add_argument("--skip-container", action="store_true", help="leave out the container-only part")
    parser.add_argument("--skip-decode", action="store_true", help="leave out the decoding part")
    parser.add_argument("--decode-images", type=int, default=1000, help="JPEGs for the decoding part (without --src)")
    parser.add_argument("--decode-seconds", type=float, default=2.0, help="least timed seconds per pipeline and round")
    parser.add_argument("--decode-rounds", type=int, default=2, help="interleaved rounds; each pipeline keeps its best")
    args = parser.parse_args()
    if args.suite:  # the suite's settings, then anything given explicitly on top
        args = parser.parse_args([*SUITES[args.suite], *sys.argv[1:]])
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
            src = args.src or work / ("src" if args.image_kind == "imagenet" else f"src-{args.image_kind}")
            if not args.src:
                started = time.perf_counter()
                make_source(src, args.images, image=IMAGE_KINDS[args.image_kind])
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
                    # The dataset is made first (the loose files' scan stats every file), then the
                    # cache dropped: every case starts its timed pass with data and inodes cold.
                    batches = case.batches(ctx)
                    how = benchlib.drop_cache(case.files(ctx))
                    samples, cold = timed_pass(batches, case.samples)
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
            ok &= scale_report(work, formats, args)
    finally:
        if temporary:
            shutil.rmtree(temporary, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
