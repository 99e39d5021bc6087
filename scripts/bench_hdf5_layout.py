"""Which HDF5 layout reads image bytes back faster at random: vlen uint8, or flat uint8 + offsets?

Writes the same random payloads (JPEG-like sizes) both ways into a temporary directory, then
times random single-sample reads through plain h5py, the vlen layout being the baseline.
The files are freshly written, so this measures HDF5's per-read overhead and read amplification
with a warm page cache, not the disk.

    .venv/bin/python scripts/bench_hdf5_layout.py --count 4000 --mean-kb 110
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np


def payloads(count: int, mean_kb: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = np.clip(rng.lognormal(np.log(mean_kb * 1000), 0.5, count), 500, None).astype(np.int64)
    return [rng.integers(0, 256, size, dtype=np.uint8) for size in sizes]


def write_vlen(path: Path, items: list[np.ndarray]) -> None:
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("images", (len(items),), dtype=h5py.vlen_dtype(np.uint8), chunks=(1024,))
        for start in range(0, len(items), 512):
            batch = items[start:start + 512]
            column = np.empty(len(batch), dtype=object)
            column[:] = batch
            ds[start:start + len(batch)] = column


def write_flat(path: Path, items: list[np.ndarray], chunk: int) -> None:
    sizes = np.array([len(item) for item in items], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    with h5py.File(path, "w") as f:
        f.create_dataset("offsets", data=offsets)
        ds = f.create_dataset("images", (int(offsets[-1]),), dtype=np.uint8, maxshape=(None,), chunks=(chunk,))
        ds[:] = np.concatenate(items)


def time_reads(path: Path, flat: bool, order: np.ndarray, items: list[np.ndarray]) -> float:
    with h5py.File(path, "r", locking=False) as f:
        images = f["images"]
        offsets = f["offsets"][:] if flat else None
        started = time.perf_counter()
        for i in order:
            if offsets is not None:
                data = images[offsets[i]:offsets[i + 1]]
            else:
                data = images[i]
        elapsed = time.perf_counter() - started
        assert np.array_equal(data, items[order[-1]])
    return len(order) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--mean-kb", type=float, default=110.0)
    parser.add_argument("--reads", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    items = payloads(args.count, args.mean_kb, args.seed)
    order = np.random.default_rng(args.seed + 1).integers(0, args.count, args.reads)
    print(f"{args.count} payloads, mean {np.mean([len(i) for i in items]) / 1000:.1f} KB; {args.reads} random reads")
    with tempfile.TemporaryDirectory() as tmp:
        layouts: list[tuple[str, Path, bool]] = [("vlen uint8 (baseline)", Path(tmp) / "vlen.h5", False)]
        write_vlen(layouts[0][1], items)
        for chunk_kib in (32, 64, 256):
            path = Path(tmp) / f"flat{chunk_kib}.h5"
            write_flat(path, items, chunk_kib * 1024)
            layouts.append((f"flat + offsets, {chunk_kib} KiB chunks", path, True))
        baseline = 0.0
        for name, path, flat in layouts:
            time_reads(path, flat, order[:200], items)  # warm the page cache
            rate = time_reads(path, flat, order, items)
            baseline = baseline or rate
            size = path.stat().st_size / 1e6
            print(f"  {name:34s} {rate:9.0f} reads/s  x{rate / baseline:5.2f}  file {size:7.1f} MB")


if __name__ == "__main__":
    main()
