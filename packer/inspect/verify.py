"""`pack verify`: check a packed dataset against its manifest, and optionally decode every sample."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from pathlib import Path
from collections import Counter
from typing import Any, Callable

from readers.base import PackedDataset
from readers.datasets import open_dataset
from readers.manifest import CARD_NAME, MANIFEST_NAME, TIMM_INFO_NAME, DatasetError, FileInfo, Manifest
from readers.remote import is_url, listed_files
from readers.stores import read_manifest

from ..run.descriptors import timm_info, wids_descriptor
from ..stores.fsutil import sha256_file
from .dataset import small_cache


class LocalFiles:
    """A dataset folder's files, checked in place."""

    def __init__(self, out: str | os.PathLike[str]) -> None:
        self.out = Path(out)

    def where(self, name: str) -> str:
        return str(self.out / name)

    def read_bytes(self, name: str) -> bytes:
        return (self.out / name).read_bytes()

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

    def read_bytes(self, name: str) -> bytes:
        return self.fs.cat_file(f"{self.base}/{name}")

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

    Checks every file index.json names (shards, their sidecars, the loader descriptors,
    rejects.jsonl) for presence, size and sha256, each damaged file once, every shard's sample
    count, and what index.json says of the samples against what they hold (`ShardsTell`,
    `descriptor_problem`). A shard
    whose hash is wrong is read sample by sample to name the damaged ones (each record carries a
    CRC-32); `full` also decodes every sample of every shard and parses each of its fields against
    index.json's types. Samples are only read through sidecars that are intact: a broken index
    would otherwise repeat one line per sample.

    A URL is read shard by shard through a temporary cache that holds at most three shards, which
    checks each shard's sha256 as it downloads it; the dataset is never downloaded whole.
    """
    manifest = read_manifest(out)
    files: LocalFiles = RemoteFiles(str(out), storage_options) if is_url(out) else LocalFiles(out)
    with small_cache(out, manifest, "verify", storage_options=storage_options) as remote:
        # Every stored field too: reading one parses it, so a damaged or missing value is named.
        dataset = open_dataset(out, decode="pil" if full else "bytes",
                               fields=("image", "label", "path", *(spec.name for spec in manifest.fields)), **remote)
        try:
            return check_shards(dataset, manifest, files, full=full, progress=progress, shard_hashed=not remote)
        finally:
            dataset.close()


def check_shards(dataset: PackedDataset, manifest: Manifest, files: LocalFiles, *, full: bool,
                 progress: Callable[[int], None] | None, shard_hashed: bool) -> list[str]:
    problems = [problem for info in manifest.descriptors if (problem := files.problem(info))]
    problems += [problem for info in manifest.descriptors if not any(line.startswith(f"{files.where(info.name)}: ")
                                                                     for line in problems)
                 if (problem := descriptor_problem(manifest, info.name, files))]
    if manifest.rejects is not None:
        problems += [problem for problem in (files.problem(manifest.rejects),) if problem]
    told = ShardsTell(manifest, files, every_sample=full)
    start = 0
    for shard, info in enumerate(manifest.shards):
        samples = range(start, start + info.num_samples)
        start += info.num_samples
        shard_problem = files.problem(FileInfo(info.name, info.bytes, info.sha256), hashed=shard_hashed)
        sidecar_problems = {sidecar.name: problem for sidecar in info.sidecars
                            if (problem := files.problem(sidecar))}
        problems += [problem for problem in (shard_problem, *sidecar_problems.values()) if problem]
        if shard_problem and shard_problem.endswith(": missing"):
            told.every_sample = False
            continue
        try:
            problems += shard_content_problems(dataset, shard, samples, files, told, full=full or bool(shard_problem),
                                               sidecar_problems=sidecar_problems)
        finally:
            dataset.close_shard(shard)  # one shard at a time: a URL's cache holds only a few
        if progress:
            progress(info.num_samples)
    return problems + told.problems()


def shard_content_problems(dataset: PackedDataset, shard: int, samples: range, files: LocalFiles, told: ShardsTell,
                           *, full: bool, sidecar_problems: dict[str, str]) -> list[str]:
    """The shard's sample count against the manifest's, and with `full` each of its `samples` read
    (else its first), what they hold noted in `told`."""
    info = dataset.manifest.shards[shard]
    try:
        stored = dataset.stored_samples(shard)
    except Exception as exc:  # noqa: BLE001 - a damaged file may fail to open at all
        told.every_sample = False
        return [str(exc) if isinstance(exc, DatasetError) else f"{files.where(info.name)}: unreadable ({exc})"]
    problems = []
    try:
        told.shard_classes(shard, dataset.stored_classes(shard))
    except DatasetError as exc:
        problems.append(str(exc))
    if stored != info.num_samples:
        problems.append(f"{files.where(info.name)}: holds {stored} samples, the manifest says {info.num_samples}")
    readable = not any(sidecar.name in sidecar_problems for sidecar in dataset.read_sidecars(shard))
    if not readable:
        told.every_sample = False
    elif full:
        problems += damaged_samples(dataset, samples, told)
    elif samples:
        try:
            told.note(shard, 0, dataset.record(samples.start)[0])
        except DatasetError as exc:
            problems.append(str(exc))
    return problems


def damaged_samples(dataset: PackedDataset, samples: range, told: ShardsTell) -> list[str]:
    found = []
    for index in samples:
        try:
            meta, _ = dataset.load_with_meta(index)
        except DatasetError as exc:
            found.append(str(exc))
            told.every_sample = False
        else:
            told.note(*dataset.locate(index), meta)
    return found


class ShardsTell:
    """What the samples read say that index.json also says: their labels (`class_counts`, where
    every sample was read), the class folders of their paths (`classes`, for a dataset labelled by
    its folders) and their codecs (`store`). Each disagreement is one line naming index.json."""

    def __init__(self, manifest: Manifest, files: LocalFiles, *, every_sample: bool) -> None:
        self.manifest = manifest
        self.files = files
        self.every_sample = every_sample
        self.labels: Counter[int] = Counter()
        self.folders: set[str] = set()
        self.agreeing = False
        self.misplaced: dict[int, str] = {}  # label -> where a sample of it lies in another class's folder
        self.wrong_store: dict[int, str] = {}  # shard -> its first sample whose codec is not the store's
        self.renamed: list[str] = []  # per shard whose file names other classes, the first of them

    def shard_classes(self, shard: int, named: list[str] | None) -> None:
        """The class names the shard file records (None: its format keeps none): index.json's
        begin with them (an append adds classes at the end only)."""
        listed = self.manifest.classes
        if named is None or named == listed[:len(named)]:
            return
        first = next(i for i, (a, b) in enumerate(itertools.zip_longest(named, listed)) if a != b)
        there, here = (names[first] if first < len(names) else None for names in (named, listed))
        self.renamed.append(f"{self.files.where(self.manifest.shards[shard].name)} names class {first} {there!r}, "
                            f"index.json {here!r}")

    def note(self, shard: int, row: int, meta: dict[str, Any]) -> None:
        where = f"{self.files.where(self.manifest.shards[shard].name)} sample {row}"
        label, path = meta["label"], meta.get("path", "")
        self.labels[label] += 1
        if label >= 0 and label < len(self.manifest.classes) and "/" in path:
            folder = path.split("/", 1)[0]
            self.folders.add(folder)
            if folder == self.manifest.classes[label]:
                self.agreeing = True
            else:
                self.misplaced.setdefault(label, f"lie in {folder}/ ({where}: {path})")
        decoded = "shape" in meta
        if (self.manifest.store == "original") == decoded or (decoded and meta["format"] != self.manifest.store):
            held = f"{meta['format']} pixels decoded at pack time" if decoded else f"a {meta['format']} file as packed"
            self.wrong_store.setdefault(shard, f"{where} holds {held}")

    def problems(self) -> list[str]:
        index = self.files.where(MANIFEST_NAME)
        found = []
        if self.misplaced and labelled_by_folders(self.manifest) and (
                self.agreeing or self.folders <= set(self.manifest.classes)):
            said = [f"label {label} is named {self.manifest.classes[label]!r}, its samples {where}"
                    for label, where in sorted(self.misplaced.items())]
            found.append(f"{index}: classes disagree with the folders of the samples' paths: " + "; ".join(said))
        if self.renamed:
            more = f" (and {len(self.renamed) - 1} more shards)" if len(self.renamed) > 1 else ""
            found.append(f"{index}: classes disagree with the shards': {self.renamed[0]}{more}")
        if self.every_sample and self.manifest.class_counts:
            counted = [self.labels.get(label, 0) for label in range(len(self.manifest.classes))]
            wrong = [f"{name!r} {count} (index.json {listed})" for name, count, listed
                     in zip(self.manifest.classes, counted, self.manifest.class_counts) if count != listed]
            if wrong:
                found.append(f"{index}: class_counts disagree with the labels the shards hold: " + ", ".join(wrong))
        if self.wrong_store:
            first, *others = self.wrong_store.values()
            more = f" (and {len(others)} more shards)" if others else ""
            found.append(f"{index}: store {self.manifest.store!r} disagrees with the payloads: {first}{more}")
        return found


def labelled_by_folders(manifest: Manifest) -> bool:
    """Whether every part was packed with labels from class folders (no metadata file, not
    --no-classes), so a sample's label names its path's top folder. index.json does not say
    whether SRC was a folder: container inputs (tars, RecordIO), labelled by their own integers,
    have the same options, and `ShardsTell` tells them apart by paths none of which lies in a
    class's folder (so a dataset whose every class was renamed is told by its card only)."""
    every = [manifest.options, *(part.get("options") or {} for part in manifest.parts)]
    return bool(manifest.classes) and all(
        isinstance(options, dict) and options.get("metadata") is None and not options.get("no_classes")
        for options in every)


CARD_HEADING = re.compile(r"^# (.+): (\d+) samples in (\d+) (\w+) shards\n\nPacked by .* \(store `(\w+)`\)",
                          re.MULTILINE)
"""The heading of a dataset card (`packer.run.descriptors.dataset_card`)."""
CARD_CLASS = re.compile(r'^ +"(\d+)": (".*")$', re.MULTILINE)
"""A class name of the card's class_label, as `packer.run.descriptors.to_yaml` writes it."""


def descriptor_problem(manifest: Manifest, name: str, files: LocalFiles) -> str | None:
    """One line if the loader descriptor `name` (intact: the one published) describes other shards,
    counts, classes or store than index.json now does: index.json was changed after publishing."""
    text = files.read_bytes(name).decode("utf-8", "replace")
    if name == CARD_NAME:
        heading = CARD_HEADING.search(text)
        said = "{} samples in {} {} shards, store {}".format(*heading.group(2, 3, 4, 5)) if heading else "nothing"
        listed = f"{manifest.num_samples} samples in {len(manifest.shards)} {manifest.format} shards, store {manifest.store}"
        if said != listed:
            return f"{files.where(name)}: says {said}, index.json {listed}"
        classes = [json.loads(found) for _, found in CARD_CLASS.findall(text)]
        if classes != manifest.classes:
            first = next(i for i, (a, b) in enumerate(itertools.zip_longest(classes, manifest.classes)) if a != b)
            card, listed = (names[first] if first < len(names) else None for names in (classes, manifest.classes))
            return f"{files.where(name)}: names class {first} {card!r}, index.json {listed!r}"
        return None
    try:
        data = json.loads(text)
        split = next(iter(data["splits"])) if name == TIMM_INFO_NAME else data["name"]
    except (ValueError, KeyError, TypeError, StopIteration):
        return f"{files.where(name)}: not the {name} pack writes"
    expected = timm_info(manifest, split) if name == TIMM_INFO_NAME else wids_descriptor(manifest, split)
    if data != expected:
        return f"{files.where(name)}: lists other shards or sample counts than index.json"
    return None
