"""`pack info`: what a packed dataset holds, from its manifest plus a sample of its records."""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict
from typing import Any

from readers.datasets import open_dataset
from readers.stores import read_manifest, read_strategy

from ..plan.options import PackOptions
from .dataset import small_cache, stored_size

SIZE_SAMPLE = 1000


def describe(out: str | os.PathLike[str]) -> dict[str, Any]:
    """A JSON-ready description; image sizes come from up to SIZE_SAMPLE evenly spaced samples
    (of a URL, read shard by shard through a temporary cache of three shards)."""
    manifest = read_manifest(out)
    shard_bytes = [shard.bytes for shard in manifest.shards]
    total = sum(shard_bytes)
    classes = manifest.classes
    counts = manifest.class_counts or [0] * len(classes)
    with small_cache(out, manifest, "info") as remote:
        sizes = image_sizes(out, manifest.num_samples, **remote)
    return {
        "path": str(out),
        "format": manifest.format,
        "store": manifest.store,
        "num_samples": manifest.num_samples,
        "classes": [{"index": i, "name": name, "samples": counts[i]} for i, name in enumerate(classes)],
        "shards": len(manifest.shards),
        "bytes": total,
        "source_bytes": manifest.source_bytes,  # None for manifests written before it was recorded
        "shard_bytes": {"min": min(shard_bytes, default=0), "median": int(statistics.median(shard_bytes or [0])),
                        "max": max(shard_bytes, default=0)},
        "bytes_per_sample": total / manifest.num_samples if manifest.num_samples else 0,
        "image_sizes": sizes,
        "fields": [spec.to_dict() for spec in manifest.fields],
        "options": manifest.options,
        "parts": manifest.parts,  # one per pack or append (`pack --append`); [] for a dataset packed once
        "tool_version": manifest.tool_version,
        "read": read_strategy(out),  # how open_dataset reads it by default, and why
        # classes the median shard holds, and a shuffled pack's would; null where not recorded
        "class_mixing": None if (mixing := manifest.class_mixing()) is None else
        {"shard_classes": mixing[0], "shuffled_classes": round(mixing[1], 1), "class_sorted": manifest.class_sorted()},
    }


def image_sizes(out: str | os.PathLike[str], num_samples: int, **remote: Any) -> dict[str, Any]:
    """min/median/max of width, height and pixels, read from image headers (no full decode)."""
    if not num_samples:
        return {}
    dataset = open_dataset(out, decode="bytes", fields=("image",), **remote)
    step = max(1, num_samples // SIZE_SAMPLE)
    widths, heights = [], []
    try:
        for index in range(0, num_samples, step):
            size = stored_size(*dataset.record(index))
            if size is not None:
                widths.append(size[0])
                heights.append(size[1])
    finally:
        dataset.close()
    if not widths:
        return {}
    pixels = [w * h for w, h in zip(widths, heights)]
    return {
        "sampled": len(widths),
        **{name: {"min": min(values), "median": statistics.median(values), "max": max(values)}
           for name, values in (("width", widths), ("height", heights), ("pixels", pixels))},
    }


def non_default_options(options: dict[str, Any]) -> dict[str, Any]:
    """The recorded options a plain `pack FORMAT SRC OUT` would not have given, `format` aside (the
    first line says it): the TFRecord keys of a folder pack, or every None, say nothing."""
    defaults = json.loads(json.dumps(asdict(PackOptions(format=options.get("format", "lmdb"),
                                                        store=options.get("store", "original")))))
    return {key: value for key, value in options.items()
            if key != "format" and (key not in defaults or value != defaults[key])}
