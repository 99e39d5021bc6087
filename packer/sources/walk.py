"""The folder walk: SRC's image files, sorted, labelled by their top-level folder.

ImageFolder layout: each top-level directory is a class (sorted names, the same indexes as
torchvision's ImageFolder) and everything beneath it belongs to that class. A folder with no
subdirectories is a flat, unlabelled set (label -1). Hidden entries and non-image files are
skipped and counted. The listing keeps no Python object per file (a PathList and integer arrays),
and a large SRC's class folders are walked by one process per CPU. On a network mount, where each
stat is a round trip, the calls are measured to wait (`inflight`) and the directories ahead of the
walk are read, and their files stat'ed, dozens at a time on threads; the walk takes them in order.
"""

from __future__ import annotations

import functools
import itertools
import logging
import multiprocessing
import os
import stat
import time
from array import array
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from readers.cpus import available_cpus
from readers.mounts import is_networked

from .inflight import InFlight
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
    known_ids: ClassIds | None = None
    with InFlight(what=f"stats under {root}") as calls:
        while True:
            listing = walk_listing(os.fspath(root), [e.name for e in class_dirs], times)
            reader = _Reader(calls)
            try:
                _walk_src(root, class_dirs, listing, companions, reader, known_ids)
                break
            except _MissedAlias as missed:  # rare: an alias met before its class folder's stat came back
                known_ids = missed.class_ids
            finally:
                reader.close()
    networked, filesystem = is_networked(root)
    if calls.concurrent or networked:
        how = f"up to {calls.threads} stats in flight" if calls.concurrent else "one stat at a time (they answered fast)"
        log.info("listed %s (%s) with %s", root, filesystem, how)
    log.info(
        "scanned %s: %d images in %d classes, %d hidden and %d other entries ignored",
        root, len(listing), len(listing.classes), listing.ignored_hidden, listing.ignored_other,
    )
    return listing


def walk_listing(root: str, classes: list[str], times: bool) -> Listing:
    """An empty listing for the walk to fill: labels and sizes start as bytes and widen as values
    need (`extended`), so ten million class indexes and image sizes take 2 + 4 bytes each, not 16."""
    return Listing(root=root, classes=classes, labels=array("b"), sizes=array("b"), mtimes=array("q") if times else None)


def _walk_src(root: Path, class_dirs: list[os.DirEntry[str]], listing: Listing, companions: frozenset[str],
              reader: _Reader, known_ids: ClassIds | None) -> None:
    """Fill `listing` from SRC's class folders, or from SRC as one unlabelled tree; `known_ids`:
    the class folders' ids, when a first walk has stat'ed them."""
    if class_dirs:
        # In path order, which puts "a/..." after "a-b/..." ("/" sorts after "-"), unlike the class order.
        order = sorted(enumerate(class_dirs), key=lambda item: item[1].name + "/")
        class_ids = _ClassIds(known_ids if known_ids is not None else
                              _class_ids(class_dirs, [entry for _, entry in order], reader.calls))
        _walk_classes([(entry.path, entry.name, label) for label, entry in order], listing, {_dir_id(root)},
                      class_ids, companions, reader)
        class_ids.settle()
        top = sorted(os.scandir(root), key=lambda entry: entry.name)
        beside = [e.name for e in top if not e.name.startswith(".") and not _is_dir(e)]
        listing.leave_out_unclassed(name for name in beside if is_image_name(name))
        listing.ignore((name for name in beside if not is_image_name(name)), hidden=False)
        listing.ignore((e.name for e in top if e.name.startswith(".")), hidden=True)
    else:  # a flat folder, or folders that are not classes
        _walk([(os.fspath(root), "", UNLABELLED)], listing, set(), _ClassIds({}), companions, reader)


ClassTask = tuple[str, str, int]  # a class folder's path, its name, its label
ClassIds = dict[tuple[int, int], str]  # each class folder's (device, inode): its name


def _class_ids(class_dirs: list[os.DirEntry[str]], in_path_order: list[os.DirEntry[str]], calls: InFlight
               ) -> ClassIds | Future[ClassIds]:
    """Each class folder's (device, inode): its name, the first in class order. Here (their stats
    measure the calls), or, once calls wait on storage, on one thread in path order while the walk
    goes on (`_ClassIds`): FUSE answers one lookup at a time in a directory, so 1,000 class folders
    at 1 ms take over a second whatever the threads."""
    paths = [entry.path for entry in class_dirs]
    probed = dict(zip(paths, calls.probe(_dir_id, paths)))
    if calls.concurrent and len(probed) < len(class_dirs):
        return calls.submit(_named_ids, class_dirs, in_path_order, probed)
    return _named_ids(class_dirs, in_path_order, probed)


def _named_ids(class_dirs: list[os.DirEntry[str]], in_path_order: list[os.DirEntry[str]],
               known: dict[str, tuple[int, int]]) -> ClassIds:
    """`_class_ids`, the folders not in `known` stat'ed in path order, one after another."""
    ids = dict(known)
    for entry in in_path_order:
        if entry.path not in ids:
            ids[entry.path] = _dir_id(entry.path)
    class_ids: ClassIds = {}
    for entry in class_dirs:
        class_ids.setdefault(ids[entry.path], entry.name)
    return class_ids


def _walk_classes(classes: list[ClassTask], listing: Listing, seen_dirs: set[tuple[int, int]],
                  class_ids: _ClassIds, companions: frozenset[str], reader: _Reader) -> None:
    """Walk the class folders in order: here, and once the rest look like taking more than
    PARALLEL_ABOVE_SECONDS (a large SRC), those in one process per CPU, since stat costs a system
    call per file. Once the calls wait on storage (a network mount: `reader.calls`), the rest are
    walked here, the directories ahead of the walk read on threads (the next classes' too), which
    keeps dozens of calls in flight.

    A process's class is walked as it would be here, unless it reached a directory that another
    class also reached (an alias): from that class on, the walk continues here, where the first
    visit wins as it always does.
    """
    started = time.monotonic()
    position = 0
    parallel = available_cpus() > 1
    while position < len(classes):
        if reader.calls.concurrent:
            reader.upcoming = []
            _walk(classes[position:], listing, seen_dirs, class_ids, companions, reader)
            return
        elapsed = time.monotonic() - started
        if parallel and position and len(classes) - position > 1 and \
                elapsed / position * (len(classes) - position) > PARALLEL_ABOVE_SECONDS:
            reader.calls.decide()  # the processes would each measure alone: a slow mount is walked here
            if not reader.calls.concurrent:
                break
            continue
        reader.upcoming = [path for path, _, _ in classes[position + 1:position + 1 + DIRS_AHEAD]]
        _walk(classes[position:position + 1], listing, seen_dirs, class_ids, companions, reader)
        position += 1
    if position == len(classes):
        return
    reader.upcoming = []  # walked by the pool
    tasks = [(task, frozenset(seen_dirs), class_ids.settle(), companions) for task in classes[position:]]
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
    _walk(classes[position:], listing, seen_dirs, class_ids, companions, reader)


def _walk_class(task: tuple[ClassTask, frozenset[tuple[int, int]], ClassIds, frozenset[str]]
                ) -> tuple[Listing, set[tuple[int, int]]]:
    """One class folder, walked in a pool process: its listing, and the directories it visited."""
    (path, name, label), seen, class_ids, companions = task
    part = walk_listing(path, [], True)
    seen_dirs = set(seen)
    with InFlight() as calls:
        reader = _Reader(calls)
        try:
            _walk([(path, name, label)], part, seen_dirs, _ClassIds(class_ids), companions, reader)
        finally:
            reader.close()
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
Directory = tuple[str, str, int]  # a directory still to list: its path, relative to SRC, and its label
Item = Directory | tuple[int, Files]  # what the walk's stack holds: directories, and labelled runs of files
StatOrReason = os.stat_result | str  # a file's stat, or why it has none
DIRS_AHEAD = 64
"""Directories read ahead of the walk (open, list, stat their files) once calls wait on storage:
each holds a descriptor and its names until the walk reaches it."""


def _walk(roots: list[ClassTask], listing: Listing, seen_dirs: set[tuple[int, int]], class_ids: _ClassIds,
          companions: frozenset[str], reader: _Reader) -> None:
    """Depth first from each root in turn, each directory's entries sorted by name ("/" after a
    directory's), which lists the files already in the order of their relative paths: no global
    sort, and nothing held per file but the listing's compact arrays. A directory reached twice
    (symlink loop or alias) is visited once; one that is another class's folder (`class_ids`)
    only as that class, whichever comes first, so an alias never relabels a class.

    Once calls wait on storage, `reader` reads the next directories on the stack ahead on its
    threads; the walk still takes each one's entries, errors and aliases in this order."""
    stack: list[Item] = [(path, rel, label) for path, rel, label in reversed(roots)]
    while stack:
        reader.read_ahead(stack)
        item = stack.pop()
        if isinstance(item[0], str):
            path, rel, label = item  # type: ignore[misc]
            read = reader.read(path, stack)
            reader.read_ahead(stack)  # the read may have found that calls wait on storage
            try:
                entries = _apply_dir(read, path, rel, listing, seen_dirs, class_ids, companions)
            finally:
                read.close()
            stack += ((label, entry) if isinstance(entry[0], list) else (*entry, label)  # type: ignore[misc]
                      for entry in reversed(entries))
        else:
            label, (rels, sizes, mtimes) = item  # type: ignore[misc]
            listing.paths.extend(rels)
            listing.labels = extended(listing.labels, [label] * len(rels))
            listing.sizes = extended(listing.sizes, sizes)
            if listing.mtimes is not None:
                listing.mtimes.extend(mtimes)
            listing.newest_mtime = max(listing.newest_mtime, max(mtimes, default=0))


@dataclass
class DirRead:
    """One directory as storage answered (opened, listed, its image files stat'ed), before the
    walk takes it in order: what is skipped, ignored or rejected is decided there."""

    fd: int = -1
    open_error: str = ""
    info: os.stat_result | None = None
    list_error: str = ""
    hidden: list[str] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)
    others: list[str] = field(default_factory=list)  # visible entries that are not directories, sorted
    names: list[str] = field(default_factory=list)  # the image files among them
    stats: list[StatOrReason] | list[Future[list[StatOrReason]]] = field(default_factory=list)

    def results(self) -> list[StatOrReason]:
        """The stats of `names`, in order, once every one has answered."""
        if self.stats and isinstance(self.stats[0], Future):
            self.stats = [info for chunk in self.stats for info in chunk.result()]  # type: ignore[union-attr]
        return self.stats  # type: ignore[return-value]

    def close(self) -> None:
        """Close the directory once no stat relative to it is running."""
        if self.fd >= 0:
            for chunk in self.stats:
                if isinstance(chunk, Future):
                    chunk.exception()  # waits; a stat never raises (its reason is its result)
            os.close(self.fd)
            self.fd = -1


def _read_dir(dir_path: str, calls: InFlight, parts: int | None = None) -> DirRead:
    """Open, list and stat one directory: every call to storage the walk needs from it (the stats
    in up to `parts` tasks, when on `calls`' threads)."""
    try:
        fd = os.open(dir_path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        return DirRead(open_error=exc.strerror or str(exc))
    read = DirRead(fd=fd)
    try:
        read.info = os.fstat(fd)
        try:
            with os.scandir(fd) as entries:
                children = [entry for entry in entries]
        except OSError as exc:
            read.list_error = exc.strerror or str(exc)
            return read
        visible = [entry for entry in children if not entry.name.startswith(".")]
        read.hidden = [entry.name for entry in children if entry.name.startswith(".")]
        try:  # d_type: no system call, except for symlinks
            kinds = [entry.is_dir() for entry in visible]
        except OSError:
            kinds = [_is_dir(entry) for entry in visible]
        read.dirs = sorted(entry.name for entry, is_dir in zip(visible, kinds) if is_dir)
        read.others = sorted(entry.name for entry, is_dir in zip(visible, kinds) if not is_dir)
        read.names = [name for name in read.others if name[name.rfind("."):].lower() in IMAGE_EXTENSIONS]
        read.stats = _stat_names(fd, read.names, calls, parts)
    except BaseException:
        read.close()
        raise
    return read


def _stat_names(fd: int, names: list[str], calls: InFlight, parts: int | None
                ) -> list[StatOrReason] | list[Future[list[StatOrReason]]]:
    """One stat per name, relative to the directory's descriptor (the kernel does not walk the
    path): here while the calls are fast, on `calls`' threads once they wait on storage."""
    stat_one = functools.partial(_stat_or_reason, fd=fd)
    probed = calls.probe(stat_one, names)  # while the walk still measures the calls
    rest = names[len(probed):]
    if not calls.concurrent or not rest:
        try:  # in bulk, the usual case: no call per name but the stat
            return probed + [os.stat(name, dir_fd=fd) for name in rest]
        except OSError:
            return probed + [stat_one(name) for name in rest]
    done: Future[list[StatOrReason]] = Future()
    done.set_result(probed)
    return [done, *calls.submit_chunks(stat_one, rest, parts)]


def _apply_dir(read: DirRead, dir_path: str, dir_rel: str, listing: Listing, seen_dirs: set[tuple[int, int]],
               class_ids: _ClassIds, companions: frozenset[str]) -> list[Files | tuple[str, str]]:
    """One directory's entries in path order: runs of its files between its subdirectories;
    hidden and other files counted, unreadable ones rejected, an alias or a directory seen before skipped."""
    if read.open_error:
        listing.rejects.append((dir_rel, f"cannot list directory: {read.open_error}"))
        return []
    assert read.info is not None
    dir_id = (read.info.st_dev, read.info.st_ino)
    aliased = class_ids.owner(dir_id, dir_rel)
    if aliased != dir_rel:
        listing.note_alias(dir_rel, aliased)
        log.info("%s", listing.aliases[-1])
        return []
    if dir_id in seen_dirs:
        class_ids.settle()  # the warning once, from the walk that counts
        log.warning("%s: directory already visited (symlink loop or alias), skipped", dir_path)
        return []
    seen_dirs.add(dir_id)
    if read.list_error:
        listing.rejects.append((dir_rel, f"cannot list directory: {read.list_error}"))
        return []
    prefix = f"{dir_rel}/" if dir_rel else ""
    listing.ignore(sorted(prefix + name for name in read.hidden), hidden=True)
    if len(read.names) < len(read.others):
        listing.ignore((prefix + name for name in read.others if name[name.rfind("."):].lower() not in IMAGE_EXTENSIONS
                        and os.path.splitext(name)[1] not in companions), hidden=False)
    files = _regular_files(read.names, read.results(), prefix, listing)
    dirs = read.dirs
    if not dirs:
        return [files]
    # Merge the files and the subdirectories in path order: a directory's key is its name + "/".
    keyed = sorted([(name, position) for position, name in enumerate(files[0])] +
                   [(prefix + name + "/", -1 - number) for number, name in enumerate(dirs)])
    items: list[Files | tuple[str, str]] = []
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


def _regular_files(names: list[str], infos: list[StatOrReason], prefix: str, listing: Listing) -> Files:
    """The regular files among `names`, with their sizes and modification times; the rest are rejects."""
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


def _stat_or_reason(name: str, fd: int) -> StatOrReason:
    try:
        return os.stat(name, dir_fd=fd)
    except OSError as exc:
        return f"cannot stat: {exc.strerror}"


class _MissedAlias(Exception):
    """A directory the walk took as a folder of its own was another class's folder: walk again."""

    def __init__(self, class_ids: ClassIds) -> None:
        super().__init__("an alias of a class folder was met before the class folders' ids")
        self.class_ids = class_ids


class _ClassIds:
    """The class folders' ids (`_class_ids`), for telling a class folder met again (an alias) from a
    folder of its own. While they are stat'ed in the background, the walk takes each directory as
    its own and keeps its id: once they are in, those are checked, and a directory that was another
    class's folder (an alias met before that folder's stat came back) makes the walk start over
    knowing them (`_MissedAlias`), so the listing, aliases and warnings are those of a walk that
    knew them from the start. A warning waits for them."""

    def __init__(self, ids: ClassIds | Future[ClassIds]) -> None:
        self._ids = ids if isinstance(ids, dict) else None
        self._pending = ids if isinstance(ids, Future) else None
        self._taken: list[tuple[tuple[int, int], str]] = []  # directories taken as their own meanwhile

    def owner(self, dir_id: tuple[int, int], dir_rel: str) -> str:
        """The class whose folder `dir_id` is, or `dir_rel` when it is no class folder (taken so
        while the ids are not in)."""
        if self._ids is None and self._pending is not None and self._pending.done():
            self.settle()
        if self._ids is None:
            self._taken.append((dir_id, dir_rel))
            return dir_rel
        return self._ids.get(dir_id, dir_rel)

    def settle(self) -> ClassIds:
        """The ids, once in; `_MissedAlias` if a directory taken as its own was a class folder."""
        if self._ids is None:
            assert self._pending is not None
            self._ids = self._pending.result()
            if any(self._ids.get(dir_id, dir_rel) != dir_rel for dir_id, dir_rel in self._taken):
                raise _MissedAlias(self._ids)
            self._taken = []
        return self._ids


class _Reader:
    """Hands the walk each directory read: here, or, once `calls` wait on storage, from the
    DIRS_AHEAD reads started ahead of the walk (`read_ahead`): the next directories on its stack,
    then the `upcoming` ones (the next class folders, walked after this one)."""

    def __init__(self, calls: InFlight) -> None:
        self.calls = calls
        self.upcoming: list[str] = []
        self._ahead: dict[str, Future[DirRead]] = {}

    def read(self, path: str, stack: list[Item]) -> DirRead:
        """The directory at `path`, read ahead or now; `stack`: what the walk has left."""
        future = self._ahead.pop(path, None)
        if future is not None:
            return future.result()
        if self.calls.concurrent is False:  # measured: the calls answer at local speed
            return _read_dir(path, self.calls)
        return _read_dir(path, self.calls, self._share(len(self._ahead) + len(self._next(stack)) + 1))

    def _next(self, stack: list[Item]) -> list[str]:
        """The next directories to read ahead: the top of the walk's stack, then the upcoming ones."""
        on_stack = (item[0] for item in reversed(stack[-4 * DIRS_AHEAD:]) if isinstance(item[0], str))
        return list(itertools.islice((path for path in itertools.chain(on_stack, self.upcoming)
                                      if path not in self._ahead), DIRS_AHEAD - len(self._ahead)))

    def _share(self, directories: int) -> int:
        """Tasks per directory when `directories` are read at once: the threads are shared among
        them, since some filesystems (FUSE here) answer one name lookup at a time per directory."""
        return max(1, self.calls.threads // max(1, directories))

    def read_ahead(self, stack: list[Item]) -> None:
        """Start reading the next directories the walk will pop (the top of its stack), then the upcoming ones."""
        if not self.calls.concurrent:
            return
        wanted = self._next(stack)
        parts = self._share(len(self._ahead) + len(wanted))
        for path in wanted:
            self._ahead[path] = self.calls.submit(_read_dir, path, self.calls, parts)

    def close(self) -> None:
        """Close what was read ahead and not taken (the walk stopped early)."""
        for future in self._ahead.values():
            if not future.cancel() and future.exception() is None:
                future.result().close()
        self._ahead.clear()
