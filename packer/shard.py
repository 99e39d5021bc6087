"""One shard, the unit of work: pack it from the plan on disk, publish it, mark it done.

`run_shard` can run in any process on any machine: it writes the shard under a temporary name,
renames it into place when complete and synced (sidecars first), then writes a marker with its
counts and hash. A rerun skips shards whose marker and files still agree (`finished_shard`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from readers.manifest import FileInfo, ShardInfo, sample_key, shard_name

from .errors import PackError, RejectedFile
from .fsutil import atomic_write_text, free_bytes, publish, sha256_file, sync_and_hash
from .load import READ_THREADS, load_samples
from .outdir import final_name, marker_path, temp_name, tmp_dir
from .plan import Plan, read_shard_entries
from .sources.containers import open_records
from .validate import ErrorPolicy
from .writers import Sample, get_writer, sidecar_path

log = logging.getLogger(__name__)

Progress = Callable[[int], None]
DISK_FULL_MARGIN = 1 << 20


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

    def info(self) -> ShardInfo:
        return ShardInfo(
            name=self.name,
            num_samples=self.num_samples,
            bytes=self.bytes,
            sha256=self.sha256,
            sidecars=tuple(FileInfo(**sidecar) for sidecar in self.sidecars),
        )

    def files(self) -> list[tuple[str, int, str]]:
        """(name, bytes, sha256) of the shard and of every sidecar: what must still be on disk."""
        return [(self.name, self.bytes, self.sha256)] + [
            (sidecar["name"], sidecar["bytes"], sidecar["sha256"]) for sidecar in self.sidecars
        ]


def shard_file_name(plan: Plan, shard: int) -> str:
    return shard_name(shard, get_writer(plan.options.format).extension)


def read_marker(out: Path, name: str) -> ShardResult | None:
    try:
        return ShardResult(**json.loads(marker_path(out, name).read_text(encoding="utf-8")))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def finished_shard(out: Path, plan: Plan, shard: int, *, check_hash: bool = True) -> ShardResult | None:
    """The marker of a shard done for this plan, if its files still match it (size, and hash)."""
    name = shard_file_name(plan, shard)
    result = read_marker(out, name)
    if result is None or result.fingerprint != plan.fingerprint:
        return None
    for file_name, size, digest in result.files():
        path = out / file_name
        try:
            if path.stat().st_size != size or (check_hash and sha256_file(path) != digest):
                log.warning("%s: does not match its marker; packing it again", path)
                return None
        except FileNotFoundError:
            return None
    return result


def clean_tmp(out: Path, plan: Plan, shards: list[int]) -> None:
    """Remove leftovers of interrupted attempts at these shards (and only these: other tasks run)."""
    folder = tmp_dir(out)
    if not folder.is_dir():
        return
    names = {shard_file_name(plan, shard) for shard in shards}
    for leftover in os.listdir(folder):
        if final_name(leftover) in names:
            (folder / leftover).unlink(missing_ok=True)


def run_shard(out: Path, plan: Plan, shard: int, *, threads: int = READ_THREADS,
              progress: Progress | None = None, policy: ErrorPolicy = ErrorPolicy()) -> ShardResult:
    """Pack one planned shard: temp files, renamed when synced (sidecars first), then the marker.

    Under `policy` the shard stops early, publishing nothing, at its first reject (fail) or when
    its own rejects alone exceed --max-errors; the total over all shards is checked in `merge`.
    """
    name = shard_file_name(plan, shard)
    entries = read_shard_entries(out, plan, shard)
    writer_cls = get_writer(plan.options.format)
    folder = tmp_dir(out)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / temp_name(name)
    tmp_sidecars = {extension: sidecar_path(tmp, extension) for extension in writer_cls.sidecars}
    rejects: list[dict[str, str]] = []
    label_counts: dict[str, int] = {}
    sidecars: list[dict[str, Any]] = []
    extensions: set[str] = set()
    count = source_bytes = 0
    final = out / name
    try:
        with writer_cls(tmp, expected_bytes=sum(entry.size for entry in entries), classes=plan.classes,
                        sample_shape=plan.options.sample_shape, fields=plan.fields) as writer, \
                open_records(plan) as records:
            for entry, loaded in load_samples(Path(plan.source), entries, plan.options, threads, plan.fields, records):
                if isinstance(loaded, RejectedFile):
                    rejects.append({"path": entry.path, "reason": str(loaded)})
                    check_rejects(out, plan, rejects, policy)
                else:
                    for encoded, fields, label, path in loaded if isinstance(loaded, list) else [loaded]:
                        writer.add(Sample(key=sample_key(shard, count), label=label, path=path,
                                          payload=encoded.payload, meta=encoded.meta, extension=encoded.extension,
                                          crc32=encoded.crc32, fields=fields))
                        count += 1
                        label_counts[str(label)] = label_counts.get(str(label), 0) + 1
                        extensions.add(encoded.extension)
                    source_bytes += entry.size
                if progress:
                    progress(1)
        # A writer that hashed its file on the way is synced by `publish`; the others are hashed while they sync.
        digest = writer.sha256 if writer.sha256 else sync_and_hash([tmp, *tmp_sidecars.values()], tmp)
        for extension, tmp_sidecar in tmp_sidecars.items():
            sidecar = out / shard_name(shard, extension)
            publish(tmp_sidecar, sidecar)
            sidecars.append({"name": sidecar.name, "bytes": sidecar.stat().st_size, "sha256": sha256_file(sidecar)})
        publish(tmp, final)
        result = ShardResult(name=name, num_samples=count, bytes=final.stat().st_size, sha256=digest,
                             fingerprint=plan.fingerprint, rejects=rejects, label_counts=label_counts,
                             source_bytes=source_bytes, sidecars=sidecars, extensions=sorted(extensions))
        marker = marker_path(out, name)
        marker.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(marker, json.dumps(asdict(result)) + "\n")
    except (OSError, *writer_cls.write_errors) as exc:
        # Without its marker a published shard would be packed again anyway: take it back too.
        remove_files(tmp, *tmp_sidecars.values(), final, *(out / sidecar["name"] for sidecar in sidecars))
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if disk_full(out) and os.strerror(errno.ENOSPC) not in reason:  # some libraries say EIO
            reason = f"{os.strerror(errno.ENOSPC)}: {reason}"
        raise PackError(f"{out}: cannot write {name} ({reason}); nothing was published") from None
    except BaseException:
        remove_files(tmp, *tmp_sidecars.values())
        raise
    log.info("%s: %d samples, %d rejected", final, count, len(rejects))
    return result


def remove_files(*paths: Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def disk_full(path: Path) -> bool:
    free = free_bytes(path)
    return free is not None and free < DISK_FULL_MARGIN


def check_rejects(out: Path, plan: Plan, rejects: list[dict[str, str]], policy: ErrorPolicy) -> None:
    """Raise PackError when these rejects break the policy; names the file, or the count."""
    if policy.on_error == "fail" and rejects:
        first = rejects[0]
        raise PackError(f"{Path(plan.source) / first['path']}: {first['reason']} (--on-error fail)")
    if policy.too_many(len(rejects)):
        raise PackError(f"{out}: {len(rejects)} files rejected, more than --max-errors {policy.max_errors} "
                        f"(first: {rejects[0]['path']}: {rejects[0]['reason']}); no index.json written")
