"""Torch datasets for packed image shards. Imports nothing from `packer`.

The manifest contract (`readers.manifest`) imports no torch, so the packer can share it without
paying torch's start-up; the dataset classes load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .manifest import DatasetChanged, DatasetError, Manifest, load_manifest

_LAZY = {
    "DATASETS": "readers.datasets",
    "open_dataset": "readers.datasets",
    "Dataset": "readers.base",
    "PackedDataset": "readers.base",
    "LMDBDataset": "readers.lmdb",
    "HDF5Dataset": "readers.hdf5",
    "WdsDataset": "readers.wds",
    "WdsStream": "readers.streaming",
    "make_loader": "readers.loader",
    "PackedLoader": "readers.loader",
    "StreamingLoader": "readers.loader",
    "ShardStream": "readers.streaming",
    "ShardCache": "readers.cache",
    "ShardWindowBatchSampler": "readers.loader",
    "CudaPrefetcher": "readers.prefetch",
    "default_num_workers": "readers.cpus",
    "epoch_order": "readers.read_order",
    "mix": "readers.mixed",
    "MixedDataset": "readers.mixed",
    "RandomResizedCrop": "readers.transforms",
}



def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'readers' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["DatasetChanged", "DatasetError", "Manifest", "load_manifest", *_LAZY]
