"""DDP training with checkpoints that resume mid-epoch, then a distributed evaluation.

    torchrun --nproc_per_node=NUM_GPUS examples/train.py train.lmdb val.lmdb
    torchrun --nproc_per_node=2 examples/train.py train.lmdb val.lmdb   # no GPU: gloo, same code

Reads any dataset `pack` wrote (LMDB, HDF5 or WebDataset). Run it again after an interruption and
it resumes from the checkpoint, skipping the batches already trained on (it says so; `--fresh`
starts over). Rank 0 prints the loss and throughput as it goes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from PIL import Image

import readers


def to_input(image: Image.Image) -> torch.Tensor:  # -> float CHW tensor of one size, so batches stack
    array = np.asarray(image.resize((64, 64)), dtype=np.float32) / 255
    return torch.from_numpy(array).permute(2, 0, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("train", help="packed training set")
    parser.add_argument("val", help="packed validation set")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--checkpoint", default="checkpoint.pt")
    parser.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints")
    parser.add_argument("--log-every", type=int, default=50, help="steps between progress lines")
    parser.add_argument("--fresh", action="store_true", help="start over, ignoring (and replacing) a checkpoint")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")  # rank and world size from torchrun's environment
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    train = readers.open_dataset(args.train, transform=to_input)
    loader = readers.make_loader(train, batch_size=args.batch_size, seed=0)  # rank and world size from torch.distributed
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(16, len(train.classes))).to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    start_epoch = 0
    lead = dist.get_rank() == 0  # the one rank that prints and saves (the loader state is the same on every rank)
    if os.path.exists(args.checkpoint) and not args.fresh:  # resume mid-epoch: the loader skips what was trained on
        state = torch.load(args.checkpoint, map_location="cpu")
        try:
            loader.load_state_dict(state["loader"])
        except ValueError as exc:  # another dataset, batch size or world size
            sys.exit(f"{args.checkpoint}: {exc}; pass --fresh to start over, or another --checkpoint")
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["loader"]["epoch"]
        if lead:
            print(f"resuming from {args.checkpoint}: epoch {start_epoch + 1}, after batch {state['loader']['batches']} "
                  f"of {len(loader)} (--fresh starts over)", flush=True)

    batches = readers.CudaPrefetcher(loader, device)  # passes batches through without CUDA
    for epoch in range(start_epoch, args.epochs):
        batches.set_epoch(epoch)  # a new order per epoch; keeps a resumed position in this epoch
        first = batches.state_dict()["batches"] + 1  # 1 unless resuming inside this epoch
        started, seen, loss_sum = time.perf_counter(), 0, torch.zeros((), device=device)
        for step, (images, labels) in enumerate(batches, start=first):
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += len(labels)
            loss_sum += loss.detach() * len(labels)
            if lead and (step % args.log_every == 0 or step == len(loader)):
                rate = seen * dist.get_world_size() / (time.perf_counter() - started)
                print(f"epoch {epoch + 1}/{args.epochs} step {step}/{len(loader)}: loss {loss.item():.3f}, "
                      f"{rate:.0f} images/s", flush=True)
            if step % args.checkpoint_every == 0 and lead:
                state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                         "loader": batches.state_dict()}
                torch.save(state, args.checkpoint + ".tmp")
                os.replace(args.checkpoint + ".tmp", args.checkpoint)
        if lead and seen:
            elapsed = time.perf_counter() - started
            print(f"epoch {epoch + 1}/{args.epochs} done: mean loss {loss_sum.item() / seen:.3f} on rank 0, "
                  f"{seen * dist.get_world_size()} images in {elapsed:.1f} s", flush=True)

    # Evaluation: every sample exactly once over all ranks; `mask` is False for padding.
    val = readers.make_loader(readers.open_dataset(args.val, transform=to_input), 256, mode="eval")
    totals = torch.zeros(2, device=device)
    model.eval()
    with torch.no_grad():
        for (images, labels), mask in readers.CudaPrefetcher(val, device):
            hits = (model(images).argmax(1) == labels) & mask
            totals += torch.stack([hits.sum(), mask.sum()]).float()
    dist.all_reduce(totals)
    if dist.get_rank() == 0:
        print(f"accuracy {totals[0] / totals[1]:.3f} on {int(totals[1])} images")
    dist.barrier()  # no rank tears the process group down while another still uses it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
