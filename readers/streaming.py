"""Streaming reads: every rank reads whole shards front to back while the next ones download.

The order of an epoch is computed, never observed: shards in `shard_order(seed, epoch)`, each front
to back (`readers.read_order.stream_order`); ranks take equal contiguous shares of it (`split_for_rank`,
the padding rule of the map-style loader; with `drop_last`, from a point of the stream that moves
every epoch, so that what is dropped changes); each DataLoader worker streams a contiguous span of
its rank's share. A worker reads `interleave` shards at once, interleaved (`interleaved_order`),
each still front to back, through a shuffle buffer, so a batch mixes several shards even where
each shard holds a few classes (a dataset packed in sorted order). DataLoader takes one batch
from each worker in turn, so worker w yields batches w, w+W, w+2W, ... of the rank; spans are
laid out so the last, possibly partial, batch is yielded last. The interleaving and the shuffle
buffer's output order are drawn from (seed, epoch, rank, worker) alone, so a resumed epoch skips
exactly the batches consumed.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_collate

from .base import Dataset, DeferredRecord, Record
from .cache import ROOM_POLL_S, Ahead, CachedFile, Lease, NoRoom
from .handover import RingWriter, Scalars
from .manifest import DatasetError
from .mixed import sources_of
from .read_order import LoaderMode, RankSplit, buffer_order, interleaved_order, renamed_arguments, split_for_rank
from .remote import ShardFiles

log = logging.getLogger(__name__)

_DROP_START_KEY = 0x64726F70  # keeps the draw of where dropping epochs start apart from the others
DEFAULT_SHUFFLE_BUFFER = 1024
"""Samples each worker holds to mix the order within and across neighbouring shards."""
DEFAULT_PREFETCH_SHARDS = 2
"""Shards each worker downloads ahead of the ones it reads."""
DEFAULT_INTERLEAVE = 4
"""Shards each worker reads at once, interleaved (docs/benchmarks.md, "Interleave": the classes
per batch of a sorted pack by shards interleaved); a shared cache must hold this many per worker."""


def distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Both given, or torch.distributed's when initialised, else (0, 1)."""
    if (rank is None) != (world_size is None):
        raise ValueError("pass both rank and world_size, or neither (then torch.distributed decides)")
    if rank is not None and world_size is not None:
        return rank, world_size
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def worker_spans(share_len: int, batch_size: int, workers: int) -> list[tuple[int, int]]:
    """Per worker, the [start, stop) span of the rank's share it streams.

    Worker w yields batches w, w+W, ... of the rank, so it gets ceil((B - w) / W) of the B batches;
    the worker that yields the last batch gets the end of the share (where a partial batch is).
    """
    batches = -(-share_len // batch_size)
    counts = [(batches - w + workers - 1) // workers for w in range(workers)]
    last = (batches - 1) % workers
    spans: list[tuple[int, int]] = [(0, 0)] * workers
    position = 0
    for offset in range(1, workers + 1):
        worker = (last + offset) % workers
        spans[worker] = (position, min(position + counts[worker] * batch_size, share_len))
        position += counts[worker] * batch_size
    return spans


def batches_before(consumed: int, worker: int, workers: int) -> int:
    """How many of the first `consumed` batches of the rank worker `worker` produced."""
    return (consumed - worker + workers - 1) // workers


@dataclass(frozen=True)
class Run:
    """Consecutive samples of one shard: local indices [start, stop), at `position` in the stream."""

    shard: int
    start: int
    stop: int
    position: int


@dataclass(frozen=True)
class WorkerPlan:
    """A worker's part of an epoch: `span`, its global sample indices in stream order (whole runs
    of shards); `read`, the span positions in the order they are read (`interleaved_order`);
    `order`, the reading positions in the order the shuffle buffer hands them out; where the span
    starts in the rank's share, and how many samples of the share are real (not padding); `runs`,
    the span cut into runs of one shard (`shard_runs`)."""

    span: np.ndarray
    runs: list[Run]
    read: np.ndarray
    order: np.ndarray
    start: int
    real: int

    @property
    def samples(self) -> np.ndarray:
        """Global sample indices in the order they are read."""
        return self.span[self.read]


def shard_runs(indices: np.ndarray, offsets: np.ndarray) -> list[Run]:
    """Cut a sequence of global sample indices into runs of consecutive samples of one shard."""
    if len(indices) == 0:
        return []
    shards = np.searchsorted(offsets, indices, side="right") - 1
    cuts = np.flatnonzero((np.diff(shards) != 0) | (np.diff(indices) != 1)) + 1
    bounds = np.concatenate(([0], cuts, [len(indices)]))
    runs = []
    for begin, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        shard = int(shards[begin])
        local = int(indices[begin] - offsets[shard])
        runs.append(Run(shard, local, local + end - begin, begin))
    return runs


LINGERING_RUNS = 64
"""The most runs a worker keeps open for their records in the shuffle buffer (two descriptors each,
a cached shard's lease and the file): with shards much smaller than the buffer, the rest are read
before they are closed."""


@dataclass
class OpenRun:
    """A run being read: its records, the lease on its shard, how many records are left to read,
    its deferred records handed to the buffer (settled before it is closed) and, where it may stay
    open until they are handed out, how many of them are still in the buffer (`waiting`)."""

    records: Generator[tuple[int, Record | DeferredRecord | DatasetError], None, None]
    lease: Lease
    left: int
    deferred: list[DeferredRecord] = field(default_factory=list)
    waiting: int = 0


def shards_ahead(prefetch_shards: int, interleave: int) -> int:
    """Shards a worker fetches past the one it opened last. Reading `interleave` shards at once, it
    opens the next each time one of its lanes ends a run, and its lanes end theirs within about one
    shard's reading of each other: the next `interleave - 1` are wanted about as soon as the next
    one, and `prefetch_shards` counts past those (0: none). Counted from the last one opened alone, a cold
    epoch's worker had 2 of the 4 it would open next on the way, and waited on the others."""
    return prefetch_shards + interleave - 1 if prefetch_shards else 0


class ShardPrefetcher:
    """Downloads a worker's shards into the cache in reading order, up to `ahead` shards past the
    one being read, each in a thread of its own, so downloads overlap reading and each other: an
    object store gives each connection a share of its bandwidth, and one shard at a time left a
    worker's link mostly idle.

    Only the shard being read is held (`take` leases it). A shard fetched ahead waits in the cache
    unheld, and is fetched only as `cache.Ahead` allows: where room for one more shard stays free,
    evicting no file fetched ahead since this pass began, and without waiting for room (it tries
    again every ROOM_POLL_S until its turn, when `take` fetches it if it is still not there). So
    shards fetched ahead never take the room, nor hold the download lock, that a shard another
    worker must read now needs."""

    def __init__(self, files: ShardFiles, shards: Sequence[CachedFile], ahead: int) -> None:
        self._files = files
        self._shards = shards
        self._ahead = ahead
        self._policy = Ahead(headroom=max((file.bytes for file in shards), default=0), since=time.time())
        self._cond = threading.Condition()
        self._settled: set[int] = set()  # fetched ahead, or left for `take`
        self._errors: dict[int, BaseException] = {}
        self._reading = 0
        self._closed = False
        threading.Thread(target=self._run, name="pack-prefetch", daemon=True).start()

    def _run(self) -> None:
        for number, file in enumerate(self._shards):
            with self._cond:
                self._cond.wait_for(lambda: self._closed or number <= self._reading + self._ahead)
                if self._closed:
                    return
            threading.Thread(target=self._download, args=(number, file), name="pack-prefetch-get",
                             daemon=True).start()

    def _download(self, number: int, file: CachedFile) -> None:
        while True:
            try:
                with self._cond:
                    if self._closed or self._reading >= number:  # closed, or its turn: `take` leases it
                        break
                self._files.lease(file, ahead=self._policy).release()
                break
            except NoRoom:
                with self._cond:
                    self._cond.wait_for(lambda: self._closed or self._reading >= number, timeout=ROOM_POLL_S)
            except BaseException as exc:  # noqa: BLE001 - handed to the reading thread, raised there
                with self._cond:
                    self._errors[number] = exc
                    self._cond.notify_all()
                return
        with self._cond:
            self._settled.add(number)
            self._cond.notify_all()

    def take(self, number: int) -> Lease:
        """The lease of the `number`-th shard, once its download ahead is settled (downloaded now if
        it was not, or was evicted since); the caller releases it. A shard already in the cache (a
        warm epoch, a local dataset) is leased at once: waiting for its thread to be started and
        scheduled cost a warm epoch's first batch a few GIL hand-overs per shard opened."""
        file = self._shards[number]
        with self._cond:
            self._reading = number
            self._cond.notify_all()
            if not self._files.present(file):
                self._cond.wait_for(lambda: number in self._settled or number in self._errors)
            if number in self._errors:
                raise self._errors.pop(number)
            self._settled.discard(number)
        return self._files.lease(file, sequential=True)

    def close(self) -> None:
        """Stop scheduling (a download under way finishes first, and stays in the cache)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class ShardStream(IterableDataset, RankSplit):
    """One rank's batches (or samples, with `collate_fn=None` and batch_size 1), read shard by shard.

    The epoch and the batches to skip live in a small shared-memory tensor, so persistent
    DataLoader workers see `set_epoch` and a resume position.
    """

    state_keys = ("seed", "world_size", "batch_size", "num_samples", "shuffle", "shuffle_buffer", "num_workers",
                  "drop_last", "mode", "interleave", "sources")

    @renamed_arguments
    def __init__(
        self,
        dataset: Dataset,
        *,
        batch_size: int,
        collate_fn: Callable[[list[Any]], Any] | None = default_collate,
        seed: int = 0,
        shuffle: bool = True,
        shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        mode: LoaderMode = "train",
        num_workers: int = 0,
        prefetch_shards: int = DEFAULT_PREFETCH_SHARDS,
        interleave: int = DEFAULT_INTERLEAVE,
        scalars_as_lists: bool = False,
        ring_slots: int = 0,
    ) -> None:
        rank, world_size = distributed(rank, world_size)
        RankSplit.__init__(self, [shard.num_samples for shard in dataset.shards], batch_size, rank=rank,
                           world_size=world_size, seed=seed, shuffle=shuffle, drop_last=drop_last, mode=mode,
                           orders=dataset.orders())
        if shuffle_buffer < 0 or prefetch_shards < 0:
            raise ValueError(f"shuffle_buffer and prefetch_shards must be >= 0, got {shuffle_buffer}, {prefetch_shards}")
        if interleave < 1:
            raise ValueError(f"interleave must be at least 1, not {interleave}")
        self._interleave = torch.tensor([interleave if shuffle else 1]).share_memory_()  # unshuffled: stored order
        self.widest_interleave: int | None = None
        """Where the loader chose `interleave` (none given): the widest the cache holds, up to which
        a resumed state's width is taken (`StreamingLoader.load_state_dict`)."""
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.shuffle_buffer = shuffle_buffer
        self.num_workers = num_workers
        self.prefetch_shards = prefetch_shards
        self.scalars_as_lists = scalars_as_lists  # eval masks leave a worker as `Scalars`
        self.ring_slots = ring_slots  # batches of bytes a worker keeps in shared memory (readers.handover)
        self._offsets = np.concatenate(([0], np.cumsum(self.shard_sizes)))
        self._position = torch.zeros(2, dtype=torch.int64).share_memory_()  # epoch, batches to skip

    @property
    def interleave(self) -> int:
        """Shards each worker reads at once; in shared memory, so persistent workers see a resumed width."""
        return int(self._interleave[0])

    @interleave.setter
    def interleave(self, width: int) -> None:
        self._interleave[0] = width

    @property
    def epoch(self) -> int:
        return int(self._position[0])

    def set_epoch(self, epoch: int) -> None:
        self._position[0] = epoch

    @property
    def start_batch(self) -> int:
        return int(self._position[1])

    @start_batch.setter
    def start_batch(self, batches: int) -> None:
        self._position[1] = batches

    def __len__(self) -> int:
        return self.samples_per_rank if self.collate_fn is None else self.num_batches

    def share(self, epoch: int) -> tuple[np.ndarray, int]:
        """This rank's sample indices in stream order, padding included, and how many are real.

        Where `drop_last` leaves samples out, the epoch's stream goes round from a point that
        moves on by the samples dropped every epoch (from one drawn from the seed): the stretch
        left out follows the last one's. Read from the start of the stream, the same tail was
        left out every epoch (one shard: the same samples; many: the ends of shards, never their
        beginnings)."""
        order = self.orders.stream_order(seed=self.seed, epoch=epoch, shuffle=self.shuffle, mode=self.mode)
        dropped = len(order) - self.samples_per_rank * self.world_size
        if self.shuffle and dropped > 0:
            first = np.random.default_rng(np.random.SeedSequence([self.seed, _DROP_START_KEY])).integers(len(order))
            order = np.roll(order, -((int(first) + epoch * dropped) % len(order)))
        return split_for_rank(order, rank=self.rank, world_size=self.world_size, batch_size=self.batch_size,
                              drop_last=self.drop_last, mode=self.mode)

    def worker_plan(self, epoch: int, worker: int, workers: int) -> WorkerPlan:
        """A worker's part of the epoch (`WorkerPlan`), from (seed, epoch, rank, worker) alone."""
        share, real = self.share(epoch)
        start, stop = worker_spans(len(share), self.batch_size, workers)[worker]
        span = share[start:stop]
        runs = shard_runs(span, self._offsets)
        read = np.arange(stop - start, dtype=np.int64)
        order = read
        if self.shuffle:
            seeds = np.random.SeedSequence([self.seed, epoch, self.rank, worker])
            order = buffer_order(stop - start, self.shuffle_buffer, np.random.default_rng(seeds))
            if self.interleave > 1:  # its own stream of draws: the buffer's stay those of unmixed reads
                lengths = [run.stop - run.start for run in runs]
                read = interleaved_order(lengths, self.interleave, np.random.default_rng(seeds.spawn(1)[0]))
        return WorkerPlan(span, runs, read, order, start, real)

    def indices(self) -> tuple[np.ndarray, int]:
        """This rank's sample indices for the current epoch in the order the loader yields them,
        and the number of real samples in its share."""
        workers = max(1, self.num_workers)
        outputs = []
        real = 0
        for worker in range(workers):
            plan = self.worker_plan(self.epoch, worker, workers)
            outputs.append(plan.samples[plan.order])
            real = plan.real
        size = self.batch_size
        batches = [outputs[j % workers][j // workers * size:(j // workers + 1) * size] for j in range(self.num_batches)]
        return np.concatenate(batches) if batches else np.empty(0, dtype=np.int64), real

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        slot, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch, consumed = self._position.tolist()
        # DataLoader starts every iteration at worker 0: after `consumed` batches, the worker that
        # produced batch `consumed` of the uninterrupted order must be the one asked first.
        worker = (slot + consumed) % workers
        plan = self.worker_plan(epoch, worker, workers)
        start, real = plan.start, plan.real
        skip = batches_before(consumed, worker, workers) * self.batch_size
        outputs = self._samples(plan, skip)
        if self.collate_fn is None:
            yield from (sample for _, sample in outputs)
            return
        ring = RingWriter(self.ring_slots if info is not None else 0)
        batch: list[Any] = []
        positions: list[int] = []
        for position, sample in outputs:
            batch.append(sample)
            positions.append(position)
            if len(batch) == self.batch_size:
                yield self._collated(batch, positions, start, real, ring)
                batch, positions = [], []
        if batch:
            yield self._collated(batch, positions, start, real, ring)

    def _collated(self, batch: list[Any], positions: list[int], start: int, real: int, ring: RingWriter) -> Any:
        assert self.collate_fn is not None
        collated = ring.pack(self.collate_fn(batch))
        if self.mode == "eval":  # padding sits at the end of the share
            if self.scalars_as_lists and get_worker_info() is not None:
                return collated, Scalars(position + start < real for position in positions)
            return collated, torch.tensor(positions) + start < real
        return collated

    def _samples(self, plan: WorkerPlan, skip: int) -> Iterator[tuple[int, tuple[Any, ...]]]:
        """(position in the span, decoded sample) in the buffer's order, the first `skip` outputs
        left out: reading starts at the first reading position still wanted, and each run there
        from its first sample read from then on (the samples before it were all handed out)."""
        wanted = plan.order[skip:]
        if len(wanted) == 0:
            return
        done = np.zeros(len(plan.read), dtype=bool)
        done[plan.order[:skip]] = True
        first = int(wanted.min())
        runs = plan.runs
        run_of = np.repeat(np.arange(len(runs)), [run.stop - run.start for run in runs])  # span position -> run
        reads = plan.read[first:]
        opened, first_read = np.unique(run_of[reads], return_index=True)
        sequence = opened[np.argsort(first_read)].tolist()  # runs in the order they are opened
        shards = self.dataset.shards
        prefetcher = ShardPrefetcher(self.dataset.files, [shards[runs[run].shard] for run in sequence],
                                     shards_ahead(self.prefetch_shards, self.interleave))
        open_runs: dict[int, OpenRun] = {}
        linger = self._may_linger()
        records = self._records(runs, run_of, reads, first, prefetcher, done, open_runs, linger)
        pending: dict[int, Record | DeferredRecord | DatasetError] = {}
        try:
            for position in wanted.tolist():
                while position not in pending:
                    read, record = next(records)
                    pending[read] = record
                span_position = int(plan.read[position])
                record = pending.pop(position)
                sample = self._decode(int(plan.span[span_position]), record)
                if linger and isinstance(record, DeferredRecord):
                    self._handed_out(open_runs, int(run_of[span_position]), runs)
                yield span_position, sample
        finally:
            records.close()
            prefetcher.close()

    def _may_linger(self) -> bool:
        """Whether a run's shard may stay open (leased) after its last read, until the deferred
        records of it in the buffer are handed out: where no cache limit needs the room (a local
        dataset, a cache without limit). Under a limit the rule of `check_cache_room` (`interleave`
        shards per worker) holds: the run's deferred records are read before it is closed."""
        caches = [source.files.cache for source in sources_of(self.dataset)]
        return all(cache is None or cache.limit is None for cache in caches)

    def _records(self, runs: list[Run], run_of: np.ndarray, reads: np.ndarray, first: int,
                 prefetcher: ShardPrefetcher, done: np.ndarray, open_runs: dict[int, OpenRun], linger: bool
                 ) -> Iterator[tuple[int, Record | DeferredRecord | DatasetError]]:
        """(reading position, record) from `first` on, each run opened (its lease taken) at its
        first read and closed at its last, so at most `interleave` are open at once; the deferred
        records of a run still in the buffer are settled (read) before it is closed, or with
        `linger` the run is closed when the last of them is handed out (`_handed_out`), while no more
        than LINGERING_RUNS are open."""
        opened = 0
        try:
            for offset, span_position in enumerate(reads.tolist()):
                number = int(run_of[span_position])
                state = open_runs.get(number)
                if state is None:
                    run = runs[number]
                    lease = prefetcher.take(opened)
                    opened += 1
                    local = run.start + span_position - run.position
                    state = open_runs[number] = OpenRun(self.dataset.stream_records(run.shard, local, run.stop),
                                                        lease, run.stop - local)
                _, record = next(state.records)
                wanted = not done[first + offset]
                if wanted and isinstance(record, DeferredRecord):
                    state.deferred.append(record)
                    state.waiting += linger
                state.left -= 1
                if state.left == 0 and (state.waiting == 0 or len(open_runs) > LINGERING_RUNS):
                    self._close_run(open_runs, number, runs, settle=True)
                if wanted:
                    yield first + offset, record
        finally:
            for number in list(open_runs):
                self._close_run(open_runs, number, runs, settle=False)  # nothing more is handed out

    def _handed_out(self, open_runs: dict[int, OpenRun], number: int, runs: list[Run]) -> None:
        """One deferred record of run `number` was handed out: close the run if it was its last."""
        state = open_runs.get(number)
        if state is None:  # closed already, its records settled
            return
        state.waiting -= 1
        if state.waiting == 0 and state.left == 0:
            self._close_run(open_runs, number, runs, settle=False)

    def _close_run(self, open_runs: dict[int, OpenRun], number: int, runs: list[Run], settle: bool) -> None:
        state = open_runs.pop(number)
        try:
            for record in state.deferred if settle else ():
                record.settle()
        finally:
            state.records.close()
            self.dataset.close_shard(runs[number].shard)
            state.lease.release()

    def _decode(self, index: int, record: Record | DeferredRecord | DatasetError) -> tuple[Any, ...]:
        if isinstance(record, DeferredRecord):
            try:
                record = record.load()
            except DatasetError as exc:
                record = exc
        if not isinstance(record, DatasetError):
            try:
                return self.dataset.decode_sample(index, *record)
            except DatasetError:
                pass
        return self.dataset[index]  # on_error decides: raise, or stand in the next readable sample


class WdsStream(ShardStream):
    """`WdsDataset.stream()` (the format table's `stream` for wds): samples one at a time, in
    stored order, split over ranks and workers."""

    def __init__(self, reader: Dataset, *, rank: int | None = None, world_size: int | None = None,
                 prefetch_shards: int | None = None) -> None:
        super().__init__(reader, batch_size=1, collate_fn=None, shuffle=False, rank=rank, world_size=world_size,
                         prefetch_shards=DEFAULT_PREFETCH_SHARDS if prefetch_shards is None else prefetch_shards)
        self.reader = reader
