"""OUT, wherever it is: one interface for a local folder (`LocalOut`) and a bucket (`RemoteOut`).

The pipeline, `run_shard` and the engines only talk to an `Output`: shards are written in its
`staging` folder (OUT itself, for a local folder) and the output makes them visible its own way:
a rename and a marker file, or an upload and a marker key. It also owns the plan's storage, the
list of finished shards, publishing the manifest and cleaning up. `output_for` picks the first
store in `STORES` that takes OUT; a new store is one module (a subclass of `Output`) and one line
there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from readers.formats import Registry
from readers.manifest import MANIFEST_NAME
from readers.remote import local_root

from .fsutil import atomic_write_text, publish, sha256_file
from .outdir import PARTS_DIR, check_paths, lock_path, marker_path, plan_path, prepare_output, wait_for_lock, work_dir
from ..plan.plan import Plan, load_plan
from ..sources.inputs import Source

log = logging.getLogger(__name__)

FileCheck = Callable[[list[tuple[str, int, str]]], bool]
"""Whether OUT still holds these (name, bytes, sha256) files, as a marker lists them."""


class ShardMarker(Protocol):
    """What an output commits: a staged shard's marker (`packer.write.shard.ShardResult`)."""

    name: str

    def files(self) -> list[tuple[str, int, str]]: ...

    def to_json(self) -> str: ...


class Output(ABC):
    """Where a pack goes. Picklable: it travels to worker processes and Dask workers."""

    staging: Path
    """The local folder shards are written in, with OUT's layout (`packer.stores.outdir`)."""
    fresh: bool = False
    """True once `planning` found OUT empty (or emptied it): no plan, marker or upload of an earlier run there."""

    @classmethod
    @abstractmethod
    def takes(cls, out: str | os.PathLike[str]) -> bool:
        """Whether this store is the one for OUT as the user wrote it."""

    @abstractmethod
    def __truediv__(self, name: str) -> str:
        """How `name` in OUT is written in messages (`out / name` for every store)."""

    # --- the plan -----------------------------------------------------------------------------

    @abstractmethod
    def planning(self, source: Source, *, overwrite: bool,
                 append: bool = False) -> contextlib.AbstractContextManager[None]:
        """Around making or reusing the plan: refuse a finished dataset or foreign files (with
        overwrite, remove ours), and serialise concurrent tasks where the store can. `append`: the
        plan of a part added to the published dataset in OUT (`packer.run.append`): OUT is kept."""

    @abstractmethod
    def stored_plan(self, first_shard: int = 0) -> Plan | None:
        """OUT's plan (an append's, from `first_shard`: `outdir.part_dir`), its listing available in
        `staging`; None when there is none."""

    @abstractmethod
    def has_parts(self) -> bool:
        """Whether OUT holds the plan of an append (`.pack/parts`), finished or not."""

    def publish_plan(self, plan: Plan) -> Plan:
        """The plan just written in `staging`, made OUT's; returns the plan OUT holds."""
        return plan

    def stage_plan(self, plan: Plan) -> None:
        """Make `plan`'s listing readable in `staging` before a shard is packed (a worker elsewhere)."""

    # --- shards -------------------------------------------------------------------------------

    def place(self, tmp: Path, final: Path) -> None:
        """Move a finished shard file from `staging`'s tmp folder to its name in `staging`, durably:
        this store's sync rules (on a local disk: fsync, rename, fsync the folder)."""
        publish(tmp, final)

    @abstractmethod
    def marker_texts(self, names: list[str]) -> dict[str, str]:
        """Shard file name -> its marker's text, for those of `names` that have one."""

    @abstractmethod
    def file_check(self, *, check_hash: bool) -> FileCheck:
        """A check that OUT holds files as a marker lists them (sizes; hashes where asked and local)."""

    @abstractmethod
    def commit(self, result: ShardMarker, *, later: bool = False) -> None:
        """Make a shard staged and synced in `staging` visible, its marker last. `later`: the
        process running the engine commits it (`commits`), where this store can do that."""

    def commits(self) -> Commits:
        """How the engine's process commits the shards its workers staged with `commit(later=True)`."""
        return Commits()

    def clean_uploads(self, finals: set[str] | None = None) -> None:
        """Remove what killed attempts left in OUT outside `staging` (of files named in `finals`; None: all)."""

    # --- publishing ---------------------------------------------------------------------------

    @abstractmethod
    def read_text(self, name: str) -> str | None:
        """A published file of OUT as text; None if it is not there."""

    def publish_files(self, names: list[str]) -> None:
        """Make these files written in `staging` visible in OUT."""

    @abstractmethod
    def publish_manifest(self, text: str, staged: list[str]) -> None:
        """Write index.json, last; `staged`: files `publish_files` has made visible already."""

    def close(self) -> None:
        """Remove what this process made only for this run (a temporary staging folder)."""

    def portable(self) -> Output:
        """This output as a process on another machine finds it (an absolute path)."""
        return self


class Commits:
    """Staged shards committed by their workers already: nothing to do, never full."""

    def __init__(self) -> None:
        self.running: dict[Any, int] = {}

    def submit(self, result: ShardMarker) -> None:
        del result

    def full(self) -> bool:
        return False

    def waits(self) -> list[Any]:
        """What to wait on, beside the workers, for a commit to end."""
        return []

    def reap(self, *, block: bool = False) -> None:
        del block

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass


class LocalOut(Output):
    """OUT as a folder on this machine: shards are written in it and renamed into place; a file
    lock serialises planning; a marker file per finished shard."""

    def __init__(self, root: str | os.PathLike[str], *, staging: str | os.PathLike[str] | None = None,
                 storage_options: dict[str, Any] | None = None) -> None:
        del staging, storage_options  # a bucket's: a local OUT is its own staging
        self.staging = local_root(root)

    @classmethod
    def takes(cls, out: str | os.PathLike[str]) -> bool:
        return True

    def __str__(self) -> str:
        return str(self.staging)

    def __repr__(self) -> str:
        return f"LocalOut({str(self.staging)!r})"

    def __truediv__(self, name: str) -> str:
        return str(self.staging / name)

    @contextmanager
    def planning(self, source: Source, *, overwrite: bool, append: bool = False) -> Iterator[None]:
        """A file lock serialises concurrent tasks on a shared filesystem, so N tasks do not all
        walk millions of files; a failed first plan leaves nothing behind."""
        out = self.staging
        check_paths(Path(source.named), out)
        made_out = not out.exists()
        if not append:
            prepare_output(out, overwrite=overwrite)
        made_work_dir = not work_dir(out).exists()
        work_dir(out).mkdir(exist_ok=True)
        try:
            with open(lock_path(out), "a") as lock:
                wait_for_lock(lock, lock_path(out))
                yield
        except BaseException:
            if made_work_dir and not plan_path(out).exists():  # nothing planned (a missing SRC): leave nothing behind
                shutil.rmtree(work_dir(out), ignore_errors=True)
                if made_out:
                    with contextlib.suppress(OSError):  # not empty: another task's files since
                        out.rmdir()
            raise

    def stored_plan(self, first_shard: int = 0) -> Plan | None:
        return load_plan(self.staging, first_shard)

    def has_parts(self) -> bool:
        return (work_dir(self.staging) / PARTS_DIR).is_dir()

    def marker_texts(self, names: list[str]) -> dict[str, str]:
        texts = {}
        for name in names:
            try:
                texts[name] = marker_path(self.staging, name).read_text(encoding="utf-8")
            except FileNotFoundError:
                pass
        return texts

    def file_check(self, *, check_hash: bool) -> FileCheck:
        def holds(files: list[tuple[str, int, str]]) -> bool:
            for file_name, size, digest in files:
                path = self.staging / file_name
                try:
                    if path.stat().st_size != size or (check_hash and sha256_file(path) != digest):
                        log.warning("%s: does not match its marker; packing it again", path)
                        return False
                except FileNotFoundError:
                    return False
            return True

        return holds

    def commit(self, result: ShardMarker, *, later: bool = False) -> None:
        """The marker, written by the worker (later or not): the shard is in place already."""
        marker = marker_path(self.staging, result.name)
        marker.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(marker, result.to_json())

    def read_text(self, name: str) -> str | None:
        try:
            return (self.staging / name).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def publish_manifest(self, text: str, staged: list[str]) -> None:
        atomic_write_text(self.staging / MANIFEST_NAME, text)

    def portable(self) -> Output:
        return LocalOut(self.staging.resolve())


STORES: Registry[type[Output]] = Registry({
    "bucket": "packer.stores.remote_out:RemoteOut",  # any fsspec URL but file://
    "folder": "packer.stores.output:LocalOut",  # takes every OUT: last
})
"""Where OUT can be, asked in order (`Output.takes`)."""


def output_for(out: str | os.PathLike[str] | Output, *, staging: str | os.PathLike[str] | None = None,
               storage_options: dict[str, Any] | None = None) -> Output:
    """OUT as the pipeline takes it; an Output passed in is returned as it is."""
    if isinstance(out, Output):
        return out
    store = next(STORES[name] for name in STORES if STORES[name].takes(out))
    return store(os.fspath(out), staging=staging, storage_options=storage_options)  # type: ignore[call-arg]


@contextmanager
def opened_output(out: str | os.PathLike[str] | Output, *, staging: str | os.PathLike[str] | None = None,
                  storage_options: dict[str, Any] | None = None) -> Iterator[Output]:
    """OUT for one call (`output_for`): an Output passed in is the caller's; one made here is
    closed afterwards."""
    if isinstance(out, Output):
        yield out
        return
    target = output_for(out, staging=staging, storage_options=storage_options)
    try:
        yield target
    finally:
        target.close()
