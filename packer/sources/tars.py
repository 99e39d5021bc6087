"""WebDataset tar shards as SRC (img2dataset output, `pack wds` output, any `tar` of samples).

WebDataset's rules: a sample's key is the member path up to the first "." of its file name, the
rest its (lower-cased) extension; only adjacent members group. The image is the first member
with an image extension; `cls`, `class` or `label` holds an integer label; every other member
whose extension is a valid field name is a field (`json`: JSON, others: UTF-8 text, as
`--sidecars`). Shards are read in name order, samples in tar order.

The scan reads only the tar headers (PAX headers included) and lists each sample as the byte
range from its first header to the end of its last member; the reader threads read that range
with one pread and take the members out of it, so nothing is extracted to disk.
"""

from __future__ import annotations

import io
import logging
import os
import posixpath
import tarfile
from array import array
from dataclasses import dataclass, field

from readers.fields import FieldSpec, check_field_name

from ..errors import RejectedFile
from ..plan import PackOptions, Plan
from .classes import read_classes
from .inputs import InputFiles, Record, Source
from .listing import IMAGE_EXTENSIONS, UNLABELLED, Listing, ScanError
from .sidecars import JSON_EXTENSION, checked_text

log = logging.getLogger(__name__)

LABEL_EXTENSIONS = ("cls", "class", "label")
BLOCK = tarfile.BLOCKSIZE


@dataclass
class Group:
    """Adjacent members sharing a key, as the scan sees them."""

    key: str
    start: int
    end: int = 0
    members: list[tuple[str, str, int]] = field(default_factory=list)  # (extension, name, size)


def split_name(name: str) -> tuple[str, str] | None:
    """`dir/x.seg.png` -> (`dir/x`, `seg.png`); None for a name without an extension."""
    folder, base = posixpath.split(name)
    dot = base.find(".")
    if dot <= 0:
        return None
    return posixpath.join(folder, base[:dot]), base[dot + 1:].lower()


def image_member(extensions: list[str]) -> int | None:
    """Position of the first member with an image extension."""
    return next((k for k, extension in enumerate(extensions) if "." + extension in IMAGE_EXTENSIONS), None)


def is_field(extension: str) -> bool:
    return extension not in LABEL_EXTENSIONS and "." + extension not in IMAGE_EXTENSIONS \
        and check_field_name(extension) is None


def scan(source: Source, options: PackOptions) -> Listing:
    """The samples of every tar in `source.inputs`, from their headers; bad ones are rejects."""
    listing = Listing(root=source.root, classes=read_classes(options.classes) if options.classes else [],
                      locations=array("q"))
    seen: dict[str, int] = {}  # field extension -> samples that have it
    for number, path in enumerate(source.inputs):
        name = os.path.relpath(path, source.root)
        for group in tar_groups(path, name, listing):
            add_sample(listing, number, name, group, seen)
    listing.fields = [FieldSpec(extension, "json" if extension == JSON_EXTENSION else "str",
                                optional=count < len(listing))
                      for extension, count in sorted(seen.items())]
    log.info("scanned %d tar files under %s: %d samples, %d rejected", len(source.inputs), source.root,
             len(listing), len(listing.rejects))
    return listing


def tar_groups(path: str, name: str, listing: Listing) -> list[Group]:
    """The tar's samples as groups of adjacent members; damage past some point is one reject."""
    groups: list[Group] = []
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            try:
                tar = tarfile.open(fileobj=handle, mode="r:")
            except tarfile.TarError as exc:
                listing.rejects.append((name, f"not a readable tar file ({exc})"))
                return groups
            last = ""
            try:
                for member in tar:
                    last = member.name
                    add_member(groups, member, listing)
                damaged = tar.offset < size and handle.seek(tar.offset) >= 0 and bool(handle.read(2 * BLOCK).strip(b"\0"))
            except tarfile.TarError:  # the data of the last member read runs past the end of the file
                damaged = not groups or groups[-1].end <= size
            if damaged:  # a header the tar module could not read: the rest of the file is lost
                listing.rejects.append((name, f"truncated or damaged at byte {tar.offset} (after member "
                                              f"{last or 'none'}): the rest of the file cannot be read"))
    except OSError as exc:
        raise ScanError(f"{path}: cannot read ({exc.strerror or exc})") from None
    for group in groups:
        if group.end > size:
            listing.rejects.append((f"{name}/{group.key}", f"member {group.members[-1][1]} is truncated "
                                                           f"(the tar ends at byte {size})"))
    return [group for group in groups if group.end <= size]


def add_member(groups: list[Group], member: tarfile.TarInfo, listing: Listing) -> None:
    """Group the member with the previous one when they share a key (only adjacent members group)."""
    if not member.isfile():
        return
    parts = split_name(member.name)
    if parts is None:
        listing.ignored_other += 1
        return
    key, extension = parts
    if not groups or groups[-1].key != key:
        groups.append(Group(key=key, start=member.offset))
    groups[-1].members.append((extension, member.name, member.size))
    groups[-1].end = member.offset_data + -(-member.size // BLOCK) * BLOCK  # with its padding


def add_sample(listing: Listing, number: int, name: str, group: Group, seen: dict[str, int]) -> None:
    path = f"{name}/{group.key}"
    extensions = [extension for extension, _, _ in group.members]
    twice = next((extension for k, extension in enumerate(extensions) if extension in extensions[:k]), None)
    if twice is not None:
        listing.rejects.append((path, f"two members {group.key}.{twice} in one sample"))
        return
    image = image_member(extensions)
    if image is None:
        listing.rejects.append((path, "no image member (members: "
                                      + ", ".join(member for _, member, _ in group.members) + ")"))
        return
    assert listing.locations is not None
    listing.paths.append(path)
    listing.labels.append(UNLABELLED)  # read with the sample
    listing.sizes.append(group.members[image][2])
    listing.locations.extend((number, group.start, group.end - group.start))
    for extension in extensions:
        if is_field(extension):
            seen[extension] = seen.get(extension, 0) + 1
    listing.ignored_other += sum(1 for k, extension in enumerate(extensions)
                                 if k != image and extension not in LABEL_EXTENSIONS and not is_field(extension))


class TarReader:
    """Reads one sample's byte range and takes its image, label and fields out of the members."""

    def __init__(self, plan: Plan) -> None:
        self.files = InputFiles(plan.inputs)
        self.fields = {spec.name for spec in plan.fields}

    def __call__(self, input: int, offset: int, length: int) -> Record:
        data = self.files.read(input, offset, length)
        if len(data) < length:
            raise RejectedFile(f"{self.files.inputs[input]}: shorter than when it was scanned")
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
                members = [(member, tar.extractfile(member)) for member in tar if member.isfile()]
                contents = [(member.name, extracted.read() if extracted else b"") for member, extracted in members]
        except tarfile.TarError as exc:
            raise RejectedFile(f"{self.files.inputs[input]} at byte {offset}: unreadable tar header ({exc})") from None
        image: tuple[str, bytes] | None = None
        label = UNLABELLED
        fields: dict[str, bytes] = {}
        for name, content in contents:
            parts = split_name(name)
            if parts is None:
                continue
            extension = parts[1]
            if image is None and "." + extension in IMAGE_EXTENSIONS:
                image = (name, content)
            elif extension in LABEL_EXTENSIONS and label == UNLABELLED:
                label = parse_label(name, content)
            elif extension in self.fields:
                fields[extension] = checked_text(name, extension, content)
        if image is None:
            raise RejectedFile(f"{self.files.inputs[input]} at byte {offset}: no image member (changed since the scan?)")
        return Record(image=image[1], label=label, fields=fields, image_name=image[0])

    def close(self) -> None:
        self.files.close()


def parse_label(name: str, content: bytes) -> int:
    text = content.decode("utf-8", "replace").strip()
    try:
        label = int(text)
    except ValueError:
        raise RejectedFile(f"{name}: label {text[:40]!r} is not an integer") from None
    if label < 0:
        raise RejectedFile(f"{name}: label {label} is negative")
    return label


def open_reader(plan: Plan) -> TarReader:
    return TarReader(plan)
