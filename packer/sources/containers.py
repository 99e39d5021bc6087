"""Container inputs meet the plan: list a container SRC through its kind's module, and give a
shard's reader threads that kind's record reader (`packer.sources.inputs` describes the kinds)."""

from __future__ import annotations

import importlib
import os
import stat
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from readers.manifest import MANIFEST_NAME

from ..errors import RejectedFile
from ..plan.options import PackOptions
from .inputs import INPUT_KINDS, Record, RecordReader, ShardPlan, Source
from .listing import MAX_LABEL, UNLABELLED, Listing, ScanError
from .remote import filesystem, modified_ns

FOLDER_OPTIONS = ("files_from", "metadata", "sidecars", "no_classes")
"""PackOptions that describe a folder of image files, meaningless for a container."""


def scan_container(source: Source, options: PackOptions) -> Listing:
    """The samples of a container SRC, listed by its kind's module."""
    given = [name for name in FOLDER_OPTIONS if getattr(options, name)]
    if given:
        raise ScanError(f"--{given[0].replace('_', '-')} applies to a folder of images, not to {source.kind} input")
    module = _module(source.kind, source.inputs[0])
    with inputs_read_ahead(source.inputs if INPUT_KINDS[source.kind].in_line else ()):
        listing = module.scan(source, options)
    listing.kind, listing.inputs = source.kind, list(source.inputs)
    if source.kind != "samples":  # those inputs are the caller's values, not files
        listing.newest_mtime = max(input_mtimes(source), default=0)
    return listing


def input_mtimes(source: Source) -> list[int]:
    """Each container input's modification time (ns; a packed dataset's is its index.json's):
    a stat each, or one listing per folder of a store's inputs. A rerun compares them with the
    plan's time (`packer.plan.changes`)."""
    names = source.inputs
    if not names or not source.is_url:
        try:
            return [os.stat(os.path.join(name, MANIFEST_NAME) if os.path.isdir(name) else name).st_mtime_ns
                    for name in names]
        except OSError as exc:
            raise ScanError(f"{exc.filename}: cannot stat ({exc.strerror})") from None
    fs, _ = filesystem(names[0])
    found: dict[str, dict[str, Any]] = {}
    times = []
    for name in names:
        _, path = filesystem(name)
        try:
            if path not in found:
                found.update(folder_entries(fs, path.rsplit("/", 1)[0]))
            info = found.get(path) or fs.info(path)
            if info.get("type") == "directory":
                info = fs.info(f"{path}/{MANIFEST_NAME}")
        except Exception as exc:  # noqa: BLE001 - each back end raises its own types
            raise ScanError(f"{name}: cannot list ({type(exc).__name__}: {exc})") from None
        times.append(modified_ns(info))
    return times


def folder_entries(fs: Any, folder: str) -> dict[str, dict[str, Any]]:
    """The `info` of every entry of `folder`, by name, in one listing; none where the store cannot
    list it (a web server without an index page for it): each input is then asked on its own."""
    try:
        return {info["name"].rstrip("/"): info for info in fs.ls(folder, detail=True)}
    except OSError:
        return {}


READ_AHEAD_SHARE = 4
"""At most 1/READ_AHEAD_SHARE of the memory available is asked for by `inputs_read_ahead`."""
READ_AHEAD_CHUNK = 4 << 20


@contextmanager
def inputs_read_ahead(inputs: Sequence[str]) -> Iterator[None]:
    """While the scan reads headers (small reads all over the inputs: the disk's latency, not its
    bandwidth), the kernel reads the first inputs whole in the background (posix_fadvise
    WILLNEED, one input at a time, from a thread), so the first shards pack from the page cache.
    It stops asking when the scan ends, or at a quarter of the memory available. Only a hint."""
    stop = threading.Event()
    thread = threading.Thread(target=ask_ahead, args=(inputs, available_memory() // READ_AHEAD_SHARE, stop),
                              name="pack-inputs-ahead", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def ask_ahead(inputs: Sequence[str], budget: int, stop: threading.Event) -> None:
    """posix_fadvise(WILLNEED) over the inputs in order, READ_AHEAD_CHUNK at a time (the kernel
    reads a call's first ~read_ahead_kb only), until `budget` bytes are asked for or `stop` is set."""
    for path in inputs:
        if stop.is_set() or budget <= 0:
            return
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # gone: the scan says what is wrong
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):  # a packed dataset's folder: its shards are not read ahead
                continue
            size = min(info.st_size, budget)
            for offset in range(0, size, READ_AHEAD_CHUNK):
                if stop.is_set():
                    return
                os.posix_fadvise(fd, offset, min(READ_AHEAD_CHUNK, size - offset), os.POSIX_FADV_WILLNEED)
            budget -= size
        except OSError:
            pass
        finally:
            os.close(fd)


def available_memory() -> int:
    """MemAvailable from /proc/meminfo, in bytes; 1 GiB where the system does not say."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 30


def _module(kind: str, where: str) -> Any:
    module = INPUT_KINDS[kind].module
    if module is None:
        raise ScanError(f"{where}: {kind} input is recognised but not supported yet")
    return importlib.import_module(module)


@contextmanager
def open_records(plan: ShardPlan) -> Iterator[Callable[[int, int, int], Record | list[Record]] | None]:
    """The shard's record reader for a container plan (None for a folder), closed at the end. It
    checks labels against a `--classes` list: one outside it is a reject, as for a folder."""
    if plan.input_kind == "folder":
        yield None
        return
    reader: RecordReader = _module(plan.input_kind, plan.source).open_reader(plan)
    fixed = len(plan.classes) if plan.options.classes is not None else None

    def read(input: int, offset: int, length: int) -> Record | list[Record]:
        found = reader(input, offset, length)
        for record in found if isinstance(found, list) else [found]:
            if record.label != UNLABELLED and not 0 <= record.label <= MAX_LABEL:
                raise RejectedFile(f"label {record.label} is out of range (0 to {MAX_LABEL})")
            if fixed is not None and record.label != UNLABELLED and not 0 <= record.label < fixed:
                raise RejectedFile(f"label {record.label} is out of range for the {fixed} classes of {plan.options.classes}")
        return found

    try:
        yield read
    finally:
        reader.close()
