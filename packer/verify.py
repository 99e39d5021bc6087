"""`pack verify`: check a packed dataset against its manifest, and optionally decode every sample."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from readers.base import PackedDataset
from readers.datasets import open_dataset
from readers.manifest import DatasetError, FileInfo, load_manifest

from .fsutil import sha256_file


def file_problem(out: Path, info: FileInfo) -> str | None:
    """One line naming `info`'s file if it is missing or differs in size or sha256 from the manifest."""
    path = out / info.name
    if not path.is_file():
        return f"{path}: missing"
    size = path.stat().st_size
    if size != info.bytes:
        return f"{path}: {size} bytes, the manifest says {info.bytes}"
    if sha256_file(path) != info.sha256:
        return f"{path}: sha256 does not match the manifest (the file is damaged)"
    return None


def verify(out: Path, *, full: bool = False, progress: Callable[[int], None] | None = None) -> list[str]:
    """Problems found, one line each naming the file (and sample where it can); empty if sound.

    Checks every file index.json names (shards, their sidecars, the loader descriptors) for
    presence, size and sha256, each damaged file once, and every shard's sample count. A shard
    whose hash is wrong is read sample by sample to name the damaged ones (each record carries a
    CRC-32); `full` also decodes every sample of every shard and parses each of its fields against
    index.json's types. Samples are only read through sidecars that are intact: a broken index
    would otherwise repeat one line per sample.
    """
    manifest = load_manifest(out)
    # Every stored field too: reading one parses it, so a damaged or missing value is named.
    dataset = open_dataset(out, decode="pil" if full else "bytes",
                           fields=("image", *(spec.name for spec in manifest.fields)))
    problems = [problem for info in manifest.descriptors if (problem := file_problem(out, info))]
    start = 0
    try:
        for shard, info in enumerate(manifest.shards):
            samples = range(start, start + info.num_samples)
            start += info.num_samples
            path = out / info.name
            shard_problem = file_problem(out, FileInfo(info.name, info.bytes, info.sha256))
            sidecar_problems = {sidecar.name: problem for sidecar in info.sidecars
                                if (problem := file_problem(out, sidecar))}
            problems += [problem for problem in (shard_problem, *sidecar_problems.values()) if problem]
            if not path.is_file():
                continue
            try:
                stored = dataset.stored_samples(shard)
            except Exception as exc:  # noqa: BLE001 - a damaged file may fail to open at all
                problems.append(str(exc) if isinstance(exc, DatasetError) else f"{path}: unreadable ({exc})")
                continue
            if stored != info.num_samples:
                problems.append(f"{path}: holds {stored} samples, the manifest says {info.num_samples}")
            readable = not any(sidecar.name in sidecar_problems for sidecar in dataset.read_sidecars(shard))
            if (full or shard_problem) and readable:
                problems += damaged_samples(dataset, samples)
            if progress:
                progress(info.num_samples)
    finally:
        dataset.close()
    return problems


def damaged_samples(dataset: PackedDataset, samples: range) -> list[str]:
    found = []
    for index in samples:
        try:
            dataset.load(index)
        except DatasetError as exc:
            found.append(str(exc))
    return found
