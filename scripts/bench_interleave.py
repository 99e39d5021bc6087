"""How mixed the batches the loaders feed a model are: mean distinct classes per batch, as a
fraction of a global shuffle's, for the map-style and the streaming loader, on a dataset packed in
sorted order (class folders in a row) and on a shuffled pack, with 1, 2, 4 and 8 shards interleaved per
streaming worker.

The loaders' orders are pure functions of (seed, epoch, ranks, workers, options), so this needs no
images: it writes the index.json of a dataset of the given proportions (default: ImageNet's scaled
down, 100 classes x 1,300 images in shards of 10,000) and asks `make_loader(...).indices()` for the
order each loader reads in. A sorted pack's sample i has the label of the i-th sorted path; a
shuffled pack's labels are those in a seeded permutation (what `pack` does to a folder's listing).

    .venv/bin/python scripts/bench_interleave.py [--classes 100 --per-class 1300 --shard-size 10000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

import readers


def fake_dataset(root: Path, sizes: list[int]) -> readers.PackedDataset:
    """A dataset whose index.json alone exists (the loaders' orders never open a shard)."""
    shards = [{"name": f"shard-{i:06d}.lmdb", "num_samples": n, "bytes": 64 * n, "sha256": "0" * 64}
              for i, n in enumerate(sizes)]
    manifest = {"format": "lmdb", "version": 2, "store": "original", "num_samples": sum(sizes), "classes": [],
                "shards": shards}
    (root / "index.json").write_text(json.dumps(manifest))
    return readers.open_dataset(root)


def classes_per_batch(order: np.ndarray, labels: np.ndarray, batch: int) -> float:
    full = len(order) // batch * batch
    batches = labels[order[:full]].reshape(-1, batch)
    return float(np.mean([len(np.unique(row)) for row in batches]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--per-class", type=int, default=1300)
    parser.add_argument("--shard-size", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    total = args.classes * args.per_class
    sizes = [min(args.shard_size, total - start) for start in range(0, total, args.shard_size)]
    sorted_labels = np.repeat(np.arange(args.classes), args.per_class)
    packs = {"sorted": sorted_labels, "shuffled": np.random.default_rng(0).permutation(sorted_labels)}
    with tempfile.TemporaryDirectory() as folder:
        dataset = fake_dataset(Path(folder), sizes)
        rng = np.random.default_rng(1)
        global_mix = np.mean([classes_per_batch(rng.permutation(total), sorted_labels, args.batch_size)
                              for _ in range(args.epochs)])
        print(f"{args.classes} classes x {args.per_class}, {len(sizes)} shards of {args.shard_size}, batches of "
              f"{args.batch_size}, {args.workers} workers: a global shuffle gives {global_mix:.1f} classes per batch")
        print(f"{'pack':9s} {'loader':24s} {'classes/batch':>13s} {'fraction':>9s}")
        for pack, labels in packs.items():
            loaders = {"map-style": {}}
            loaders.update({f"streaming, interleave={width}": {"streaming": True, "interleave": width}
                            for width in (1, 2, 4, 8)})
            for name, options in loaders.items():
                loader = readers.make_loader(dataset, args.batch_size, num_workers=args.workers, seed=0, **options)
                mixes = []
                for epoch in range(args.epochs):
                    loader.set_epoch(epoch)
                    mixes.append(classes_per_batch(loader.indices(), labels, args.batch_size))
                mix = float(np.mean(mixes))
                print(f"{pack:9s} {name:24s} {mix:13.1f} {mix / global_mix:9.2f}")


if __name__ == "__main__":
    main()
