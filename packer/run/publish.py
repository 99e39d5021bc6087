"""The end of a run: OUT's index.json, for a pack or for a part an append added, and `merge`.

A dataset packed once is published from its plan and its shards' markers (`publish`). A dataset
grown by `pack --append` (`packer.run.append`) lists its parts in index.json: an append's plan lives
in `.pack/parts/<first shard>/`, and `publish_part` adds its shards after the published ones,
leaving every earlier entry as it was. `merge` (`pack merge OUT`) knows both, so a merge of an
appended dataset publishes the append its tasks packed, or keeps the dataset as it is, and never
republishes it from the first pack's plan alone (which would drop the appended shards).

Either way rejects.jsonl and the loader descriptors are written first and index.json last
(`release`), in `Output.staging`, and the output makes them visible its own way.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from readers.layouts.wds import image_extension
from readers.manifest import CARD_NAME, MANIFEST_NAME, REJECTS_NAME, DatasetError, FileInfo, Manifest, parse_manifest

from ..plan.changes import source_changes
from .descriptors import DEFAULT_SPLIT, descriptor_texts, write_descriptors
from ..errors import PackError
from ..stores.fsutil import atomic_write_text
from ..stores.outdir import PARTS_DIR, PLAN_NAME, WORK_DIR, part_dir, tmp_dir
from ..stores.output import Output, opened_output
from ..plan.plan import Plan, parse_plan
from ..write.shard import ShardResult, check_rejects, finished_shards, parse_marker, shard_file_name
from ..sources.listing import ScanError
from ..write.validate import ErrorPolicy
from ..version import __version__

log = logging.getLogger(__name__)

MAX_IMPLIED_CLASSES = 1 << 20
"""Integer labels beyond this are not taken as class indexes (an ID, not a class): no class list."""
IMAGE_FEATURE = re.compile(r'^ *- name: "([A-Za-z0-9][A-Za-z0-9_.-]{0,31})"\n *dtype: "image"$', re.MULTILINE)
"""An image column of a wds dataset card (`descriptors.wds_features`, as `descriptors.to_yaml` writes it)."""
PART_KEY = "part"
"""The key of a rejects.jsonl row that an append added: the number of its part's first shard."""


def merge(out: str | os.PathLike[str] | Output, policy: ErrorPolicy = ErrorPolicy(), *,
          split: str = DEFAULT_SPLIT) -> Manifest:
    """Publish rejects.jsonl, the loader descriptors (`packer.run.descriptors`, `split` named there)
    and, last, index.json, once every planned shard has its marker.

    The authoritative --max-errors check (all shards, scan-time rejects included): rejects.jsonl
    is still written so the bad files can be looked at, but index.json is not. A remote OUT gets
    the same files, written in staging and uploaded, index.json last. Where OUT is published
    already, the append its tasks packed is published (`publish_part`), and an appended dataset
    with nothing pending is kept as it is.
    """
    with opened_output(out) as target:
        appended = merge_append(target, policy, split)
        if appended is not None:
            return appended
        plan = target.stored_plan()
        if plan is None:
            raise PackError(f"{target / WORK_DIR}: no plan; nothing was packed here")
        done = finished_shards(target, plan, list(range(plan.num_shards)), check_hash=False)
        if all(result is not None for result in done.values()):
            check_source(target, plan, "nothing was published; pack it again with --overwrite")
        return publish(target, policy, split, plan, done)


def check_source(out: Output, plan: Plan, way_on: str) -> None:
    """Before a merge publishes: SRC unchanged since the plan (`packer.plan.changes`), so the shards
    that tasks packed at different times hold one state of it; a task checks SRC when it starts,
    this sees what changed while they ran. Where SRC cannot be listed from here (a merge on
    another machine), that is said and the check left out."""
    try:
        changes = source_changes(plan.planned_source, out, plan, plan.options)
    except ScanError as exc:
        log.warning("%s: not checked against %s's plan (%s)", plan.source, out, exc)
        return
    if changes:
        raise PackError(changes.describe(plan.source, out, way_on))


def merge_append(out: Output, policy: ErrorPolicy, split: str) -> Manifest | None:
    """`merge` where OUT is published already: publish the append its tasks packed, or keep an
    appended dataset as it is. None: OUT has no index.json, or was packed once (`publish` it)."""
    text = out.read_text(MANIFEST_NAME)
    if text is None:
        return None
    try:
        manifest = parse_manifest(text.encode("utf-8"), out / MANIFEST_NAME)
    except DatasetError as exc:
        if out.has_parts():  # the first pack's plan alone would leave the appended shards out
            raise PackError(f"{exc}; OUT has appended parts (.pack/{PARTS_DIR}), so merge cannot rebuild it from "
                            "the first pack's plan: restore index.json from a copy") from None
        return None  # publish() writes a new one from the plan
    base = base_plan(out, manifest)
    first = next_shard(out, manifest, base)
    plan = out.stored_plan(first)
    if plan is None:
        return manifest if manifest.parts else None
    done = finished_shards(out, plan, list(range(plan.num_shards)), check_hash=False)
    if all(result is not None for result in done.values()):
        check_source(out, plan, f"nothing was published; remove {out / part_dir(Path(), first).as_posix()} to drop "
                                "the append, then append SRC again")
    return publish_part(out, manifest, recorded_parts(out, manifest, base), plan, done, policy, split)


# --- a pack -------------------------------------------------------------------------------------


def publish(out: Output, policy: ErrorPolicy, split: str, plan: Plan, done: dict[int, ShardResult | None]) -> Manifest:
    """Publish the dataset OUT's `plan` packed; `done`: every shard's marker, just read by the
    caller (a remote OUT's reads are round trips to the store)."""
    results = finished_results(out, plan, done)
    rejects = all_rejects(plan, results)
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
    rejects_text = "".join(json.dumps(reject) + "\n" for reject in rejects)
    return release(out, plan, manifest, rejects, rejects_text, image_extensions(results), policy, split)


def finished_results(out: Output, plan: Plan, done: dict[int, ShardResult | None]) -> list[ShardResult]:
    """The markers of `plan`'s shards, every one of them finished; else an error naming the others."""
    missing = [shard_file_name(plan, shard) for shard, result in done.items() if result is None]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        of = "shards of the append" if plan.first_shard else "shards"
        raise PackError(f"{out}: {len(missing)} of {plan.num_shards} {of} unfinished: {shown}")
    return [result for result in done.values() if result is not None]


def all_rejects(plan: Plan, results: list[ShardResult]) -> list[dict[str, str]]:
    """The scan-time rejects of `plan` and every shard's, sorted by path."""
    return sorted(plan.scan_rejects + [reject for result in results for reject in result.rejects],
                  key=lambda reject: reject["path"])


def image_extensions(results: list[ShardResult]) -> list[str]:
    return sorted({image_extension(extension) for result in results for extension in result.extensions})


def implied_classes(results: list[ShardResult]) -> list[str]:
    """Classes "0".."K-1" for integer labels that came without names (a metadata file's indexes, a
    tar's `cls`, a .rec's labels), K the largest label + 1: `len(ds.classes)` is the class count."""
    labels = [int(label) for result in results for label in result.label_counts if int(label) >= 0]
    count = max(labels, default=-1) + 1
    if count > MAX_IMPLIED_CLASSES:
        log.warning("labels up to %d: too many to be class indexes; index.json lists no classes", count - 1)
        return []
    return [str(index) for index in range(count)]


def release(out: Output, plan: Plan, manifest: Manifest, rejects: list[dict[str, str]], rejects_text: str,
            extensions: list[str], policy: ErrorPolicy, split: str) -> Manifest:
    """Write rejects.jsonl (`rejects_text`), check `rejects` against the error policy, then write
    the loader descriptors and, last, index.json, and make them visible in OUT. Over the policy,
    rejects.jsonl is made visible (so the bad files can be looked at) and index.json is not."""
    folder = out.staging
    atomic_write_text(folder / REJECTS_NAME, rejects_text)
    rejects_bytes = rejects_text.encode("utf-8")
    manifest.rejects = FileInfo(REJECTS_NAME, len(rejects_bytes), hashlib.sha256(rejects_bytes).hexdigest())
    try:
        check_rejects(out, plan, rejects, policy)
    except PackError:
        out.publish_files([REJECTS_NAME])
        raise
    manifest.descriptors = write_descriptors(folder, descriptor_texts(manifest, split, extensions,
                                                                      plan.options.sample_shape))
    staged = [REJECTS_NAME, *(info.name for info in manifest.descriptors)]
    out.publish_files(staged)
    out.publish_manifest(manifest.to_json(), staged)
    shutil.rmtree(tmp_dir(folder), ignore_errors=True)
    return manifest


# --- an append's part ---------------------------------------------------------------------------


def publish_part(out: Output, manifest: Manifest, parts: list[dict[str, Any]], plan: Plan,
                 done: dict[int, ShardResult | None], policy: ErrorPolicy, split: str) -> Manifest:
    """Publish OUT with the part `plan` packed (every shard of it done) after what `manifest` lists:
    rejects.jsonl (earlier rows kept, this part's tagged), the loader descriptors, then index.json."""
    results = finished_results(out, plan, done)
    rejects = all_rejects(plan, results)
    earlier = [line for line in (out.read_text(REJECTS_NAME) or "").splitlines(keepends=True)
               if not appended_by(line, plan.first_shard)]
    rejects_text = "".join(earlier) + "".join(json.dumps({**reject, PART_KEY: plan.first_shard}) + "\n"
                                              for reject in rejects)
    classes = plan.classes or extended_implied(manifest.classes, results)
    old_counts = manifest.class_counts if manifest.class_counts or not manifest.classes else []
    counts = [] if manifest.classes and not old_counts else [
        (old_counts[label] if label < len(old_counts) else 0)
        + sum(result.label_counts.get(str(label), 0) for result in results) for label in range(len(classes))]
    part = {
        "first_shard": plan.first_shard,
        "num_shards": plan.num_shards,
        "num_samples": sum(result.num_samples for result in results),
        "source": plan.source,
        "options": asdict(plan.options),
        "fingerprint": plan.fingerprint,
        "extensions": image_extensions(results),
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
    release(out, plan, grown, rejects, rejects_text, every_extension, policy, split)
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


# --- OUT's parts, as published ------------------------------------------------------------------


def part_number(part: dict[str, Any], key: str, out: Output) -> int:
    """An integer of a `parts` entry (index.json is untrusted)."""
    value = part.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PackError(f"{out / MANIFEST_NAME}: parts: {key} {value!r} is not a shard number; nothing was appended")
    return value


def next_shard(out: Output, manifest: Manifest, base: Plan | None) -> int:
    """The first shard number an append to OUT gets: past every listed shard and every planned one
    (a shard whose every sample was rejected is planned, numbered, and not listed). `base`:
    `base_plan(out, manifest)`."""
    listed = max(manifest.shard_numbers, default=-1) + 1
    if manifest.parts:
        last = manifest.parts[-1]
        return max(listed, part_number(last, "first_shard", out) + part_number(last, "num_shards", out))
    return max(listed, base.num_shards if base else 0)


def base_plan(out: Output, manifest: Manifest) -> Plan | None:
    """The plan OUT was first packed with, when OUT was packed once (no `parts`) and still holds
    it (its listing is not read); read once per run, for `next_shard` and `recorded_parts`."""
    if manifest.parts:
        return None
    name = f"{WORK_DIR}/{PLAN_NAME}"
    text = out.read_text(name)
    return parse_plan(text, out / name) if text is not None else None


def recorded_parts(out: Output, manifest: Manifest, base: Plan | None) -> list[dict[str, Any]]:
    """OUT's `parts`; for a dataset packed once, the entry of its pack, made from its plan `base`
    (`base_plan(out, manifest)`: when OUT still holds it) and its markers."""
    if manifest.parts:
        return list(manifest.parts)
    return [{
        "first_shard": 0,
        "num_shards": base.num_shards if base else max(manifest.shard_numbers, default=-1) + 1,
        "num_samples": manifest.num_samples,
        "source": base.source if base else None,
        "options": manifest.options,
        "fingerprint": base.fingerprint if base else None,
        "extensions": base_extensions(out, manifest),
    }]


def base_extensions(out: Output, manifest: Manifest) -> list[str]:
    """The image extensions in OUT's shards (for the loader descriptors), from the shards' markers."""
    names = [shard.name for shard in manifest.shards]
    markers = [parse_marker(text) for text in out.marker_texts(names).values()]
    found = [marker for marker in markers if marker is not None]
    extensions = {image_extension(extension) for marker in found for extension in marker.extensions}
    if len(found) < len(names):  # OUT copied without its .pack: the published dataset card still names them
        named = card_extensions(out, manifest)
        if not named:
            log.warning("%s: %d shards have no marker in .pack/done; the loader descriptors list the image types "
                        "of the others", out, len(names) - len(found))
        extensions.update(named)
    return sorted(extensions)


def card_extensions(out: Output, manifest: Manifest) -> list[str]:
    """The image columns of OUT's published dataset card (a wds dataset's README.md), when it is
    the one index.json lists (same sha256); [] otherwise."""
    listed = {info.name: info for info in manifest.descriptors}
    text = out.read_text(CARD_NAME) if CARD_NAME in listed else None
    if text is None or hashlib.sha256(text.encode("utf-8")).hexdigest() != listed[CARD_NAME].sha256:
        return []
    return IMAGE_FEATURE.findall(text)
