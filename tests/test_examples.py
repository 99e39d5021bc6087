"""examples/train.py, the README's DDP training loop, run as torchrun would: 2 gloo ranks on CPU."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable

import torch

TRAIN = Path(__file__).parents[1] / "examples" / "train.py"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


EXIT_ABORT = "terminate called without an active exception"
"""What a rank prints when C++ aborts it in interpreter shutdown, after its work is done (seen about
once in 150 runs, no Python frame on the stack): a run that ends so is run once more."""


def run_ranks(command: list[str], env: dict[str, str], world: int, cwd: Path, checkpoint: Path) -> list[tuple[str, str]]:
    """(stdout, stderr) of each rank of `command`, started as torchrun would; every rank must exit 0.
    A run that aborted at exit is run again from the checkpoint it started from."""
    before = checkpoint.read_bytes() if checkpoint.exists() else None
    for attempt in (1, 2):
        if attempt == 2:
            checkpoint.unlink(missing_ok=True)
            if before is not None:
                checkpoint.write_bytes(before)
        env = {**env, "MASTER_PORT": str(free_port())}
        ranks = [subprocess.Popen(command, env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}, cwd=cwd,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(world)]
        try:
            outputs = [rank.communicate(timeout=120) for rank in ranks]
        finally:
            for rank in ranks:
                rank.kill()
        aborted_at_exit = any(rank.returncode == -6 and EXIT_ABORT in stderr for rank, (_, stderr) in zip(ranks, outputs))
        if not aborted_at_exit or attempt == 2:
            break
    for rank, (_, stderr) in zip(ranks, outputs):
        assert rank.returncode == 0, stderr
    return outputs


def test_train_example_with_two_gloo_ranks(packed_as: Callable[[str], tuple[Path, dict[str, bytes]]],
                                            tmp_path: Path) -> None:
    data, files = packed_as("lmdb")
    checkpoint = tmp_path / "checkpoint.pt"
    world = 2
    # What torchrun sets for each rank; no GPU, so the example picks gloo even where CUDA is present.
    # PYTHONFAULTHANDLER: a rank that aborts (SIGABRT from C++ at exit, seen once in ~150 runs) logs its Python stack.
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world),
           "LOCAL_WORLD_SIZE": str(world), "CUDA_VISIBLE_DEVICES": "", "PYTHONFAULTHANDLER": "1"}
    command = [sys.executable, str(TRAIN), str(data), str(data), "--epochs", "2", "--batch-size", "4",
               "--checkpoint", str(checkpoint), "--checkpoint-every", "2", "--log-every", "2"]
    outputs = run_ranks(command, env, world, tmp_path, checkpoint)
    # Rank 0 prints progress and a line per epoch; evaluation saw every sample exactly once over both ranks.
    lines = outputs[0][0].splitlines()
    assert [line for line in lines if line.startswith("epoch 1/2 step ")] == [
        line for line in lines[:2] if re.fullmatch(r"epoch 1/2 step [23]/3: loss \d+\.\d{3}, \d+ images/s", line)]
    assert re.fullmatch(r"epoch 2/2 done: mean loss \d+\.\d{3} on rank 0, 20 images in \d+\.\d s", lines[-2])
    assert lines[-1].startswith("accuracy ") and lines[-1].endswith(f" on {len(files)} images")
    assert outputs[1][0] == ""
    # 10 samples per rank in batches of 4: 3 steps per epoch, the last checkpoint after step 2 of epoch 1.
    state = torch.load(checkpoint, map_location="cpu")
    assert {key: state["loader"][key] for key in ("epoch", "batches", "world_size")} == {
        "epoch": 1, "batches": 2, "world_size": world}
    # Run again: it says it resumes (here: after the last checkpoint's batch).
    again = run_ranks(command, env, world, tmp_path, checkpoint)
    assert again[0][0].startswith(f"resuming from {checkpoint}: epoch 2, after batch 2 of 3 (--fresh starts over)\n")
