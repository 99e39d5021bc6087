"""OUT in an object store (`s3://bucket/x.wds`, `gs://...`, any fsspec URL that can write).

Shards are written, synced and hashed in a local staging folder exactly as for a local OUT
(`staging` mirrors OUT's layout: `.pack/plan.json`, `listing.jsonl`, `tmp/`, the shard being
uploaded), then uploaded; the remote keys are the local names, so the remote layout is the
local one. An object store has no rename and no flock, so:

- on an object store a key is only ever one whole upload (a cut-off PUT or multipart upload
  leaves the old object or none), so each file is put straight to its key, then checked by size
  and by the store's checksum where it offers one (S3's ETag); on other filesystems it goes to a
  temporary key (`.pack/tmp/<name>.tmp-<host>-<pid>`) first and is moved into place once checked.
  Two tasks racing on one shard upload the same bytes (packing is deterministic);
- a shard's marker is uploaded after its files, `index.json` after every marker;
- concurrent tasks agree on the plan by writing the same bytes: a plan is deterministic given SRC
  and the options, and a task that finds a different plan in the bucket after writing its own stops.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from readers.manifest import MANIFEST_NAME
from readers.remote import UrlFilesystem, is_url, url_folder_name

from ..errors import FinishedOutput, PackError
from .fsutil import atomic_write_text
from .outdir import DONE_DIR, LISTING_NAME, PARTS_DIR, PLAN_NAME, TMP_DIR, WORK_DIR, final_name, listing_path, pack_outputs, \
    part_dir, plan_path, temp_name
from .output import FileCheck, Output
from ..plan.plan import Plan, listing_sha256, load_plan
from ..write.shard import BackgroundUploads, ShardResult
from ..sources.inputs import Source
from ..sources.remote import modified_ns

log = logging.getLogger(__name__)

T = TypeVar("T")
UPLOAD_THREADS = 4
"""Files of one shard (the shard and its sidecars) uploaded at once; parts of one file are s3fs's business."""
MAX_PARTS = 10_000
SECOND_NS = 1_000_000_000  # whole-second object times (S3 LastModified) stand for the end of their second
ATOMIC_PUT = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "oss"})
"""Object stores where a key is always one whole upload (old or new, never a mix, never a part)."""


def no_bucket(exc: BaseException) -> bool:
    """A FileNotFoundError for the bucket itself, not for a key in it (S3's and GCS's words)."""
    return re.search(r"no\s*such\s*bucket|bucket does not exist", str(exc), re.IGNORECASE) is not None


def store_error(url: str, exc: BaseException) -> PackError:
    """One line naming `url` and what the store (or the way to it) said."""
    name = type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        cause = f"not found ({exc})" if no_bucket(exc) else "not found"
    elif isinstance(exc, PermissionError):
        cause = f"access denied ({exc})"
    elif "Credentials" in name:
        cause = "no credentials (set AWS_ACCESS_KEY_ID/AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS or storage options)"
    elif "Connect" in name or "Endpoint" in name or isinstance(exc, (ConnectionError, TimeoutError)):
        cause = f"cannot reach the store ({name}: {exc})"
    else:
        cause = f"{name}: {exc}"
    return PackError(f"{url}: {cause}; finished shards are kept: rerun the same command to resume")


def protocols(fs: Any) -> set[str]:
    return set(fs.protocol) if isinstance(fs.protocol, (tuple, list)) else {fs.protocol}


def multipart_part_bytes(fs: Any, size: int) -> int | None:
    """S3's multipart part size for a file of `size`: the filesystem's block size (storage option
    `default_block_size`, s3fs's default 50 MiB), grown to stay within S3's 10,000 parts.
    s3fs uploads a file of two parts or more in parts, several at once. None: not S3."""
    if "s3" not in protocols(fs):
        return None
    return max(int(getattr(fs, "default_block_size", 0) or 50 << 20), -(-size // MAX_PARTS))


def md5_etags(path: Path, part_bytes: int | None) -> set[str]:
    """The S3 ETags a correct upload of `path` can have: the md5 of the whole, and (multipart, in
    parts of `part_bytes`) the md5 of the parts' md5s with the part count."""
    whole = hashlib.md5()  # noqa: S324 - S3's checksum, not a security hash
    parts: list[bytes] = []
    with open(path, "rb") as handle:
        while chunk := handle.read(part_bytes or 1 << 24):
            whole.update(chunk)
            parts.append(hashlib.md5(chunk).digest())  # noqa: S324
    etags = {whole.hexdigest()}
    if part_bytes and len(parts) > 1:
        etags.add(f"{hashlib.md5(b''.join(parts)).hexdigest()}-{len(parts)}")  # noqa: S324
    return etags


class RemoteOut(UrlFilesystem, Output):
    """A remote OUT and the local staging folder that mirrors it.

    Picklable (it travels to worker processes and Dask workers), as its `UrlFilesystem` is.
    """

    purpose = "writing"

    def __init__(self, url: str, *, staging: str | os.PathLike[str] | None = None,
                 storage_options: dict[str, Any] | None = None) -> None:
        super().__init__(url, storage_options)
        self.owns_staging = staging is None
        root = Path(tempfile.mkdtemp(prefix="pack-staging-")) if staging is None else Path(staging)
        self.staging = root.resolve() / url_folder_name(self.url, 60, 8)
        self.fresh = False
        """True once `prepare` found OUT empty (or emptied it): no plan, marker or upload of an earlier run there."""

    @classmethod
    def takes(cls, out: str | os.PathLike[str]) -> bool:
        return is_url(out)

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RemoteOut({self.url!r})"

    def __truediv__(self, name: str) -> str:
        """The URL of `name` in OUT, for messages (`out / name` reads as for a local OUT)."""
        return f"{self.url}/{name}"

    # --- the store ---------------------------------------------------------------------------

    def filesystem(self) -> tuple[Any, str]:
        try:
            return super().filesystem()
        except ImportError as exc:
            raise PackError(str(exc)) from None

    def key(self, name: str) -> str:
        return f"{self.filesystem()[1]}/{name}"

    def call(self, name: str, action: Callable[[], T]) -> T:
        """Run one store request; any failure becomes a one-line PackError naming the URL of `name`."""
        try:
            return action()
        except PackError:
            raise
        except Exception as exc:  # noqa: BLE001 - every back end raises its own types
            raise store_error(self / name if name else self.url, exc) from None

    def names(self, folder: str = "") -> dict[str, int]:
        """name -> size of the entries directly in `folder` of OUT (-1 for folders); empty when there is none."""
        fs, _ = self.filesystem()
        prefix = self.key(folder) if folder else self.filesystem()[1]

        def listing() -> dict[str, int]:
            try:
                entries = fs.ls(prefix, detail=True, refresh=True)
            except FileNotFoundError as exc:
                if no_bucket(exc):
                    raise
                return {}
            return {entry["name"].rstrip("/").rsplit("/", 1)[-1]:
                    -1 if entry.get("type") == "directory" else int(entry.get("size") or 0) for entry in entries}

        return self.call(folder, listing)

    def read_text(self, name: str) -> str | None:
        """`name`'s text, or None when there is no such file."""
        fs, _ = self.filesystem()

        def read() -> str | None:
            try:
                return fs.cat_file(self.key(name)).decode("utf-8")
            except FileNotFoundError as exc:
                if no_bucket(exc):
                    raise
                return None

        return self.call(name, read)

    def read_texts(self, names: list[str]) -> dict[str, str]:
        """Several small files at once (markers): one concurrent batch of GETs; missing ones left out."""
        if not names:
            return {}
        fs, _ = self.filesystem()
        keys = {self.key(name): name for name in names}
        found = self.call(names[0], lambda: fs.cat(list(keys), on_error="return"))
        return {keys[key]: data.decode("utf-8") for key, data in found.items()
                if isinstance(data, bytes) and key in keys}

    def download(self, name: str, dest: Path) -> None:
        """`name` into `dest`, through a temporary sibling renamed when complete."""
        fs, _ = self.filesystem()
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(temp_name(dest.name))
        try:
            self.call(name, lambda: fs.get_file(self.key(name), str(tmp)))
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    def upload(self, local: Path, name: str) -> None:
        """`local` to `name`, checked by size and, on S3, by ETag.

        Object stores (`ATOMIC_PUT`) replace a key whole or not at all, even when a PUT or a
        multipart upload is cut off, so the file goes straight to its key. Elsewhere it goes to a
        temporary key first and is moved into place once checked.
        """
        fs, _ = self.filesystem()
        size = local.stat().st_size
        direct = self.atomic_puts()
        target = name if direct else f"{WORK_DIR}/{TMP_DIR}/{temp_name(name)}"
        part_bytes = multipart_part_bytes(fs, size)
        if direct and part_bytes and size < 2 * part_bytes:  # what s3fs sends in one PUT
            self.put_object(local, name)
            return
        extra = {"chunksize": part_bytes} if part_bytes else {}
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pack-md5") as pool:  # hashed while it uploads
            expected = pool.submit(md5_etags, local, part_bytes) if part_bytes else None
            self.call(name, lambda: fs.put_file(str(local), self.key(target), **extra))
            etags = expected.result() if expected else set()
        if direct:
            self.check_upload(name, size, etags)
            return
        try:
            self.check_upload(target, size, etags)
            self.call(name, lambda: fs.mv(self.key(target), self.key(name)))
        finally:
            if fs.exists(self.key(target)):
                fs.rm_file(self.key(target))

    def put_object(self, local: Path, name: str) -> None:
        """One S3 PUT, checked by the ETag it answers (the md5 of what the store received: its
        size too), so no HEAD request follows."""
        fs, _ = self.filesystem()
        data = local.read_bytes()
        bucket, key, _ = fs.split_path(self.key(name))
        response = self.call(name, lambda: fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data))
        fs.invalidate_cache(self.key(name))
        etag = str(response.get("ETag") or "").strip('"')
        if re.fullmatch(r"[0-9a-f]{32}", etag) and etag != hashlib.md5(data).hexdigest():  # noqa: S324
            raise PackError(f"{self / name}: the store's checksum {etag} does not match the staged file; "
                            "rerun to upload it again")

    def check_upload(self, name: str, size: int, etags: set[str]) -> None:
        fs, _ = self.filesystem()
        info = self.call(name, lambda: fs.info(self.key(name), refresh=True))
        etag = str(info.get("ETag") or "").strip('"')
        if int(info.get("size") or 0) != size:
            raise PackError(f"{self / name}: uploaded {info.get('size')} bytes of {size}; rerun to upload it again")
        if etags and re.fullmatch(r"[0-9a-f]{32}(-\d+)?", etag) and etag not in etags:
            raise PackError(f"{self / name}: the store's checksum {etag} does not match the staged file; "
                            "rerun to upload it again")

    def upload_text(self, name: str, text: str) -> None:
        path = self.staging / WORK_DIR / TMP_DIR / temp_name(Path(name).name)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.write_text(text, encoding="utf-8")
            self.upload(path, name)
        finally:
            path.unlink(missing_ok=True)

    def upload_all(self, files: list[tuple[Path, str]]) -> None:
        """Upload (local, name) pairs side by side; the first error is raised once all have stopped."""
        if len(files) == 1:
            self.upload(*files[0])
            return
        with ThreadPoolExecutor(max_workers=UPLOAD_THREADS, thread_name_prefix="pack-upload") as pool:
            for future in [pool.submit(self.upload, local, name) for local, name in files]:
                future.result()

    def remove(self, names: list[str]) -> None:
        fs, _ = self.filesystem()
        if names:
            self.call(names[0], lambda: fs.rm([self.key(name) for name in names], recursive=True))

    def atomic_puts(self) -> bool:
        return not ATOMIC_PUT.isdisjoint(protocols(self.filesystem()[0]))

    def clean_uploads(self, finals: set[str] | None = None) -> None:
        """Remove temporary keys left by killed uploads (of files named in `finals`; None: all).
        An OUT that was empty at `prepare` has none from earlier runs, and this run's object
        store uploads make none (`upload`): spared a listing."""
        if self.fresh and self.atomic_puts():
            return
        folder = f"{WORK_DIR}/{TMP_DIR}"
        leftovers = [f"{folder}/{name}" for name in self.names(folder)
                     if finals is None or final_name(name) in finals]
        self.remove(leftovers)

    def marker_names(self) -> set[str]:
        return set(self.names(f"{WORK_DIR}/{DONE_DIR}"))

    # --- OUT's layout --------------------------------------------------------------------------

    def prepare(self, *, overwrite: bool) -> None:
        """As `outdir.prepare_output`: refuse a finished dataset or foreign keys; with overwrite, remove ours."""
        names = self.names()
        self.fresh = overwrite or not names
        ours = pack_outputs(list(names))
        if overwrite:
            self.remove(sorted(ours))
            return
        if MANIFEST_NAME in names:
            raise FinishedOutput(f"{self.url}: already holds a packed dataset; pass --overwrite to replace it")
        foreign = sorted(set(names) - ours)
        if foreign:
            raise PackError(f"{self.url}: not empty and not a pack output (found {foreign[0]!r}); choose another OUT")

    def mirror_plan(self, first_shard: int = 0) -> Plan | None:
        """OUT's plan (an append's: `first_shard`), with its listing mirrored in staging (downloaded
        unless staging has this plan already)."""
        folder = self.part_folder(first_shard)
        text = self.read_text(f"{folder}/{PLAN_NAME}")
        if text is None:
            return None
        local_plan, local_listing = plan_path(self.staging, first_shard), listing_path(self.staging, first_shard)
        if not (local_plan.is_file() and local_listing.is_file() and local_plan.read_text(encoding="utf-8") == text):
            local_plan.unlink(missing_ok=True)
            self.download(f"{folder}/{LISTING_NAME}", local_listing)
            self.date_listing(f"{folder}/{LISTING_NAME}", local_listing)
            atomic_write_text(local_plan, text)
            plan = load_plan(self.staging, first_shard)
            if plan is not None and listing_sha256(local_listing, plan.inputs) != plan.listing_sha256:
                local_plan.unlink()
                raise PackError(f"{self / folder}/{LISTING_NAME}: does not match {PLAN_NAME} (another task is "
                                "writing a different plan: same SRC and options in every task?)")
        return load_plan(self.staging, first_shard)

    def date_listing(self, name: str, local: Path) -> None:
        """Give the downloaded listing the time the bucket's copy was stored: the plan's time, which a
        rerun compares SRC's modification times with (`packer.plan.changes`). A time in whole seconds (S3's
        LastModified) stands for the end of its second: files written in the second of the upload,
        before it, are older than the plan, not changed since."""
        fs, _ = self.filesystem()
        stored = modified_ns(self.call(name, lambda: fs.info(self.key(name))))
        if stored and stored % SECOND_NS == 0:
            stored += SECOND_NS - 1
        if stored:
            os.utime(local, ns=(stored, stored))

    def part_folder(self, first_shard: int) -> str:
        """`.pack`, or an append's `.pack/parts/<first shard>`, as a key prefix."""
        return part_dir(Path(), first_shard).as_posix()

    def publish_plan(self, plan: Plan) -> Plan:
        """Upload the plan written in staging (listing first) and read back what the bucket holds.

        Tasks starting together each scan and upload; identical plans are the same bytes, so
        whichever copy lands is the same. A task that reads back another plan than its own stops.
        """
        folder = self.part_folder(plan.first_shard)
        self.upload(listing_path(self.staging, plan.first_shard), f"{folder}/{LISTING_NAME}")
        self.upload(plan_path(self.staging, plan.first_shard), f"{folder}/{PLAN_NAME}")
        mine = plan_path(self.staging, plan.first_shard).read_text(encoding="utf-8")
        there = self.read_text(f"{folder}/{PLAN_NAME}")
        if there != mine:
            raise PackError(f"{self / folder}/{PLAN_NAME}: another task wrote a different plan at the same "
                            "time (same SRC and options in every task?)")
        return plan

    def close(self) -> None:
        """The staging folder, when this process made it (a --staging folder is the user's)."""
        if self.owns_staging:
            shutil.rmtree(self.staging.parent, ignore_errors=True)

    # --- Output ------------------------------------------------------------------------------------

    @contextmanager
    def planning(self, source: Source, *, overwrite: bool, append: bool = False) -> Iterator[None]:
        """No lock: tasks agree by writing the same plan (`publish_plan`)."""
        del source
        if not append:
            self.prepare(overwrite=overwrite)
        yield

    def stored_plan(self, first_shard: int = 0) -> Plan | None:
        return None if self.fresh else self.mirror_plan(first_shard)

    def has_parts(self) -> bool:
        return bool(self.names(f"{WORK_DIR}/{PARTS_DIR}"))

    def stage_plan(self, plan: Plan) -> None:
        if getattr(load_plan(self.staging, plan.first_shard), "fingerprint", None) != plan.fingerprint:
            self.mirror_plan(plan.first_shard)  # a worker on another machine (Dask): its staging has no listing yet

    def marker_texts(self, names: list[str]) -> dict[str, str]:
        """From one listing of the markers and one batch of GETs."""
        there = self.marker_names()
        keys = {f"{WORK_DIR}/{DONE_DIR}/{name}.json": name for name in names if f"{name}.json" in there}
        return {keys[key]: text for key, text in self.read_texts(list(keys)).items()}

    def file_check(self, *, check_hash: bool) -> FileCheck:
        """Sizes from one listing of OUT, made on first use; hashes are checked on upload, and by `pack verify`."""
        del check_hash
        listed: list[dict[str, int]] = []

        def holds(files: list[tuple[str, int, str]]) -> bool:
            if files and not listed:
                listed.append(self.names())
            return all(listed[0].get(file) == size for file, size, _ in files)

        return holds

    def commit(self, result: ShardResult, *, later: bool = False) -> None:
        """Upload a staged shard (files side by side, then its marker) and free its staging space;
        `later`: left staged for `commits()`, which uploads it from threads of the engine's process."""
        if later:
            return
        files = [self.staging / file for file, _, _ in result.files()]
        try:
            self.upload_all([(path, path.name) for path in files])
            self.upload_text(f"{WORK_DIR}/{DONE_DIR}/{result.name}.json", result.to_json())
        finally:
            for path in files:
                path.unlink(missing_ok=True)

    def commits(self) -> BackgroundUploads:
        return BackgroundUploads(self)

    def publish_files(self, names: list[str]) -> None:
        self.upload_all([(self.staging / name, name) for name in names])

    def publish_manifest(self, text: str, staged: list[str]) -> None:
        self.upload_text(MANIFEST_NAME, text)
        self.clean_uploads()
        for name in staged:
            (self.staging / name).unlink(missing_ok=True)
