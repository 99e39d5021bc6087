"""Two DDP ranks (gloo) x 2 DataLoader workers streaming one dataset over HTTP through one node cache."""

from __future__ import annotations

import collections
import hashlib
import json
import urllib.parse
from pathlib import Path
from typing import Callable

import ddp_ranks
import torch.multiprocessing as mp
from loopback import LoopbackHTTP, PeakSampler

import readers
from readers.cache import MIN_CACHE_SHARDS, ShardCache
from readers.read_order import stream_order


def test_two_ranks_two_workers_stream_through_one_cache(packed_as: Callable, serve: Callable[[str], str],
                                                         http_server: LoopbackHTTP, tmp_path: Path) -> None:
    local, files = packed_as("wds")
    manifest = readers.load_manifest(local)
    url, tight_url = serve("wds"), serve("wds")
    tight_limit = MIN_CACHE_SHARDS * max(shard.bytes + sum(s.bytes for s in shard.sidecars) for shard in manifest.shards)
    tight_cache = ShardCache(tmp_path / "tight", tight_limit)
    world = 2
    with PeakSampler(tight_cache.disk_bytes) as size:
        mp.spawn(ddp_ranks.run_streaming_rank, nprocs=world, join=True,
                 args=(world, str(tmp_path / "rendezvous"), url, str(tmp_path / "cache"), tight_url,
                       str(tmp_path / "tight"), tight_limit, str(tmp_path)))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    total = len(files)
    per_rank = -(-total // world)
    padding = per_rank * world - total

    for r in ranks:
        assert len(r["epochs"][0]) == len(r["epochs"][1]) == r["len"] == len(ranks[0]["tight"][0])
        assert r["resumed"] == r["epochs"][1]  # resumed mid-epoch in fresh workers: the same batches
    for epoch in (0, 1):
        for key in ("epochs", "tight"):
            counts = collections.Counter(i for r in ranks for batch in r[key][epoch] for i in batch)
            # every sample once; the train padding repeats the first samples of the epoch's stream
            repeated = stream_order([s.num_samples for s in manifest.shards], seed=ddp_ranks.SEED, epoch=epoch)[:padding]
            assert set(counts) == set(range(total)) and sum(counts.values()) == per_rank * world
            assert {i for i, n in counts.items() if n == 2} == set(repeated.tolist())
    # The bytes are the packed files', in the order a loader told its rank explicitly computes.
    digests = {hashlib.sha256(data).hexdigest() for data in files.values()}
    assert {digest for r in ranks for _, digest in r["samples"]} == digests
    for rank, r in enumerate(ranks):
        ds = readers.open_dataset(local, decode="bytes", fields=("index",))
        loader = readers.make_loader(ds, ddp_ranks.BATCH, seed=ddp_ranks.SEED, streaming=True, shuffle_buffer=4,
                                     num_workers=ddp_ranks.STREAM_WORKERS, rank=rank, world_size=world)
        assert loader.indices().tolist() == [i for batch in r["epochs"][0] for i in batch]
    assert sorted(ranks[0]["eval_real"] + ranks[1]["eval_real"]) == list(range(total))
    # One download per shard on this node: 2 ranks x 2 workers, 2 epochs, resume and eval loaders.
    path = urllib.parse.urlsplit(url).path
    assert {http_server.gets[f"{path}/{shard.name}"] for shard in manifest.shards} == {1}
    # The small cache was used, evicted from, and never above its limit.
    tight_path = urllib.parse.urlsplit(tight_url).path
    assert sum(http_server.gets[f"{tight_path}/{shard.name}"] for shard in manifest.shards) > len(manifest.shards)
    assert 0 < size.peak <= tight_limit
