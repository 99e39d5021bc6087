"""Split a listing into shards, and keep that split on disk so any process can run one shard.

The plan lives in OUT/.pack/: `plan.json` (options, classes, fields, shard boundaries) and
`listing.jsonl` (one `[path, label, size]` per line, `[path, label, size, {field: value}]` when
values come with the listing, from a metadata file, and `[path, label, size, values or null,
[input, offset, length]]` for a sample inside a container input: a tar shard, a record file, a
packed dataset; `plan.inputs` names those files). The listing is in packing order (`--order`,
`packer.order`): shard boundaries depend only on it and the shard options, and the order only on
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

from .encode import DEFAULT_QUALITY, ENCODE_OPTIONS, PIXEL_MODES, STORES
from .errors import PackError
from .fsutil import atomic_write_text
from .outdir import listing_path, part_dir, plan_path, temp_name
from .sources.inputs import INPUT_FORMATS
from .sources.listing import Listing
from .sources.metadata import DEFAULT_LABEL_COLUMN
from .sources.sidecars import extension_problem
from .validate import DEFAULT_MAX_PIXELS, VALIDATE_MODES

log = logging.getLogger(__name__)

DEFAULT_ORDER = "shuffled"
ORDERS = ("shuffled", "sorted")
"""`--order`: how `packer.order.arrange` puts the listing in packing order."""
MAX_SEED = 2**64 - 1

DEFAULT_SHARD_SIZE = 10_000
DEFAULT_IMAGE_KEY = "image/encoded"  # TFRecord features (packer.sources.tfrecord): ImageNet's names
DEFAULT_LABEL_KEY = "image/class/label"
DEFAULT_SHARD_BYTES = 1 << 30


@dataclass(frozen=True)
class PackOptions:
    """Everything that changes the packed result; recorded in the plan and the manifest."""

    format: str
    store: str = "original"
    shard_size: int = DEFAULT_SHARD_SIZE
    shard_bytes: int = DEFAULT_SHARD_BYTES
    mode: str | None = None
    resize: int | None = None
    max_side: int | None = None
    center_crop: int | None = None
    quality: int | None = None
    validate: str = "quick"
    max_pixels: int = DEFAULT_MAX_PIXELS
    # Where samples, labels and fields come from (packer.sources); files by absolute path.
    files_from: str | None = None  # "-": standard input
    null: bool = False
    metadata: str | None = None
    label_column: str = DEFAULT_LABEL_COLUMN
    classes: str | None = None
    no_classes: bool = False
    sidecars: tuple[str, ...] = ()
    sidecars_optional: bool = False
    input_format: str | None = None  # None: what SRC looks like (packer.sources.inputs.resolve_source)
    image_key: str = DEFAULT_IMAGE_KEY  # TFRecord features (packer.sources.tfrecord)
    label_key: str = DEFAULT_LABEL_KEY
    label_offset: int = 0
    # The order samples are packed in (packer.order): a seeded shuffle, or the listing's sorted order.
    order: str = DEFAULT_ORDER
    seed: int = 0

    def __post_init__(self) -> None:
        """Reject contradictory options; fill in the defaults of decoding stores (RGB, quality 90)."""
        object.__setattr__(self, "sidecars", tuple(self.sidecars))  # a list, when read back from plan.json
        self._check_sources()
        if self.shard_size < 1:
            raise PackError(f"--shard-size must be at least 1, not {self.shard_size}")
        if self.shard_bytes < 1:
            raise PackError(f"--shard-bytes must be positive, not {self.shard_bytes}")
        if self.store not in STORES:
            raise PackError(f"--store must be one of {', '.join(STORES)}, not {self.store!r}")
        sizes = {"--resize": self.resize, "--max-side": self.max_side, "--center-crop": self.center_crop}
        for flag, value in sizes.items():
            if value is not None and value < 1:
                raise PackError(f"{flag} must be at least 1, not {value}")
        if self.store == "original":
            given = [flag for flag, value in {**sizes, "--mode": self.mode}.items() if value is not None]
            if given:
                raise PackError(f"{given[0]} needs a store that decodes (--store raw, bmp or jpeg); original keeps file bytes")
        elif self.mode is None:
            object.__setattr__(self, "mode", "RGB")
        if self.mode is not None and self.mode not in PIXEL_MODES:
            raise PackError(f"--mode must be one of {', '.join(PIXEL_MODES)}, not {self.mode!r}")
        if self.resize is not None and self.max_side is not None and self.max_side < self.resize:
            raise PackError(f"--max-side {self.max_side} is smaller than --resize {self.resize}")
        if self.store != "jpeg":
            if self.quality is not None:
                raise PackError("--quality applies only to --store jpeg")
        elif self.quality is None:
            object.__setattr__(self, "quality", DEFAULT_QUALITY)
        elif not 1 <= self.quality <= 100:
            raise PackError(f"--quality must be between 1 and 100, not {self.quality}")
        if self.validate not in VALIDATE_MODES:
            raise PackError(f"--validate must be one of {', '.join(VALIDATE_MODES)}, not {self.validate!r}")
        if self.max_pixels < 1:
            raise PackError(f"--max-pixels must be at least 1, not {self.max_pixels}")
        if self.order not in ORDERS:
            raise PackError(f"--order must be one of {', '.join(ORDERS)}, not {self.order!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise PackError(f"--seed must be an integer from 0 to {MAX_SEED}, not {self.seed!r}")

    def _check_sources(self) -> None:
        for name in ("files_from", "metadata", "classes"):
            value = getattr(self, name)
            if value is not None and value != "-":
                object.__setattr__(self, name, os.path.abspath(value))  # the plan outlives the working directory
        if self.metadata == "-" or self.classes == "-":
            raise PackError("only --files-from reads standard input (-)")
        if self.null and self.files_from is None:
            raise PackError("--null needs --files-from")
        if self.label_column != DEFAULT_LABEL_COLUMN and self.metadata is None:
            raise PackError("--label-column needs --metadata")
        if self.no_classes and (self.metadata is not None or self.classes is not None):
            raise PackError("--no-classes contradicts " + ("--metadata (its labels come from the label column)"
                                                           if self.metadata is not None else "--classes"))
        for extension in self.sidecars:
            problem = extension_problem(extension)
            if problem:
                raise PackError(f"--sidecars {extension}: {problem}")
        if len(set(self.sidecars)) != len(self.sidecars):
            raise PackError(f"--sidecars names an extension twice: {','.join(self.sidecars)}")
        if self.sidecars_optional and not self.sidecars:
            raise PackError("--sidecars-optional needs --sidecars")
        if self.input_format is not None and self.input_format not in INPUT_FORMATS:
            raise PackError(f"--input-format must be one of {', '.join(INPUT_FORMATS)}, not {self.input_format!r}")

    @property
    def encoding(self) -> dict[str, Any]:
        """The keyword arguments of `encode.encode` (unset ones left to its defaults)."""
        return {key: getattr(self, key) for key in ENCODE_OPTIONS if getattr(self, key) is not None}

    @property
    def sample_shape(self) -> tuple[int, int, int] | None:
        """The (H, W, C) every sample has when the options guarantee one: raw pixels, center-cropped."""
        if self.store != "raw" or self.center_crop is None or self.mode is None:
            return None
        return (self.center_crop, self.center_crop, len(self.mode))


def option_differences(before: PackOptions, now: PackOptions) -> list[str]:
    """`--shard-size: 2 before, 4 now` for each option that differs, named as its flag."""
    old, new = asdict(before), asdict(now)
    return [f"{'format' if name == 'format' else '--' + name.replace('_', '-')}: {old[name]} before, {new[name]} now"
            for name in old if old[name] != new[name]]


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
    first_shard: int = 0  # an append's (packer.append): its shards are numbered from here, after OUT's

    @property
    def num_shards(self) -> int:
        return len(self.bounds) - 1

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


def write_plan(out: Path, listing: Listing, options: PackOptions, first_shard: int = 0) -> Plan:
    """Put the listing in packing order, write it to listing.jsonl, cut shards from it, and write
    plan.json under OUT/.pack; return the plan. The order comes from the options alone, so every
    task and rerun that plans the same SRC packs the same shards."""
    from .order import arrange  # here: it loads numpy, which shard workers (importing this module) never need

    arrange(listing, options.order, options.seed)
    part_dir(out, first_shard).mkdir(parents=True, exist_ok=True)
    bounds = shard_bounds(listing.sizes, options.shard_size, options.shard_bytes)
    if options.shard_size > 1 and len(listing) > 1 and len(bounds) - 1 == len(listing):
        log.warning("--shard-bytes %d (bytes) is below the files' sizes: one shard per sample, %d shards; "
                    "give a size with its unit, e.g. 512MiB", options.shard_bytes, len(listing))
    digest = hashlib.sha256()
    if listing.inputs:  # the locations index them: other inputs, other samples
        digest.update(json.dumps(listing.inputs).encode())
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
    os.replace(tmp, listing_file)
    plan = Plan(
        source=listing.root if "://" in listing.root else os.path.abspath(listing.root),  # a URL SRC stays one
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
    )
    atomic_write_text(plan_path(out, first_shard), json.dumps(asdict(plan)) + "\n")
    for name in plan.ignored_names:
        log.info("ignored: %s", name)
    return plan


def load_plan(out: Path, first_shard: int = 0) -> Plan | None:
    path = plan_path(out, first_shard)
    try:
        return parse_plan(path.read_text(encoding="utf-8"), path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PackError(f"{path}: unreadable plan ({exc})") from None


def parse_plan(text: str, path: Path | str) -> Plan:
    """The plan in `text` (plan.json, read from `path`)."""
    try:
        data = json.loads(text)
        data["options"].setdefault("order", "sorted")  # planned before --order existed: the sorted order
        return Plan(**{**data, "options": PackOptions(**data["options"]),
                       "fields": [FieldSpec.from_dict(spec) for spec in data.get("fields", ())]})
    except (ValueError, TypeError, KeyError, PackError) as exc:
        raise PackError(f"{path}: unreadable plan ({exc})") from None


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
