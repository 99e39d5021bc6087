"""The folder walk: SRC's image files, sorted, labelled by their top-level folder.

ImageFolder layout: each top-level directory is a class (sorted names, the same indexes as
torchvision's ImageFolder) and everything beneath it belongs to that class. A folder with no
subdirectories is a flat, unlabelled set (label -1). Hidden entries and non-image files are
skipped and counted. The listing keeps only strings and compact integer arrays per file.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from .listing import UNLABELLED, Listing, ScanError, is_image_name

log = logging.getLogger(__name__)


def walk(src: str | os.PathLike[str], *, folders_are_classes: bool = True,
         companions: frozenset[str] = frozenset()) -> Listing:
    """List the images under `src`, sorted by relative path, labelled by top-level folder.

    Without `folders_are_classes` (labels come from elsewhere, or there are none) every image at
    any depth is listed, unlabelled, with no classes. Files whose extension is in `companions`
    (sidecars: ".txt", ...) are not counted as ignored.
    """
    root = Path(src)
    if not root.exists():
        raise ScanError(f"{root}: does not exist")
    if not root.is_dir():
        raise ScanError(f"{root}: is not a directory")
    folders = class_folders(root)  # also proves SRC can be listed
    class_dirs = folders if folders_are_classes else []
    listing = Listing(root=os.fspath(root), classes=[e.name for e in class_dirs])
    entries: list[tuple[str, int, int]] = []
    if class_dirs:
        seen_dirs = {_dir_id(root)}
        for label, entry in enumerate(class_dirs):
            _walk(entry.path, entry.name, label, entries, listing, seen_dirs, companions)
        top = list(os.scandir(root))
        listing.ignored_other += sum(1 for e in top if not e.name.startswith(".") and not _is_dir(e))
        listing.ignored_hidden += sum(1 for e in top if e.name.startswith("."))
    else:  # a flat folder, or folders that are not classes
        _walk(os.fspath(root), "", UNLABELLED, entries, listing, set(), companions)

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


def class_folders(root: Path) -> list[os.DirEntry[str]]:
    """SRC's top-level folders, the classes of an ImageFolder, sorted by name (hidden ones skipped)."""
    try:
        top = sorted(os.scandir(root), key=lambda entry: entry.name)
    except OSError as exc:
        raise ScanError(f"{root}: cannot list ({exc.strerror})") from None
    return [e for e in top if not e.name.startswith(".") and _is_dir(e)]


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
    companions: frozenset[str],
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
            listing.rejects.append((dir_rel, f"cannot list directory: {exc.strerror}"))
            continue
        for entry in children:
            if entry.name.startswith("."):
                listing.ignored_hidden += 1
            elif _is_dir(entry):
                stack.append((entry.path, f"{dir_rel}/{entry.name}" if dir_rel else entry.name))
            else:
                _add_file(entry, f"{dir_rel}/{entry.name}" if dir_rel else entry.name, label, entries, listing,
                          companions)


def _add_file(
    entry: os.DirEntry[str],
    rel: str,
    label: int,
    entries: list[tuple[str, int, int]],
    listing: Listing,
    companions: frozenset[str],
) -> None:
    if not is_image_name(entry.name):
        if os.path.splitext(entry.name)[1] not in companions:
            listing.ignored_other += 1
        return
    try:
        info = entry.stat(follow_symlinks=True)
    except OSError as exc:
        listing.rejects.append((rel, f"cannot stat: {exc.strerror}"))
        return
    if not stat.S_ISREG(info.st_mode):  # a named pipe called x.jpg would block its reader forever
        listing.rejects.append((rel, "not a regular file"))
        return
    entries.append((rel, label, info.st_size))
