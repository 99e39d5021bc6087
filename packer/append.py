"""`pack FORMAT NEW_SRC OUT --append`: NEW_SRC's samples become new shards of the dataset in OUT.

An append is a pack of NEW_SRC whose plan and listing live in `OUT/.pack/parts/<first shard>/`
and whose shards are numbered after OUT's (`Plan.first_shard`); scanning, the pack-time order,
shards, markers, resume, engines, tasks and buckets are the pack's own. What differs is the
beginning and the end:

- before: OUT's index.json is read (it must be there and sound), the encode options and fields
  must be OUT's, and class names new to OUT get indexes after OUT's (no existing index changes);
- after: a new index.json lists OUT's shards, then the new ones, and records every part (a pack
  or an append: its shards, source, options, fingerprint) under `parts`; rejects.jsonl and the
  loader descriptors are rewritten first, index.json last.

Old shard files are never written, renamed or deleted, so OUT's previous index.json describes
valid files until the new one replaces it, and a reader that opened it keeps working. Killed at
any point, a rerun of the same command finds the part's plan (its first shard is the next free
number of the unchanged index.json) and resumes; after success, a rerun recognises the recorded
part (same SRC, same listing, same options) and does nothing, like a rerun of a finished pack.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from array import array
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from readers.cpus import available_cpus
from readers.layouts.wds import image_extension
from readers.manifest import FORMAT_VERSION, MANIFEST_NAME, REJECTS_NAME, DatasetError, Manifest, parse_manifest

from .descriptors import DEFAULT_SPLIT, descriptor_texts, write_descriptors
from .engines import get_engine
from .errors import PackError
from .fsutil import atomic_write_text, release_freed_memory
from .outdir import DONE_DIR, PARTS_DIR, PLAN_NAME, check_paths, lock_path, part_dir, tmp_dir, work_dir
from .partition import Partition
from .pipeline import (Summary, canonical_options, implied_classes, plan_differences, publish, published_text,
                       scan_source, source_path, wait_for_lock)
from .plan import PackOptions, Plan, load_plan, parse_plan, write_plan
from .remote_out import RemoteOut, opened_output, output_for, staging_dir
from .shard import Progress, ShardResult, check_rejects, clean_tmp, finished_shards, parse_marker, read_marker, \
    shard_file_name
from .sources.listing import Listing
from .validate import ErrorPolicy
from .version import __version__

log = logging.getLogger(__name__)

ENCODE_OPTIONS = ("store", "mode", "resize", "max_side", "center_crop", "quality")
"""What every sample of a dataset shares, so what an append must take from OUT as it was packed."""
PART_KEY = "part"
"""The key of a rejects.jsonl row that an append added: the number of its part's first shard."""


def append(src: str | os.PathLike[str], out: str | os.PathLike[str], options: PackOptions, *,
           overwrite: bool = False, workers: int | None = None, partition: Partition = Partition(),
           engine: str = "local", scheduler: str | None = None, progress: Progress | None = None,
           planned: Callable[[int], None] | None = None, policy: ErrorPolicy = ErrorPolicy(),
           split: str = DEFAULT_SPLIT, staging: str | os.PathLike[str] | None = None,
           storage_options: dict[str, Any] | None = None) -> Summary:
    """Add the samples of `src` to the packed dataset in `out` (a folder or a URL) as new shards;
    `pipeline.pack`'s arguments. With a partition, this task packs its shards of the append and
    `pack merge OUT` publishes it once every task is done."""
    if overwrite:
        raise PackError(f"{out}: --append adds to OUT and --overwrite replaces it; choose one")
    target = output_for(out, staging=staging, storage_options=storage_options)
    try:
        return append_into(src, target, options, workers=workers, partition=partition, engine=engine,
                           scheduler=scheduler, progress=progress, planned=planned, policy=policy, split=split)
    finally:
        if isinstance(target, RemoteOut):
            target.remove_staging()


def append_into(src: str | os.PathLike[str], out: Path | RemoteOut, options: PackOptions, *, workers: int | None,
                partition: Partition, engine: str, scheduler: str | None, progress: Progress | None,
                planned: Callable[[int], None] | None, policy: ErrorPolicy, split: str) -> Summary:
    started = time.monotonic()
    options = canonical_options(options)
    src_path = source_path(src)
    if engine != "local" and not partition.is_whole:
        raise PackError(f"--engine {engine} runs every shard itself; drop --task-index/--task-count")
    manifest = published_manifest(out)
    check_compatible(out, manifest, options)
    first = next_shard(out, manifest)
    parts = recorded_parts(out, manifest)
    plan = ensure_part_plan(src_path, out, options, manifest, parts, first)
    if isinstance(plan, dict):
        return up_to_date_summary(out, manifest, plan, started)
    if policy.on_error == "fail":
        check_rejects(out, plan, plan.scan_rejects, policy)
    mine = partition.shards(plan.num_shards)
    done = finished_shards(out, plan, mine)
    pending = [shard for shard, result in done.items() if result is None]
    if planned:
        planned(sum(plan.bounds[k + 1] - plan.bounds[k] for k in mine))
    if progress:
        progress(sum(plan.bounds[k + 1] - plan.bounds[k] for k, result in done.items() if result is not None))
    clean_tmp(out, plan, pending)
    release_freed_memory()
    get_engine(engine)(out, plan, pending, workers=workers or available_cpus(), scheduler=scheduler,
                       progress=progress, policy=policy)
    final = finished_shards(out, plan, mine, check_hash=False)
    published = partition.is_whole
    total = publish_part(out, manifest, parts, plan, final, policy, split) if published else None
    finished = [result for result in final.values() if result is not None]
    return Summary(
        out=str(out),
        num_samples=sum(result.num_samples for result in finished),
        bytes=sum(result.bytes for result in finished),
        source_bytes=sum(result.source_bytes for result in finished),
        num_shards=sum(1 for result in finished if result.written),
        planned_shards=plan.num_shards,
        rejects=sum(len(result.rejects) for result in finished) + (len(plan.scan_rejects) if published else 0),
        ignored=plan.ignored,
        ignored_names=plan.ignored_names,
        resumed_shards=len(mine) - len(pending),
        elapsed=time.monotonic() - started,
        published=published,
        dataset=(total.num_samples, len(total.shards), len(total.classes)) if total else None,
    )


# --- OUT as it is ----------------------------------------------------------------------------


def published_manifest(out: Path | RemoteOut) -> Manifest:
    """OUT's index.json, checked: an append needs a sound dataset to add to."""
    try:
        text = published_text(out, MANIFEST_NAME)
    except IsADirectoryError:
        text = None
    except NotADirectoryError:
        raise PackError(f"{out}: not a directory; --append adds to a packed dataset") from None
    if text is None:
        raise PackError(f"{out / MANIFEST_NAME}: not found; --append adds to a packed dataset: pack OUT first "
                        "(without --append), or finish its pack (rerun it, or `pack merge`)")
    try:
        manifest = parse_manifest(text.encode("utf-8"), out / MANIFEST_NAME)
    except DatasetError as exc:
        raise PackError(f"{exc}; nothing was appended") from None
    if manifest.version != FORMAT_VERSION:
        raise PackError(f"{out / MANIFEST_NAME}: format version {manifest.version}, written by an older pack; "
                        f"repack it (pack {manifest.format} OUT NEW_OUT) to append to it")
    return manifest


def check_compatible(out: Path | RemoteOut, manifest: Manifest, options: PackOptions) -> None:
    """The format and encode options must be OUT's: a dataset's samples are all stored alike.
    Shard sizes, order, seed, validation and the way SRC is read may differ per part."""
    if options.format != manifest.format:
        raise PackError(f"{out}: holds {manifest.format} shards; append to it with `pack {manifest.format} ... "
                        "--append`")
    now = asdict(options)
    differences = [f"--{name.replace('_', '-')} {manifest.options.get(name)} in OUT, {now[name]} now"
                   for name in ENCODE_OPTIONS if manifest.options.get(name) != now[name]]
    if differences:
        raise PackError(f"{out}: an append stores samples as OUT does; {'; '.join(differences)}")


def part_number(part: dict[str, Any], key: str, out: Path | RemoteOut) -> int:
    """An integer of a `parts` entry (index.json is untrusted)."""
    value = part.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PackError(f"{out / MANIFEST_NAME}: parts: {key} {value!r} is not a shard number; nothing was appended")
    return value


def next_shard(out: Path | RemoteOut, manifest: Manifest) -> int:
    """The first shard number an append to OUT gets: past every listed shard and every planned one
    (a shard whose every sample was rejected is planned, numbered, and not listed)."""
    listed = max(manifest.shard_numbers, default=-1) + 1
    if manifest.parts:
        last = manifest.parts[-1]
        return max(listed, part_number(last, "first_shard", out) + part_number(last, "num_shards", out))
    plan = base_plan(out)
    return max(listed, plan.num_shards if plan else 0)


def base_plan(out: Path | RemoteOut) -> Plan | None:
    """The plan OUT was first packed with, when OUT still holds it (its listing is not read)."""
    if isinstance(out, RemoteOut):
        text = out.read_text(f"{out.part_folder(0)}/{PLAN_NAME}")
        return parse_plan(text, f"{out.url}/{out.part_folder(0)}/{PLAN_NAME}") if text is not None else None
    return load_plan(out)


def recorded_parts(out: Path | RemoteOut, manifest: Manifest) -> list[dict[str, Any]]:
    """OUT's `parts`; for a dataset packed once, the entry of its pack, made from its plan (when
    OUT still holds it) and its markers."""
    if manifest.parts:
        return list(manifest.parts)
    plan = base_plan(out)
    return [{
        "first_shard": 0,
        "num_shards": plan.num_shards if plan else max(manifest.shard_numbers, default=-1) + 1,
        "num_samples": manifest.num_samples,
        "source": plan.source if plan else None,
        "options": manifest.options,
        "fingerprint": plan.fingerprint if plan else None,
        "extensions": base_extensions(out, manifest),
    }]


def base_extensions(out: Path | RemoteOut, manifest: Manifest) -> list[str]:
    """The image extensions in OUT's shards (for the loader descriptors), from the shards' markers."""
    names = [shard.name for shard in manifest.shards]
    if isinstance(out, RemoteOut):
        texts = out.read_texts([f"{out.part_folder(0)}/{DONE_DIR}/{name}.json" for name in names])
        markers = [parse_marker(text) for text in texts.values()]
    else:
        markers = [read_marker(out, name) for name in names]
    found = [marker for marker in markers if marker is not None]
    if len(found) < len(names):
        log.warning("%s: %d shards have no marker in .pack/done; the loader descriptors list the image types of "
                    "the others", out, len(names) - len(found))
    return sorted({image_extension(extension) for marker in found for extension in marker.extensions})


# --- the part's plan ---------------------------------------------------------------------------


def ensure_part_plan(src: Path | str, out: Path | RemoteOut, options: PackOptions, manifest: Manifest,
                     parts: list[dict[str, Any]], first: int) -> Plan | dict[str, Any]:
    """The plan of this append (its shards numbered from `first`), written once and reused by
    reruns and tasks; or the recorded part that already holds exactly what it would pack."""
    if isinstance(out, RemoteOut):
        plan = out.mirror_plan(first)
        if plan is not None:
            return unfinished(plan, src, out, options)
        plan = write_plan(out.staging, part_listing(src, out, options, manifest), options, first)
        earlier = same_part(parts, plan)
        if earlier is not None:
            shutil.rmtree(part_dir(out.staging, first), ignore_errors=True)
            return earlier
        return out.publish_plan(plan)
    check_paths(Path(src), out)
    work_dir(out).mkdir(exist_ok=True)
    with open(lock_path(out), "a") as lock:
        wait_for_lock(lock, lock_path(out))
        plan = load_plan(out, first)
        if plan is not None:
            return unfinished(plan, src, out, options)
        listing = part_listing(src, out, options, manifest)
        try:
            plan = write_plan(out, listing, options, first)
        except BaseException:
            shutil.rmtree(part_dir(out, first), ignore_errors=True)
            raise
        earlier = same_part(parts, plan)
        if earlier is not None:
            shutil.rmtree(part_dir(out, first))
            return earlier
        return plan


def unfinished(plan: Plan, src: Path | str, out: Path | RemoteOut, options: PackOptions) -> Plan:
    """The plan of an append that was started and not published, when it is this one's."""
    differences = plan_differences(plan, src, options)
    if differences:
        raise PackError(f"{out}: an unfinished append of {differences} is under way; rerun that command (or its "
                        f"tasks and `pack merge`) to finish it first, or remove {out / part_dir(Path(), plan.first_shard).as_posix()} "
                        "to drop it")
    log.info("%s: resuming the append from shard %d", out, plan.first_shard)
    return plan


def same_part(parts: list[dict[str, Any]], plan: Plan) -> dict[str, Any] | None:
    """The recorded part packed from the same SRC with the same listing and options, if any."""
    return next((part for part in parts if part.get("source") == plan.source
                 and part.get("fingerprint") == plan.fingerprint), None)


def part_listing(src: Path | str, out: Path | RemoteOut, options: PackOptions, manifest: Manifest) -> Listing:
    """NEW_SRC's listing with labels indexing OUT's class list extended by its new class names."""
    listing = scan_source(src, options)
    if listing.fields != manifest.fields:
        names = ", ".join(spec.name for spec in manifest.fields) or "none"
        now = ", ".join(spec.name for spec in listing.fields) or "none"
        changed = next(f"; {a.name}: {a.to_dict()} in OUT, {b.to_dict()} now"
                       for a, b in zip(manifest.fields, listing.fields) if a != b) \
            if [spec.name for spec in manifest.fields] == [spec.name for spec in listing.fields] else ""
        raise PackError(f"{src}: its samples' fields ({now}) are not OUT's ({names}){changed}; every sample of "
                        f"{out} has OUT's fields")
    listing.classes = extended_classes(src, out, manifest.classes, listing)
    return listing


def is_implied(classes: list[str]) -> bool:
    """Whether a class list is the "0".."K-1" a dataset of bare integer labels gets."""
    return classes == [str(index) for index in range(len(classes))]


def extended_classes(src: Path | str, out: Path | RemoteOut, classes: list[str], listing: Listing) -> list[str]:
    """OUT's classes, then NEW_SRC's class names OUT lacks (in NEW_SRC's order); `listing`'s labels
    are turned into indexes of that list. Bare integer labels (no names) keep their values, as
    indexes of OUT's list, when OUT's classes are themselves bare indexes (or none)."""
    if not listing.classes:
        if not classes or is_implied(classes):
            return []  # publish_part extends OUT's indexes to the largest label
        if any(label >= 0 for label in listing.labels):
            raise PackError(f"{src}: its labels are bare integers and {out}'s classes have names; pass --classes "
                            f"with OUT's index.json to read them as indexes of OUT's classes")
        return classes  # unlabelled samples (--no-classes, a flat folder)
    known = set(classes)
    merged = classes + [name for name in listing.classes if name not in known]
    index = {name: position for position, name in enumerate(merged)}
    remap = [index[name] for name in listing.classes]
    listing.labels = array("q", (remap[label] if label >= 0 else label for label in listing.labels))
    added = len(merged) - len(classes)
    if added:
        log.info("%s: %d classes new to %s, indexes %d on", src, added, out, len(classes))
    return merged


# --- publishing --------------------------------------------------------------------------------


def publish_part(out: Path | RemoteOut, manifest: Manifest, parts: list[dict[str, Any]], plan: Plan,
                 done: dict[int, ShardResult | None], policy: ErrorPolicy, split: str) -> Manifest:
    """Publish OUT with the part `plan` packed (every shard of it done): rejects.jsonl and the
    loader descriptors first, then index.json, each replaced whole (a bucket: uploaded)."""
    missing = [shard_file_name(plan, shard) for shard, result in done.items() if result is None]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise PackError(f"{out}: {len(missing)} of {plan.num_shards} shards of the append unfinished: {shown}")
    results = [result for result in done.values() if result is not None]
    folder = staging_dir(out)
    rejects = sorted(plan.scan_rejects + [reject for result in results for reject in result.rejects],
                     key=lambda reject: reject["path"])
    earlier = [line for line in (published_text(out, REJECTS_NAME) or "").splitlines(keepends=True)
               if not appended_by(line, plan.first_shard)]
    atomic_write_text(folder / REJECTS_NAME, "".join(earlier) + "".join(
        json.dumps({**reject, PART_KEY: plan.first_shard}) + "\n" for reject in rejects))
    try:
        check_rejects(out, plan, rejects, policy)
    except PackError:
        if isinstance(out, RemoteOut):
            out.upload(folder / REJECTS_NAME, REJECTS_NAME)
        raise
    classes = plan.classes or extended_implied(manifest.classes, results)
    old_counts = manifest.class_counts if manifest.class_counts or not manifest.classes else []
    counts = [] if manifest.classes and not old_counts else [
        (old_counts[label] if label < len(old_counts) else 0)
        + sum(result.label_counts.get(str(label), 0) for result in results) for label in range(len(classes))]
    extensions = sorted({image_extension(extension) for result in results for extension in result.extensions})
    part = {
        "first_shard": plan.first_shard,
        "num_shards": plan.num_shards,
        "num_samples": sum(result.num_samples for result in results),
        "source": plan.source,
        "options": asdict(plan.options),
        "fingerprint": plan.fingerprint,
        "extensions": extensions,
        "tool_version": f"pack {__version__}",
    }
    grown = Manifest(
        format=manifest.format,
        store=manifest.store,
        num_samples=manifest.num_samples + part["num_samples"],
        classes=classes,
        shards=[*manifest.shards, *(result.info() for result in results if result.written)],
        class_counts=counts,
        options=manifest.options,
        tool_version=f"pack {__version__}",
        source_bytes=(manifest.source_bytes or 0) + sum(result.source_bytes for result in results),
        fields=manifest.fields,
        parts=[*parts, part],
    )
    every_extension = sorted({str(name) for entry in grown.parts for name in entry.get("extensions") or ()
                              if isinstance(name, str)})
    grown.descriptors = write_descriptors(
        folder, descriptor_texts(grown, split, every_extension, plan.options.sample_shape))
    if isinstance(out, RemoteOut):
        out.upload_all([(folder / name, name) for name in (REJECTS_NAME, *(info.name for info in grown.descriptors))])
        out.upload_text(MANIFEST_NAME, grown.to_json())
        out.clean_uploads()
        for name in (REJECTS_NAME, *(info.name for info in grown.descriptors)):
            (folder / name).unlink(missing_ok=True)
    else:
        atomic_write_text(out / MANIFEST_NAME, grown.to_json())
    shutil.rmtree(tmp_dir(folder), ignore_errors=True)
    log.info("%s: appended %d samples in %d shards from %s", out, part["num_samples"], plan.num_shards, plan.source)
    return grown


def appended_by(line: str, first_shard: int) -> bool:
    """Whether a rejects.jsonl row is one the append starting at `first_shard` wrote (a rerun
    writes them again)."""
    try:
        row = json.loads(line)
    except ValueError:
        return False
    return isinstance(row, dict) and row.get(PART_KEY) == first_shard


def extended_implied(classes: list[str], results: list[ShardResult]) -> list[str]:
    """OUT's bare-index classes ("0".."K-1", or none) grown to the append's largest label."""
    implied = implied_classes(results)
    return implied if len(implied) > len(classes) else classes


def merge(out: str | os.PathLike[str] | RemoteOut, policy: ErrorPolicy = ErrorPolicy(), *,
          split: str = DEFAULT_SPLIT) -> Manifest:
    """`pack merge OUT`: `pipeline.merge`, except where OUT is already published: then publish the
    append its tasks packed, or keep an appended dataset as it is (a merge from the first pack's
    plan alone would drop the appended shards from index.json)."""
    with opened_output(out) as target:
        appended = merge_pending(target, policy, split)
        return appended if appended is not None else publish(target, policy, split)


def merge_pending(out: Path | RemoteOut, policy: ErrorPolicy, split: str) -> Manifest | None:
    """`pack merge OUT` where OUT is already published: publish the append its tasks packed, or
    keep an appended dataset as it is. None: OUT has no index.json, or was packed once (merge it
    as `pipeline.publish` does)."""
    text = published_text(out, MANIFEST_NAME)
    if text is None:
        return None
    try:
        manifest = parse_manifest(text.encode("utf-8"), out / MANIFEST_NAME)
    except DatasetError as exc:
        if appended_before(out):  # the first pack's plan alone would leave the appended shards out
            raise PackError(f"{exc}; OUT has appended parts (.pack/parts), so merge cannot rebuild it from the "
                            "first pack's plan: restore index.json from a copy") from None
        return None  # publish() writes a new one from the plan
    first = next_shard(out, manifest)
    plan = out.mirror_plan(first) if isinstance(out, RemoteOut) else load_plan(out, first)
    if plan is None:
        return manifest if manifest.parts else None
    parts = recorded_parts(out, manifest)
    done = finished_shards(out, plan, list(range(plan.num_shards)), check_hash=False)
    return publish_part(out, manifest, parts, plan, done, policy, split)


def appended_before(out: Path | RemoteOut) -> bool:
    """Whether OUT holds an append's plan (one started, finished or not)."""
    if isinstance(out, RemoteOut):
        return bool(out.names(f"{out.part_folder(0)}/{PARTS_DIR}"))
    return (work_dir(out) / PARTS_DIR).is_dir()


def up_to_date_summary(out: Path | RemoteOut, manifest: Manifest, part: dict[str, Any], started: float) -> Summary:
    first = part.get("first_shard", 0)
    log.info("%s: up to date (part from shard %s holds %s with the same options)", out, first, part.get("source"))
    shards = [shard for shard, number in zip(manifest.shards, manifest.shard_numbers)
              if first <= number < first + int(part.get("num_shards") or 0)]
    return Summary(
        out=str(out), num_samples=sum(shard.num_samples for shard in shards),
        bytes=sum(shard.bytes for shard in shards), source_bytes=0, num_shards=len(shards),
        planned_shards=len(shards), rejects=0, ignored=0, ignored_names=[], resumed_shards=len(shards),
        elapsed=time.monotonic() - started, published=True, up_to_date=True,
        dataset=(manifest.num_samples, len(manifest.shards), len(manifest.classes)),
    )
