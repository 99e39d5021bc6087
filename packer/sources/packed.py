"""A dataset `pack` made, as SRC: any format and store in, any out (`pack wds train.lmdb/ out.wds`).

The listing comes from index.json alone (no sample is read to plan): one entry per stored
sample, located by its index in the dataset; sizes are the shard's bytes shared out evenly,
since only they shape shards. Each sample is read through `readers` (checked against its
CRC-32): stored bytes pass through unchanged, a `raw` store's pixels come as a lossless PNG to
re-encode, labels, paths and fields carry over. A damaged sample is a reject naming the input
shard and sample.
"""

from __future__ import annotations

import io
import threading
from array import array
from typing import Any

from readers.fields import encode_value
from readers.manifest import DatasetError
from readers.stores import read_manifest

from ..errors import RejectedFile
from ..plan.options import PackOptions
from .classes import ClassMap, read_classes
from .inputs import Record, ShardPlan, Source
from .listing import UNLABELLED, Listing, ScanError


def scan(source: Source, options: PackOptions) -> Listing:
    try:
        manifest = read_manifest(source.root)
    except DatasetError as exc:
        raise ScanError(str(exc)) from None
    classes = read_classes(options.classes) if options.classes else list(manifest.classes)
    listing = Listing(root=source.root, classes=classes, locations=array("q"), fields=list(manifest.fields))
    index = 0
    for shard in manifest.shards:
        size = shard.bytes // max(shard.num_samples, 1)
        for local in range(shard.num_samples):
            listing.paths.append(f"{shard.name}/{local}")
            listing.labels.append(UNLABELLED)  # read with the sample
            listing.sizes.append(size)
            listing.locations.extend((0, index, size))
            index += 1
    return listing


class PackedReader:
    """One `readers` dataset per shard task, shared by the reader threads under a lock (an LMDB
    environment opens once per process; a tar handle has one file position)."""

    def __init__(self, plan: ShardPlan) -> None:
        import readers  # here: torch loads only in tasks that read a packed dataset

        self.root = plan.inputs[0]
        self.names = [spec.name for spec in plan.fields]
        self.specs = {spec.name: spec for spec in plan.fields}
        manifest = read_manifest(self.root)
        self.raw = manifest.store == "raw"
        self.dataset = readers.open_dataset(self.root, decode="numpy" if self.raw else "bytes",
                                            fields=("image", "label", "path", *self.names))
        names = manifest.classes
        relabel = plan.options.classes is not None and names
        self.classes = ClassMap(plan.classes, plan.options.classes) if relabel else None
        self.input_classes = names
        self.lock = threading.Lock()

    def __call__(self, input: int, offset: int, length: int) -> Record:
        try:
            with self.lock:
                image, label, path, *values = self.dataset[offset]
        except DatasetError as exc:
            raise RejectedFile(str(exc)) from None
        if self.raw:
            image = png_bytes(image)
        if self.classes is not None and label != UNLABELLED:
            label = self.classes.index(self.input_classes[label])
            if isinstance(label, str):
                raise RejectedFile(label)
        fields = {}
        for name, value in zip(self.names, values):
            if value is not None:
                fields[name] = encode_value(self.specs[name], plain(value))
        return Record(image=bytes(image), label=int(label), fields=fields, image_name=f"sample {offset}", path=path)

    def close(self) -> None:
        self.dataset.close()


def plain(value: Any) -> Any:
    """numpy arrays and scalars (HDF5 columns, array fields) as the JSON values they were packed from."""
    return value.tolist() if hasattr(value, "tolist") else value


def png_bytes(pixels: Any) -> bytes:
    """Raw HWC pixels as a PNG, so they go through the same checks and encoders as any image."""
    from PIL import Image

    array_ = pixels[:, :, 0] if pixels.ndim == 3 and pixels.shape[2] == 1 else pixels
    buffer = io.BytesIO()
    Image.fromarray(array_).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def open_reader(plan: ShardPlan) -> PackedReader:
    return PackedReader(plan)
