"""The folder walk: SRC's image files, sorted, labelled by their top-level folder.

ImageFolder layout: each top-level directory is a class (sorted names, the same indexes as
torchvision's ImageFolder) and everything beneath it belongs to that class. A folder with no
subdirectories is a flat, unlabelled set (label -1). Hidden entries and non-image files are
skipped and counted. The listing keeps no Python object per file (a PathList and integer arrays),
and a large SRC's class folders are walked by one process per CPU.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import stat
import time
from array import array
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from readers.cpus import available_cpus

from .listing import IGNORED_NAMES_KEPT, IMAGE_EXTENSIONS, UNLABELLED, Listing, ScanError, extended, is_image_name

log = logging.getLogger(__name__)

PARALLEL_ABOVE_SECONDS = 2.0
"""The walk hands the remaining class folders to a pool of processes when walking them here looks
like taking longer than this (starting the pool takes a fraction of a second)."""


def walk(src: str | os.PathLike[str], *, folders_are_classes: bool = True,
         companions: frozenset[str] = frozenset(), times: bool = False) -> Listing:
    """List the images under `src`, sorted by relative path, labelled by top-level folder.

    Without `folders_are_classes` (labels come from elsewhere, or there are none) every image at
    any depth is listed, unlabelled, with no classes. Files whose extension is in `companions`
    (sidecars: ".txt", ...) are not counted as ignored. With `times`, the listing keeps each file's
    modification time (`Listing.mtimes`: a rerun's check; a plan does without those 8 bytes a file).
    """
    root = Path(src)
    if not root.exists():
        raise ScanError(f"{root}: does not exist")
    if not root.is_dir():
        raise ScanError(f"{root}: is not a directory")
    folders = class_folders(root)  # also proves SRC can be listed
    class_dirs = folders if folders_are_classes else []
    listing = walk_listing(os.fspath(root), [e.name for e in class_dirs], times)
    if class_dirs:
        # In path order, which puts "a/..." after "a-b/..." ("/" sorts after "-"), unlike the class order.
        order = sorted(enumerate(class_dirs), key=lambda item: item[1].name + "/")
        class_ids: ClassIds = {}
        for entry in class_dirs:
            class_ids.setdefault(_dir_id(entry.path), entry.name)
        _walk_classes([(entry.path, entry.name, label) for label, entry in order], listing, {_dir_id(root)},
                      class_ids, companions)
        top = sorted(os.scandir(root), key=lambda entry: entry.name)
        beside = [e.name for e in top if not e.name.startswith(".") and not _is_dir(e)]
        listing.leave_out_unclassed(name for name in beside if is_image_name(name))
        listing.ignore((name for name in beside if not is_image_name(name)), hidden=False)
        listing.ignore((e.name for e in top if e.name.startswith(".")), hidden=True)
    else:  # a flat folder, or folders that are not classes
        _walk(os.fspath(root), "", UNLABELLED, listing, set(), {}, companions)
    log.info(
        "scanned %s: %d images in %d classes, %d hidden and %d other entries ignored",
        root, len(listing), len(listing.classes), listing.ignored_hidden, listing.ignored_other,
    )
    return listing


def walk_listing(root: str, classes: list[str], times: bool) -> Listing:
    """An empty listing for the walk to fill: labels and sizes start as bytes and widen as values
    need (`extended`), so ten million class indexes and image sizes take 2 + 4 bytes each, not 16."""
    return Listing(root=root, classes=classes, labels=array("b"), sizes=array("b"), mtimes=array("q") if times else None)


ClassTask = tuple[str, str, int]  # a class folder's path, its name, its label
ClassIds = dict[tuple[int, int], str]  # each class folder's (device, inode): its name


def _walk_classes(classes: list[ClassTask], listing: Listing, seen_dirs: set[tuple[int, int]],
                  class_ids: ClassIds, companions: frozenset[str]) -> None:
    """Walk the class folders in order: here, and once the rest look like taking more than
    PARALLEL_ABOVE_SECONDS (a large SRC), those in one process per CPU, since stat costs a system
    call per file.

    A process's class is walked as it would be here, unless it reached a directory that another
    class also reached (an alias): from that class on, the walk continues here, where the first
    visit wins as it always does.
    """
    started = time.monotonic()
    position = 0
    parallel = available_cpus() > 1
    while position < len(classes):
        elapsed = time.monotonic() - started
        if parallel and position and len(classes) - position > 1 and \
                elapsed / position * (len(classes) - position) > PARALLEL_ABOVE_SECONDS:
            break
        _walk(*classes[position], listing, seen_dirs, class_ids, companions)
        position += 1
    if position == len(classes):
        return
    tasks = [(task, frozenset(seen_dirs), class_ids, companions) for task in classes[position:]]
    workers = min(available_cpus(), len(tasks))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for part, visited in pool.map(_walk_class, tasks):  # one class a task: a small reply each
            if visited & seen_dirs:
                pool.shutdown(wait=False, cancel_futures=True)
                break
            seen_dirs |= visited
            listing.paths.extend(part.paths)
            listing.labels = extended(listing.labels, part.labels)
            listing.sizes = extended(listing.sizes, part.sizes)
            if listing.mtimes is not None:
                listing.mtimes.extend(part.mtimes)  # type: ignore[arg-type]
            listing.newest_mtime = max(listing.newest_mtime, part.newest_mtime)
            listing.ignored_hidden += part.ignored_hidden
            listing.ignored_other += part.ignored_other
            listing.ignored_names += part.ignored_names[: max(0, IGNORED_NAMES_KEPT - len(listing.ignored_names))]
            listing.rejects += part.rejects
            listing.aliases += part.aliases
            position += 1
    for task in classes[position:]:
        _walk(*task, listing, seen_dirs, class_ids, companions)


def _walk_class(task: tuple[ClassTask, frozenset[tuple[int, int]], ClassIds, frozenset[str]]
                ) -> tuple[Listing, set[tuple[int, int]]]:
    """One class folder, walked in a pool process: its listing, and the directories it visited."""
    (path, name, label), seen, class_ids, companions = task
    part = walk_listing(path, [], True)
    seen_dirs = set(seen)
    _walk(path, name, label, part, seen_dirs, class_ids, companions)
    return part, seen_dirs - seen


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


Files = tuple[list[str], list[int], list[int]]  # a run of consecutive listed files: relative paths, sizes, mtimes
Directory = tuple[str, str]  # a directory still to list: its path, and relative to SRC


def _walk(path: str, rel: str, label: int, listing: Listing, seen_dirs: set[tuple[int, int]],
          class_ids: ClassIds, companions: frozenset[str]) -> None:
    """Depth first, each directory's entries sorted by name ("/" after a directory's), which lists
    the files already in the order of their relative paths: no global sort, and nothing held per
    file but the listing's compact arrays. A directory reached twice (symlink loop or alias) is
    visited once; one that is another class's folder (`class_ids`) only as that class, whichever
    comes first, so an alias never relabels a class."""
    stack: list[Files | Directory] = [(path, rel)]
    while stack:
        item = stack.pop()
        if isinstance(item[0], list):
            rels, sizes, mtimes = item
            listing.paths.extend(rels)
            listing.labels = extended(listing.labels, [label] * len(rels))
            listing.sizes = extended(listing.sizes, sizes)
            if listing.mtimes is not None:
                listing.mtimes.extend(mtimes)
            listing.newest_mtime = max(listing.newest_mtime, max(mtimes, default=0))
        else:
            stack += reversed(_list_dir(*item, listing, seen_dirs, class_ids, companions))  # type: ignore[misc]


def _list_dir(dir_path: str, dir_rel: str, listing: Listing, seen_dirs: set[tuple[int, int]],
              class_ids: ClassIds, companions: frozenset[str]) -> list[Files | Directory]:
    """One directory's entries in path order: runs of its files (stat'ed, relative to the
    directory's descriptor, in one pass) between its subdirectories; hidden and other files counted."""
    try:
        fd = os.open(dir_path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        listing.rejects.append((dir_rel, f"cannot list directory: {exc.strerror}"))
        return []
    try:
        info = os.fstat(fd)
        aliased = class_ids.get((info.st_dev, info.st_ino), dir_rel)
        if aliased != dir_rel:
            listing.note_alias(dir_rel, aliased)
            log.info("%s", listing.aliases[-1])
            return []
        if (info.st_dev, info.st_ino) in seen_dirs:
            log.warning("%s: directory already visited (symlink loop or alias), skipped", dir_path)
            return []
        seen_dirs.add((info.st_dev, info.st_ino))
        try:
            with os.scandir(fd) as entries:
                children = [entry for entry in entries]
        except OSError as exc:
            listing.rejects.append((dir_rel, f"cannot list directory: {exc.strerror}"))
            return []
        visible = [entry for entry in children if not entry.name.startswith(".")]
        prefix = f"{dir_rel}/" if dir_rel else ""
        listing.ignore(sorted(prefix + entry.name for entry in children if entry.name.startswith(".")), hidden=True)
        try:  # d_type: no system call, except for symlinks
            kinds = [entry.is_dir() for entry in visible]
        except OSError:
            kinds = [_is_dir(entry) for entry in visible]
        dirs = sorted(entry.name for entry, is_dir in zip(visible, kinds) if is_dir)
        others = sorted(entry.name for entry, is_dir in zip(visible, kinds) if not is_dir)
        names = [name for name in others if name[name.rfind("."):].lower() in IMAGE_EXTENSIONS]
        if len(names) < len(others):
            listing.ignore((prefix + name for name in others if name[name.rfind("."):].lower() not in IMAGE_EXTENSIONS
                            and os.path.splitext(name)[1] not in companions), hidden=False)
        files = _stat_files(fd, names, prefix, listing)
    finally:
        os.close(fd)
    if not dirs:
        return [files]
    # Merge the files and the subdirectories in path order: a directory's key is its name + "/".
    keyed = sorted([(name, position) for position, name in enumerate(files[0])] +
                   [(prefix + name + "/", -1 - number) for number, name in enumerate(dirs)])
    items: list[Files | Directory] = []
    for _, position in keyed:
        if position < 0:
            name = dirs[-1 - position]
            items.append((f"{dir_path}/{name}", prefix + name))
        elif items and isinstance(items[-1][0], list):
            for column, values in zip(items[-1], files):
                column.append(values[position])  # type: ignore[union-attr]
        else:
            items.append(([files[0][position]], [files[1][position]], [files[2][position]]))
    return items


def _stat_files(fd: int, names: list[str], prefix: str, listing: Listing) -> Files:
    """The regular files among `names` (in a directory open as `fd`), with their sizes and
    modification times; the rest are rejects. One stat each, relative to the descriptor: the kernel does not walk the path."""
    try:
        infos: list[os.stat_result | str] = [os.stat(name, dir_fd=fd) for name in names]
    except OSError:
        infos = [_stat_or_reason(name, fd) for name in names]
    if all(not isinstance(info, str) and stat.S_ISREG(info.st_mode) for info in infos):  # the usual case, in bulk
        return ([prefix + name for name in names], [info.st_size for info in infos],  # type: ignore[union-attr]
                [info.st_mtime_ns for info in infos])  # type: ignore[union-attr]
    rels, sizes, mtimes = [], [], []
    for name, info in zip(names, infos):
        if isinstance(info, str):
            listing.rejects.append((prefix + name, info))
        elif not stat.S_ISREG(info.st_mode):  # a named pipe called x.jpg would block its reader forever
            listing.rejects.append((prefix + name, "not a regular file"))
        else:
            rels.append(prefix + name)
            sizes.append(info.st_size)
            mtimes.append(info.st_mtime_ns)
    return rels, sizes, mtimes


def _stat_or_reason(name: str, fd: int) -> os.stat_result | str:
    try:
        return os.stat(name, dir_fd=fd)
    except OSError as exc:
        return f"cannot stat: {exc.strerror}"
