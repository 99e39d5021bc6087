"""Walk SRC into a deterministic, sorted listing of image files with their class labels.

ImageFolder layout: each top-level directory is a class (sorted names, the same indexes as
torchvision's ImageFolder) and everything beneath it belongs to that class. A folder with no
subdirectories is a flat, unlabelled set (label -1). Hidden entries and non-image files are
skipped and counted. The listing keeps only strings and compact integer arrays per file.
"""

from __future__ import annotations

import logging
import os
import stat
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from readers.fields import FieldSpec

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".jpe", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".ppm", ".pgm"}
)
UNLABELLED = -1


class ScanError(Exception):
    """SRC cannot be used as an image folder; the message names it."""


@dataclass
class Listing:
    """Files to pack, in packing order. `paths` are relative POSIX paths in os.fsdecode form."""

    root: str
    classes: list[str]
    paths: list[str] = field(default_factory=list)
    labels: array = field(default_factory=lambda: array("q"))
    sizes: array = field(default_factory=lambda: array("q"))
    ignored_hidden: int = 0
    ignored_other: int = 0
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    fields: list[FieldSpec] = field(default_factory=list)
    # Per file, the values of the fields that come with the listing (None: no such fields).
    values: list[dict[str, Any]] | None = None

    def __len__(self) -> int:
        return len(self.paths)


def is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def scan(src: str | os.PathLike[str]) -> Listing:
    """List the images under `src`, sorted by relative path."""
    root = Path(src)
    if not root.exists():
        raise ScanError(f"{root}: does not exist")
    if not root.is_dir():
        raise ScanError(f"{root}: is not a directory")
    try:
        top = sorted(os.scandir(root), key=lambda entry: entry.name)
    except OSError as exc:
        raise ScanError(f"{root}: cannot list ({exc.strerror})") from None

    class_dirs = [e for e in top if not e.name.startswith(".") and _is_dir(e)]
    listing = Listing(root=os.fspath(root), classes=[e.name for e in class_dirs])
    entries: list[tuple[str, int, int]] = []
    seen_dirs = {_dir_id(root)}
    if class_dirs:
        for label, entry in enumerate(class_dirs):
            _walk(entry.path, entry.name, label, entries, listing, seen_dirs)
        listing.ignored_other += sum(
            1 for e in top if not e.name.startswith(".") and not _is_dir(e)
        )
        listing.ignored_hidden += sum(1 for e in top if e.name.startswith("."))
    else:
        for entry in top:
            if entry.name.startswith("."):
                listing.ignored_hidden += 1
            else:
                _add_file(entry, entry.name, UNLABELLED, entries, listing)

    entries.sort(key=lambda item: item[0])
    for path, label, size in entries:
        listing.paths.append(path)
        listing.labels.append(label)
        listing.sizes.append(size)
    log.info(
        "scanned %s: %d images in %d classes, %d hidden and %d other entries ignored",
        root, len(listing), len(listing.classes), listing.ignored_hidden, listing.ignored_other,
    )
    return listing


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=True)
    except OSError:
        return False


def _dir_id(path: str | os.PathLike[str]) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_dev, info.st_ino


def _walk(
    path: str,
    rel: str,
    label: int,
    entries: list[tuple[str, int, int]],
    listing: Listing,
    seen_dirs: set[tuple[int, int]],
) -> None:
    """Iterative walk; a directory reached twice (symlink loop or alias) is visited once."""
    stack = [(path, rel)]
    while stack:
        dir_path, dir_rel = stack.pop()
        try:
            dir_id = _dir_id(dir_path)
            if dir_id in seen_dirs:
                log.warning("%s: directory already visited (symlink loop or alias), skipped", dir_path)
                continue
            seen_dirs.add(dir_id)
            children = list(os.scandir(dir_path))
        except OSError as exc:
            listing.unreadable.append((dir_rel, f"cannot list directory: {exc.strerror}"))
            continue
        for entry in children:
            if entry.name.startswith("."):
                listing.ignored_hidden += 1
            elif _is_dir(entry):
                stack.append((entry.path, dir_rel + "/" + entry.name))
            else:
                _add_file(entry, dir_rel + "/" + entry.name, label, entries, listing)


def _add_file(
    entry: os.DirEntry[str],
    rel: str,
    label: int,
    entries: list[tuple[str, int, int]],
    listing: Listing,
) -> None:
    if not is_image_name(entry.name):
        listing.ignored_other += 1
        return
    try:
        info = entry.stat(follow_symlinks=True)
    except OSError as exc:
        listing.unreadable.append((rel, f"cannot stat: {exc.strerror}"))
        return
    if not stat.S_ISREG(info.st_mode):  # a named pipe called x.jpg would block its reader forever
        listing.unreadable.append((rel, "not a regular file"))
        return
    entries.append((rel, label, info.st_size))
