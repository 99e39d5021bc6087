"""The top level: scan -> plan -> shards (run by an engine) -> manifest.

`pack` plans once (`ensure_plan`), hands the shards not yet done to an engine, which runs
`packer.shard.run_shard` on each, and then `merge` publishes `index.json` once every planned
shard has its marker. A rerun of the same command resumes: finished shards are kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO, Any, Callable

from readers.cpus import available_cpus
from readers.formats import ALIASES, FORMATS
from readers.layouts.wds import image_extension
from readers.manifest import MANIFEST_NAME, REJECTS_NAME, Manifest, parse_manifest

from .version import __version__
from .descriptors import DEFAULT_SPLIT, descriptor_texts, write_descriptors
from .engines import get_engine
from .errors import FinishedOutput, PackError
from .fsutil import atomic_write_text, release_freed_memory
from .outdir import WORK_DIR, check_paths, lock_path, plan_path, prepare_output, tmp_dir, work_dir
from .partition import Partition
from .plan import PackOptions, Plan, load_plan, option_differences, write_plan
from .remote_out import RemoteOut, is_remote, opened_output, output_for, staging_dir
from .scan import Listing, scan
from .shard import Progress, ShardResult, check_rejects, clean_tmp, finished_shards, shard_file_name
from .sources.inputs import resolve_source
from .validate import ErrorPolicy

log = logging.getLogger(__name__)

PLAN_LOCK_SECONDS = 6 * 3600.0
"""The longest a task waits for another to finish planning: past it, an error instead of a hang."""
LOCK_POLL_SECONDS = 0.5



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
    ignored_names: list[str]  # the first of them
    resumed_shards: int
    elapsed: float
    published: bool
    up_to_date: bool = False  # OUT already held this dataset, packed from the same SRC and options: nothing done
    dataset: tuple[int, int, int] | None = None  # an append (packer.append): OUT's samples, shards, classes now

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
    planned: Callable[[int], None] | None = None,
    policy: ErrorPolicy = ErrorPolicy(),
    split: str = DEFAULT_SPLIT,
    staging: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Summary:
    """Pack the images under `src` into shards in `out`.

    With a partition of several tasks, only this task's shards are packed and nothing is
    published: `merge` does that once all tasks are done. An interrupted run of the same
    command resumes: finished shards are kept, the others are packed again. `policy` says
    whether a rejected file stops the run, and how many rejects are too many; `split` names the
    split in the loader descriptors written at publish. `planned(n)` is called once the plan exists,
    with the samples this run will have done (resumed ones included), before any `progress`.

    Rerunning a finished pack (index.json there) with the same SRC and options does nothing and
    returns a Summary that says so (`up_to_date`): a requeued batch job must not fail.

    `out` may be a URL (`s3://bucket/x.wds`, any writable fsspec URL): shards are then written in
    `staging` (default: a temporary folder) and uploaded one by one, `index.json` last;
    `storage_options` go to fsspec (endpoint, credentials).
    """
    target = output_for(out, staging=staging, storage_options=storage_options)
    try:
        return pack_into(src, target, options, overwrite=overwrite, workers=workers, partition=partition,
                         engine=engine, scheduler=scheduler, progress=progress, planned=planned, policy=policy,
                         split=split)
    finally:
        if isinstance(target, RemoteOut):
            target.remove_staging()


def pack_into(src: str | os.PathLike[str], out_path: Path | RemoteOut, options: PackOptions, *, overwrite: bool,
              workers: int | None, partition: Partition, engine: str, scheduler: str | None,
              progress: Progress | None, planned: Callable[[int], None] | None, policy: ErrorPolicy,
              split: str) -> Summary:
    started = time.monotonic()
    src_path = source_path(src)
    if engine != "local" and not partition.is_whole:
        raise PackError(f"--engine {engine} runs every shard itself; drop --task-index/--task-count")
    if overwrite and not partition.is_whole:
        raise PackError(f"{out_path}: --overwrite cannot be combined with a partitioned run; remove OUT first")
    try:
        plan = ensure_plan(src_path, out_path, options, overwrite=overwrite)
    except FinishedOutput as finished:
        return up_to_date_summary(src_path, out_path, options, finished, started)
    if policy.on_error == "fail":
        check_rejects(out_path, plan, plan.scan_rejects, policy)
    mine = partition.shards(plan.num_shards)
    fresh = isinstance(out_path, RemoteOut) and out_path.fresh  # no marker there yet: spare the store's round trips
    done: dict[int, ShardResult | None] = dict.fromkeys(mine) if fresh else finished_shards(out_path, plan, mine)
    pending = [shard for shard, result in done.items() if result is None]
    if planned:
        planned(sum(plan.bounds[k + 1] - plan.bounds[k] for k in mine))
    if progress:
        progress(sum(plan.bounds[k + 1] - plan.bounds[k] for k, result in done.items() if result is not None))
    clean_tmp(out_path, plan, pending)
    release_freed_memory()
    get_engine(engine)(out_path, plan, pending, workers=workers or available_cpus(), scheduler=scheduler,
                       progress=progress, policy=policy)
    final = finished_shards(out_path, plan, mine, check_hash=False)
    results = list(final.values())
    published = partition.is_whole
    if published:
        publish(out_path, policy, split, known=(plan, final))
    finished = [result for result in results if result is not None]
    written = [result for result in finished if result.written]
    return Summary(
        out=str(out_path),
        num_samples=sum(result.num_samples for result in finished),
        bytes=sum(result.bytes for result in finished),
        source_bytes=sum(result.source_bytes for result in finished),
        num_shards=len(written),
        planned_shards=plan.num_shards,
        rejects=sum(len(result.rejects) for result in finished)
        + (len(plan.scan_rejects) if published else 0),
        ignored=plan.ignored,
        ignored_names=plan.ignored_names,
        resumed_shards=len(mine) - len(pending),
        elapsed=time.monotonic() - started,
        published=published,
    )


def up_to_date_summary(src: Path | str, out: Path | RemoteOut, options: PackOptions, finished: FinishedOutput,
                       started: float) -> Summary:
    """The Summary of a dataset OUT already holds, when its plan has this SRC and these options;
    otherwise `finished` (no plan: who knows what made it), or an error naming what differs."""
    plan = out.mirror_plan() if isinstance(out, RemoteOut) else load_plan(out)
    if plan is None:
        raise finished
    differences = plan_differences(plan, src, canonical_options(options))
    if differences:
        raise PackError(f"{out}: already holds a packed dataset of {differences}; pass --overwrite to replace it")
    manifest = parse_manifest((published_text(out, MANIFEST_NAME) or "").encode(), out / MANIFEST_NAME)
    rejects = published_text(out, REJECTS_NAME) or ""
    log.info("%s: up to date (packed from %s with the same options)", out, plan.source)
    return Summary(
        out=str(out), num_samples=manifest.num_samples, bytes=sum(shard.bytes for shard in manifest.shards),
        source_bytes=manifest.source_bytes or 0, num_shards=len(manifest.shards), planned_shards=plan.num_shards,
        rejects=len(rejects.splitlines()), ignored=plan.ignored, ignored_names=plan.ignored_names,
        resumed_shards=len(manifest.shards),
        elapsed=time.monotonic() - started, published=True, up_to_date=True,
    )


def published_text(out: Path | RemoteOut, name: str) -> str | None:
    """A published file of OUT (a folder or a bucket) as text; None if it is not there."""
    if isinstance(out, RemoteOut):
        return out.read_text(name)
    try:
        return (out / name).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def source_path(src: str | os.PathLike[str]) -> Path | str:
    """SRC as the scan takes it: a URL stays a string (a Path would fold its `//`)."""
    return str(src) if is_remote(str(src)) else Path(src)


def canonical_options(options: PackOptions) -> PackOptions:
    """Options naming the format by its registry name, so an alias never reaches the manifest."""
    name = ALIASES.get(options.format, options.format)
    if name not in FORMATS:
        raise PackError(f"unknown format {options.format!r} (choose from {', '.join(FORMATS)})")
    return replace(options, format=name)


def wait_for_lock(lock: IO[str], path: Path, timeout: float = PLAN_LOCK_SECONDS) -> None:
    """Take the plan lock, waiting while another task scans SRC (an hour for ten million files on a
    cluster filesystem), but not forever: a holder that is alive and stuck becomes an error. A dead
    holder's flock is released by the kernel, so a killed task never blocks the next one."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise PackError(f"{path}: another pack process has held this lock for over {timeout:g} s "
                                "(still scanning SRC, or stuck?); rerun once it has finished or been stopped") from None
            time.sleep(LOCK_POLL_SECONDS)


def ensure_plan(src: str | os.PathLike[str], out: str | os.PathLike[str] | RemoteOut, options: PackOptions, *,
                overwrite: bool = False) -> Plan:
    """The plan in OUT, written once: the first process scans SRC, the others (and reruns) reuse it.

    A file lock serialises concurrent tasks on a shared filesystem, so N tasks do not all walk
    millions of files; a plan made with other options is an error, never silently replaced.
    A remote OUT has no lock: see `RemoteOut.publish_plan`.
    """
    options = canonical_options(options)
    src = source_path(src)
    with opened_output(out) as target:
        if isinstance(target, RemoteOut):
            return ensure_remote_plan(src, target, options, overwrite=overwrite)
        return ensure_local_plan(src, target, options, overwrite=overwrite)


def ensure_local_plan(src: Path | str, out: Path, options: PackOptions, *, overwrite: bool) -> Plan:
    check_paths(Path(src), out)
    made_out = not out.exists()
    prepare_output(out, overwrite=overwrite)
    made_work_dir = not work_dir(out).exists()
    work_dir(out).mkdir(exist_ok=True)
    try:
        with open(lock_path(out), "a") as lock:
            wait_for_lock(lock, lock_path(out))
            plan = load_plan(out)
            if plan is not None:
                return reuse_plan(plan, src, out, options)
            return write_plan(out, scan_source(src, options), options)
    except BaseException:
        if made_work_dir and not plan_path(out).exists():  # nothing planned (a missing SRC): leave nothing behind
            shutil.rmtree(work_dir(out), ignore_errors=True)
            if made_out:
                with contextlib.suppress(OSError):  # not empty: another task's files since
                    out.rmdir()
        raise


def source_name(src: Path | str) -> str:
    """How a plan names SRC: a URL as given (less a trailing slash), a local path absolute."""
    text = os.fspath(src)
    return text.rstrip("/") if "://" in text else os.path.abspath(text)


def plan_differences(plan: Plan, src: Path | str, options: PackOptions) -> str | None:
    """What makes `plan` another pack than SRC with `options`: `options --shard-size: 2 before,
    4 now`, or the other SRC; None when it is the same."""
    source = resolve_source(src, options.input_format)
    now = (source_name(source.root), source.kind, list(source.inputs))
    if (plan.source, plan.input_kind, plan.inputs) != now:
        return f"another SRC ({plan.source} before, {now[0]} now)" if plan.source != now[0] else \
            f"other inputs of {plan.source} ({len(plan.inputs)} {plan.input_kind} before, {len(now[2])} {now[1]} now)"
    changed = option_differences(plan.options, options)
    return f"other options ({'; '.join(changed)})" if changed else None


def reuse_plan(plan: Plan, src: Path | str, out: Path | RemoteOut, options: PackOptions) -> Plan:
    differences = plan_differences(plan, src, options)
    if differences:
        raise PackError(f"{out}: holds an unfinished run of {differences}; rerun with those, or pass --overwrite "
                        "to start over")
    log.info("%s: reusing the plan (%d shards)", out, plan.num_shards)
    return plan


def scan_source(src: Path | str, options: PackOptions) -> Listing:
    listing = scan(src, options)
    if not len(listing):
        first = f" (rejected: {listing.rejects[0][0]}: {listing.rejects[0][1]})" if listing.rejects else ""
        raise PackError(f"{src}: no image files found{first}")
    return listing


def ensure_remote_plan(src: Path | str, out: RemoteOut, options: PackOptions, *, overwrite: bool) -> Plan:
    """The plan in a remote OUT, mirrored in staging; written there by whichever task comes first."""
    out.prepare(overwrite=overwrite)
    plan = None if out.fresh else out.mirror_plan()
    if plan is not None:
        return reuse_plan(plan, src, out, options)
    return out.publish_plan(write_plan(out.staging, scan_source(src, options), options))


def merge(out: str | os.PathLike[str] | RemoteOut, policy: ErrorPolicy = ErrorPolicy(), *,
          split: str = DEFAULT_SPLIT) -> Manifest:
    """Publish rejects.jsonl, the loader descriptors (`packer.descriptors`, `split` named there)
    and, last, index.json, once every planned shard has its marker.

    The authoritative --max-errors check (all shards, scan-time rejects included): rejects.jsonl
    is still written so the bad files can be looked at, but index.json is not. A remote OUT gets
    the same files, written in staging and uploaded, index.json last.
    """
    with opened_output(out) as target:
        return publish(target, policy, split)


MAX_IMPLIED_CLASSES = 1 << 20
"""Integer labels beyond this are not taken as class indexes (an ID, not a class): no class list."""


def implied_classes(results: list[ShardResult]) -> list[str]:
    """Classes "0".."K-1" for integer labels that came without names (a metadata file's indexes, a
    tar's `cls`, a .rec's labels), K the largest label + 1: `len(ds.classes)` is the class count."""
    labels = [int(label) for result in results for label in result.label_counts if int(label) >= 0]
    count = max(labels, default=-1) + 1
    if count > MAX_IMPLIED_CLASSES:
        log.warning("labels up to %d: too many to be class indexes; index.json lists no classes", count - 1)
        return []
    return [str(index) for index in range(count)]


def publish(out: Path | RemoteOut, policy: ErrorPolicy, split: str, *,
            known: tuple[Plan, dict[int, ShardResult | None]] | None = None) -> Manifest:
    """`merge`'s work; `known`: the plan and every shard's marker, just read by the caller (a remote
    OUT's reads are round trips to the store)."""
    folder = staging_dir(out)
    if known is None:
        plan = out.mirror_plan() if isinstance(out, RemoteOut) else load_plan(out)
        if plan is None:
            raise PackError(f"{out / WORK_DIR}: no plan; nothing was packed here")
        done = finished_shards(out, plan, list(range(plan.num_shards)), check_hash=False)
    else:
        plan, done = known
    results: list[ShardResult] = []
    missing: list[str] = []
    for shard, result in done.items():
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
    atomic_write_text(folder / REJECTS_NAME, "".join(json.dumps(reject) + "\n" for reject in rejects))
    try:
        check_rejects(out, plan, rejects, policy)
    except PackError:
        if isinstance(out, RemoteOut):  # there too, so the bad files can be looked at
            out.upload(folder / REJECTS_NAME, REJECTS_NAME)
        raise
    classes = plan.classes or implied_classes(results)
    manifest = Manifest(
        format=plan.options.format,
        store=plan.options.store,
        num_samples=sum(result.num_samples for result in results),
        classes=classes,
        shards=[result.info() for result in results if result.written],
        class_counts=[sum(result.label_counts.get(str(label), 0) for result in results)
                      for label in range(len(classes))],
        options=asdict(plan.options),
        tool_version=f"pack {__version__}",
        source_bytes=sum(result.source_bytes for result in results),
        fields=plan.fields,
    )
    extensions = sorted({image_extension(extension) for result in results for extension in result.extensions})
    manifest.descriptors = write_descriptors(
        folder, descriptor_texts(manifest, split, extensions, plan.options.sample_shape))
    if isinstance(out, RemoteOut):
        out.upload_all([(folder / name, name) for name in (REJECTS_NAME, *(info.name for info in manifest.descriptors))])
        out.upload_text(MANIFEST_NAME, manifest.to_json())
        out.clean_uploads()
        for name in (REJECTS_NAME, *(info.name for info in manifest.descriptors)):
            (folder / name).unlink(missing_ok=True)
    else:
        atomic_write_text(out / MANIFEST_NAME, manifest.to_json())
    shutil.rmtree(tmp_dir(folder), ignore_errors=True)
    return manifest
