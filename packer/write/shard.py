"""One shard, the unit of work: pack it from the plan on disk, publish it, mark it done.

`run_shard` can run in any process on any machine: it writes the shard under a temporary name,
renames it into place when complete and synced (sidecars first), then writes a marker with its
counts and hash. A rerun skips shards whose marker and files still agree (`finished_shard`).
"""

from __future__ import annotations

import errno
import json
import logging
import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from readers.manifest import FileInfo, ShardInfo, sample_key, shard_name

from ..errors import PackError, RejectedFile
from ..stores.fsutil import free_bytes, sha256_file, sync_and_hash
from .load import READ_THREADS, load_samples
from ..stores.outdir import final_name, temp_name, tmp_dir
from ..plan.plan import Plan, read_shard_entries
from ..stores.output import Commits, Output
from ..sources.containers import open_records
from ..sources.inputs import read_mode
from .validate import ErrorPolicy
from .writers import Sample, get_writer, sidecar_path

log = logging.getLogger(__name__)

Progress = Callable[[int], None]
DISK_FULL_MARGIN = 1 << 20
UPLOAD_BYTES_IN_FLIGHT = 256 << 20
"""What a process uploads at once to a remote OUT while its workers pack (see BackgroundUploads)..."""
UPLOADS_IN_FLIGHT = (2, 16)
"""... in at least 2 and at most 16 shards: large shards go up two at a time, small ones many, as
an object store's latency is paid per request and its bandwidth per connection."""


@dataclass
class ShardResult:
    """What a finished shard's marker records."""

    name: str
    num_samples: int
    bytes: int
    sha256: str
    fingerprint: str
    rejects: list[dict[str, str]]
    label_counts: dict[str, int]
    source_bytes: int
    sidecars: list[dict[str, Any]] = field(default_factory=list)
    extensions: list[str] = field(default_factory=list)  # the samples' (`Sample.extension`), sorted
    written: bool = True  # False: every sample was rejected, so no shard file (index.json lists no empty shard)

    def info(self) -> ShardInfo:
        return ShardInfo(
            name=self.name,
            num_samples=self.num_samples,
            bytes=self.bytes,
            sha256=self.sha256,
            sidecars=tuple(FileInfo(**sidecar) for sidecar in self.sidecars),
            num_classes=sum(1 for label in self.label_counts if int(label) >= 0),
        )

    def to_json(self) -> str:
        """The marker file's text."""
        return json.dumps(asdict(self)) + "\n"

    def files(self) -> list[tuple[str, int, str]]:
        """(name, bytes, sha256) of the shard and of every sidecar: what must still be on disk."""
        if not self.written:
            return []
        return [(self.name, self.bytes, self.sha256)] + [
            (sidecar["name"], sidecar["bytes"], sidecar["sha256"]) for sidecar in self.sidecars
        ]


def shard_file_name(plan: Plan, shard: int) -> str:
    return shard_name(plan.shard_number(shard), get_writer(plan.options.format).extension)


def finished_shards(out: Output, plan: Plan, shards: list[int], *,
                    check_hash: bool = True) -> dict[int, ShardResult | None]:
    """The marker of each of `shards` done for this plan, if OUT still holds its files as the
    marker lists them (sizes; and hashes, where `check_hash` and the output can)."""
    names = {shard: shard_file_name(plan, shard) for shard in shards}
    markers = out.marker_texts(list(names.values()))
    holds = out.file_check(check_hash=check_hash)
    done: dict[int, ShardResult | None] = {}
    for shard, name in names.items():
        text = markers.get(name)
        result = parse_marker(text) if text is not None else None
        if result is not None and (result.fingerprint != plan.fingerprint or not holds(result.files())):
            result = None
        done[shard] = result
    return done


def parse_marker(text: str) -> ShardResult | None:
    try:
        return ShardResult(**json.loads(text))
    except (ValueError, TypeError):
        return None


def clean_tmp(out: Output, plan: Plan, shards: list[int]) -> None:
    """Remove leftovers of interrupted attempts at these shards (and only these: other tasks run):
    temp files in staging, and what the output keeps elsewhere (a bucket's temporary uploads)."""
    names = {shard_file_name(plan, shard) for shard in shards}
    out.clean_uploads({name for shard in shards for name in shard_files(plan, shard)})
    folder = tmp_dir(out.staging)
    if not folder.is_dir():
        return
    for leftover in os.listdir(folder):
        if final_name(leftover) in names:
            (folder / leftover).unlink(missing_ok=True)


def shard_files(plan: Plan, shard: int) -> list[str]:
    """The names a shard's files (the shard and its sidecars) and its marker have in OUT."""
    name = shard_file_name(plan, shard)
    sidecars = [shard_name(plan.shard_number(shard), extension) for extension in get_writer(plan.options.format).sidecars]
    return [name, *sidecars, f"{name}.json"]


def run_shard(out: Output, plan: Plan, shard: int, *, threads: int = READ_THREADS,
              progress: Progress | None = None, policy: ErrorPolicy = ErrorPolicy(),
              upload: bool = True) -> ShardResult:
    """Pack one planned shard in OUT's staging folder: temp files, renamed when synced (sidecars
    first); then `out.commit` makes it visible, the marker last (`upload=False`: where the output
    can, left staged for the caller's `out.commits()`, as a bucket's uploads are).

    Under `policy` the shard stops early, publishing nothing, at its first reject (fail) or when
    its own rejects alone exceed --max-errors; the total over all shards is checked in `merge`.
    """
    name = shard_file_name(plan, shard)
    local = out.staging
    out.stage_plan(plan)
    entries = read_shard_entries(local, plan, shard)
    writer_cls = get_writer(plan.options.format)
    folder = tmp_dir(local)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / temp_name(name)
    tmp_sidecars = {extension: sidecar_path(tmp, extension) for extension in writer_cls.sidecars}
    rejects: list[dict[str, str]] = []
    label_counts: dict[str, int] = {}
    sidecars: list[dict[str, Any]] = []
    extensions: set[str] = set()
    count = source_bytes = 0
    final = local / name
    source = plan.planned_source  # the task's SRC: the plan's, made once per shard
    try:
        with writer_cls(tmp, expected_bytes=entries.total_size, classes=plan.classes,
                        sample_shape=plan.options.sample_shape, fields=plan.fields) as writer, \
                open_records(plan) as records:
            for entry, loaded in load_samples(source.location, entries, plan.options, threads, plan.fields, records,
                                              mode=read_mode(source)):
                if isinstance(loaded, RejectedFile):
                    rejects.append({"path": entry.path, "reason": str(loaded)})
                    check_rejects(out, plan, rejects, policy)
                else:
                    for encoded, fields, label, path in loaded if isinstance(loaded, list) else [loaded]:
                        writer.add(Sample(key=sample_key(plan.shard_number(shard), count), label=label, path=path,
                                          payload=encoded.payload, meta=encoded.meta, extension=encoded.extension,
                                          crc32=encoded.crc32, fields=fields))
                        count += 1
                        label_counts[str(label)] = label_counts.get(str(label), 0) + 1
                        extensions.add(encoded.extension)
                    source_bytes += entry.size
                if progress:
                    progress(1)
        if not count:  # every sample rejected: only the marker, no empty shard for readers to find
            remove_files(tmp, *tmp_sidecars.values())
            result = ShardResult(name=name, num_samples=0, bytes=0, sha256="", fingerprint=plan.fingerprint,
                                 rejects=rejects, label_counts={}, source_bytes=0, written=False)
        else:
            # A writer that hashed its file on the way is synced by `out.place`; the others are hashed while they sync.
            digest = writer.sha256 if writer.sha256 else sync_and_hash([tmp, *tmp_sidecars.values()], tmp)
            for extension, tmp_sidecar in tmp_sidecars.items():
                sidecar = local / shard_name(plan.shard_number(shard), extension)
                out.place(tmp_sidecar, sidecar)
                sidecars.append({"name": sidecar.name, "bytes": sidecar.stat().st_size,
                                 "sha256": sha256_file(sidecar)})
            out.place(tmp, final)
            result = ShardResult(name=name, num_samples=count, bytes=final.stat().st_size, sha256=digest,
                                 fingerprint=plan.fingerprint, rejects=rejects, label_counts=label_counts,
                                 source_bytes=source_bytes, sidecars=sidecars, extensions=sorted(extensions))
        out.commit(result, later=not upload)
    except (OSError, *writer_cls.write_errors) as exc:
        # Without its marker a published shard would be packed again anyway: take it back too.
        remove_files(tmp, *tmp_sidecars.values(), final, *(local / sidecar["name"] for sidecar in sidecars))
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if disk_full(local) and os.strerror(errno.ENOSPC) not in reason:  # some libraries say EIO
            reason = f"{os.strerror(errno.ENOSPC)}: {reason}"
        raise PackError(f"{out}: cannot write {name} ({reason}); nothing was published") from None
    except BaseException:
        remove_files(tmp, *tmp_sidecars.values())
        raise
    log.info("%s: %d samples, %d rejected", out / name, count, len(rejects))
    return result


class BackgroundUploads(Commits):
    """Staged shards uploaded in threads of this process while its workers pack the next ones.

    An upload mostly waits on the store (latency, then bandwidth): done in line, each worker
    would stop packing for it. `full()` tells the caller to hold back new shards once
    UPLOAD_BYTES_IN_FLIGHT (or the most shards of UPLOADS_IN_FLIGHT) are on their way, so
    staging never holds more than that beyond the shards being packed. `wakeup` becomes
    readable when an upload ends, for a caller waiting on several things at once.
    """

    def __init__(self, out: Output, limit_bytes: int = UPLOAD_BYTES_IN_FLIGHT,
                 limit_shards: tuple[int, int] = UPLOADS_IN_FLIGHT) -> None:
        self.out = out
        self.limit_bytes = limit_bytes
        self.fewest, self.most = limit_shards
        self.running: dict[Future[None], int] = {}
        self._pool = ThreadPoolExecutor(max_workers=self.most, thread_name_prefix="pack-shard-upload")
        self.wakeup, self._wake = multiprocessing.Pipe(duplex=False)

    def submit(self, result: ShardResult) -> None:
        future = self._pool.submit(self.out.commit, result)
        future.add_done_callback(self._ended)
        self.running[future] = sum(size for _, size, _ in result.files())

    def _ended(self, _: Future[None]) -> None:
        try:
            self._wake.send_bytes(b"")
        except OSError:  # closed: nobody waits any more
            pass

    def waits(self) -> list[Any]:
        return [self.wakeup]

    def full(self) -> bool:
        count = len(self.running)
        return count >= self.most or (count >= self.fewest and sum(self.running.values()) >= self.limit_bytes)

    def reap(self, *, block: bool = False) -> None:
        """Take the uploads that ended (with `block`, wait for one first); the first failure is raised."""
        if block and self.running:
            wait_futures(self.running, return_when=FIRST_COMPLETED)
        while self.wakeup.poll():
            self.wakeup.recv_bytes()
        for future in [future for future in self.running if future.done()]:
            del self.running[future]
            future.result()

    def finish(self) -> None:
        while self.running:
            self.reap(block=True)

    def close(self) -> None:
        """Stop: queued uploads are dropped; running ones end by themselves (their shards have no marker)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.wakeup.close()
        self._wake.close()


def remove_files(*paths: Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def disk_full(path: Path) -> bool:
    free = free_bytes(path)
    return free is not None and free < DISK_FULL_MARGIN


def check_rejects(out: Output, plan: Plan, rejects: list[dict[str, str]], policy: ErrorPolicy) -> None:
    """Raise PackError when these rejects break the policy; names the file, or the count."""
    if policy.on_error == "fail" and rejects:
        first = rejects[0]
        name = f"pack_samples input {first['path']}" if plan.input_kind == "samples" else Path(plan.source) / first["path"]
        raise PackError(f"{name}: {first['reason']} (--on-error fail)")
    if policy.too_many(len(rejects)):
        raise PackError(f"{out}: {len(rejects)} files rejected, more than --max-errors {policy.max_errors} "
                        f"(first: {rejects[0]['path']}: {rejects[0]['reason']}); no index.json written")
