"""A file list instead of a walk (`--files-from FILE|-`): on cluster filesystems the list usually
exists already, and walking ten million files takes an hour.

Paths are relative to SRC, one per line (or NUL-separated with `null`, as `find -print0`, tar and
rsync write them), a leading `./` allowed. The same rules as the walk apply (image extensions,
hidden entries skipped, top-level folders as classes), and the listing is sorted the same way,
so a list of the files a walk would find packs byte-identical shards. Each file is still stat'ed
(sizes shape the shards), relative to a descriptor of SRC. A path that leaves SRC, or a file that
is missing or not a regular file, is a reject naming the list and line.
"""

from __future__ import annotations

import bisect
import logging
import os
import stat
import sys
from array import array
from pathlib import Path

from .listing import IMAGE_EXTENSIONS, UNLABELLED, Listing, ScanError
from .walk import class_folders

log = logging.getLogger(__name__)


def read_list(list_path: str, null: bool) -> list[str]:
    """The list's entries in `os.fsdecode` form (file names need not be UTF-8), from a file or `-`."""
    try:
        if list_path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(list_path, "rb") as handle:
                data = handle.read()
    except OSError as exc:
        raise ScanError(f"{list_path}: cannot read the file list ({exc.strerror or exc})") from None
    text = os.fsdecode(data)  # one call for the whole list: the same as decoding each name
    if null:
        return text.split("\0")
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")] if "\r" in text \
        else text.split("\n")


def list_files(src: str | os.PathLike[str], list_path: str, *, null: bool = False, folders_are_classes: bool = True,
               companions: frozenset[str] = frozenset()) -> Listing:
    """The images a list names under `src`, sorted and labelled as `walk.walk` would list them.

    Written as whole-list passes (comprehensions, one sort, one stat each) rather than one loop
    doing everything per line: a million names take about a second, most of it in stat.
    """
    root = Path(src)
    if not root.is_dir():
        raise ScanError(f"{root}: {'does not exist' if not root.exists() else 'is not a directory'}")
    class_dirs = [entry.name for entry in class_folders(root)] if folders_are_classes else []
    listing = Listing(root=os.fspath(root), classes=class_dirs)
    where = "stdin" if list_path == "-" else list_path
    lines = [line[2:] if line[:2] == "./" else line for line in read_list(list_path, null)]
    for number in [k for k, path in enumerate(lines)
                   if "/." in path or "//" in path or path[:1] in "./" or path[-1:] == "/"]:  # "" too
        lines[number] = unusual_path(lines[number], number + 1, where, listing)
    names = [path for path in lines if path is not None]
    images = [path for path in names if path[path.rfind("."):].lower() in IMAGE_EXTENSIONS and
              "/" not in path[path.rfind("."):]]
    chosen = set(images)
    listing.ignore((path for path in names if path not in chosen and path[path.rfind("."):] not in companions),
                   hidden=False)
    if class_dirs:  # as in the walk: files beside the class folders are not samples
        listing.leave_out_unclassed(sorted({path for path in images if "/" not in path}))
        images = [path for path in images if "/" in path]
    unique = sorted(set(images))
    if len(unique) < len(images):
        log.warning("%s: %d paths listed more than once, packed once", where, len(images) - len(unique))
    if class_dirs:
        unique = leave_out_aliases(root, unique, class_dirs, listing)
    sizes = stat_sizes(root, unique, where, lines, listing)
    listing.paths = [path for path, size in zip(unique, sizes) if size >= 0]
    listing.sizes = array("q", (size for size in sizes if size >= 0))
    listing.labels = folder_labels(listing.paths, class_dirs)
    log.info("listed %s from %s: %d images, %d hidden and %d other entries ignored, %d rejected", root, where,
             len(listing), listing.ignored_hidden, listing.ignored_other, len(listing.rejects))
    return listing


def leave_out_aliases(root: Path, paths: list[str], class_dirs: list[str], listing: Listing) -> list[str]:
    """`paths` less those through a folder inside a class that is a class folder (a symlink, which
    `find -L` lists through): as in the walk, those images are packed once, under their own class.
    One stat per folder, not per file."""
    folders: set[str] = set()
    for parent in {path.rpartition("/")[0] for path in paths}:
        parts = parent.split("/")
        folders.update("/".join(parts[:depth]) for depth in range(2, len(parts) + 1))
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        class_ids: dict[tuple[int, int], str] = {}
        for name in class_dirs:
            info = os.stat(name, dir_fd=fd)
            class_ids.setdefault((info.st_dev, info.st_ino), name)
        aliases: list[str] = []
        for folder in sorted(folders):  # a folder before the folders inside it
            try:
                info = os.stat(folder, dir_fd=fd)
            except OSError:  # its files are rejects naming the problem
                continue
            owner = class_ids.get((info.st_dev, info.st_ino))
            if owner is not None and not any(folder.startswith(alias + "/") for alias in aliases):
                aliases.append(folder)
                listing.note_alias(folder, owner)
                log.info("%s", listing.aliases[-1])
    finally:
        os.close(fd)
    if not aliases:
        return paths
    inside = tuple(alias + "/" for alias in aliases)
    return [path for path in paths if not path.startswith(inside)]


def unusual_path(path: str, number: int, where: str, listing: Listing) -> str | None:
    """A line that is empty, leaves SRC, names a hidden entry or has redundant slashes: the path to
    pack, or None once it is counted as ignored or rejected."""
    if not path:
        return None
    if path.startswith("/") or ".." in path.split("/"):
        listing.rejects.append((path, f"{where} line {number}: leaves SRC (paths are relative to SRC)"))
        return None
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if any(part.startswith(".") for part in parts):
        listing.ignore([path], hidden=True)
        return None
    return "/".join(parts) or None


def stat_sizes(root: Path, paths: list[str], where: str, lines: list[str | None], listing: Listing) -> list[int]:
    """Each file's size, -1 for one that is rejected (missing, unreadable, not a regular file)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:  # relative to SRC's descriptor: the kernel does not resolve SRC's path a million times
            infos = [os.stat(path, dir_fd=fd) for path in paths]
        except OSError:
            infos = [stat_or_reason(path, fd) for path in paths]
    finally:
        os.close(fd)
    if all(isinstance(info, os.stat_result) and stat.S_ISREG(info.st_mode) for info in infos):
        return [info.st_size for info in infos if isinstance(info, os.stat_result)]
    line_of = {path: number for number, path in enumerate(lines, 1) if path is not None}
    sizes = []
    for path, info in zip(paths, infos):
        if isinstance(info, os.stat_result) and stat.S_ISREG(info.st_mode):
            sizes.append(info.st_size)
            continue
        reason = info if isinstance(info, str) else "not a regular file"
        listing.rejects.append((path, f"{reason} (listed in {where} line {line_of[path]})"))
        sizes.append(-1)
    return sizes


def stat_or_reason(path: str, fd: int) -> os.stat_result | str:
    try:
        return os.stat(path, dir_fd=fd)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"cannot stat: {exc.strerror}"


def folder_labels(paths: list[str], class_dirs: list[str]) -> array:
    """Each sorted path's class: the index of its top-level folder. The paths of one class are
    consecutive, so each class's range is found by bisection rather than per path, the classes
    taken in path order ("sea lion/..." sorts before "sea/...", unlike the class names)."""
    if not class_dirs:
        return array("q", [UNLABELLED]) * len(paths)
    labels = array("q")
    for label, name in sorted(enumerate(class_dirs), key=lambda item: item[1] + "/"):
        first = bisect.bisect_left(paths, name + "/")
        end = bisect.bisect_left(paths, name + "0")  # "0" is the character after "/"
        labels += array("q", [UNLABELLED]) * (first - len(labels)) + array("q", [label]) * (end - first)
    return labels + array("q", [UNLABELLED]) * (len(paths) - len(labels))
