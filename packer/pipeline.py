"""scan -> plan -> encode -> write -> manifest, with one shard as the unit of work.

`run_shard` packs one shard from the plan on disk, so any process on any machine can run it:
it writes the shard under a temporary name, renames it into place when complete and synced,
then writes a marker with its counts and hash. `merge` publishes `index.json` only when every
planned shard has its marker. A rerun skips shards whose marker and file still agree.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import logging
import os
import shutil
import socket
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from readers.cpus import available_cpus
from readers.manifest import (
    MANIFEST_NAME,
    REJECTS_NAME,
    FileInfo,
    Manifest,
    ShardInfo,
    shard_name,
)

from . import __version__
from .encode import Encoded, encode, encode_kwargs, fixed_shape
from .errors import PackError, RejectedFile
from .fsutil import atomic_write_text, publish, sha256_file, sync_and_hash
from .partition import Partition
from .plan import (
    Entry,
    PackOptions,
    Plan,
    load_plan,
    read_shard_entries,
    work_dir,
    write_plan,
)
from .scan import scan
from .validate import ErrorPolicy, check_image
from .writers import WRITERS, Sample, get_writer, sidecar_path

log = logging.getLogger(__name__)

Progress = Callable[[int], None]
DONE_DIR = "done"
TMP_DIR = "tmp"
LOCK_NAME = "plan.lock"
READ_THREADS = 8
DISK_FULL_MARGIN = 1 << 20
READAHEAD_BYTES = 8 << 20
READAHEAD_FILES = 512
READ_RUN_FILES = 16
READ_RUN_BYTES = 1 << 20


@dataclass
class ShardResult:
    """What a finished shard's marker records."""

    name: str
    num_samples: int
    bytes: int
    sha256: str
    fingerprint: str
    rejects: list[dict[str, str]]
    label_counts: dict[str, int]
    source_bytes: int
    sidecars: list[dict[str, Any]] = field(default_factory=list)

    def info(self) -> ShardInfo:
        return ShardInfo(
            name=self.name,
            num_samples=self.num_samples,
            bytes=self.bytes,
            sha256=self.sha256,
            sidecars=tuple(FileInfo(**sidecar) for sidecar in self.sidecars),
        )

    def files(self) -> list[tuple[str, int, str]]:
        """(name, bytes, sha256) of the shard and of every sidecar: what must still be on disk."""
        return [(self.name, self.bytes, self.sha256)] + [
            (sidecar["name"], sidecar["bytes"], sidecar["sha256"]) for sidecar in self.sidecars
        ]


@dataclass
class Summary:
    out: str
    num_samples: int
    bytes: int
    source_bytes: int
    num_shards: int
    planned_shards: int
    rejects: int
    ignored: int
    resumed_shards: int
    elapsed: float
    published: bool

    @property
    def files_per_second(self) -> float:
        return (self.num_samples + self.rejects) / self.elapsed if self.elapsed > 0 else 0.0


def pack(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: PackOptions,
    *,
    overwrite: bool = False,
    workers: int | None = None,
    partition: Partition = Partition(),
    engine: str = "local",
    scheduler: str | None = None,
    progress: Progress | None = None,
    policy: ErrorPolicy = ErrorPolicy(),
) -> Summary:
    """Pack the images under `src` into shards in `out`.

    With a partition of several tasks, only this task's shards are packed and nothing is
    published: `merge` does that once all tasks are done. An interrupted run of the same
    command resumes: finished shards are kept, the others are packed again. `policy` says
    whether a rejected file stops the run, and how many rejects are too many.
    """
    from .engines import get_engine

    started = time.monotonic()
    src_path, out_path = Path(src), Path(out)
    if engine != "local" and not partition.is_whole:
        raise PackError(f"--engine {engine} runs every shard itself; drop --task-index/--task-count")
    if overwrite and not partition.is_whole:
        raise PackError(f"{out_path}: --overwrite cannot be combined with a partitioned run; remove OUT first")
    plan = ensure_plan(src_path, out_path, options, overwrite=overwrite)
    if policy.on_error == "fail":
        check_rejects(out_path, plan, plan.scan_rejects, policy)
    mine = partition.shards(plan.num_shards)
    done = {shard: finished_shard(out_path, plan, shard) for shard in mine}
    pending = [shard for shard, result in done.items() if result is None]
    if progress:
        progress(sum(plan.bounds[k + 1] - plan.bounds[k] for k, result in done.items() if result is not None))
    clean_tmp(out_path, plan, pending)
    get_engine(engine)(out_path, plan, pending, workers=workers or available_cpus(), scheduler=scheduler,
                       progress=progress, policy=policy)
    results = [finished_shard(out_path, plan, shard, check_hash=False) for shard in mine]
    published = partition.is_whole
    if published:
        merge(out_path, policy)
    finished = [result for result in results if result is not None]
    return Summary(
        out=str(out_path),
        num_samples=sum(result.num_samples for result in finished),
        bytes=sum(result.bytes for result in finished),
        source_bytes=sum(result.source_bytes for result in finished),
        num_shards=len(finished),
        planned_shards=plan.num_shards,
        rejects=sum(len(result.rejects) for result in finished)
        + (len(plan.scan_rejects) if published else 0),
        ignored=plan.ignored,
        resumed_shards=len(mine) - len(pending),
        elapsed=time.monotonic() - started,
        published=published,
    )


def canonical_options(options: PackOptions) -> PackOptions:
    """Options naming the format by its registry name, so an alias never reaches the manifest."""
    try:
        writer = get_writer(options.format)
    except KeyError:
        raise PackError(f"unknown format {options.format!r} (choose from {', '.join(WRITERS)})") from None
    return replace(options, format=writer.format)


def check_paths(src: Path, out: Path) -> None:
    if src.is_dir():
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
        out.mkdir(parents=True, exist_ok=True)
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


def ensure_plan(src: Path, out: Path, options: PackOptions, *, overwrite: bool = False) -> Plan:
    """The plan in OUT, written once: the first process scans SRC, the others (and reruns) reuse it.

    A file lock serialises concurrent tasks on a shared filesystem, so N tasks do not all walk
    millions of files; a plan made with other options is an error, never silently replaced.
    """
    options = canonical_options(options)
    check_paths(src, out)
    prepare_output(out, overwrite=overwrite)
    work = work_dir(out)
    work.mkdir(exist_ok=True)
    with open(work / LOCK_NAME, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        plan = load_plan(out)
        if plan is not None:
            wanted = asdict(options)
            if plan.options != wanted or plan.source != os.path.abspath(src):
                raise PackError(
                    f"{out}: holds an unfinished run of {plan.source} with options {plan.options}; "
                    "rerun with those, or pass --overwrite to start over"
                )
            log.info("%s: reusing the plan (%d shards)", out, plan.num_shards)
            return plan
        listing = scan(src)
        if not len(listing):
            raise PackError(f"{src}: no image files found")
        return write_plan(out, listing, options)


def marker_path(out: Path, name: str) -> Path:
    return work_dir(out) / DONE_DIR / (name + ".json")


def shard_file_name(plan: Plan, shard: int) -> str:
    return shard_name(shard, get_writer(plan.options["format"]).extension)


def read_marker(out: Path, name: str) -> ShardResult | None:
    try:
        return ShardResult(**json.loads(marker_path(out, name).read_text(encoding="utf-8")))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def finished_shard(out: Path, plan: Plan, shard: int, *, check_hash: bool = True) -> ShardResult | None:
    """The marker of a shard done for this plan, if its files still match it (size, and hash)."""
    name = shard_file_name(plan, shard)
    result = read_marker(out, name)
    if result is None or result.fingerprint != plan.fingerprint:
        return None
    for file_name, size, digest in result.files():
        path = out / file_name
        try:
            if path.stat().st_size != size or (check_hash and sha256_file(path) != digest):
                log.warning("%s: does not match its marker; packing it again", path)
                return None
        except FileNotFoundError:
            return None
    return result


def clean_tmp(out: Path, plan: Plan, shards: list[int]) -> None:
    """Remove leftovers of interrupted attempts at these shards (and only these: other tasks run)."""
    tmp_dir = work_dir(out) / TMP_DIR
    if not tmp_dir.is_dir():
        return
    names = {shard_file_name(plan, shard) for shard in shards}
    for leftover in os.listdir(tmp_dir):
        if leftover.split(".tmp-")[0] in names:
            (tmp_dir / leftover).unlink(missing_ok=True)


def run_shard(out: Path, plan: Plan, shard: int, *, threads: int = READ_THREADS,
              progress: Progress | None = None, policy: ErrorPolicy = ErrorPolicy()) -> ShardResult:
    """Pack one planned shard: temp files, renamed when synced (sidecars first), then the marker.

    Under `policy` the shard stops early, publishing nothing, at its first reject (fail) or when
    its own rejects alone exceed --max-errors; the total over all shards is checked in `merge`.
    """
    name = shard_file_name(plan, shard)
    entries = read_shard_entries(out, plan, shard)
    writer_cls = get_writer(plan.options["format"])
    tmp_dir = work_dir(out) / TMP_DIR
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / f"{name}.tmp-{socket.gethostname()}-{os.getpid()}"
    tmp_sidecars = {extension: sidecar_path(tmp, extension) for extension in writer_cls.sidecars}
    rejects: list[dict[str, str]] = []
    label_counts: dict[str, int] = {}
    sidecars: list[dict[str, Any]] = []
    count = source_bytes = 0
    final = out / name
    try:
        with writer_cls(tmp, expected_bytes=sum(entry.size for entry in entries), classes=plan.classes,
                        sample_shape=fixed_shape(plan.options)) as writer:
            for entry, encoded in load_samples(Path(plan.source), entries, plan.options, threads):
                if isinstance(encoded, RejectedFile):
                    rejects.append({"path": entry.path, "reason": str(encoded)})
                    check_rejects(out, plan, rejects, policy)
                else:
                    writer.add(Sample(local_index=count, label=entry.label, path=entry.path,
                                      payload=encoded.payload, meta=encoded.meta, extension=encoded.extension,
                                      crc32=encoded.crc32))
                    count += 1
                    label_counts[str(entry.label)] = label_counts.get(str(entry.label), 0) + 1
                    source_bytes += entry.size
                if progress:
                    progress(1)
        # A writer that hashed its file on the way is synced by `publish`; the others are hashed while they sync.
        digest = writer.sha256 if writer.sha256 else sync_and_hash([tmp, *tmp_sidecars.values()], tmp)
        for extension, tmp_sidecar in tmp_sidecars.items():
            sidecar = out / shard_name(shard, extension)
            publish(tmp_sidecar, sidecar)
            sidecars.append({"name": sidecar.name, "bytes": sidecar.stat().st_size, "sha256": sha256_file(sidecar)})
        publish(tmp, final)
        result = ShardResult(name=name, num_samples=count, bytes=final.stat().st_size, sha256=digest,
                             fingerprint=plan.fingerprint, rejects=rejects, label_counts=label_counts,
                             source_bytes=source_bytes, sidecars=sidecars)
        marker = marker_path(out, name)
        marker.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(marker, json.dumps(asdict(result)) + "\n")
    except (OSError, *writer_cls.write_errors) as exc:
        # Without its marker a published shard would be packed again anyway: take it back too.
        remove_files(tmp, *tmp_sidecars.values(), final, *(out / sidecar["name"] for sidecar in sidecars))
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if disk_full(out) and os.strerror(errno.ENOSPC) not in reason:  # some libraries say EIO
            reason = f"{os.strerror(errno.ENOSPC)}: {reason}"
        raise PackError(f"{out}: cannot write {name} ({reason}); nothing was published") from None
    except BaseException:
        remove_files(tmp, *tmp_sidecars.values())
        raise
    log.info("%s: %d samples, %d rejected", final, count, len(rejects))
    return result


def remove_files(*paths: Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def disk_full(path: Path) -> bool:
    stats = os.statvfs(path)
    return bool(stats.f_blocks) and stats.f_bavail * stats.f_frsize < DISK_FULL_MARGIN


def check_rejects(out: Path, plan: Plan, rejects: list[dict[str, str]], policy: ErrorPolicy) -> None:
    """Raise PackError when these rejects break the policy; names the file, or the count."""
    if policy.on_error == "fail" and rejects:
        first = rejects[0]
        raise PackError(f"{Path(plan.source) / first['path']}: {first['reason']} (--on-error fail)")
    if policy.too_many(len(rejects)):
        raise PackError(f"{out}: {len(rejects)} files rejected, more than --max-errors {policy.max_errors} "
                        f"(first: {rejects[0]['path']}: {rejects[0]['reason']}); no index.json written")


def read_file(path: str, size: int) -> bytes:
    """The whole file, in one read() when it still has the size the scan saw.

    Three system calls where `open().read()` makes seven; with eight reader threads, each call
    is a hand-over of the GIL, and those hand-overs were most of a shard's system time.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.read(fd, size + 1)
        if len(data) != size:  # changed since the scan, or a short read: read on to the end
            parts = [data]
            while chunk := os.read(fd, 1 << 20):
                parts.append(chunk)
            data = b"".join(parts)
        return data
    finally:
        os.close(fd)


def load_sample(root: str, entry: Entry, validate: str, max_pixels: int,
                encoding: dict[str, Any]) -> Encoded | RejectedFile:
    """Read, check and encode one file; runs in a reader thread (Pillow's codecs release the GIL)."""
    try:
        data = read_file(os.path.join(root, entry.path), entry.size)
        kind = check_image(data, validate=validate, max_pixels=max_pixels)
        return encode(data, kind=kind, **encoding)
    except RejectedFile as exc:
        return exc
    except OSError as exc:
        return RejectedFile(f"cannot read: {exc.strerror or exc}")


def load_samples(root: Path, entries: list[Entry], options: dict[str, Any],
                 threads: int) -> Iterator[tuple[Entry, Encoded | RejectedFile]]:
    """Samples in listing order, loaded by a thread pool with a read-ahead bounded in bytes and files.

    Each task loads a run of consecutive files (up to READ_RUN_FILES or READ_RUN_BYTES), so the
    pool's queue and futures cost once per run instead of once per file.
    """
    load = functools.partial(load_sample, str(root), validate=options["validate"], max_pixels=options["max_pixels"],
                             encoding=encode_kwargs(options))

    def load_run(run: list[Entry]) -> list[Encoded | RejectedFile]:
        return [load(entry) for entry in run]

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pack-read") as pool:
        pending: deque[tuple[list[Entry], int, Future[list[Encoded | RejectedFile]]]] = deque()
        position = in_flight = 0
        try:
            while position < len(entries) or pending:
                while position < len(entries) and (
                    not pending or (in_flight < READAHEAD_BYTES and len(pending) * READ_RUN_FILES < READAHEAD_FILES)
                ):
                    run, run_bytes = [], 0
                    while position < len(entries) and len(run) < READ_RUN_FILES and run_bytes < READ_RUN_BYTES:
                        run.append(entries[position])
                        run_bytes += entries[position].size
                        position += 1
                    pending.append((run, run_bytes, pool.submit(load_run, run)))
                    in_flight += run_bytes
                run, run_bytes, future = pending.popleft()
                in_flight -= run_bytes
                yield from zip(run, future.result())
        finally:
            for _, _, future in pending:
                future.cancel()


def merge(out: Path, policy: ErrorPolicy = ErrorPolicy()) -> Manifest:
    """Publish index.json and rejects.jsonl once every planned shard has its marker.

    The authoritative --max-errors check (all shards, scan-time rejects included): rejects.jsonl
    is still written so the bad files can be looked at, but index.json is not.
    """
    plan = load_plan(out)
    if plan is None:
        raise PackError(f"{work_dir(out)}: no plan; nothing was packed here")
    results: list[ShardResult] = []
    missing: list[str] = []
    for shard in range(plan.num_shards):
        result = finished_shard(out, plan, shard, check_hash=False)
        if result is None:
            missing.append(shard_file_name(plan, shard))
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
    check_rejects(out, plan, rejects, policy)
    manifest = Manifest(
        format=plan.options["format"],
        store=plan.options["store"],
        num_samples=sum(result.num_samples for result in results),
        classes=plan.classes,
        shards=[result.info() for result in results],
        class_counts=[sum(result.label_counts.get(str(label), 0) for result in results)
                      for label in range(len(plan.classes))],
        options=plan.options,
        tool_version=f"pack {__version__}",
        source_bytes=sum(result.source_bytes for result in results),
    )
    atomic_write_text(out / MANIFEST_NAME, manifest.to_json())
    shutil.rmtree(work_dir(out) / TMP_DIR, ignore_errors=True)
    return manifest
