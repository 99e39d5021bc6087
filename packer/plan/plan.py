"""Split a listing into shards, and keep that split on disk so any process can run one shard.

The plan lives in OUT/.pack/: `plan.json` (options, classes, fields, shard boundaries) and
`listing.jsonl` (one `[path, label, size]` per line, `[path, label, size, {field: value}]` when
values come with the listing, from a metadata file, and `[path, label, size, values or null,
[input, offset, length]]` for a sample inside a container input: a tar shard, a record file, a
packed dataset; `plan.inputs` names those files). The listing is in packing order (`--order`,
`packer.plan.pack_order`): shard boundaries depend only on it and the shard options, and the order only on
the sorted scan and the options, so every run and every task computes the same shards.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from json.encoder import encode_basestring_ascii as encode_string
from typing import Any, Iterable, Iterator, Sequence

from readers.fields import FieldSpec
from readers.manifest import FORMAT_VERSION

from ..errors import PackError
from ..stores.fsutil import atomic_write_text, hash_file
from .options import PackOptions
from ..stores.outdir import listing_path, part_dir, plan_path, temp_name
from ..sources.inputs import Source
from ..sources.listing import Listing

log = logging.getLogger(__name__)

@dataclass(slots=True)
class Entry:
    """One file to pack; `path` (relative to SRC) is its key: unique, and the sorted order's sort key.
    A shard's worker holds one per sample: slots, and a tuple for the location, keep them small."""

    path: str
    label: int
    size: int
    fields: dict[str, Any] | None = None  # values from the listing (a metadata file's columns)
    location: Sequence[int] | None = None  # a container sample: (input number, offset, length)


@dataclass
class Plan:
    source: str
    options: PackOptions
    classes: list[str]
    num_listed: int
    bounds: list[int]
    line_offsets: list[int]
    listing_sha256: str
    ignored: int = 0
    ignored_names: list[str] = field(default_factory=list)  # the first of them (`Listing.ignored_names`)
    scan_rejects: list[dict[str, str]] = field(default_factory=list)
    fields: list[FieldSpec] = field(default_factory=list)
    input_kind: str = "folder"  # packer.sources.inputs.INPUT_KINDS; "folder": files under `source`
    inputs: list[str] = field(default_factory=list)  # container inputs, absolute paths, in order
    first_shard: int = 0  # an append's (packer.run.append): its shards are numbered from here, after OUT's
    unclassed: int = 0  # images beside the class folders, left out (`Listing.unclassed`)
    unclassed_names: list[str] = field(default_factory=list)
    aliases: list[str] = field(default_factory=list)  # class folders aliased inside another (`Listing.aliases`)

    @property
    def num_shards(self) -> int:
        return len(self.bounds) - 1

    @property
    def planned_source(self) -> Source:
        """SRC as this plan names it, for a shard task or `pack merge`, which get the plan, not SRC."""
        return Source(self.input_kind, self.source, tuple(self.inputs))

    def shard_number(self, shard: int) -> int:
        """The number in the name and sample keys of this plan's shard `shard`."""
        return self.first_shard + shard

    @property
    def fingerprint(self) -> str:
        """Identifies what this plan would produce: same fingerprint, same shards. The layout version
        is part of it, so a run started by an older pack is not finished with shards of another layout."""
        key = json.dumps([FORMAT_VERSION, asdict(self.options), self.listing_sha256], sort_keys=True)
        return hashlib.sha256(key.encode()).hexdigest()


def shard_bounds(sizes: Sequence[int], shard_size: int, shard_bytes: int) -> list[int]:
    """Start index of every shard, plus the end: a new shard starts when either limit is hit.

    Each shard's end is found by bisecting the running totals of a window of its files, the
    window doubling until it holds the end: no loop per file, and nothing as large as the listing
    (at millions of files, either was seconds or tens of megabytes of `pack plan`).
    """
    bounds = [0]
    window = 64
    while (start := bounds[-1]) < len(sizes):
        limit = min(start + shard_size, len(sizes))
        while True:
            end = min(start + window, limit)
            totals = list(itertools.accumulate(sizes[start:end]))
            fit = bisect.bisect_right(totals, shard_bytes)  # files that fit; the first always goes in
            if fit < end - start or end == limit:
                bounds.append(start + max(fit, 1))
                break
            window *= 2
        window = max(64, 2 * (bounds[-1] - start))
    return bounds


PLAIN_LINE = '["{}", {}, {}]\n'.format


def listing_lines(listing: Listing, start: int, end: int) -> Iterable[str]:
    """Lines `start:end` of listing.jsonl: what `json.dumps(row) + "\\n"` gives, several times
    faster for the plain rows (no list to serialise per row; where no path needs escaping, which
    one call of json's C string encoder on them all shows, no per-row call at all)."""
    paths = listing.paths[start:end]
    rows = zip(paths, listing.labels[start:end], listing.sizes[start:end])
    if listing.locations is not None:
        values = listing.values[start:end] if listing.values is not None else [None] * (end - start)
        return (json.dumps([path, label, size, fields, listing.location(position)]) + "\n"
                for position, ((path, label, size), fields) in enumerate(zip(rows, values), start))
    if listing.values is None:
        joined = "\0".join(paths)  # escaping adds characters; each NUL becomes \u0000, 5 more
        if len(encode_string(joined)) == len(joined) + 2 + 5 * max(len(paths) - 1, 0):
            return map(PLAIN_LINE, paths, listing.labels[start:end], listing.sizes[start:end])
        return (f"[{encode_string(path)}, {label}, {size}]\n" for path, label, size in rows)
    return (json.dumps([path, label, size, values]) + "\n"
            for (path, label, size), values in zip(rows, listing.values[start:end]))


def listing_digest(inputs: list[str]) -> Any:
    """The hash `Plan.listing_sha256` is taken with, before the listing's lines: the names of the
    container inputs first (the locations index them: other inputs, other samples)."""
    digest = hashlib.sha256()
    if inputs:
        digest.update(json.dumps(inputs).encode())
    return digest


def listing_sha256(listing_file: Path, inputs: list[str]) -> str:
    """What `Plan.listing_sha256` holds for this listing.jsonl."""
    return hash_file(listing_file, listing_digest(inputs)).hexdigest()


def write_plan(out: Path, listing: Listing, options: PackOptions, first_shard: int = 0, *, source: Source) -> Plan:
    """Put the listing of `source` in packing order, write it to listing.jsonl, cut shards from it,
    and write plan.json under OUT/.pack; return the plan. The order comes from the options alone,
    so every task and rerun that plans the same SRC packs the same shards."""
    from .pack_order import arrange  # here: it loads numpy, which shard workers (importing this module) never need

    arrange(listing, options.order, options.seed)
    part_dir(out, first_shard).mkdir(parents=True, exist_ok=True)
    bounds = shard_bounds(listing.sizes, options.shard_size, options.shard_bytes)
    if options.shard_size > 1 and len(listing) > 1 and len(bounds) - 1 == len(listing):
        log.warning("--shard-bytes %d (bytes) is below the files' sizes: one shard per sample, %d shards; "
                    "give a size with its unit, e.g. 512MiB", options.shard_bytes, len(listing))
    digest = listing_digest(listing.inputs)
    offsets: list[int] = []
    position = 0
    listing_file = listing_path(out, first_shard)
    tmp = listing_file.with_name(temp_name(listing_file.name))
    with open(tmp, "wb") as handle:
        for start, end in zip(bounds, bounds[1:]):  # one shard's lines at a time: one write, one hash update
            chunk = "".join(listing_lines(listing, start, end)).encode("ascii")
            offsets.append(position)
            handle.write(chunk)
            digest.update(chunk)
            position += len(chunk)
        offsets.append(position)
        handle.flush()
        os.fsync(handle.fileno())
    if listing.listed_at is not None:  # the plan's time, against which a rerun finds files changed since
        planned_at = max(listing.listed_at, listing.newest_mtime + 1)  # a file dated later: a clock ahead of ours
        os.utime(tmp, ns=(planned_at, planned_at))
    os.replace(tmp, listing_file)
    plan = Plan(
        source=source.name,
        options=options,
        classes=listing.classes,
        num_listed=len(listing),
        bounds=bounds,
        line_offsets=offsets if len(listing) else [0],
        listing_sha256=digest.hexdigest(),
        ignored=listing.ignored_hidden + listing.ignored_other,
        ignored_names=listing.ignored_names,
        scan_rejects=[{"path": path, "reason": reason} for path, reason in listing.rejects],
        fields=listing.fields,
        input_kind=listing.kind,
        inputs=listing.inputs,
        first_shard=first_shard,
        unclassed=listing.unclassed,
        unclassed_names=listing.unclassed_names,
        aliases=listing.aliases,
    )
    data = asdict(plan)
    for name in ("first_shard", "unclassed", "unclassed_names", "aliases"):
        if not data[name]:  # a plan.json reads as it did before appends, and these, existed
            del data[name]
    atomic_write_text(plan_path(out, first_shard), json.dumps(data) + "\n")
    for name in plan.ignored_names:
        log.info("ignored: %s", name)
    for name in plan.unclassed_names:
        log.info("outside any class folder, skipped: %s", name)
    return plan


def load_plan(out: Path, first_shard: int = 0) -> Plan | None:
    path = plan_path(out, first_shard)
    try:
        return parse_plan(path.read_text(encoding="utf-8"), path, first_shard)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PackError(f"{path}: unreadable plan ({exc})") from None


def parse_plan(text: str, path: Path | str, first_shard: int = 0) -> Plan:
    """The plan in `text` (plan.json, read from `path`): a pack's (`first_shard` 0) or the plan of
    the append whose folder is `.pack/parts/<first_shard>`. Its shards are named and its listing
    found from its first_shard, so that must be the folder's."""
    try:
        data = json.loads(text)
        data["options"].setdefault("order", "sorted")  # planned before --order existed: the sorted order
        plan = Plan(**{**data, "options": PackOptions(**data["options"]),
                       "fields": [FieldSpec.from_dict(spec) for spec in data.get("fields", ())]})
    except (ValueError, TypeError, KeyError, PackError) as exc:
        raise PackError(f"{path}: unreadable plan ({exc})") from None
    if type(plan.first_shard) is not int or plan.first_shard != first_shard:
        raise PackError(f"{path}: unreadable plan (first_shard {plan.first_shard!r} where its folder says "
                        f"{first_shard})")
    return plan


def entry_of(row: list[Any]) -> Entry:
    """A listing row as an Entry; a container sample's location as a tuple (a list costs 24 bytes more)."""
    if len(row) == 5 and row[4] is not None:
        row[4] = tuple(row[4])
    return Entry(*row)


class ShardEntries:
    """One shard's listing slice, parsed from `listing.jsonl` each time it is iterated instead of
    held: a shard's 10k entries are 2-3 MB of objects in every worker. Made by `read_shard_entries`,
    which reads the slice once to check its count and total its sizes."""

    def __init__(self, listing: Path, start: int, end: int) -> None:
        self._listing, self._start, self._end = listing, start, end
        self.count = self.total_size = 0
        for row in self._rows():
            self.count += 1
            self.total_size += row[2]

    def _rows(self) -> Iterator[list[Any]]:
        with open(self._listing, "rb") as handle:
            handle.seek(self._start)
            left = self._end - self._start
            while left > 0:
                line = handle.readline(left)
                if not line:
                    break
                left -= len(line)
                yield json.loads(line)

    def __iter__(self) -> Iterator[Entry]:
        return map(entry_of, self._rows())

    def __len__(self) -> int:
        return self.count


def read_shard_entries(out: Path, plan: Plan, shard: int) -> ShardEntries:
    """The listing slice of one shard, checked against the plan's count."""
    listing = listing_path(out, plan.first_shard)
    entries = ShardEntries(listing, plan.line_offsets[shard], plan.line_offsets[shard + 1])
    expected = plan.bounds[shard + 1] - plan.bounds[shard]
    if entries.count != expected:
        raise PackError(f"{listing}: shard {shard} lists {entries.count} files, plan says {expected}")
    return entries
