"""WebDataset tar shards as SRC (img2dataset output, `pack wds` output, any `tar` of samples).

WebDataset's rules: a sample's key is the member path up to the first "." of its file name, the
rest its (lower-cased) extension; only adjacent members group. The image is the first member
with an image extension; `cls`, `class` or `label` holds an integer label; every other member
whose extension is a valid field name is a field (`json`: JSON, others: UTF-8 text, as
`--sidecars`), except the extensions WebDataset decodes as binary (pickles, tensors, audio,
video: BINARY_EXTENSIONS), which no field type stores: those members are left out, named in a
warning. A tar pack wrote has a `<key>.pack.json` per sample (its label, path, crc32): the
sample keeps that path, as a packed dataset's samples keep theirs. Shards are read in name order,
samples in tar order.

The scan reads only the tar headers (PAX headers included) and lists each sample as the byte
range from its first header to the end of its last member; the reader threads read the members
of that range with pread (the image in one read of its own), so nothing is extracted to disk.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from array import array
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from readers.fields import FieldSpec, check_field_name
from readers.layouts.wds import META_EXTENSION
from readers.tar import TarDamage, read_members, split_name

from ..errors import RejectedFile
from ..plan.options import PackOptions
from .classes import read_classes
from .inputs import Record, ShardPlan, Source
from .ranges import InputFiles, RangeFile
from .listing import IMAGE_EXTENSIONS, UNLABELLED, Listing, ScanError
from .sidecars import JSON_EXTENSION, checked_text

log = logging.getLogger(__name__)

LABEL_EXTENSIONS = ("cls", "class", "label")
BINARY_EXTENSIONS = frozenset({
    "pyd", "pickle", "pkl", "pth", "pt", "ten", "tb", "mp", "msgpack", "npz", "bin",  # WebDataset's binary decoders
    "flac", "mp3", "wav", "ogg", "opus", "m4a", "sox", "mp4", "avi", "webm", "mov", "mkv",  # its audio and video
})
SCAN_THREADS = 8


@dataclass(slots=True)
class Group:
    """Adjacent members sharing a key, as the scan sees them."""

    key: str
    start: int
    end: int = 0
    members: list[tuple[str, str, int]] = field(default_factory=list)  # (extension, name, size)


def sample_parts(name: str) -> tuple[str, str] | None:
    """`dir/x.seg.png` -> (`dir/x`, `seg.png`), WebDataset's split (`readers.tar.split_name`) with
    the extension lower-cased; None for a name without a dot, or with nothing before it."""
    key, extension = split_name(name)
    if key == name or not key or key.endswith("/"):
        return None
    return key, extension.lower()


@dataclass(frozen=True)
class Layout:
    """What a sample's member extensions make of it; samples mostly share one (`layout` caches it)."""

    image: int | None  # position of the first member with an image extension
    twice: str | None  # an extension two members have
    fields: tuple[str, ...]
    ignored: int  # members that are neither the image, nor a label, nor a field
    binary: tuple[str, ...]  # extensions of members left out as binary


@functools.lru_cache(maxsize=1024)
def layout(extensions: tuple[str, ...]) -> Layout:
    image = next((k for k, extension in enumerate(extensions) if "." + extension in IMAGE_EXTENSIONS), None)
    twice = next((extension for k, extension in enumerate(extensions) if extension in extensions[:k]), None)
    fields = tuple(extension for extension in extensions if is_field(extension))
    ignored = sum(1 for k, extension in enumerate(extensions) if k != image and extension not in LABEL_EXTENSIONS
                  and extension not in fields and extension != META_EXTENSION)
    binary = tuple(extension for extension in extensions if extension in BINARY_EXTENSIONS)
    return Layout(image, twice, fields, ignored, binary)


def is_field(extension: str) -> bool:
    return extension not in LABEL_EXTENSIONS and extension not in BINARY_EXTENSIONS \
        and "." + extension not in IMAGE_EXTENSIONS and check_field_name(extension) is None


def scan(source: Source, options: PackOptions) -> Listing:
    """The samples of every tar in `source.inputs`, from their headers; bad ones are rejects."""
    listing = Listing(root=source.root, classes=read_classes(options.classes) if options.classes else [],
                      locations=array("q"))
    seen: dict[str, int] = {}  # field extension (or binary one) -> samples that have it
    names = [os.path.relpath(path, source.root) for path in source.inputs]
    # Reading headers is one small read every member: on a cold cache, disk latency. Several tars
    # at once keep several reads in flight (pread releases the GIL); at most 2 x SCAN_THREADS
    # tars' listings wait at once, and they are appended in tar order.
    with ThreadPoolExecutor(SCAN_THREADS, thread_name_prefix="pack-scan") as pool:
        pending: deque[Future[tuple[Listing, dict[str, int]]]] = deque()
        for number in range(len(names)):
            while len(pending) < 2 * SCAN_THREADS and number + len(pending) < len(names):
                ahead = number + len(pending)
                pending.append(pool.submit(scan_tar, ahead, source.inputs[ahead], names[ahead]))
            part, fields = pending.popleft().result()
            append(listing, part)
            for extension, count in fields.items():
                seen[extension] = seen.get(extension, 0) + count
    binary = sorted(extension for extension in seen if extension in BINARY_EXTENSIONS)
    if binary:
        log.warning("%s: members .%s hold binary data, which no field type stores: left out", source.root,
                    ", .".join(binary))
    listing.fields = [FieldSpec(extension, "json" if extension == JSON_EXTENSION else "str",
                                optional=count < len(listing))
                      for extension, count in sorted(seen.items()) if extension not in BINARY_EXTENSIONS]
    log.info("scanned %d tar files under %s: %d samples, %d rejected", len(source.inputs), source.root,
             len(listing), len(listing.rejects))
    return listing


def append(listing: Listing, part: Listing) -> None:
    assert listing.locations is not None and part.locations is not None
    listing.paths.extend(part.paths)
    listing.labels += part.labels
    listing.sizes += part.sizes
    listing.locations += part.locations
    listing.rejects += part.rejects
    listing.ignored_other += part.ignored_other


def scan_tar(number: int, path: str, name: str) -> tuple[Listing, dict[str, int]]:
    """Input `number`'s samples (a listing to append) and how many samples have each field; each
    sample is classified as soon as its last member is seen, so only one waits at a time."""
    part = Listing(root="", classes=[], locations=array("q"))
    seen: dict[str, int] = {}
    try:
        file = RangeFile(path)
    except OSError as exc:
        raise ScanError(f"{path}: cannot read ({exc.strerror or exc})") from None
    with file:
        size = file.size
        group: Group | None = None
        last = ""
        try:
            for member in read_members(SpanReader(file.read), 0, size, archive=True):
                last = member.name
                parts = sample_parts(member.name) if member.is_file else None
                if parts is None:
                    part.ignored_other += member.is_file
                    continue
                key, extension = parts
                if group is None or group.key != key:
                    if group is not None:
                        add_sample(part, number, name, group, seen, size)
                    group = Group(key=key, start=member.start)
                group.members.append((extension, member.name, member.size))
                group.end = member.end
        except TarDamage as exc:
            if group is None or group.end <= size:  # else that sample is rejected as truncated
                part.rejects.append((name, f"{exc} (after member {last or 'none'}): the rest of the file "
                                           "cannot be read"))
            if group is not None and group.end <= size:  # its other members may be past the damage
                part.rejects.append((f"{name}/{group.key}", f"may be incomplete: {exc}"))
                group = None
        except OSError as exc:
            raise ScanError(f"{path}: cannot read ({exc.strerror or exc})") from None
        if group is not None:
            add_sample(part, number, name, group, seen, size)
    return part, seen


class SpanReader:
    """`read(offset, length)` over `read_at` (a pread): a small span comes out of one CHUNK-byte read,
    which usually holds a header, the small members after it (a label, a caption) and the next
    header; a large span (an image) is read on its own, into the bytes object that is handed on
    (no copy, so one image costs one allocation, as a file does)."""

    CHUNK = 4096

    def __init__(self, read_at: Callable[[int, int], bytes]) -> None:
        self.read_at = read_at
        self.start = 0
        self.data = b""

    def __call__(self, offset: int, length: int) -> bytes:
        if self.start <= offset and offset + length <= self.start + len(self.data):
            return self.data[offset - self.start:offset - self.start + length]
        if length > self.CHUNK:
            return self.read_at(offset, length)
        self.start, self.data = offset, self.read_at(offset, self.CHUNK)
        return self.data[:length]


def add_sample(listing: Listing, number: int, name: str, group: Group, seen: dict[str, int], size: int) -> None:
    path = f"{name}/{group.key}"
    found = layout(tuple(extension for extension, _, _ in group.members))
    if group.end > size:
        listing.rejects.append((path, f"member {group.members[-1][1]} is truncated (the tar ends at byte {size})"))
    elif found.twice is not None:
        listing.rejects.append((path, f"two members {group.key}.{found.twice} in one sample"))
    elif found.image is None:
        listing.rejects.append((path, "no image member (members: "
                                      + ", ".join(member for _, member, _ in group.members) + ")"))
    else:
        assert listing.locations is not None
        listing.paths.append(path)
        listing.labels.append(UNLABELLED)  # read with the sample
        listing.sizes.append(group.members[found.image][2])
        listing.locations.extend((number, group.start, group.end - group.start))
        for extension in found.fields + found.binary:
            seen[extension] = seen.get(extension, 0) + 1
        listing.ignored_other += found.ignored


class TarReader:
    """Reads one sample's byte range and takes its image, label and fields out of the members."""

    def __init__(self, plan: ShardPlan) -> None:
        self.files = InputFiles(plan.inputs)
        self.fields = {spec.name for spec in plan.fields}

    def __call__(self, input: int, offset: int, length: int) -> Record:
        read = SpanReader(lambda at, size: self.files.read(input, at, size))
        image: tuple[str, bytes] | None = None
        label = UNLABELLED
        fields: dict[str, bytes] = {}
        path: str | None = None
        try:
            for member in read_members(read, offset, offset + length):
                parts = sample_parts(member.name) if member.is_file else None
                if parts is None:
                    continue
                extension = parts[1]
                is_image = image is None and "." + extension in IMAGE_EXTENSIONS
                if not (is_image or extension in self.fields or (extension in LABEL_EXTENSIONS and label == UNLABELLED)
                        or extension == META_EXTENSION):
                    continue
                content = read(member.data, member.size)
                if len(content) < member.size:
                    raise TarDamage(f"member {member.name} is cut short at byte {member.data + len(content)}")
                if is_image:
                    image = (member.name, content)
                elif extension in self.fields:
                    fields[extension] = checked_text(member.name, extension, content)
                elif extension == META_EXTENSION:
                    path = stored_path(member.name, content)
                else:
                    label = parse_label(member.name, content)
        except TarDamage as exc:
            raise RejectedFile(f"{self.files.inputs[input]}: {exc} (changed since the scan?)") from None
        if image is None:
            raise RejectedFile(f"{self.files.inputs[input]} at byte {offset}: no image member (changed since the scan?)")
        return Record(image=image[1], label=label, fields=fields, image_name=image[0], path=path)

    def close(self) -> None:
        self.files.close()


def stored_path(name: str, content: bytes) -> str:
    """The path in pack's record meta (`<key>.pack.json`); a member that does not hold one is a reject."""
    try:
        path = json.loads(content.decode("utf-8")).get("path")
    except (ValueError, AttributeError):
        path = None
    if not isinstance(path, str) or not path:
        raise RejectedFile(f"{name}: not pack's record meta (no path in it)")
    return path


def parse_label(name: str, content: bytes) -> int:
    text = content.decode("utf-8", "replace").strip()
    try:
        label = int(text)
    except ValueError:
        raise RejectedFile(f"{name}: label {text[:40]!r} is not an integer") from None
    if label < 0:
        raise RejectedFile(f"{name}: label {label} is negative")
    return label


def open_reader(plan: ShardPlan) -> TarReader:
    return TarReader(plan)
