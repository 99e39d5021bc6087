"""Packing speed and memory, against `tar cf` of the same folder in the same run.

`--suite speed` (default): for every format in the registry, time `pack FORMAT SRC OUT`
(passthrough store) and `tar cf` on the same folder, each from a cold page cache where this
machine lets us drop it, and report the ratio tar_seconds / pack_seconds plus each run's peak
RSS. Goals (issue 5): >= 2x for wds and lmdb, >= 1.5x for hdf5; peak RSS < 300 MB and not
growing with the file count beyond the listing.

`--suite fields` (issue 20): the same with one caption `.txt` beside every image, packed with
`--sidecars txt`, against `tar cf` of that folder; then reading `fields=("image", "label", "txt")`
against `("image", "label")` from each packed dataset (goal: within 1.2x).

`--suite files-from` (issue 20): `pack plan` of `--list-files` empty image files by walking SRC
and from a `find` list (`--files-from`), same run (goal: planning >= 2x faster than walking).

`--suite inputs` (issue 21): the speed benchmark's folder as WebDataset tar shards (`.JPEG` +
`.cls` per sample); `pack FORMAT SHARDS/` against `tar xf` of every shard followed by packing the
extracted folder (also with a `sync` between, so the extraction is paid on disk rather than left
in the page cache), and against packing the original folder, interleaved, medians of `--repeats`
(goal: >= 2x faster than extract-then-pack; the median peak RSS of the whole process tree not
above that of packing the folder).

    python scripts/bench_pack.py                      # 20k ImageNet-sized JPEGs
    python scripts/bench_pack.py --suite inputs --repeats 3
    python scripts/bench_pack.py --files 2000 --rss-files 20000,200000
    python scripts/bench_pack.py --suite fields --files 20000
    python scripts/bench_pack.py --suite files-from --list-files 1000000
    python scripts/bench_pack.py --suite recordio --files 20000 --repeats 3
    python scripts/bench_pack.py --suite order --files 20000 --repeats 3 --formats lmdb

`--suite recordio` (issue 21): the speed benchmark's folder written as an MXNet `.rec` + `.idx`
(by tests/recordfiles.py, as im2rec lays it out), then `pack FORMAT train.rec` against what
users do without it: write the records out as files, then pack that folder; same run,
interleaved, medians. Goals: >= 2x faster, and peak RSS never above packing the folder.

`--suite order` (issue 28): `pack FORMAT SRC --order shuffled` against `--order sorted` for the
speed benchmark's folder, its tar shards (`--suite inputs`') and its `.rec` (`--suite recordio`'s),
each from a cold page cache, in interleaved rounds (which order goes first alternates), medians.
Goal: shuffled within 10% of sorted (time ratio <= 1.10) for every input.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Iterator

import benchlib
import numpy as np
from PIL import Image

from packer.write.writers import WRITERS

GOALS = {"lmdb": 2.0, "wds": 2.0, "hdf5": 1.5}
DISTINCT_IMAGES = 256


def jpeg_pool(count: int, seed: int, width: int = 500, height: int = 375) -> list[bytes]:
    """Noisy JPEGs; at the default 500x375 around ImageNet's average file size (~100 KB)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
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


def make_caption_source(work: Path, files: int) -> Path:
    """The speed benchmark's folder plus a caption `x.txt` beside every `x.JPEG` (img2dataset style)."""
    src = make_source(work / "captioned", files)
    for number, image in enumerate(sorted(src.rglob("*.JPEG"))):
        caption = image.with_suffix(".txt")
        if not caption.exists():
            caption.write_text(f"a photo of sample {number}, a {'large ' * (number % 4)}thing in a place")
    return src


def read_rate(out: Path, fields: tuple[str, ...], order: np.ndarray, decode: str) -> float:
    """Samples per second reading `order` (random access, one process) with these fields."""
    import readers  # torch: only for this part

    dataset = readers.open_dataset(out, decode=decode, fields=fields)
    dataset[0]  # open the first shard outside the timing
    started = time.perf_counter()
    for index in order:
        dataset[int(index)]
    seconds = time.perf_counter() - started
    dataset.close()
    return len(order) / seconds


def bench_fields(work: Path, files: int, repeats: int, extra: list[str]) -> bool:
    """--sidecars txt against tar cf of the folder, then reading the field against not reading it."""
    src = make_caption_source(work, files)
    cold = benchlib.drop_page_cache()
    print(f"{files} JPEGs + {files} captions; page cache {'dropped before each run' if cold else 'NOT dropped: warm runs'}")
    tar_out = work / "bench.tar"
    tar = min(timed(["tar", "cf", str(tar_out), "-C", str(src), "."], cold)[0] for _ in range(repeats))
    tar_out.unlink()
    print(f"  {'tar cf':8s} {tar:6.2f} s  ({files / tar:7.0f} images/s)")
    ok = True
    for fmt in WRITERS:
        out = work / f"fields-{fmt}"
        best = min(timed(pack_command(fmt, src, out, ["--sidecars", "txt", *extra]), cold)[0] for _ in range(repeats))
        print(f"  {fmt:8s} {best:6.2f} s  ({files / best:7.0f} images/s)  {tar / best:4.2f}x tar cf, --sidecars txt")
    order = np.random.default_rng(0).permutation(files)[:min(files, 2000)]
    print(f"reading {len(order)} samples at random, one process, warm cache (samples/s, best of {repeats + 2}):")
    for fmt in WRITERS:
        for decode in ("bytes", "pil"):
            rates = {fields: max(read_rate(work / f"fields-{fmt}", fields, order, decode) for _ in range(repeats + 2))
                     for fields in (("image", "label"), ("image", "label", "txt"))}
            plain, with_txt = rates.values()
            ok &= plain / with_txt <= 1.2
            print(f"  {fmt:5s} decode={decode:5s}  image+label {plain:8.0f}  +txt {with_txt:8.0f}  "
                  f"({plain / with_txt:4.2f}x the time; goal <= 1.2x: {'met' if plain / with_txt <= 1.2 else 'MISSED'})")
    return ok


def make_empty_tree(root: Path, files: int, per_folder: int = 1000, classes: int = 100) -> Path:
    """`files` empty .jpg files, `per_folder` to a folder, in `classes` class folders; reused when present."""
    marker = root / benchlib.SOURCE_MARKER
    if marker.exists() and marker.read_text() == str(files):
        return root
    shutil.rmtree(root, ignore_errors=True)
    for start in range(0, files, per_folder):
        folder = root / f"n{start // per_folder % classes:08d}" / f"part{start // per_folder:06d}"
        folder.mkdir(parents=True)
        for index in range(start, min(files, start + per_folder)):
            os.close(os.open(folder / f"img_{index:08d}.jpg", os.O_CREAT | os.O_WRONLY, 0o644))
    marker.write_text(str(files))
    return root


def bench_files_from(work: Path, files: int, repeats: int) -> bool:
    """`pack plan` by walking SRC against `pack plan --files-from` a find list of the same files."""
    src = make_empty_tree(work / f"empty-{files}", files)
    listing = work / f"empty-{files}.txt"
    with open(listing, "wb") as handle:  # find's order, not sorted: the packer sorts
        subprocess.run(["find", ".", "-type", "f", "-name", "*.jpg"], cwd=src, stdout=handle, check=True)
    print(f"{files} files in {files // 1000} folders, warm cache; best of {repeats}:")
    times = {}
    for name, args in (("walk", []), ("files-from", ["--files-from", str(listing)])):
        command = [sys.executable, "-m", "packer.cli", "plan", str(src), str(work / "plan-out"), "--format", "lmdb",
                   *args]
        runs = []
        for _ in range(repeats):
            shutil.rmtree(work / "plan-out", ignore_errors=True)
            runs.append(timed(command, cold=False)[0])
        times[name] = min(runs)
    scan_times = scan_seconds(src, listing, repeats)
    ratio = times["walk"] / times["files-from"]
    for name in times:
        print(f"  pack plan, {name:10s} {times[name]:6.2f} s  (listing alone: {scan_times[name]:5.2f} s)")
    print(f"  files-from plans {ratio:.2f}x faster (goal >= 2x: {'met' if ratio >= 2 else 'MISSED'}); listing alone "
          f"{scan_times['walk'] / scan_times['files-from']:.2f}x")
    shutil.rmtree(work / "plan-out", ignore_errors=True)
    return ratio >= 2


def scan_seconds(src: Path, listing: Path, repeats: int) -> dict[str, float]:
    """The listing step alone, in this process: walk against reading the list (stat included)."""
    from packer.sources.filelist import list_files
    from packer.sources.walk import walk

    times: dict[str, list[float]] = {"walk": [], "files-from": []}
    for _ in range(repeats):
        for name, run in (("walk", lambda: walk(src)), ("files-from", lambda: list_files(src, str(listing)))):
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    return {name: min(values) for name, values in times.items()}


def make_tar_shards(src: Path, shards: Path, per_shard: int) -> Path:
    """The folder as WebDataset shards: `n########/img_########.JPEG` and `.cls` (its class index)
    per sample, `per_shard` samples per tar; extracting them gives the folder back (plus .cls files)."""
    marker = shards / benchlib.SOURCE_MARKER
    wanted = json.dumps({"source": str(src), "per_shard": per_shard})
    if marker.exists() and marker.read_text() == wanted:
        return shards
    shutil.rmtree(shards, ignore_errors=True)
    shards.mkdir(parents=True)
    classes = sorted(path.name for path in src.iterdir() if path.is_dir())
    images = sorted(src.rglob("*.JPEG"))
    for start in range(0, len(images), per_shard):
        with tarfile.open(shards / f"data-{start // per_shard:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for image in images[start:start + per_shard]:
                name = image.relative_to(src).as_posix()
                tar.add(image, arcname=name)
                label = str(classes.index(image.parent.name)).encode()
                info = tarfile.TarInfo(name.rsplit(".", 1)[0] + ".cls")
                info.size = len(label)
                tar.addfile(info, io.BytesIO(label))
    marker.write_text(wanted)
    return shards


def bench_inputs(work: Path, files: int, repeats: int, extra: list[str], formats: list[str]) -> bool:
    """Packing tar shards directly, against extracting them and packing the folder; and the folder itself."""
    src = make_source(work, files)
    shards = make_tar_shards(src, work / f"shards-{files}", per_shard=1000)
    cold = benchlib.drop_page_cache()
    print(f"{files} JPEGs in {len(list(shards.glob('*.tar')))} tar shards; page cache "
          f"{'dropped before each run' if cold else 'NOT dropped: warm runs'}; medians of {repeats}, interleaved")
    extracted, out = work / "extracted", work / "inputs-out"
    ok = True
    for fmt in formats:
        runs: dict[str, list[tuple[float, float]]] = {"extract+pack": [], "extract+sync+pack": [], "pack tars": [],
                                                      "pack folder": []}
        for _ in range(repeats):
            for name, sync in (("extract+pack", ""), ("extract+sync+pack", "sync && ")):
                shutil.rmtree(extracted, ignore_errors=True)
                extract = (f"mkdir {extracted} && for t in {shards}/*.tar; do tar xf $t -C {extracted} || exit 1; "
                           f"done && {sync}" + " ".join(pack_command(fmt, extracted, out, extra)))
                runs[name].append(timed(["sh", "-c", extract], cold))
                shutil.rmtree(extracted)
            runs["pack tars"].append(timed(pack_command(fmt, shards, out, extra), cold))
            runs["pack folder"].append(timed(pack_command(fmt, src, out, extra), cold))
        shutil.rmtree(out, ignore_errors=True)
        seconds = {name: float(np.median([run[0] for run in values])) for name, values in runs.items()}
        peaks = {name: float(np.median([run[1] for run in values])) for name, values in runs.items()}
        ratio = seconds["extract+pack"] / seconds["pack tars"]
        lean = peaks["pack tars"] <= peaks["pack folder"]
        ok &= ratio >= 2 and lean
        for name in runs:
            print(f"  {fmt:5s} {name:17s} {seconds[name]:6.2f} s  ({files / seconds[name]:6.0f} images/s)  "
                  f"peak RSS {peaks[name]:5.0f} MB")
        print(f"  {fmt:5s} tar shards {ratio:4.2f}x faster than extract+pack (goal >= 2x: {'met' if ratio >= 2 else 'MISSED'}); "
              f"peak RSS {peaks['pack tars']:.0f} MB vs {peaks['pack folder']:.0f} MB packing the folder "
              f"({'not above: met' if lean else 'ABOVE: MISSED'})")
    return ok


def bench_memory(work: Path, counts: list[int], extra: list[str]) -> None:
    """Peak RSS for tiny-file folders of several sizes: what grows is the listing alone."""
    print("peak RSS by file count (8x8 JPEGs, lmdb):")
    for count in counts:
        src = make_source(work, count, tiny=True)
        seconds, peak = timed(pack_command("lmdb", src, work / "out-rss", extra), cold=False)
        print(f"  {count:8d} files: {peak:6.0f} MB peak RSS, {seconds:.1f} s")
        shutil.rmtree(work / "out-rss")


def write_rec(src: Path, rec: Path) -> int:
    """The folder's JPEGs in path order as `rec` + its `.idx`, labelled by class folder; reused when there."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from recordfiles import recordio_payload, write_recordio

    paths = sorted(src.rglob("*.JPEG"))
    index = rec.with_suffix(".idx")
    if rec.exists() and index.exists() and len(index.read_text().splitlines()) == len(paths):
        return len(paths)
    classes = sorted({path.parent.name for path in paths})
    write_recordio(rec, (recordio_payload(path.read_bytes(), float(classes.index(path.parent.name)), id=key)
                         for key, path in enumerate(paths)))
    return len(paths)


def extract_records(rec: Path, folder: Path) -> float:
    """The usual workaround, timed: read the .rec front to back and write every image out as a file
    under a folder per label (what an MXNet reader loop does, without MXNet)."""
    from packer.sources.recordio import join_parts, record_ranges, unpack

    started = time.perf_counter()
    shutil.rmtree(folder, ignore_errors=True)
    with open(rec, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        for key, (offset, length) in enumerate(record_ranges(handle, size)):
            handle.seek(offset)
            record = unpack(join_parts(handle.read(length), offset)[0])
            target = folder / f"{int(record.class_label):05d}"
            target.mkdir(parents=True, exist_ok=True)
            (target / f"{key:08d}.jpg").write_bytes(record.image)
    return time.perf_counter() - started


def bench_recordio(work: Path, files: int, repeats: int, extra: list[str], formats: list[str]) -> bool:
    """`pack FORMAT train.rec` against extracting the records to files and packing the folder."""
    src = make_source(work, files)
    rec = work / f"records-{files}" / "train.rec"
    rec.parent.mkdir(exist_ok=True)
    write_rec(src, rec)
    cold = benchlib.drop_page_cache()
    print(f"{files} records, {rec.stat().st_size / 1e9:.2f} GB .rec + .idx; page cache "
          f"{'dropped before each run' if cold else 'NOT dropped (no permission): warm runs'}; {repeats} interleaved "
          "rounds, medians; the machine was shared with other jobs")
    extracted = work / f"records-{files}" / "extracted"
    runs: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for round_number in range(repeats):
        for fmt in formats:
            out = work / f"records-out-{fmt}"
            order = ("rec", "files") if round_number % 2 else ("files", "rec")
            for way in order:
                if cold:
                    benchlib.drop_page_cache()
                if way == "rec":
                    seconds, peak = timed(pack_command(fmt, rec, out, extra), cold=False)
                    runs.setdefault(fmt, {}).setdefault("rec", []).append((seconds, peak))
                else:
                    extract = extract_records(rec, extracted)
                    seconds, peak = timed(pack_command(fmt, extracted, out, extra), cold=False)
                    runs.setdefault(fmt, {}).setdefault("files", []).append((extract + seconds, peak))
                    runs[fmt].setdefault("extract", []).append((extract, 0.0))
                shutil.rmtree(out)
    shutil.rmtree(extracted, ignore_errors=True)
    ok = True
    for fmt, ways in runs.items():
        rec_s, files_s, extract_s = (float(np.median([s for s, _ in ways[way]])) for way in ("rec", "files", "extract"))
        rec_rss, files_rss = (max(peak for _, peak in ways[way]) for way in ("rec", "files"))
        ratio = files_s / rec_s
        met = ratio >= 2 and rec_rss <= files_rss
        ok &= met
        print(f"  {fmt:5s} from .rec {rec_s:6.2f} s ({files / rec_s:5.0f}/s), peak RSS {rec_rss:4.0f} MB | write files "
              f"{extract_s:5.2f} s + pack folder {files_s - extract_s:5.2f} s = {files_s:6.2f} s, pack's peak RSS "
              f"{files_rss:4.0f} MB | {ratio:4.2f}x faster (goals >= 2x, RSS <= folder's: {'met' if met else 'MISSED'})")
    return ok


def bench_order(work: Path, files: int, repeats: int, extra: list[str], formats: list[str]) -> bool:
    """Shuffled against sorted packing of one set of images as a folder, as tar shards and as a .rec."""
    src = make_source(work, files)
    rec = work / f"records-{files}" / "train.rec"
    rec.parent.mkdir(exist_ok=True)
    write_rec(src, rec)
    inputs = {"folder": src, "tars": make_tar_shards(src, work / f"shards-{files}", per_shard=1000), "recordio": rec}
    cold = benchlib.drop_page_cache()
    print(f"{files} JPEGs as a folder, {len(list(inputs['tars'].glob('*.tar')))} tar shards and one .rec; page cache "
          f"{'dropped before each run' if cold else 'NOT dropped (no permission): warm runs'}; {repeats} interleaved "
          "rounds, medians")
    out = work / "order-out"
    runs: dict[tuple[str, str, str], list[float]] = {}
    for round_number in range(repeats):
        orders = ("sorted", "shuffled") if round_number % 2 == 0 else ("shuffled", "sorted")
        for fmt in formats:
            for name, path in inputs.items():
                for order in orders:
                    seconds, _ = timed(pack_command(fmt, path, out, [*extra, "--order", order]), cold)
                    runs.setdefault((fmt, name, order), []).append(seconds)
    shutil.rmtree(out, ignore_errors=True)
    ok = True
    for fmt in formats:
        for name in inputs:
            shuffled, ordered = (float(np.median(runs[fmt, name, order])) for order in ("shuffled", "sorted"))
            ratio = shuffled / ordered
            ok &= ratio <= 1.10
            print(f"  {fmt:5s} {name:8s} sorted {ordered:6.2f} s ({files / ordered:5.0f}/s)  shuffled {shuffled:6.2f} s "
                  f"({files / shuffled:5.0f}/s)  shuffled/sorted {ratio:4.2f} (goal <= 1.10: "
                  f"{'met' if ratio <= 1.10 else 'MISSED'})")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=("speed", "fields", "files-from", "inputs", "recordio", "order"), default="speed")
    parser.add_argument("--formats", default="lmdb,wds", help="formats for --suite inputs, recordio and order")
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--list-files", type=int, default=1_000_000, help="files for --suite files-from")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "pack-bench")
    parser.add_argument("--rss-files", default="", help="comma-separated file counts for the memory check, e.g. 20000,200000")
    parser.add_argument("--pack-args", default="", help="extra arguments for pack, e.g. '--workers 4'")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    extra = args.pack_args.split()
    if args.suite == "fields":
        sys.exit(0 if bench_fields(args.work, args.files, args.repeats, extra) else 1)
    if args.suite == "inputs":
        sys.exit(0 if bench_inputs(args.work, args.files, args.repeats, extra, args.formats.split(",")) else 1)
    if args.suite == "recordio":
        sys.exit(0 if bench_recordio(args.work, args.files, max(args.repeats, 1), extra, args.formats.split(",")) else 1)
    if args.suite == "order":
        sys.exit(0 if bench_order(args.work, args.files, max(args.repeats, 1), extra, args.formats.split(",")) else 1)
    if args.suite == "files-from":
        sys.exit(0 if bench_files_from(args.work, args.list_files, max(args.repeats, 3)) else 1)
    ok = bench_speed(args.work, args.files, args.repeats, extra)
    if args.rss_files:
        bench_memory(args.work, [int(n) for n in args.rss_files.split(",")], extra)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
