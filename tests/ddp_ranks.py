"""What one DDP rank does in the loader tests; runs in processes started by torch.multiprocessing.spawn.

Each rank reads through make_loader with rank and world size taken from torch.distributed, does
one collective per batch (uneven batch counts would hang there until the timeout), and writes
what it saw to OUT/rank<N>.json for the test process to check.
"""

from __future__ import annotations

import hashlib
import json
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
