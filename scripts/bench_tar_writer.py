"""Samples/s of pack's tar shard writer against Python's tarfile and webdataset's TarWriter.

All three write the same in-memory samples (image, .cls, .pack.json members per sample) to a file in a
temporary directory, one Python thread each; tarfile is the baseline. Source reading and encoding
are left out: this is the writer alone.

    .venv/bin/python scripts/bench_tar_writer.py --count 20000 --mean-kb 20
"""

from __future__ import annotations

import argparse
import io
import json
import tarfile
import tempfile
import time
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
import webdataset

from packer.write.writers.base import Sample
from packer.write.writers.wds import WdsWriter
from readers.manifest import sample_key


def make_samples(count: int, mean_kb: float, seed: int) -> list[Sample]:
    rng = np.random.default_rng(seed)
    sizes = np.clip(rng.lognormal(np.log(mean_kb * 1000), 0.5, count), 500, None).astype(np.int64)
    blob = rng.integers(0, 256, int(sizes.max()), dtype=np.uint8).tobytes()
    return [
        Sample(key=sample_key(0, i), label=i % 1000, path=f"n{i % 1000:08d}/img_{i:08d}.JPEG",
               payload=blob[:size], meta={"format": "jpeg"}, extension="jpg", crc32=zlib.crc32(blob[:size]))
        for i, size in enumerate(sizes)
    ]


def write_pack(path: Path, samples: list[Sample]) -> None:
    with WdsWriter(path, expected_bytes=sum(len(s.payload) for s in samples), classes=[]) as writer:
        for sample in samples:
            writer.add(sample)


def write_tarfile(path: Path, samples: list[Sample]) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for sample in samples:
            key = sample.key
            members = (
                (f"{key}.{sample.extension}", sample.payload),
                (f"{key}.cls", b"%d" % sample.label),
                (f"{key}.pack.json", json.dumps(sample.record_meta(), separators=(",", ":")).encode()),
            )
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))


def write_webdataset(path: Path, samples: list[Sample]) -> None:
    with webdataset.TarWriter(str(path)) as sink:
        for sample in samples:
            sink.write({
                "__key__": sample.key,
                sample.extension: sample.payload,
                "cls": sample.label,
                "json": sample.record_meta(),
            })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--mean-kb", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    samples = make_samples(args.count, args.mean_kb, args.seed)
    total = sum(len(sample.payload) for sample in samples)
    print(f"{args.count} samples, {total / 1e6:.0f} MB of image bytes")
    writers: list[tuple[str, Callable[[Path, list[Sample]], None]]] = [
        ("tarfile (baseline)", write_tarfile),
        ("webdataset.TarWriter", write_webdataset),
        ("pack WdsWriter", write_pack),
    ]
    baseline = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name, write in writers:
            path = Path(tmp) / "shard.tar"
            started = time.perf_counter()
            write(path, samples)
            rate = args.count / (time.perf_counter() - started)
            baseline = baseline or rate
            print(f"  {name:24s} {rate:9.0f} samples/s  x{rate / baseline:5.2f}")
            path.unlink()


if __name__ == "__main__":
    main()
