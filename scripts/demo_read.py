"""Read every packed dataset of the demo back and check it against the source folder."""

from __future__ import annotations

import sys
from pathlib import Path

import readers


def check(out: Path, src: Path) -> None:
    ds = readers.open_dataset(out, decode="bytes", fields=("image", "label", "path"))
    mismatches = sum(1 for data, _, path in ds if (src / path).read_bytes() != data)
    image, label = readers.open_dataset(out, decode="tensor")[0]
    print(
        f"  {out.name:10s} {ds.manifest.format:5s} {len(ds)} samples, {len(ds.manifest.shards)} shards, "
        f"classes={ds.classes}; sample 0: tensor {tuple(image.shape)} label {label}; "
        f"byte-identical to source: {len(ds) - mismatches}/{len(ds)}"
    )
    if mismatches:
        sys.exit(f"{out}: {mismatches} samples differ from the source")


if __name__ == "__main__":
    src = Path(sys.argv[1])
    for out in sys.argv[2:]:
        check(Path(out), src)
