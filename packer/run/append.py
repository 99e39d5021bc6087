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

The shards are packed by the pipeline's own `pack_shards`; publishing a part (`publish_part`) and
reading OUT's parts live in `packer.run.publish`, beside the pack's `publish`, so that `pack merge`
(one `merge` for both) publishes an append its tasks packed and never drops appended shards.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

from readers.manifest import FORMAT_VERSION, MANIFEST_NAME, REJECTS_NAME, DatasetError, Manifest, parse_manifest

from ..plan.changes import plan_differences, run_changes
from ..write.encode import ENCODE_OPTIONS
from ..errors import PackError
from ..plan.options import STORE_FILLED, PackOptions, differing_options, option_flag, shown_value
from ..stores.outdir import listing_path, part_dir
from ..stores.output import Output, opened_output
from ..plan.partition import Partition
from .pipeline import RunOptions, Summary, canonical_options, pack_shards, run_summary
from ..plan.plan import Plan, write_plan
from .publish import base_plan, next_shard, publish_part, recorded_parts
from ..plan.scan import scan_source
from ..write.shard import Progress
from ..sources.classes import reindex
from ..sources.inputs import Source, resolve_source
from ..sources.listing import Listing

log = logging.getLogger(__name__)


def append_run(src: str | os.PathLike[str] | Source, out: str | os.PathLike[str], options: PackOptions,
               run: RunOptions, *, progress: Progress | None = None,
               planned: Callable[[int], None] | None = None) -> Summary:
    """Add the samples of `src` to the packed dataset in `out` (a folder or a URL) as new shards;
    `pipeline.pack_run`'s arguments (SRC becomes a Source here, once). With a partition, this task
    packs its shards of the append and `pack merge OUT` publishes it once every task is done."""
    source = src if isinstance(src, Source) else resolve_source(src, options.input_format)
    with opened_output(out, staging=run.staging, storage_options=run.storage_options) as target:
        started = time.monotonic()
        options = canonical_options(options)
        partition = run.partition()
        run.check(target, partition)
        manifest = published_manifest(target)
        options = with_outs_defaults(target, options, manifest, run.given_encoding)
        check_compatible(target, manifest, options)
        base = base_plan(target, manifest)
        parts = recorded_parts(target, manifest, base)
        plan = ensure_part_plan(source, target, options, manifest, parts, next_shard(target, manifest, base),
                                again=run.append_again, partition=partition)
        if isinstance(plan, dict):
            return up_to_date_summary(target, manifest, plan, started)
        final, resumed = pack_shards(target, plan, run, partition, progress=progress, planned=planned)
        published = partition.is_whole
        total = publish_part(target, manifest, parts, plan, final, run.policy, run.split) if published else None
        return run_summary(target, plan, final, resumed, started, published, total)


# --- OUT as it is ----------------------------------------------------------------------------


def published_manifest(out: Output) -> Manifest:
    """OUT's index.json, checked: an append needs a sound dataset to add to."""
    try:
        text = out.read_text(MANIFEST_NAME)
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


SIZE_OPTIONS = ("shard_size", "shard_bytes")
RESIZING_OPTIONS = ("resize", "max_side", "center_crop")


def with_outs_defaults(out: Output, options: PackOptions, manifest: Manifest,
                       given_encoding: dict[str, Any] | None) -> PackOptions:
    """The append's options, OUT's where not given: its shard size and bytes (a part cut at the
    default 10,000 where OUT's shards hold 200 is not what anyone means; given, a part may have its
    own), and its store options: all of them where no --store is given (a --resize or --quality
    given alone is then held to OUT's store), the others not given where the store is OUT's.
    `given_encoding` is `RunOptions.given_encoding`; without it (PackOptions built by the caller)
    an option is given if it is not its default, and a --mode or --quality a given --store fills
    in is not told from a given one, so it must be OUT's (`check_compatible`)."""
    recorded = manifest.options
    taken = [name for name in SIZE_OPTIONS if not options.is_given(name)]
    store_given = options.is_given("store") if given_encoding is None else "store" in given_encoding
    if not store_given:
        taken += ENCODE_OPTIONS
    elif options.store == recorded.get("store"):
        taken += [name for name in RESIZING_OPTIONS if getattr(options, name) is None]
        if given_encoding is not None:  # the --mode and --quality the store filled in were not given
            taken += [name for name in STORE_FILLED if name not in given_encoding]
    inherited = {name: recorded[name] for name in taken if name in recorded}
    if not store_given and given_encoding:
        inherited.update(given_encoding)
    try:
        return replace(options, **inherited) if inherited else options
    except PackError as exc:  # a given option OUT's store takes none of
        raise PackError(f"{out}: {exc} (OUT's store is {recorded.get('store')})") from None
    except TypeError as exc:  # a value of the wrong kind, as `api.split_options` says it
        raise PackError(f"invalid option value: {exc}") from None


def check_compatible(out: Output, manifest: Manifest, options: PackOptions) -> None:
    """The format and encode options must be OUT's: a dataset's samples are all stored alike.
    Shard sizes, order, seed, validation and the way SRC is read may differ per part."""
    if options.format != manifest.format:
        raise PackError(f"{out}: holds {manifest.format} shards; append to it with `pack {manifest.format} ... "
                        "--append`")
    now = asdict(options)
    differences = [f"{option_flag(name)} {shown_value(manifest.options.get(name))} in OUT, {shown_value(now[name])} now"
                   for name in differing_options(manifest.options, now, ENCODE_OPTIONS)]
    if differences:
        raise PackError(f"{out}: an append stores samples as OUT does; {'; '.join(differences)}")


# --- the part's plan ---------------------------------------------------------------------------


def ensure_part_plan(source: Source, out: Output, options: PackOptions, manifest: Manifest,
                     parts: list[dict[str, Any]], first: int, *, again: bool = False,
                     partition: Partition = Partition()) -> Plan | dict[str, Any]:
    """The plan of this append (its shards numbered from `first`), written once and reused by
    reruns and tasks; or the recorded part that already holds exactly what it would pack. The same
    listing and options from another path (a symlink, a copy) are refused unless `again`."""
    with out.planning(source, overwrite=False, append=True):
        plan = out.stored_plan(first)
        if plan is not None:
            return unfinished(plan, source, out, options, partition)
        folder = part_dir(out.staging, first)
        try:
            listing = part_listing(source, out, options, manifest)
            plan = write_plan(out.staging, listing, options, first, source=source)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        earlier = same_part(parts, plan)
        elsewhere = earlier is not None and earlier.get("source") != plan.source
        if earlier is not None and not (elsewhere and again):
            shutil.rmtree(folder)
            if elsewhere:
                raise PackError(already_held(source, out, earlier))
            return earlier
        warn_repacked(out, parts, plan)
        warn_shared_paths(out, parts, plan, listing.paths)
        return out.publish_plan(plan)


def warn_repacked(out: Output, parts: list[dict[str, Any]], plan: Plan) -> None:
    """An append of a SRC OUT already holds a part of, whose listing or options changed since (a
    folder that grew, another --shard-size): every sample of it is packed again, so those in both
    are twice in OUT. Said, not refused: appending a changed SRC may be what the user means."""
    for part in parts:
        if part.get("source") == plan.source:
            log.warning("%s: %s was packed into %s before (the part from shard %s, %s samples), with another "
                        "listing or options: all its samples are appended again, so those it held then are in %s "
                        "twice; to add only new images, append a folder of them", out, plan.source, out,
                        part.get("first_shard"), part.get("num_samples"), out)
            return


SHOWN_PATHS = 3


def warn_shared_paths(out: Output, parts: list[dict[str, Any]], plan: Plan, paths: list[str]) -> None:
    """Appended samples whose path a sample of OUT has (a folder of the same names holding other
    images): `path` then names two images, which the user is told with a count and the first
    names. OUT's paths are its parts' listings (read line by line, whatever OUT holds) less its
    rejects; only folder listings are compared, the others name input records, not stored paths."""
    if plan.input_kind != "folder":
        return
    appended = set(paths)
    shared: set[str] = set()
    for part in parts:
        first = part.get("first_shard")
        try:
            earlier = out.stored_plan(first) if isinstance(first, int) and first < plan.first_shard else None
            if earlier is None or earlier.input_kind != "folder":
                continue
            with open(listing_path(out.staging, first), "rb") as handle:
                shared.update(path for path in (json.loads(line)[0] for line in handle) if path in appended)
        except (OSError, ValueError, PackError) as exc:  # OUT copied without its .pack, or it is damaged
            log.info("%s: the paths of the part from shard %s are not compared (%s)", out, first, exc)
    if shared:
        shared -= rejected_paths(out)
    if shared:
        names = sorted(shared)
        log.warning("%s: %d appended samples share a path with samples already in OUT (%s%s)", out, len(names),
                    ", ".join(names[:SHOWN_PATHS]), ", ..." if len(names) > SHOWN_PATHS else "")


def rejected_paths(out: Output) -> set[str]:
    """The paths OUT's rejects.jsonl names: listed, but not samples of OUT."""
    paths: set[str] = set()
    for line in (out.read_text(REJECTS_NAME) or "").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("path"), str):
            paths.add(row["path"])
    return paths


def unfinished(plan: Plan, source: Source, out: Output, options: PackOptions, partition: Partition) -> Plan:
    """The plan of an append that was started and not published, when it is this one's and SRC
    has not changed since it was made (its finished shards hold SRC as it was then)."""
    differences = plan_differences(plan, source, options)
    folder = out / part_dir(Path(), plan.first_shard).as_posix()
    if differences:
        raise PackError(f"{out}: an unfinished append of {differences} is under way; rerun that command (or its "
                        f"tasks and `pack merge`) to finish it first, or remove {folder} to drop it")
    changes = run_changes(source, out, plan, options, partition)
    if changes:
        raise PackError(changes.describe(source.named, out, f"remove {folder} to drop the unfinished append, then "
                                                            "append SRC again"))
    log.info("%s: resuming the append from shard %d", out, plan.first_shard)
    return plan


def same_part(parts: list[dict[str, Any]], plan: Plan) -> dict[str, Any] | None:
    """The recorded part packed with the same listing and options, if any: from the same SRC if
    one is, else from another path. The listing names files relative to SRC, so a folder reached
    through a symlink, or copied, has the same one."""
    same = [part for part in parts if part.get("fingerprint") == plan.fingerprint]
    return next((part for part in same if part.get("source") == plan.source), same[0] if same else None)


def already_held(source: Source, out: Output, part: dict[str, Any]) -> str:
    """Why an append of the samples of a part OUT holds, from another path, is refused."""
    first = part.get("first_shard", 0)
    how = "packed" if first == 0 else "appended"
    return (f"{source.named}: its samples are in {out} already: the part from shard {first} was {how} from "
            f"{part.get('source')} with the same listing and options; pass --append-again to add them a second time")


def part_listing(source: Source, out: Output, options: PackOptions, manifest: Manifest) -> Listing:
    """NEW_SRC's listing with labels indexing OUT's class list extended by its new class names; a
    PackError naming SRC where its samples cannot join OUT's (other fields; bare integer labels
    where OUT's classes have names)."""
    listing = scan_source(source, options)
    if listing.fields != manifest.fields:
        names = ", ".join(spec.name for spec in manifest.fields) or "none"
        now = ", ".join(spec.name for spec in listing.fields) or "none"
        changed = next(f"; {a.name}: {a.to_dict()} in OUT, {b.to_dict()} now"
                       for a, b in zip(manifest.fields, listing.fields) if a != b) \
            if [spec.name for spec in manifest.fields] == [spec.name for spec in listing.fields] else ""
        raise PackError(f"{source.named}: its samples' fields ({now}) are not OUT's ({names}){changed}; every "
                        f"sample of {out} has OUT's fields")
    classes = manifest.classes
    if not listing.classes and classes and not is_implied(classes) and any(label >= 0 for label in listing.labels):
        raise PackError(f"{source.named}: its labels are bare integers and {out}'s classes have names; pass "
                        f"--classes with OUT's index.json (a label that is one of its class names is that class, "
                        f"another integer an index of its list)")
    listing.classes = extended_classes(classes, listing)
    added = len(listing.classes) - len(classes)
    if added > 0:
        log.info("%s: %d classes new to %s, indexes %d on", source.named, added, out, len(classes))
    return listing


def is_implied(classes: list[str]) -> bool:
    """Whether a class list is the "0".."K-1" a dataset of bare integer labels gets."""
    return classes == [str(index) for index in range(len(classes))]


def extended_classes(classes: list[str], listing: Listing) -> list[str]:
    """OUT's classes, then NEW_SRC's class names OUT lacks (in NEW_SRC's order); `listing`'s labels
    are turned into indexes of that list. Bare integer labels (no names) keep their values, as
    indexes of OUT's list, when OUT's classes are themselves bare indexes (or none): `part_listing`
    refuses them against named classes."""
    if not listing.classes:
        if not classes or is_implied(classes):
            return []  # publish_part extends OUT's indexes to the largest label
        return classes  # unlabelled samples (--no-classes, a flat folder)
    known = set(classes)
    merged = classes + [name for name in listing.classes if name not in known]
    reindex(listing, merged)
    return merged


def up_to_date_summary(out: Output, manifest: Manifest, part: dict[str, Any], started: float) -> Summary:
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
