"""Remote storage benchmarks: reading from a slow store (`--suite stream`, the default) and packing
into one (`--suite pack`).

    python scripts/bench_remote.py [--images 2000] [--delay-ms 20] [--bandwidth-mb 200] [--workers 2]
    python scripts/bench_remote.py --suite pack [--images 2000] [--shard-size 100] [--delay-ms 20] [--repeats 3]

Stream suite: loose JPEGs, one GET each, against make_loader(streaming=True) over shards.

A loopback HTTP server (scripts/loopback.py, in a process of its own) answers every request after `--delay-ms` (an object
store's first-byte latency) and sends at most `--bandwidth-mb` MB/s per response. Both cases use a
DataLoader with `--workers` workers and hand over the images' bytes undecoded, so the figures are
what the store delivers, not what a JPEG decoder does with it:

- loose: a Dataset of image URLs, one urllib GET per image (what training on an unpacked bucket does);
- streaming, cold: the same images packed as tar shards, read with make_loader(streaming=True) into
  an empty cache; then two more epochs from the warm cache;
- local: the same shards read with make_loader(streaming=True) from local disk (page cache warm).

Goals (issue 13): streaming >= 20x the loose files' samples/s at 20 ms; the warm epoch within 10% of
local. The cache's peak size (sampled every 5 ms) is printed against its limit. Pass a
--cache-limit below the dataset's size to watch eviction keep the cache under it.

Pack suite: a folder packed straight into a loopback S3 (moto, in a process of its own, `--delay-ms`
before each request, request bodies at `--bandwidth-mb` MB/s) against the same folder packed to local
disk and then uploaded by a command running fsspec's recursive `put` (what `aws s3 cp --recursive` does), the two
interleaved `--repeats` times in one run, each a `pack` command with `--workers` workers. Goal (issue 14):
packing to the bucket within 1.3x of packing locally plus the upload.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterable

import bench_read
import benchlib
from loopback import LoopbackHTTP, LoopbackS3, PeakSampler
from torch.utils.data import DataLoader, Dataset

import readers
from packer.run.pipeline import pack
from packer.plan.options import PackOptions
from packer.plan.scan import scan
from readers.cache import format_size, parse_size


class LooseHTTP(Dataset):
    """One GET per image."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, index: int) -> bytes:
        with urllib.request.urlopen(self.urls[index]) as response:
            return response.read()


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far."""
    return bench_read.cpu_seconds([pid for pid in pids if Path(f"/proc/{pid}").exists()])


def timed_epoch(loader: Any, epoch: int, exclude: int) -> tuple[float, float]:
    """One epoch of a streaming loader: (samples/s, samples per CPU-second of this process and its
    children but `exclude` (the store)). The second does not move with other load on the machine."""
    loader.set_epoch(epoch)
    workers = [pid for pid in benchlib.children(os.getpid()) if pid != exclude]
    cpu = time.process_time() + cpu_seconds(workers)
    started = time.perf_counter()
    samples = sum(len(batch[0]) for batch in loader)
    elapsed = time.perf_counter() - started
    workers = [pid for pid in benchlib.children(os.getpid()) if pid != exclude]  # persistent: the same ones
    return samples / elapsed, samples / (time.process_time() + cpu_seconds(workers) - cpu)


def serve(directory: Path, delay_s: float, bandwidth: float, urls: multiprocessing.Queue, stop: Any) -> None:
    """The store, in its own process: it must not compete with the training loop for one GIL."""
    with LoopbackHTTP(directory, delay_s=delay_s, bandwidth=bandwidth) as server:
        urls.put(server.url)
        stop.wait()


def rate(batches: Iterable[Any], count: Any) -> tuple[int, float]:
    started = time.perf_counter()
    samples = sum(count(batch) for batch in batches)
    return samples, samples / (time.perf_counter() - started)


def serve_s3(delay_s: float, bandwidth: float, urls: multiprocessing.Queue, stop: Any) -> None:
    """The bucket, in its own process (see `serve`)."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    with LoopbackS3(delay_s=delay_s, bandwidth=bandwidth) as server:
        urls.put(server.storage_options)
        stop.wait()


def timed(action: Callable[[], Any]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


UPLOAD = "import sys, fsspec; fsspec.filesystem('s3').put(sys.argv[1], sys.argv[2], recursive=True)"
"""The baseline's upload, a command of its own as `aws s3 cp --recursive` is: fsspec's recursive put,
every file in one concurrent batch, the endpoint from FSSPEC_S3 as for `pack`."""


def pack_suite(args: argparse.Namespace) -> None:
    import s3fs

    work = Path(args.work)
    source = work / "src"
    bench_read.make_source(source, args.images)

    def pack_command(out: Path | str) -> list[str]:  # the CLI, as users run it (its workers import no benchmark)
        return [sys.executable, "-m", "packer.cli", args.format, str(source), str(out), "--quiet",
                "--shard-size", str(args.shard_size), "--workers", str(args.workers)]

    context = multiprocessing.get_context("spawn")
    queue, stop = context.Queue(), context.Event()
    store = context.Process(target=serve_s3, args=(args.delay_ms / 1000, args.bandwidth_mb * 1e6, queue, stop))
    store.start()
    times: dict[str, list[float]] = {"local + put": [], "into the bucket": []}
    try:
        storage = queue.get(timeout=60)
        fs = s3fs.S3FileSystem(**storage, skip_instance_cache=True)
        env = {**os.environ, "FSSPEC_S3": json.dumps(storage)}  # the store's endpoint, through fsspec's config
        fs.call_s3("create_bucket", Bucket="bench")
        local = work / "packed-local"
        print(f"{args.images} images -> {args.format} shards of {args.shard_size}; bucket: {args.delay_ms:g} ms per "
              f"request, {args.bandwidth_mb:g} MB/s per request body; {args.workers} workers; {args.repeats} repeats")
        for repeat in range(args.repeats):
            shutil.rmtree(local, ignore_errors=True)
            order = ("local + put", "into the bucket") if repeat % 2 == 0 else ("into the bucket", "local + put")
            for case in order:
                prefix = f"bench/{case.replace(' ', '-').replace('+', 'and')}-{repeat}"
                if case == "local + put":
                    def run() -> None:
                        subprocess.run(pack_command(local), check=True, stdout=subprocess.DEVNULL)
                        subprocess.run([sys.executable, "-c", UPLOAD, str(local), prefix], check=True, env=env)
                else:
                    def run() -> None:
                        subprocess.run(pack_command(f"s3://{prefix}"), check=True, env=env, stdout=subprocess.DEVNULL)
                times[case].append(timed(run))
                print(f"  repeat {repeat}: {case:<16} {times[case][-1]:6.2f} s")
            sizes = [{key.split("/", 2)[2]: info["size"] for key, info in fs.find(f"bench/{name}-{repeat}",
                                                                                   detail=True).items()
                      if "/.pack/" not in key} for name in ("local-and-put", "into-the-bucket")]
            assert sizes[0] == sizes[1], "the two cases uploaded different files"
            fs.rm("bench", recursive=True)
            fs.call_s3("create_bucket", Bucket="bench")
    finally:
        stop.set()
        store.join()
    local_time, remote_time = (statistics.median(times[case]) for case in ("local + put", "into the bucket"))
    print(f"{'case':<28}{'median s':>10}{'images/s':>10}")
    for case, median in (("pack locally, then put", local_time), ("pack into the bucket", remote_time)):
        print(f"{case:<28}{median:>10.2f}{args.images / median:>10.0f}")
    print(f"into the bucket / (local + put) = {remote_time / local_time:.2f} (goal <= 1.3)")
    paired = [remote / local for remote, local in zip(times["into the bucket"], times["local + put"])]
    print(f"the same ratio per repeat (each pair run back to back): {', '.join(f'{r:.2f}' for r in paired)}; "
          f"median {statistics.median(paired):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=("stream", "pack"), default="stream")
    parser.add_argument("--format", default="wds", help="pack suite: the format packed")
    parser.add_argument("--repeats", type=int, default=3, help="pack suite: interleaved runs of each case")
    parser.add_argument("--images", type=int, default=2000, help="images packed and streamed")
    parser.add_argument("--loose-images", type=int, default=400, help="images fetched one GET each")
    parser.add_argument("--shard-size", type=int, default=100, help="images per shard")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="server delay before each response")
    parser.add_argument("--bandwidth-mb", type=float, default=200.0, help="MB/s per response")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--cache-limit", default=None, help="default: 1.25 x the dataset")
    parser.add_argument("--warm-rounds", type=int, default=5, help="warm epochs of each loader, interleaved")
    parser.add_argument("--work", default="/tmp/pack-bench-remote", help="sources, shards and cache live here")
    args = parser.parse_args()
    if args.suite == "pack":
        pack_suite(args)
    else:
        stream_suite(args)


def stream_suite(args: argparse.Namespace) -> None:
    work = Path(args.work)
    source = work / "src"
    bench_read.make_source(source, args.images)
    served = work / "served"
    packed = served / "packed.wds"
    options = PackOptions(format="wds", shard_size=args.shard_size)
    if not (packed / "index.json").exists() or readers.load_manifest(packed).options.get("shard_size") != args.shard_size \
            or readers.load_manifest(packed).num_samples != args.images:
        shutil.rmtree(packed, ignore_errors=True)
        pack(source, packed, options)
    loose = served / "loose"
    if not loose.exists():
        loose.symlink_to(source)
    manifest = readers.load_manifest(packed)
    total = sum(shard.bytes for shard in manifest.shards)
    limit = parse_size(args.cache_limit) if args.cache_limit else int(total * 1.25)
    loader_args: dict[str, Any] = {"batch_size": args.batch_size, "num_workers": args.workers, "seed": 0,
                                   "streaming": True}
    print(f"{args.images} images, {format_size(total)} in {len(manifest.shards)} shards; server: "
          f"{args.delay_ms:g} ms per request, {args.bandwidth_mb:g} MB/s per response; {args.workers} workers")

    context = multiprocessing.get_context("spawn")
    url_queue, stop = context.Queue(), context.Event()
    store = context.Process(target=serve, args=(served, args.delay_ms / 1000, args.bandwidth_mb * 1e6, url_queue, stop))
    store.start()
    try:
        url = url_queue.get(timeout=60)
        paths = scan(source).paths[: args.loose_images]
        urls = [f"{url}/loose/{urllib.request.pathname2url(str(path))}" for path in paths]
        loose_loader = DataLoader(LooseHTTP(urls), batch_size=args.batch_size, num_workers=args.workers,
                                  collate_fn=as_list)
        _, loose_rate = rate(loose_loader, len)

        cache_dir = work / "cache"
        shutil.rmtree(cache_dir, ignore_errors=True)
        remote = readers.open_dataset(f"{url}/packed.wds", decode="bytes", cache_dir=cache_dir,
                                      cache_limit=limit)
        cache = remote.files.cache  # type: ignore[attr-defined]
        streamed = readers.make_loader(remote, **loader_args)
        local = readers.make_loader(readers.open_dataset(packed, decode="bytes"), **loader_args)
        with PeakSampler(cache.disk_bytes, 0.005) as size:
            streamed.set_epoch(0)
            count, cold = rate(streamed, lambda batch: len(batch[0]))
            assert count == args.images
            timed_epoch(local, 0, store.pid)  # starts its workers and warms the page cache
            # Warm epochs of both loaders interleaved, the same epoch (the same order) for both in
            # each round: load from other jobs then falls on both alike.
            warm: dict[str, list[tuple[float, float]]] = {"warm": [], "local": []}
            for epoch in range(1, args.warm_rounds + 1):
                warm["warm"].append(timed_epoch(streamed, epoch, store.pid))
                warm["local"].append(timed_epoch(local, epoch, store.pid))
    finally:
        stop.set()
        store.join()

    (remote_rate, remote_cpu), (local_rate, local_cpu) = (
        [statistics.median(values) for values in zip(*warm[name])] for name in ("warm", "local"))
    print(f"{'case':<28}{'samples/s':>12}{'per CPU-s':>12}")
    print(f"{'loose, one GET each':<28}{loose_rate:>12.0f}")
    print(f"{'streaming, cold cache':<28}{cold:>12.0f}{'':>12}   {cold / loose_rate:.1f}x loose (goal 20x)")
    print(f"{'streaming, warm cache':<28}{remote_rate:>12.0f}{remote_cpu:>12.0f}   {remote_rate / local_rate:.2f} of local "
          f"(goal >= 0.90), per CPU-s {remote_cpu / local_cpu:.2f}")
    print(f"{'local shards':<28}{local_rate:>12.0f}{local_cpu:>12.0f}")
    print(f"warm: medians of {args.warm_rounds} epochs each, interleaved; per epoch, warm / local samples/s: "
          + ", ".join(f"{w[0]:.0f}/{lo[0]:.0f}" for w, lo in zip(warm["warm"], warm["local"])))
    print(f"cache peak {format_size(size.peak)} of limit {format_size(limit)}")


if __name__ == "__main__":
    main()
