"""scan -> plan -> encode -> write -> manifest, with one shard as the unit of work.

`run_shard` packs one shard from the plan on disk, so any process on any machine can run it:
it writes the shard under a temporary name, renames it into place when complete and synced,
then writes a marker with its counts and hash. `merge` publishes `index.json` only when every
planned shard has its marker. A rerun skips shards whose marker and file still agree.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

from readers.manifest import MANIFEST_NAME, REJECTS_NAME, Manifest, ShardInfo, shard_name

from . import __version__
from .encode import encode
from .errors import PackError, RejectedFile
from .fsutil import atomic_write_text, publish, sha256_file
from .plan import Entry, PackOptions, Plan, load_plan, read_shard_entries, work_dir, write_plan
from .scan import Listing, scan
from .writers import Sample, get_writer

log = logging.getLogger(__name__)

Progress = Callable[[int], None]
DONE_DIR = "done"
TMP_DIR = "tmp"


@dataclass
class ShardResult:
    """What a finished shard's marker records."""

    name: str
    num_samples: int
    bytes: int
    sha256: str
    fingerprint: str
    rejects: list[dict[str, str]]

    def info(self) -> ShardInfo:
        return ShardInfo(name=self.name, num_samples=self.num_samples, bytes=self.bytes, sha256=self.sha256)


@dataclass
class Summary:
    out: str
    num_samples: int
    bytes: int
    num_shards: int
    rejects: int
    ignored: int
    resumed_shards: int
    elapsed: float

    @property
    def files_per_second(self) -> float:
        return (self.num_samples + self.rejects) / self.elapsed if self.elapsed > 0 else 0.0


def default_workers() -> int:
    """CPUs this job may use: the Slurm allocation or the affinity mask, not the whole node."""
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        return int(slurm)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def pack(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: PackOptions,
    *,
    overwrite: bool = False,
    workers: int | None = None,
    progress: Progress | None = None,
) -> Summary:
    """Pack every image under `src` into shards in `out`; resumes an interrupted run of the same plan."""
    started = time.monotonic()
    src_path, out_path = Path(src), Path(out)
    check_paths(src_path, out_path)
    prepare_output(out_path, overwrite=overwrite)
    listing = scan(src_path)
    if not len(listing):
        raise PackError(f"{src_path}: no image files found")
    plan = plan_or_resume(out_path, listing, options)
    threads = max(1, (workers or default_workers()) * 4)
    resumed = 0
    for shard in range(plan.num_shards):
        result = finished_shard(out_path, plan, shard)
        if result is not None:
            resumed += 1
            if progress:
                progress(plan.bounds[shard + 1] - plan.bounds[shard])
            continue
        run_shard(out_path, plan, shard, threads=threads, progress=progress)
    manifest = merge(out_path)
    return Summary(
        out=str(out_path),
        num_samples=manifest.num_samples,
        bytes=sum(shard.bytes for shard in manifest.shards),
        num_shards=len(manifest.shards),
        rejects=count_rejects(out_path),
        ignored=listing.ignored_hidden + listing.ignored_other,
        resumed_shards=resumed,
        elapsed=time.monotonic() - started,
    )


def check_paths(src: Path, out: Path) -> None:
    if src.exists() and src.is_dir():
        src_real, out_real = src.resolve(), out.resolve()
        if out_real == src_real or src_real in out_real.parents:
            raise PackError(f"{out}: OUT must not be inside SRC ({src}); the packer would scan its own output")
    if out.exists() and not out.is_dir():
        raise PackError(f"{out}: exists and is not a directory")


def is_pack_output(name: str) -> bool:
    return name in (MANIFEST_NAME, REJECTS_NAME, work_dir(Path()).name) or name.startswith("shard-")


def prepare_output(out: Path, *, overwrite: bool) -> None:
    """Refuse to clobber a finished dataset or foreign files; with overwrite, remove our files only."""
    if not out.exists():
        out.mkdir(parents=True)
        return
    names = os.listdir(out)
    foreign = sorted(name for name in names if not is_pack_output(name))
    if overwrite:
        for name in names:
            if is_pack_output(name):
                target = out / name
                shutil.rmtree(target) if target.is_dir() else target.unlink()
        return
    if (out / MANIFEST_NAME).exists():
        raise PackError(f"{out}: already holds a packed dataset; pass --overwrite to replace it")
    if foreign:
        raise PackError(f"{out}: not empty and not a pack output (found {foreign[0]!r}); choose another OUT")


def plan_or_resume(out: Path, listing: Listing, options: PackOptions) -> Plan:
    """Keep an unfinished run's plan if it would produce the same shards; else start over."""
    previous = load_plan(out)
    plan = write_plan(out, listing, options)
    if previous is not None and previous.fingerprint != plan.fingerprint:
        log.warning("%s: source or options changed since the unfinished run; starting over", out)
        discard_shards(out)
    shutil.rmtree(work_dir(out) / TMP_DIR, ignore_errors=True)
    return plan


def discard_shards(out: Path) -> None:
    shutil.rmtree(work_dir(out) / DONE_DIR, ignore_errors=True)
    for name in os.listdir(out):
        if name.startswith("shard-"):
            (out / name).unlink()


def marker_path(out: Path, name: str) -> Path:
    return work_dir(out) / DONE_DIR / (name + ".json")


def shard_file_name(plan: Plan, shard: int) -> str:
    return shard_name(shard, get_writer(plan.options["format"]).extension)


def read_marker(out: Path, name: str) -> ShardResult | None:
    try:
        return ShardResult(**json.loads(marker_path(out, name).read_text(encoding="utf-8")))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def finished_shard(out: Path, plan: Plan, shard: int) -> ShardResult | None:
    """The marker of a shard that is done for this plan and whose file still matches its hash."""
    name = shard_file_name(plan, shard)
    result = read_marker(out, name)
    if result is None or result.fingerprint != plan.fingerprint:
        return None
    path = out / name
    try:
        if path.stat().st_size != result.bytes or sha256_file(path) != result.sha256:
            log.warning("%s: does not match its marker; packing it again", path)
            return None
    except FileNotFoundError:
        return None
    return result


def run_shard(
    out: Path,
    plan: Plan,
    shard: int,
    *,
    threads: int = 8,
    progress: Progress | None = None,
) -> ShardResult:
    """Pack one planned shard: temp file, rename when synced, then the marker (written last)."""
    name = shard_file_name(plan, shard)
    entries = read_shard_entries(out, plan, shard)
    options = plan.options
    writer_cls = get_writer(options["format"])
    tmp_dir = work_dir(out) / TMP_DIR
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / f"{name}.{os.getpid()}"
    writer = writer_cls(tmp, expected_bytes=sum(entry.size for entry in entries))
    rejects: list[dict[str, str]] = []
    count = 0
    try:
        for entry, data in read_files(Path(plan.source), entries, threads):
            try:
                if isinstance(data, RejectedFile):
                    raise data
                encoded = encode(data, options["store"])
            except RejectedFile as exc:
                rejects.append({"path": entry.path, "reason": str(exc)})
            else:
                writer.add(
                    Sample(
                        local_index=count,
                        label=entry.label,
                        path=entry.path,
                        payload=encoded.payload,
                        meta=encoded.meta,
                        extension=encoded.extension,
                    )
                )
                count += 1
            if progress:
                progress(1)
        writer.close()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    final = out / name
    publish(tmp, final)
    result = ShardResult(
        name=name,
        num_samples=count,
        bytes=final.stat().st_size,
        sha256=sha256_file(final),
        fingerprint=plan.fingerprint,
        rejects=rejects,
    )
    marker = marker_path(out, name)
    marker.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(marker, json.dumps(asdict(result)) + "\n")
    log.info("%s: %d samples, %d rejected", final, count, len(rejects))
    return result


def read_files(root: Path, entries: list[Entry], threads: int) -> Iterator[tuple[Entry, bytes | RejectedFile]]:
    """Read files with a thread pool, yielding in listing order with a bounded read-ahead."""

    def read(entry: Entry) -> bytes | RejectedFile:
        try:
            with open(os.path.join(root, entry.path), "rb") as handle:
                return handle.read()
        except OSError as exc:
            return RejectedFile(f"cannot read: {exc.strerror or exc}")

    window = threads * 4
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pack-read") as pool:
        pending: deque[tuple[Entry, Future[bytes | RejectedFile]]] = deque()
        position = 0
        while position < len(entries) or pending:
            while position < len(entries) and len(pending) < window:
                entry = entries[position]
                pending.append((entry, pool.submit(read, entry)))
                position += 1
            entry, future = pending.popleft()
            yield entry, future.result()


def merge(out: Path) -> Manifest:
    """Publish index.json and rejects.jsonl once every planned shard has its marker."""
    plan = load_plan(out)
    if plan is None:
        raise PackError(f"{work_dir(out)}: no plan; nothing was packed here")
    results: list[ShardResult] = []
    missing: list[str] = []
    for shard in range(plan.num_shards):
        name = shard_file_name(plan, shard)
        result = read_marker(out, name)
        if result is None or result.fingerprint != plan.fingerprint or not (out / name).exists():
            missing.append(name)
        else:
            results.append(result)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise PackError(f"{out}: {len(missing)} of {plan.num_shards} shards unfinished: {shown}")
    rejects = sorted(
        plan.scan_rejects + [reject for result in results for reject in result.rejects],
        key=lambda reject: reject["path"],
    )
    atomic_write_text(out / REJECTS_NAME, "".join(json.dumps(reject) + "\n" for reject in rejects))
    manifest = Manifest(
        format=plan.options["format"],
        store=plan.options["store"],
        num_samples=sum(result.num_samples for result in results),
        classes=plan.classes,
        shards=[result.info() for result in results],
        options=plan.options,
        tool_version=f"pack {__version__}",
    )
    atomic_write_text(out / MANIFEST_NAME, manifest.to_json())
    return manifest


def count_rejects(out: Path) -> int:
    with open(out / REJECTS_NAME, "rb") as handle:
        return sum(1 for _ in handle)
