"""`pack verify`: check a packed dataset against its manifest, and optionally decode every sample."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from readers.base import PackedDataset
from readers.datasets import open_dataset
from readers.manifest import DatasetError, FileInfo, Manifest, load_manifest
from readers.remote import RemoteStore, is_url, listed_files

from .fsutil import sha256_file


def read_manifest(out: str | os.PathLike[str]) -> Manifest:
    """index.json of a dataset folder or URL."""
    return RemoteStore(str(out)).manifest() if is_url(out) else load_manifest(out)


class LocalFiles:
    """A dataset folder's files, checked in place."""

    def __init__(self, out: str | os.PathLike[str]) -> None:
        self.out = Path(out)

    def where(self, name: str) -> str:
        return str(self.out / name)

    def problem(self, info: FileInfo, *, hashed: bool = True) -> str | None:
        """One line naming `info`'s file if it is missing or differs in size or sha256 from the manifest."""
        path = self.out / info.name
        if not path.is_file():
            return f"{path}: missing"
        size = path.stat().st_size
        if size != info.bytes:
            return f"{path}: {size} bytes, the manifest says {info.bytes}"
        if hashed and sha256_file(path) != info.sha256:
            return f"{path}: sha256 does not match the manifest (the file is damaged)"
        return None


class RemoteFiles(LocalFiles):
    """A dataset URL's files: sizes from one listing (or from the file itself where the listing
    gives none: an HTTP server's index page); small files hashed as read, shards by the readers'
    cache as it downloads them (one at a time, see `verify`)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        from fsspec.core import url_to_fs

        self.url = url.rstrip("/")
        self.fs, base = url_to_fs(self.url, **(storage_options or {}))
        self.base = base.rstrip("/")
        try:
            listed = self.fs.ls(self.base, detail=True, refresh=True)
        except (FileNotFoundError, NotImplementedError):  # a web server that lists nothing there
            listed = []
        self.sizes: dict[str, int | None] = listed_files(listed)

    def where(self, name: str) -> str:
        return f"{self.url}/{name}"

    def problem(self, info: FileInfo, *, hashed: bool = True) -> str | None:
        url, size = self.where(info.name), self.sizes.get(info.name)
        if size is None:  # not listed, or listed without a size
            try:
                size = self.fs.info(f"{self.base}/{info.name}").get("size")
            except FileNotFoundError:
                return f"{url}: missing"
            except OSError as exc:  # denied, or the store gone: named, and the other files still checked
                return f"{url}: cannot be read ({exc.strerror or exc})"
        if size is not None and size != info.bytes:
            return f"{url}: {size} bytes, the manifest says {info.bytes}"
        if hashed and hashlib.sha256(self.fs.cat_file(f"{self.base}/{info.name}")).hexdigest() != info.sha256:
            return f"{url}: sha256 does not match the manifest (the file is damaged)"
        return None


def verify(out: str | os.PathLike[str], *, full: bool = False, progress: Callable[[int], None] | None = None,
           storage_options: dict[str, Any] | None = None) -> list[str]:
    """Problems found, one line each naming the file (and sample where it can); empty if sound.

    Checks every file index.json names (shards, their sidecars, the loader descriptors) for
    presence, size and sha256, each damaged file once, and every shard's sample count. A shard
    whose hash is wrong is read sample by sample to name the damaged ones (each record carries a
    CRC-32); `full` also decodes every sample of every shard and parses each of its fields against
    index.json's types. Samples are only read through sidecars that are intact: a broken index
    would otherwise repeat one line per sample.

    A URL is read shard by shard through a temporary cache that holds at most three shards, which
    checks each shard's sha256 as it downloads it; the dataset is never downloaded whole.
    """
    manifest = read_manifest(out)
    with tempfile.TemporaryDirectory(prefix="pack-verify-") as cache_dir:
        if is_url(out):
            files: LocalFiles = RemoteFiles(str(out), storage_options)
            largest = max((shard.bytes + sum(s.bytes for s in shard.sidecars) for shard in manifest.shards), default=1)
            remote = {"cache_dir": cache_dir, "cache_limit": 3 * max(largest, 1), "storage_options": storage_options}
        else:
            files, remote = LocalFiles(out), {}
        # Every stored field too: reading one parses it, so a damaged or missing value is named.
        dataset = open_dataset(out, decode="pil" if full else "bytes",
                               fields=("image", *(spec.name for spec in manifest.fields)), **remote)
        try:
            return check_shards(dataset, manifest, files, full=full, progress=progress, shard_hashed=not remote)
        finally:
            dataset.close()


def check_shards(dataset: PackedDataset, manifest: Manifest, files: LocalFiles, *, full: bool,
                 progress: Callable[[int], None] | None, shard_hashed: bool) -> list[str]:
    problems = [problem for info in manifest.descriptors if (problem := files.problem(info))]
    start = 0
    for shard, info in enumerate(manifest.shards):
        samples = range(start, start + info.num_samples)
        start += info.num_samples
        shard_problem = files.problem(FileInfo(info.name, info.bytes, info.sha256), hashed=shard_hashed)
        sidecar_problems = {sidecar.name: problem for sidecar in info.sidecars
                            if (problem := files.problem(sidecar))}
        problems += [problem for problem in (shard_problem, *sidecar_problems.values()) if problem]
        if shard_problem and shard_problem.endswith(": missing"):
            continue
        try:
            problems += shard_content_problems(dataset, shard, samples, files, full=full or bool(shard_problem),
                                               sidecar_problems=sidecar_problems)
        finally:
            dataset.close_shard(shard)  # one shard at a time: a URL's cache holds only a few
        if progress:
            progress(info.num_samples)
    return problems


def shard_content_problems(dataset: PackedDataset, shard: int, samples: range, files: LocalFiles, *, full: bool,
                           sidecar_problems: dict[str, str]) -> list[str]:
    """The shard's sample count against the manifest's, and with `full` each of its `samples` read."""
    info = dataset.manifest.shards[shard]
    try:
        stored = dataset.stored_samples(shard)
    except Exception as exc:  # noqa: BLE001 - a damaged file may fail to open at all
        return [str(exc) if isinstance(exc, DatasetError) else f"{files.where(info.name)}: unreadable ({exc})"]
    problems = []
    if stored != info.num_samples:
        problems.append(f"{files.where(info.name)}: holds {stored} samples, the manifest says {info.num_samples}")
    readable = not any(sidecar.name in sidecar_problems for sidecar in dataset.read_sidecars(shard))
    if full and readable:
        problems += damaged_samples(dataset, samples)
    return problems


def damaged_samples(dataset: PackedDataset, samples: range) -> list[str]:
    found = []
    for index in samples:
        try:
            dataset.load(index)
        except DatasetError as exc:
            found.append(str(exc))
    return found
