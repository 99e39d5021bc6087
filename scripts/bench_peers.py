"""Streaming from a slow S3 store, side by side with the peers: our `make_loader(streaming=True)`
against LitData's StreamingDataset/StreamingDataLoader and MosaicML Streaming's StreamingDataset.

    bash scripts/bench_peers.sh [--images 10000] [--delay-ms 20] [--rounds 5] [--cold-rounds 1] [--mix 4,1]
        [--peers litdata,mds]

Run by scripts/bench_peers.sh in a venv of its own (.venv-peers), which holds the peers beside our
tree. Every loader writes its own format from the same folder of `--images` generated ~33 KB JPEGs
(`bench_read.small_jpeg`) in 8 MB shards (`pack wds --shard-bytes 8MB`, LitData `optimize(chunk_bytes=)`,
MDS `MDSWriter(size_limit=)`, each as image bytes and an int label), uploads it to one loopback S3
(moto, in a process of its own, `--delay-ms` before each request), and reads it back with 2
DataLoader workers, batches of 64, bytes only (no decode), shuffled. Each loader's cache starts
empty: its first epoch is the cold one (`--cold-rounds` rounds of them, interleaved, each loader made
anew with an empty cache, medians); then `--rounds` rounds of one warm epoch per loader of the last
cold round, interleaved (load from other jobs falls on all alike), reported as medians. Per epoch: samples/s
over the whole epoch, seconds to the first batch, and samples per CPU-second of this process and
its children (the store excluded), which other load on the machine moves less.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import bench_read
import benchlib
from bench_remote import serve_s3

import readers
from packer.run.pipeline import pack
from packer.plan.options import PackOptions
from readers.cache import format_size

SHARD_BYTES = 8_000_000
BUCKET = "bench"


def stub_torchvision() -> None:
    """MosaicML Streaming imports torchvision for its vision datasets, which are not used here; the
    torchvision wheels this machine can install are CUDA builds tied to another torch. An empty
    stand-in lets `import streaming` work with our CPU torch (LitData checks torchvision's
    installed metadata, which a stand-in does not have, and so does not use it)."""
    try:
        import torchvision  # noqa: F401
        return
    except ImportError:
        pass

    def module(name: str) -> types.ModuleType:
        made = types.ModuleType(name)
        made.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = made
        return made

    module("torchvision")
    module("torchvision.datasets").VisionDataset = type("VisionDataset", (), {})
    module("torchvision.transforms")
    module("torchvision.transforms.functional").to_tensor = lambda image: None


def cpu_seconds(exclude: int) -> float:
    """CPU time of this process, its live children but `exclude` (the store) and its reaped ones."""
    live = [pid for pid in benchlib.children(os.getpid()) if pid != exclude]
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + bench_read.cpu_seconds(
        [pid for pid in live if Path(f"/proc/{pid}").exists()]) + reaped.ru_utime + reaped.ru_stime


class Epoch:
    """One epoch's figures: samples/s over the whole epoch, seconds to the first batch, samples per CPU-s."""

    def __init__(self, batches: Iterable[Any], count: Callable[[Any], int], store_pid: int) -> None:
        cpu = cpu_seconds(store_pid)
        started = time.perf_counter()
        self.first = 0.0
        self.samples = 0
        for batch in batches:
            if self.samples == 0:
                self.first = time.perf_counter() - started
            self.samples += count(batch)
        elapsed = time.perf_counter() - started
        self.rate = self.samples / elapsed
        self.per_cpu = self.samples / max(1e-9, cpu_seconds(store_pid) - cpu)


# Writing each format -----------------------------------------------------------------------------


def samples(source: Path) -> list[tuple[str, int]]:
    from packer.plan.scan import scan

    listing = scan(source)
    return [(str(source / path), int(label)) for path, label in zip(listing.paths, listing.labels)]


def litdata_sample(item: tuple[str, int]) -> dict[str, Any]:
    path, label = item
    return {"image": Path(path).read_bytes(), "label": label}


def write_ours(source: Path, out: Path) -> None:
    pack(source, out, PackOptions(format="wds", shard_bytes=SHARD_BYTES))


def write_litdata(source: Path, out: Path) -> None:
    from litdata import optimize

    optimize(fn=litdata_sample, inputs=samples(source), output_dir=str(out), chunk_bytes=SHARD_BYTES,
             num_workers=2, mode="overwrite")


def write_mds(source: Path, out: Path) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"image": "bytes", "label": "int"}, size_limit=SHARD_BYTES) as writer:
        for path, label in samples(source):
            writer.write({"image": Path(path).read_bytes(), "label": label})


WRITERS: dict[str, Callable[[Path, Path], None]] = {"ours": write_ours, "litdata": write_litdata, "mds": write_mds}


def written(source: Path, work: Path, name: str, images: int) -> Path:
    """The format `name` of the source under work/written/name, written once per source."""
    out = work / "written" / name
    marker = out.parent / f"{name}.done"
    if not marker.exists() or marker.read_text() != str(images):
        shutil.rmtree(out, ignore_errors=True)
        marker.unlink(missing_ok=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        WRITERS[name](source, out)
        marker.write_text(str(images))
    return out


# Reading each format -----------------------------------------------------------------------------


def batch_len(batch: Any) -> int:
    if isinstance(batch, dict):
        return len(batch["label"])
    # each one's default collate: columns, labels last; collate_fn=list: the samples
    return len(batch[1]) if hasattr(batch[1], "shape") else len(batch)


class Loader:
    """A loader kept across epochs, so warm epochs reuse its workers and cache as training would."""

    name: str
    collate = "default"  # the collate it runs with: 'default' (its own) or 'list'

    def epoch(self, number: int) -> Iterator[Any]:
        raise NotImplementedError


class Ours(Loader):
    def __init__(self, url: str, cache: Path, storage: dict[str, Any], args: argparse.Namespace, mix: int,
                 collate: str) -> None:
        self.name, self.collate = f"ours, interleave={mix}" + CUSTOM_SUFFIX[collate], collate
        dataset = readers.open_dataset(url, decode="bytes", fields=("image", "label"), cache_dir=cache,
                                       storage_options=storage)
        self.loader = readers.make_loader(dataset, args.batch_size, num_workers=args.workers, seed=0,
                                          streaming=True, interleave=mix,
                                          collate_fn=list if collate == "list" else None)

    def epoch(self, number: int) -> Iterator[Any]:
        self.loader.set_epoch(number)
        return iter(self.loader)


def allow_http_obstore() -> None:
    """LitData downloads chunks with obstore, which refuses a plain-http endpoint (the loopback
    store; "HTTP error: builder error ... BadScheme") unless told `allow_http`; LitData does not
    pass client options, so its S3Store is made with that one added. Workers fork and inherit it."""
    import obstore.store

    made = obstore.store.S3Store

    def s3_store(*args: Any, client_options: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        return made(*args, client_options={"allow_http": True, **(client_options or {})}, **kwargs)

    obstore.store.S3Store = s3_store  # type: ignore[misc]


def litdata_collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """LitData hands `bytes` columns over as memoryviews of its chunk, which neither collate nor
    pickle to the main process: the bytes, and the labels as a tensor, as default_collate gives ours."""
    import torch

    return {"image": [bytes(item["image"]) for item in items],
            "label": torch.tensor([item["label"] for item in items])}


def litdata_list(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`collate_fn=list` for LitData: its items as they are, a list of dicts, with the image bytes
    (a memoryview would not pickle to the main process)."""
    return [{"image": bytes(item["image"]), "label": item["label"]} for item in items]


CUSTOM_SUFFIX = {"default": "", "list": ", collate_fn=list"}


class LitData(Loader):
    def __init__(self, url: str, cache: Path, storage: dict[str, Any], args: argparse.Namespace,
                 collate: str) -> None:
        from litdata import StreamingDataLoader, StreamingDataset

        self.name, self.collate = "LitData" + CUSTOM_SUFFIX[collate], collate

        allow_http_obstore()

        dataset = StreamingDataset(url, cache_dir=str(cache), shuffle=True, seed=0, storage_options={
            "endpoint_url": storage["client_kwargs"]["endpoint_url"], "aws_access_key_id": storage["key"],
            "aws_secret_access_key": storage["secret"], "region_name": "us-east-1"})
        self.loader = StreamingDataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers,
                                          persistent_workers=True,
                                          collate_fn=litdata_list if collate == "list" else litdata_collate)

    def epoch(self, number: int) -> Iterator[Any]:
        return iter(self.loader)  # the loader counts its epochs itself


class Mds(Loader):
    name = "MosaicML Streaming"

    def __init__(self, url: str, cache: Path, storage: dict[str, Any], args: argparse.Namespace) -> None:
        from streaming import StreamingDataset
        from torch.utils.data import DataLoader

        os.environ["S3_ENDPOINT_URL"] = storage["client_kwargs"]["endpoint_url"]
        dataset = StreamingDataset(remote=url, local=str(cache), shuffle=True, shuffle_seed=0,
                                   batch_size=args.batch_size)
        self.loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers,
                                 persistent_workers=True)

    def epoch(self, number: int) -> Iterator[Any]:
        return iter(self.loader)  # the dataset counts its epochs itself


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=10000)
    parser.add_argument("--delay-ms", type=float, default=20.0, help="the store's delay before each request")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="warm epochs of each loader, interleaved")
    parser.add_argument("--cold-rounds", type=int, default=1,
                        help="cold epochs of each loader, interleaved, each of a new loader with an empty cache")
    parser.add_argument("--mix", default="4,1", help="our loader once per interleave value")
    parser.add_argument("--peers", default="litdata,mds", help="which peers to run (none: '')")
    parser.add_argument("--collate", default="default,list",
                        help="ours and LitData once per collate: 'default' (each one's), 'list' (collate_fn=list, "
                             "a custom collate as detection and captioning loaders have; MDS runs with 'default' only)")
    parser.add_argument("--work", default="/tmp/pack-bench-peers")
    args = parser.parse_args()
    peers = [name for name in args.peers.split(",") if name]
    stub_torchvision()
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"})

    work = Path(args.work)
    source = work / "src"
    bench_read.make_source(source, args.images, image=bench_read.small_jpeg)
    start_method = multiprocessing.get_start_method()
    folders = {name: written(source, work, name, args.images) for name in ("ours", *peers)}
    # LitData's optimize() sets spawn for the whole process: its loader's workers would then start
    # without the obstore `allow_http` patch below (GETs fail with "builder error ... BadScheme").
    multiprocessing.set_start_method(start_method, force=True)
    sizes = {name: sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
             for name, folder in folders.items()}

    context = multiprocessing.get_context("spawn")
    queue, stop = context.Queue(), context.Event()
    store = context.Process(target=serve_s3, args=(args.delay_ms / 1000, None, queue, stop))
    store.start()
    try:
        storage = queue.get(timeout=60)
        os.environ["AWS_ENDPOINT_URL"] = storage["client_kwargs"]["endpoint_url"]
        import s3fs

        fs = s3fs.S3FileSystem(**storage, skip_instance_cache=True)
        fs.call_s3("create_bucket", Bucket=BUCKET)
        for name, folder in folders.items():
            fs.put(str(folder) + "/", f"{BUCKET}/{name}/", recursive=True)
        caches = work / "caches"
        shutil.rmtree(caches, ignore_errors=True)
        makers: list[Callable[[Path], Loader]] = []
        for collate in args.collate.split(","):
            for mix in (int(value) for value in args.mix.split(",")):
                makers.append(lambda cache, mix=mix, collate=collate: Ours(
                    f"s3://{BUCKET}/ours", cache / f"ours-{mix}-{collate}", storage, args, mix, collate))
            if "litdata" in peers:
                makers.append(lambda cache, collate=collate: LitData(
                    f"s3://{BUCKET}/litdata", cache / f"litdata-{collate}", storage, args, collate))
        if "mds" in peers:
            makers.append(lambda cache: Mds(f"s3://{BUCKET}/mds", cache / "mds", storage, args))
        print(f"{args.images} JPEGs; formats: " + ", ".join(f"{name} {format_size(size)}" for name, size in sizes.items()))
        print(f"store: loopback S3, {args.delay_ms:g} ms per request; {args.workers} workers, batches of "
              f"{args.batch_size}, bytes only; {args.cold_rounds} cold and {args.rounds} warm rounds, interleaved; "
              "load average " + " ".join(f"{load:.2f}" for load in os.getloadavg()))
        cold: dict[str, list[Epoch]] = {}
        for round_ in range(args.cold_rounds):  # each a new loader with an empty cache; the last ones stay
            loaders = [make(caches / f"cold-{round_}") for make in makers]
            for loader in loaders[round_ % len(loaders):] + loaders[:round_ % len(loaders)]:
                epoch = Epoch(loader.epoch(0), batch_len, store.pid)
                assert epoch.samples >= args.images, (loader.name, epoch.samples)
                cold.setdefault(loader.name, []).append(epoch)
                print(f"  cold {round_ + 1}: {loader.name:<22} {epoch.rate:8.0f}/s first batch {epoch.first:6.3f} s "
                      f"{epoch.per_cpu:8.0f}/CPU-s", flush=True)
            if round_ + 1 < args.cold_rounds:
                del loaders, loader  # their workers end with them
                shutil.rmtree(caches / f"cold-{round_}", ignore_errors=True)
        figures: dict[str, list[Epoch]] = {loader.name: [] for loader in loaders}
        for round_ in range(1, args.rounds + 1):
            turn = loaders[round_ % len(loaders):] + loaders[:round_ % len(loaders)]
            for loader in turn:
                epoch = Epoch(loader.epoch(round_), batch_len, store.pid)
                assert epoch.samples >= args.images, (loader.name, epoch.samples)
                figures[loader.name].append(epoch)
                print(f"  warm {round_}: {loader.name:<22} {epoch.rate:8.0f}/s "
                      f"first batch {epoch.first:6.3f} s  {epoch.per_cpu:8.0f}/CPU-s", flush=True)
    finally:
        stop.set()
        store.join()
    print("load average at the end: " + " ".join(f"{load:.2f}" for load in os.getloadavg()))
    report(cold, figures, {loader.name: loader.collate for loader in loaders})


def report(cold: dict[str, list[Epoch]], figures: dict[str, list[Epoch]], collates: dict[str, str]) -> None:
    """Medians: cold over the cold rounds, warm over the warm ones; ours against each peer of the
    same collate, paired per round (cold round k of each against the other's)."""
    def median(epochs: list[Epoch], key: Callable[[Epoch], float]) -> float:
        return statistics.median(key(epoch) for epoch in epochs) if epochs else float("nan")

    def paired(mine: list[Epoch], peer: list[Epoch]) -> str:
        ratios = [a.rate / b.rate for a, b in zip(mine, peer)]
        return f"median {statistics.median(ratios):.2f} (rounds {', '.join(f'{ratio:.2f}' for ratio in ratios)})"

    print(f"\n{'loader':<38}{'cold /s':>9}{'cold 1st s':>11}{'cold /CPU-s':>12}{'warm /s':>9}{'warm 1st s':>11}"
          f"{'warm /CPU-s':>12}")
    for name in cold:
        warm = figures[name]
        print(f"{name:<38}{median(cold[name], lambda epoch: epoch.rate):>9.0f}"
              f"{median(cold[name], lambda epoch: epoch.first):>11.3f}"
              f"{median(cold[name], lambda epoch: epoch.per_cpu):>12.0f}"
              f"{median(warm, lambda epoch: epoch.rate):>9.0f}{median(warm, lambda epoch: epoch.first):>11.3f}"
              f"{median(warm, lambda epoch: epoch.per_cpu):>12.0f}")
    for mine in (name for name in cold if name.startswith("ours")):  # against each peer, same collate
        for peer in (name for name in cold if not name.startswith("ours") and collates[name] == collates[mine]):
            warm = f"warm, paired per round, {paired(figures[mine], figures[peer])}; " if figures[mine] else ""
            print(f"{mine} / {peer}: {warm}cold, paired per round, {paired(cold[mine], cold[peer])}")
    print("per round, samples/s: cold " + json.dumps({name: [round(epoch.rate) for epoch in epochs]
                                                      for name, epochs in cold.items()})
          + "; warm " + json.dumps({name: [round(epoch.rate) for epoch in epochs] for name, epochs in figures.items()}))

if __name__ == "__main__":
    main()
