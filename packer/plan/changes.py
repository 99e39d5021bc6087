"""Whether SRC is still what OUT's plan listed: a rerun, a resume, a task and an append compare
SRC's listing now with the plan's before they trust it (#35). One task of several checks only
its own shards' files (`run_changes`): N tasks do not walk SRC N times.

Shards finished from the plan hold the files as they were when it was made; packing the rest, or
calling the dataset up to date, after SRC changed would give one output of two states of SRC, or
a dataset that silently lacks what was added. So SRC is listed again, as the plan's scan listed it
(names, sizes and, where the source tells them, modification times; no file is read), and any
difference stops the run in one line: how many files were added, removed and changed, the first
of them, and the way on.

A file counts as changed when its size differs from the plan's, or when it was modified after the
plan's scan began (or after the newest file it saw, if that is later: a clock ahead of this one's
must not make every rerun stop): the plan's listing file carries that time as its own
modification time (`plan.write_plan`; a bucket's copy, the time it was stored), so nothing is
added to the plan.
Container inputs (tar shards, record files, a packed dataset) are not listed again, which reads
them: each input's modification time is compared instead (a packed dataset's index.json).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .options import PackOptions, option_differences
from ..stores.outdir import listing_path
from ..stores.output import Output
from .partition import Partition
from .plan import Plan, listing_digest, listing_lines, read_shard_entries
from .scan import scan_source
from ..sources.classes import reindex
from ..sources.containers import input_mtimes
from ..sources.inflight import InFlight
from ..sources.inputs import Source
from ..sources.listing import Listing

NAMES_SHOWN = 3
"""Changed files named in the message; the counts say how many there are."""


@dataclass
class Changes:
    """SRC's files that differ from the plan's listing, each list sorted by name."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    relabelled: bool = False  # the same files, with other labels or a metadata file's other values

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed or self.relabelled)

    def describe(self, src: object, out: object, way_on: str) -> str:
        """The one line a run stops with, ending with `way_on` (`pack_way_on`, or an append's)."""
        if not (self.added or self.removed or self.changed):
            return f"{src}: SRC changed since {out}'s plan: its labels or fields differ; {way_on}"
        names = sorted(self.added + self.removed + self.changed)
        shown = ", ".join(names[:NAMES_SHOWN]) + (", ..." if len(names) > NAMES_SHOWN else "")
        return (f"{src}: SRC changed since {out}'s plan: {len(self.added)} added, {len(self.removed)} removed, "
                f"{len(self.changed)} changed ({shown}); {way_on}")

    def pack_way_on(self, *, published: bool) -> str:
        """What to do about a pack's changed SRC: pack it again; or, when files were only added to
        a published dataset, append them (`published`: OUT holds one)."""
        if published and self.added and not (self.removed or self.changed or self.relabelled):
            return "append them with --append, or pack it again with --overwrite"
        return "pack it again with --overwrite"


def plan_differences(plan: Plan, source: Source, options: PackOptions) -> str | None:
    """What makes `plan` another pack than SRC with `options`: `options --shard-size: 2 before,
    4 now`, or the other SRC; None when it is the same."""
    now = (source.name, source.kind, list(source.inputs))
    if (plan.source, plan.input_kind, plan.inputs) != now:
        return f"another SRC ({plan.source} before, {now[0]} now)" if plan.source != now[0] else \
            f"other inputs of {plan.source} ({len(plan.inputs)} {plan.input_kind} before, {len(now[2])} {now[1]} now)"
    changed = option_differences(plan.options, options)
    return f"other options ({'; '.join(changed)})" if changed else None


def plan_time(listing_file: Path) -> int:
    """The plan's date (ns): its listing file's modification time, set when it was written."""
    return os.stat(listing_file).st_mtime_ns


def listing_changes(plan: Plan, listing: Listing, listing_file: Path, options: PackOptions) -> Changes | None:
    """What differs between SRC's `listing` now (scanned with the plan's options, in scan order)
    and the plan's, stored in `listing_file`; None when nothing does. The usual case, nothing,
    costs a hash of the listing's lines in packing order and one pass over the times."""
    import numpy as np  # here, as `arrange`, which loads it: shard workers import this package's modules

    from .pack_order import arrange

    planned_at = plan_time(listing_file)
    mtimes = listing.mtimes
    newer = [] if not mtimes else np.flatnonzero(np.frombuffer(mtimes, dtype=np.int64) > planned_at).tolist()
    if not newer and len(listing) == plan.num_listed:
        arrange(listing, options.order, options.seed)
        if lines_sha256(listing) == plan.listing_sha256:
            return None
    changes = compared(listing, listing_file)
    touched = {listing.paths[position] for position in newer} if newer else set()
    changes.changed = sorted(set(changes.changed) | (touched - set(changes.added)))
    changes.relabelled = not changes  # same names and sizes: the labels or a metadata file's values differ
    return changes


def lines_sha256(listing: Listing) -> str:
    """`Plan.listing_sha256` of a plan made from `listing` (in packing order): the same lines, hashed."""
    digest = listing_digest(listing.inputs)
    step = 65536
    for start in range(0, len(listing), step):
        digest.update("".join(listing_lines(listing, start, min(start + step, len(listing)))).encode("ascii"))
    return digest.hexdigest()


def compared(listing: Listing, listing_file: Path) -> Changes:
    """Files added, removed or of another size, by name: the plan's listing file against `listing`."""
    planned: dict[str, int] = {}
    with open(listing_file, "rb") as handle:
        for line in handle:
            row = json.loads(line)
            planned[row[0]] = row[2]
    changes = Changes()
    for path, size in zip(listing.paths, listing.sizes):
        before = planned.pop(path, None)
        if before is None:
            changes.added.append(path)
        elif before != size:
            changes.changed.append(path)
    changes.removed = list(planned)
    changes.added.sort()
    changes.removed.sort()
    changes.changed.sort()
    return changes


def input_changes(plan: Plan, listing_file: Path) -> Changes | None:
    """Container inputs modified after the plan was made (their list is `plan_differences`' check)."""
    planned_at = plan_time(listing_file)
    times = input_mtimes(plan.planned_source)
    changed = [display_name(plan.source, name) for name, mtime in zip(plan.inputs, times) if mtime > planned_at]
    return Changes(changed=sorted(changed)) if changed else None


def display_name(source: str, name: str) -> str:
    """An input as a message names it: relative to SRC when inside it."""
    prefix = source.rstrip("/") + "/"
    return name[len(prefix):] if name.startswith(prefix) else name


def run_changes(source: Source, out: Output, plan: Plan, options: PackOptions, partition: Partition) -> Changes | None:
    """What changed in SRC since `plan`, as a run of `partition` needs to know it before packing:
    one task of several stats only the files of its own shards (`task_changes`), so N tasks look at
    SRC once between them rather than walk it N times (and files added since are found by `pack
    merge`, which lists SRC once); a whole run, or a SRC in a bucket (listed by the thousand),
    lists SRC again (`source_changes`)."""
    if partition.is_whole or source.kind != "folder" or source.is_url:
        return source_changes(source, out, plan, options)
    return task_changes(source, out, plan, partition.shards(plan.num_shards))


def task_changes(source: Source, out: Output, plan: Plan, shards: Sequence[int]) -> Changes | None:
    """The files of `shards` that are gone, of another size, or modified after the plan was made:
    a stat each, many in flight where each waits on storage (`InFlight`); no file is read and no folder listed."""
    listing_file = listing_path(out.staging, plan.first_shard)
    planned_at = plan_time(listing_file)
    root = str(source.location)
    rows = [(entry.path, entry.size) for shard in shards for entry in read_shard_entries(out.staging, plan, shard)]

    def state(row: tuple[str, int]) -> str | None:
        try:
            info = os.stat(os.path.join(root, row[0]))
        except FileNotFoundError:
            return "removed"
        except OSError:
            return None  # unreadable: the shard rejects it, as it would have
        return "changed" if info.st_size != row[1] or info.st_mtime_ns > planned_at else None

    changes = Changes()
    with InFlight(what=f"stats under {root}") as calls:
        for (path, _), found in zip(rows, calls.map(state, rows)):
            if found == "removed":
                changes.removed.append(path)
            elif found == "changed":
                changes.changed.append(path)
    changes.removed.sort()
    changes.changed.sort()
    return changes or None


def source_changes(source: Source, out: Output, plan: Plan, options: PackOptions) -> Changes | None:
    """What changed in SRC since OUT's `plan` was made from it: SRC listed again, or its container
    inputs' times; None when nothing did. Samples of
    `packer.pack_samples` come from the caller's code, which has no listing to compare."""
    if source.kind == "samples":
        return None
    listing_file = listing_path(out.staging, plan.first_shard)
    if source.kind != "folder":
        return input_changes(plan, listing_file)
    listing = scan_source(source, options, times=True)
    labelled_as_planned(listing, plan.classes)
    return listing_changes(plan, listing, listing_file, options)


def labelled_as_planned(listing: Listing, classes: list[str]) -> None:
    """`listing`'s labels as indexes of the plan's `classes`, by name. An append's plan lists OUT's
    classes, then SRC's new ones (`packer.run.append.part_listing`), so SRC's own indexes may
    differ from its plan's though nothing changed; a pack's are the same. A class name the plan
    lacks is left to the comparison, which tells what changed."""
    if listing.classes and listing.classes != classes and set(listing.classes) <= set(classes):
        reindex(listing, classes)
