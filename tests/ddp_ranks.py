"""What one DDP rank does in the loader tests; runs in processes started by torch.multiprocessing.spawn.

Each rank reads through make_loader with rank and world size taken from torch.distributed, does
one collective per batch (uneven batch counts would hang there until the timeout), and writes
what it saw to OUT/rank<N>.json for the test process to check.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import readers

SEED = 7
BATCH = 3
RESUME_AFTER = 2


def _loader(root: str, **kwargs: object) -> readers.PackedLoader:
    dataset = readers.open_dataset(root, decode="bytes", fields=("index", "image", "path"))
    return readers.make_loader(dataset, BATCH, seed=SEED, num_workers=0, **kwargs)  # type: ignore[arg-type]


def _step() -> None:
    dist.all_reduce(torch.ones(1))


def run_rank(rank: int, world_size: int, init_file: str, root: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    try:
        loader = _loader(root)
        result: dict[str, object] = {"rank": loader.rank, "world_size": loader.world_size, "len": len(loader)}
        epochs = []
        samples = []
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            batches = []
            for index, images, paths in loader:
                _step()
                batches.append(index.tolist())
                if epoch == 0:
                    samples += [[p, hashlib.sha256(data).hexdigest()] for p, data in zip(paths, images)]
            epochs.append(batches)
        result["epochs"] = epochs
        result["samples"] = samples

        loader.set_epoch(1)
        head = []
        for number, (index, _, _) in enumerate(loader, start=1):
            _step()
            head.append(index.tolist())
            if number == RESUME_AFTER:
                break
        state = loader.state_dict()
        fresh = _loader(root)
        fresh.load_state_dict(state)
        fresh.set_epoch(state["epoch"])  # what a training loop does after resuming: keeps the position
        tail = []
        for index, _, _ in fresh:
            _step()
            tail.append(index.tolist())
        result["state"] = state
        result["resumed"] = head + tail

        evaluation = _loader(root, mode="eval", drop_last=True)
        real = []
        for (index, _, _), mask in evaluation:
            _step()
            real += index[mask].tolist()
        result["eval_real"] = real
        result["eval_padding"] = evaluation.num_padding
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


STREAM_WORKERS = 2


def _streaming(url: str, cache_dir: str, limit: int | None = None, **kwargs: object) -> readers.PackedLoader:
    dataset = readers.open_dataset(url, decode="bytes", fields=("index", "image"), cache_dir=cache_dir,
                                   cache_limit=limit)
    # fork: a process started by spawn would start its DataLoader workers by spawn too (seconds each)
    return readers.make_loader(dataset, BATCH, seed=SEED, streaming=True, num_workers=STREAM_WORKERS,  # type: ignore[arg-type]
                               shuffle_buffer=4, multiprocessing_context=multiprocessing.get_context("fork"), **kwargs)


def _indexes(loader: readers.PackedLoader) -> list[list[int]]:
    batches = []
    for index, _ in loader:
        _step()
        batches.append(index.tolist())
    return batches


def run_streaming_rank(rank: int, world_size: int, init_file: str, url: str, cache_dir: str, tight_url: str,
                       tight_cache_dir: str, tight_limit: int, out: str) -> None:
    """Stream one remote dataset with 2 workers through a cache shared with the other rank: two epochs
    (bytes digested in the first), a resume mid-epoch, an eval pass; then the same dataset at another
    URL through a cache too small for it."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    try:
        loader = _streaming(url, cache_dir)
        result: dict[str, object] = {"len": len(loader)}
        epochs = []
        samples = []
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            batches = []
            for index, images in loader:
                _step()
                batches.append(index.tolist())
                if epoch == 0:
                    samples += [[i, hashlib.sha256(data).hexdigest()] for i, data in zip(index.tolist(), images)]
            epochs.append(batches)
        result["epochs"] = epochs
        result["samples"] = samples

        loader.set_epoch(1)
        head = []
        for index, _ in loader:
            _step()
            head.append(index.tolist())
            if len(head) == RESUME_AFTER:
                break
        fresh = _streaming(url, cache_dir)
        fresh.load_state_dict(loader.state_dict())
        result["resumed"] = head + _indexes(fresh)

        real = []
        for (index, _), mask in _streaming(url, cache_dir, mode="eval"):
            _step()
            real += index[mask].tolist()
        result["eval_real"] = real

        tight = _streaming(tight_url, tight_cache_dir, tight_limit, interleave=1)  # the least room streaming takes
        result["tight"] = []
        for epoch in (0, 1):
            tight.set_epoch(epoch)
            result["tight"].append(_indexes(tight))  # type: ignore[attr-defined]
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()
