"""The training loader: DDP-equal ranks, epochs and mid-epoch resume, over `readers.read_order`.

Map-style (the default): the sampler computes each epoch's order in the main process. DataLoader
workers receive index batches and never hold the order, so their memory does not grow with the
dataset and the order cannot depend on them. `streaming=True` reads whole shards front to back
instead (`readers.streaming`), for datasets behind a URL or on slow disks.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import logging
import multiprocessing
import os
import pickle
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler
from torch.utils.data._utils.collate import default_collate

from .base import Dataset, PackedDataset
from .cache import end_waits_with_parent, format_size
from .cpus import THREAD_VARIABLES, default_num_workers
from .handover import Handover, Scalars
from .mixed import MIX_FIELDS, sources_of
from .read_order import (
    DEFAULT_SHUFFLE_WINDOW,
    EpochOrders,
    LoaderMode,
    RankSplit,
    renamed_arguments,
    renamed_state,
    split_for_rank,
)
from .streaming import (
    DEFAULT_INTERLEAVE,
    DEFAULT_PREFETCH_SHARDS,
    DEFAULT_SHUFFLE_BUFFER,
    ShardStream,
    distributed,
)

log = logging.getLogger(__name__)

STATE_VERSION = 2
"""2: a state names its datasets and whether it streamed (`PackedLoader.state_dict`); version 1
states load with a warning where they can be told apart, and streamed drop_last ones, whose order
changed with version 2, are refused."""
# What must match for a saved position to mean the same batches in a fresh loader.
_STATE_KEYS = ("seed", "world_size", "batch_size", "num_samples", "shuffle", "shuffle_window",
               "drop_last", "mode", "sources")


class ShardWindowBatchSampler(Sampler[list[int]], RankSplit):
    """Batches of sample indices for one rank: windowed shard shuffle, equal share per rank.

    `orders` says what an epoch reads (`dataset.orders()`: a mix's shares of its sources); by
    default every sample of `shard_sizes` once.

    `start_batch` skips the batches an interrupted run already consumed (mid-epoch resume).
    `len()` is the number of batches the next iteration yields (full epoch less `start_batch`).
    """

    state_keys = _STATE_KEYS

    def __init__(
        self,
        shard_sizes: Sequence[int] | np.ndarray,
        batch_size: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        shuffle_window: int | None = DEFAULT_SHUFFLE_WINDOW,
        drop_last: bool = False,
        mode: LoaderMode = "train",
        orders: EpochOrders | None = None,
    ) -> None:
        RankSplit.__init__(self, shard_sizes, batch_size, rank=rank, world_size=world_size, seed=seed, shuffle=shuffle,
                           drop_last=drop_last, mode=mode, shuffle_window=shuffle_window, orders=orders)
        self.shuffle_window = shuffle_window
        self.epoch = 0
        self.start_batch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def indices(self) -> tuple[np.ndarray, int]:
        """This rank's sample indices for the current epoch (padding included) and the real count."""
        order = self.orders.epoch_order(seed=self.seed, epoch=self.epoch, shuffle=self.shuffle,
                                        shuffle_window=self.shuffle_window, mode=self.mode)
        return split_for_rank(order, rank=self.rank, world_size=self.world_size, batch_size=self.batch_size,
                              drop_last=self.drop_last, mode=self.mode)

    def __len__(self) -> int:
        return max(0, self.num_batches - self.start_batch)

    def __iter__(self) -> Iterator[list[int]]:
        share, _ = self.indices()
        for batch in range(self.start_batch, self.num_batches):
            yield share[batch * self.batch_size : (batch + 1) * self.batch_size].tolist()


class _WorkerInit:
    """Per-worker setup: one thread for torch and for OpenMP/MKL/BLAS users, waits in the shard
    cache that end with the main process (`end_waits_with_parent`), then the user's hook.

    The worker's torch, `random` and numpy seeds are set by DataLoader from its generator, which
    make_loader seeds from (seed, rank, epoch); this class is picklable for spawn contexts.
    """

    def __init__(self, user_fn: Callable[[int], None] | None) -> None:
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        torch.set_num_threads(1)
        end_waits_with_parent()
        for name in THREAD_VARIABLES:
            os.environ[name] = "1"
        if self.user_fn is not None:
            self.user_fn(worker_id)


class SampleCollate:
    """Batches a dataset's samples field by field: images, labels, indexes and numeric fields that
    every sample has in one shape are stacked (torch's default_collate); text, paths, JSON values
    and fields a sample may lack stay lists (default_collate would fail on None, merge dicts and
    transpose lists).

    With `scalars_as_lists` (DataLoader workers), columns of plain numbers (labels, indexes, number
    fields) come out as `Scalars`, which the loader stacks in the main process (`Handover.settle`).
    """

    def __init__(self, dataset: Dataset, *, scalars_as_lists: bool = False) -> None:
        self.stack = [name in ("image", "label", "index", *MIX_FIELDS) or (spec is not None and spec.stackable)
                      for name, spec in ((name, dataset.field_spec(name)) for name in dataset.fields)]
        self.image = dataset.fields.index("image") if "image" in dataset.fields else None
        self.scalars_as_lists = scalars_as_lists

    def __call__(self, batch: list[tuple[Any, ...]]) -> list[Any]:
        columns = list(zip(*batch))
        if self.image is not None:
            check_one_size(columns[self.image])
        return [self._column(list(column)) if stack else list(column) for stack, column in zip(self.stack, columns)]

    def _column(self, column: list[Any]) -> Any:
        if self.scalars_as_lists and all(type(value) in (int, float, bool) for value in column):
            return Scalars(column)
        return default_collate(column)


def check_one_size(images: Sequence[Any]) -> None:
    """Images of two sizes cannot stack into one batch (torch says only "Trying to resize storage
    that is not resizable", from a worker): say which sizes met and how to make them one."""
    shapes = {tuple(getattr(image, "shape", ())) for image in images}
    if len(shapes) > 1:
        first, second = sorted(shapes)[:2]
        raise ValueError(f"images of shapes {first} and {second} in one batch cannot be stacked: resize them to "
                         "one size in transform= (e.g. a RandomResizedCrop), or pack with --store raw --resize N "
                         "--center-crop N")


RESULT_PIPE_BYTES = 1 << 18
"""The size of the pipe that carries batches from the DataLoader workers to the main process
(Linux's default is 64 KB): a batch of 64 images of 33 KB then crosses in 8 writes and wake-ups,
not 32. Warm streaming epoch (docs/benchmarks.md, "Streaming against the peers"): system CPU per
sample 12-13 -> 6-8 us in the main process and in each worker."""


def widen_result_pipe(iterator: Any) -> None:
    """Resize the workers' result pipe of a DataLoader iterator to RESULT_PIPE_BYTES. The pipe is a
    private attribute of torch's iterator: where it is not there, or the user's pipe quota refuses
    the size, the pipe stays as it was (only slower)."""
    reader = getattr(getattr(iterator, "_worker_result_queue", None), "_reader", None)
    size, resize = getattr(fcntl, "F_GETPIPE_SZ", None), getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux only
    if reader is None or size is None or resize is None:
        return
    try:
        if fcntl.fcntl(reader.fileno(), size) < RESULT_PIPE_BYTES:
            fcntl.fcntl(reader.fileno(), resize, RESULT_PIPE_BYTES)
    except OSError:
        pass


@contextlib.contextmanager
def frozen_for_fork() -> Iterator[None]:
    """The process's objects out of the cyclic collector's reach while DataLoader forks workers:
    a worker inherits them all (~170k with torch loaded), and its first full collection walked
    every one, 75-90 ms of CPU and a private copy of each page it touched, while the worker's first
    batch waited (the Python docs' advice for fork without exec: `gc.freeze`). The parent takes
    them back as they were (`gc.unfreeze`); where the program froze objects itself, it is left to it."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class SettlingDataLoader(DataLoader):
    """The loader's DataLoader (`loader.dataloader`): its batches are settled as they leave it, so
    what workers hand over cheaply (`Scalars` lists, bytes in a shared-memory ring: readers.handover)
    comes out as tensors and bytes, also for code that iterates `loader.dataloader` itself (a
    trainer that wants a DataLoader) rather than the loader."""

    def __iter__(self) -> Any:
        if self.num_workers == 0:
            return super().__iter__()
        with frozen_for_fork():
            batches = super().__iter__()  # starts the workers, the first time or each pass
        widen_result_pipe(batches)
        return _settled(batches, Handover(), _pins(self))


def _settled(batches: Any, handover: Handover, pin: bool) -> Iterator[Any]:
    """One pass's batches with the number columns made tensors and the ring columns bytes; the
    rings live as long as the pass. An error readers raised in a worker comes out as its one line."""
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as error:
            short = worker_error(error)
            if short is None:
                raise
            log.debug("%s", error)
            raise short from None
        yield handover.settle(batch, pin)


READERS_DIR = os.path.dirname(os.path.abspath(__file__))
_WORKER_ERROR = re.compile(
    r"Caught \w+ in DataLoader worker process \d+\.\nOriginal Traceback \(most recent call last\):\n")
_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line \d+, in .*$', re.M)


def worker_error(error: BaseException) -> BaseException | None:
    """The error a DataLoader worker raised, as its own type and one-line message, when readers
    raised it on purpose (its last frame is in readers: a batch of two sizes, a damaged sample);
    None for any other error, whose worker traceback shows where a transform went wrong.

    torch sends a worker's error as the text of its traceback (`ExceptionWrapper`) and raises
    `type(error)("Caught ... in DataLoader worker process N. Original Traceback ...")`; the
    message is the traceback's last lines, after the raising frame's source excerpt."""
    text = error.args[0] if len(error.args) == 1 and isinstance(error.args[0], str) else ""
    frames = list(_FRAME.finditer(text))
    if not _WORKER_ERROR.match(text) or not frames:
        return None
    last = frames[-1]
    if not os.path.abspath(last.group("file")).startswith(READERS_DIR + os.sep):
        return None
    lines = text[last.end():].strip("\n").split("\n")
    while lines and lines[0].startswith("    "):  # the source line and its ^^^ markers
        lines.pop(0)
    name, _, message = "\n".join(lines).partition(": ")
    if name.rsplit(".", 1)[-1] != type(error).__name__ or not message or "\n" in message.strip():
        return None
    try:
        return type(error)(message.strip())
    except Exception:  # an error type that takes other arguments: torch's text stays
        return None


def _pins(dataloader: DataLoader) -> bool:
    """Whether DataLoader pins its batches' tensors (then the ones stacked here are pinned too)."""
    accelerator = getattr(torch, "accelerator", None)
    return dataloader.pin_memory and (accelerator.is_available() if accelerator is not None
                                      else torch.cuda.is_available())


def _worker_seed(seed: int, rank: int, epoch: int) -> int:
    return int(np.random.SeedSequence([seed, rank, epoch]).generate_state(1, dtype=np.uint64)[0] >> 1)


class PackedLoader:
    """A DataLoader over a packed dataset with DDP-equal ranks, epochs and mid-epoch resume.

    Iterating yields what the DataLoader yields; in "eval" mode each item is `(batch, mask)`,
    `mask` a bool tensor that is False for the padding samples at the end of a rank's share.
    `len()` is the number of batches per rank in a full epoch, the same on every rank.
    """

    def __init__(self, dataset: Dataset, sampler: ShardWindowBatchSampler | ShardStream,
                 **dataloader_args: Any) -> None:
        self.dataset = dataset
        self.sampler = sampler
        self._generator = torch.Generator()
        self.dataloader = self._dataloader(dataloader_args)
        self._consumed = 0
        self._resume: int | None = None
        self._passes = 0  # passes begun: only the latest may take batches

    def _dataloader(self, args: dict[str, Any]) -> DataLoader:
        return SettlingDataLoader(self.dataset, batch_sampler=self.sampler, generator=self._generator, **args)

    @property
    def batch_size(self) -> int:
        return self.sampler.batch_size

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    @property
    def rank(self) -> int:
        return self.sampler.rank

    @property
    def world_size(self) -> int:
        return self.sampler.world_size

    @property
    def num_workers(self) -> int:
        return self.dataloader.num_workers

    @property
    def num_padding(self) -> int:
        """Samples of this rank's share that repeat others ("eval" mode marks them in the mask)."""
        return self.sampler.samples_per_rank - self.sampler.num_real

    def indices(self) -> np.ndarray:
        """This rank's sample indices for the current epoch, in the order they will be read."""
        return self.sampler.indices()[0]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next iteration reads; a pending resume for another
        epoch is dropped, one for this epoch is kept (so resume, then `set_epoch(same)` works)."""
        if epoch != self.sampler.epoch:
            self._resume = None
            self._consumed = 0
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return self.sampler.num_batches

    def __iter__(self) -> Iterator[Any]:
        start = self._resume if self._resume is not None else 0
        self._resume = None
        self._consumed = start
        self.sampler.start_batch = start
        self._generator.manual_seed(_worker_seed(self.sampler.seed, self.rank, self.epoch))
        self._passes += 1
        mine = self._passes
        batches = iter(self.dataloader)
        left = self.sampler.num_batches - start  # this pass's batches not yet taken
        while True:
            if mine != self._passes:
                if left <= 0:
                    return
                # The position (state_dict) is the newer pass's now, so a batch taken here would be
                # missing from a checkpoint; with persistent workers, DataLoader restarted its one
                # set of them for the newer pass, and a batch taken here would be lost to that pass
                raise RuntimeError(f"{self.dataset.root}: another pass over this loader began while this one was "
                                   "under way; the loader's position (state_dict) and its persistent workers "
                                   "follow one pass at a time: finish or drop one iterator first")
            try:
                batch = next(batches)
            except StopIteration:
                return
            number = self._consumed
            self._consumed += 1
            left -= 1
            yield self._with_mask(batch, number)

    def _with_mask(self, batch: Any, number: int) -> Any:
        if self.sampler.mode != "eval":
            return batch
        first = number * self.batch_size
        size = min(self.batch_size, self.sampler.samples_per_rank - first)
        return batch, torch.arange(first, first + size) < self.sampler.num_real

    def state_dict(self) -> dict[str, Any]:
        """Where this epoch stands: the same on every rank, so rank 0 alone may save it. It names
        what it was taken on: every setting that shapes the order, whether the loader streamed,
        and the datasets read (each source's `Manifest.identity`, in order)."""
        return {
            "version": STATE_VERSION,
            "epoch": self.sampler.epoch,
            "batches": self._resume if self._resume is not None else self._consumed,
            **{key: getattr(self.sampler, key) for key in self.sampler.state_keys},
            "streaming": isinstance(self.sampler, ShardStream),
            "datasets": [source.manifest.identity for source in sources_of(self.dataset)],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration yield exactly the batches of `state`'s epoch not yet consumed;
        a state taken on other datasets, or read otherwise, is a ValueError naming what differs."""
        mine = self.state_dict()
        if int(state.get("version", 1)) > STATE_VERSION:
            raise ValueError(f"loader state version {state['version']} is newer than this loader's ({STATE_VERSION}): "
                             "resume with the version that saved it")
        state = self._from_version_1(state) if state.get("version", 1) == 1 else state
        changed = [f"{key} {state.get(key)!r} (now {mine[key]!r})" for key in (*self.sampler.state_keys, "streaming")
                   if state.get(key) != mine[key]]
        if "datasets" in state and state["datasets"] != mine["datasets"]:
            changed.append(_datasets_changed(list(state["datasets"]), mine["datasets"]))
        if changed:
            raise ValueError("loader state was saved with a different setup, cannot resume exactly: " + ", ".join(changed))
        batches = int(state["batches"])
        if not 0 <= batches <= len(self):
            raise ValueError(f"loader state has {batches} batches consumed, outside 0..{len(self)}")
        self.sampler.set_epoch(int(state["epoch"]))
        self._resume = batches
        self._consumed = batches

    def _from_version_1(self, state: dict[str, Any]) -> dict[str, Any]:
        """A state saved before states named their datasets: whether it streamed is told by its
        keys (a streaming state's shuffle_buffer); its datasets cannot be checked (a warning); a
        streamed epoch that dropped samples was read in the order version 2 changed (refused)."""
        streaming = "shuffle_buffer" in state
        if (streaming and isinstance(self.sampler, ShardStream) and state.get("drop_last") and state.get("shuffle")
                and self.sampler.samples_per_rank * self.world_size < self.sampler.num_samples):
            raise ValueError("loader state was saved by an older version, whose streaming order with drop_last=True "
                             "this one changed (each epoch now drops other samples): it cannot resume exactly; "
                             "start its epoch over (set_epoch) or the next one")
        warnings.warn(f"{self.dataset.root}: this loader state (version 1) names no dataset, so it cannot be checked "
                      "that it was taken on this one; resuming as saved", stacklevel=3)
        return {**state, "streaming": streaming}

    def __repr__(self) -> str:
        s = self.sampler
        return (f"{type(self).__name__}({self.dataset!r}, batch_size={s.batch_size}, rank={s.rank}/{s.world_size}, "
                f"epoch={s.epoch}, batches={len(self)}, workers={self.num_workers}, mode={s.mode!r})")


class StreamingLoader(PackedLoader):
    """`make_loader(..., streaming=True)`: the same epochs, equal ranks and resume as PackedLoader,
    read shard by shard by each worker (`ShardStream`), which also builds batches and eval masks."""

    sampler: ShardStream

    def _dataloader(self, args: dict[str, Any]) -> DataLoader:
        return SettlingDataLoader(self.sampler, batch_size=None, generator=self._generator, **args)

    def _with_mask(self, batch: Any, number: int) -> Any:
        # Streaming workers make the eval masks; DataLoader's default_convert made the pair a list.
        return tuple(batch) if self.sampler.mode == "eval" else batch

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """As PackedLoader's; where the interleave's width was chosen (`interleave` not given),
        the state's width is taken if the cache holds it, so the rest of the epoch is the one saved."""
        state = renamed_state(state)
        mine, saved, widest = self.sampler.interleave, state.get("interleave"), self.sampler.widest_interleave
        if widest is not None and isinstance(saved, int) and saved >= 1 and saved != mine:
            workers = max(1, self.sampler.num_workers)
            tight = tight_cache(self.dataset, saved, workers)
            if tight is not None:
                raise ValueError(f"loader state was saved reading interleave={saved} shards at once; cache_limit "
                                 f"{format_size(tight[0])} holds {widest} for {workers} workers: to resume exactly, "
                                 f"raise cache_limit to hold {tight[1]} of this dataset's largest shard")
            self.sampler.interleave = saved
        try:
            super().load_state_dict(state)
        except ValueError:
            self.sampler.interleave = mine
            raise


def _datasets_changed(saved: list[str], now: list[str]) -> str:
    """What differs between the datasets a state names and this loader's, in a few words."""
    if len(saved) != len(now):
        return f"{len(saved)} datasets (now {len(now)})"
    if sorted(saved) == sorted(now):
        return "the datasets in another order"
    differ = [number for number, (before, after) in enumerate(zip(saved, now)) if before != after]
    which = "the dataset" if len(now) == 1 else f"datasets[{differ[0]}]"
    return (f"{which} {saved[differ[0]][:12]} (now {now[differ[0]][:12]}: another dataset, or the same samples "
            "packed in other shards)")


def warn_class_sorted(dataset: PackedDataset) -> None:
    """Streaming a class-sorted pack feeds batches of a few classes: a warning (once per line of the
    caller's that makes such a loader, as Python shows warnings: past make_loader and its
    `renamed_arguments`)."""
    mixing = dataset.manifest.class_mixing()
    if mixing is None or not dataset.manifest.class_sorted():
        return
    root = dataset.root
    warnings.warn(
        f"{root}: its shards hold {mixing[0]:.0f} classes each where a shuffled pack's would hold {mixing[1]:.0f}, "
        f"so streamed batches hold few classes (a worse model, with no error); pack it again, shuffled: "
        f"pack {dataset.manifest.format} {root} NEW_OUT", stacklevel=4)


def check_cache_room(dataset: Dataset, interleave: int, workers: int) -> None:
    """Refuse a `cache_limit` too small for `interleave` (`tight_cache`) in one line."""
    tight = tight_cache(dataset, interleave, workers)
    if tight is not None:
        limit, needed, largest = tight
        local_ranks = _local_ranks()
        ranks = f"{local_ranks} ranks x " if local_ranks > 1 else ""
        raise ValueError(
            f"cache_limit {format_size(limit)} is too small for streaming: {ranks}{workers} workers reading "
            f"interleave={interleave} shards at once need room for {needed} of this dataset's largest shard, "
            f"{format_size(needed * largest)}; raise cache_limit, or lower interleave or num_workers")


def _local_ranks() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)


def tight_cache(dataset: Dataset, interleave: int, workers: int) -> tuple[int, int, int] | None:
    """A streaming worker opens a shard while it holds up to `interleave - 1` others in the cache:
    unless the cache holds that many for every worker of every rank on the node that shares it,
    plus one, all of them could wait for room at once, for good (a cache with room for every shard
    never makes one wait). The first cache too small for that, as (its limit, the shards it must
    hold, the largest shard's bytes); None where all hold them. A mix's sources that share a cache
    folder count together: a worker's shards may be any of theirs."""
    caches: dict[Path, tuple[int, int, int]] = {}  # folder -> its limit, the largest lease, the shards
    for source in sources_of(dataset):
        cache = source.files.cache
        if cache is not None and cache.limit is not None:
            _, largest, shards = caches.get(cache.root, (cache.limit, 0, 0))
            caches[cache.root] = (cache.limit, max(largest, source.largest_lease()), shards + len(source.manifest.shards))
    for limit, largest, shards in caches.values():
        needed = min(_local_ranks() * workers * (interleave - 1) + 1, shards)  # room for all of them: none waits
        if limit < needed * largest:
            return limit, needed, largest
    return None


def widest_interleave(dataset: Dataset, workers: int) -> int:
    """The most shards a streaming worker may read at once, up to DEFAULT_INTERLEAVE, that every
    capped cache of the dataset holds (`tight_cache`); 1 where none wider fits."""
    return next((width for width in range(DEFAULT_INTERLEAVE, 1, -1) if tight_cache(dataset, width, workers) is None),
                1)


def log_narrow_interleave(dataset: Dataset, widest: int, workers: int) -> None:
    """Say in one line why streaming reads fewer shards at once than DEFAULT_INTERLEAVE."""
    tight = tight_cache(dataset, widest + 1, workers)
    assert tight is not None  # `widest` is the widest that fits
    limit, needed, largest = tight
    log.warning("%s: cache_limit %s holds %d of this dataset's largest shard, and %d workers reading %d shards at "
                "once need room for %d: streaming reads interleave=%d shards at once, not %d (batches mix fewer "
                "shards; raise cache_limit for more)", dataset.root, format_size(limit), limit // largest, workers,
                widest + 1, needed, widest, DEFAULT_INTERLEAVE)


def start_method(context: Any) -> str:
    """How DataLoader will start workers: `multiprocessing_context` as a name or a context, else
    this process's start method (the platform's default, first in get_all_start_methods, if unset)."""
    if isinstance(context, str):
        return context
    if context is not None:
        return context.get_start_method()
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]


def check_picklable(dataset: Dataset, method: str, functions: dict[str, Any]) -> None:
    """Workers started by spawn or forkserver receive the dataset pickled: a lambda or a function
    defined inside another cannot be, and DataLoader would fail in a worker with a PicklingError.
    Say which function, before any worker starts."""
    if method == "fork":
        return
    named = list(functions.items())
    for source in sources_of(dataset):  # each of a mix's sources has its own
        named += [("transform", source.transform), ("target_transform", source.target_transform)]
    for role, function in named:
        if function is None:
            continue
        try:
            pickle.dumps(function)
        except Exception:
            name = getattr(function, "__qualname__", None) or type(function).__qualname__
            crop = " or readers.RandomResizedCrop" if role == "transform" else ""
            raise ValueError(f"{role} {name} can't be pickled for multiprocessing_context={method!r}: use a function "
                             f"defined at module top level (def ...){crop}") from None


@renamed_arguments
def make_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    shuffle: bool | None = None,
    seed: int = 0,
    drop_last: bool = False,
    mode: LoaderMode = "train",
    shuffle_window: int | None = DEFAULT_SHUFFLE_WINDOW,
    num_workers: int | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    pin_memory: bool | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    prefetch_factor: int | None = None,
    persistent_workers: bool | None = None,
    worker_init_fn: Callable[[int], None] | None = None,
    multiprocessing_context: Any = None,
    timeout: float = 0,
    streaming: bool = False,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    prefetch_shards: int = DEFAULT_PREFETCH_SHARDS,
    interleave: int | None = None,
) -> PackedLoader:
    """A loader for a dataset from `open_dataset`, ready for single-process or DDP training.

    - `mode="train"` (shuffled by default): every rank yields the same number of batches;
      `drop_last=False` pads by repeating samples, `True` drops what does not fill a batch on every rank.
    - `mode="eval"` (stored order by default): every sample exactly once over all ranks; items
      are `(batch, mask)` and the mask is False for padding. `drop_last` is ignored.
    - The order depends only on (seed, epoch, world_size); call `set_epoch` for a new one.
      Samples are mixed within windows of `shuffle_window` shards (None: global shuffle).
    - rank/world_size default to torch.distributed's when initialised, else 0 and 1.
    - Defaults: `default_num_workers()`, pin_memory when CUDA is present, persistent workers and
      torch's prefetch_factor when there are workers, one thread per worker.
    - Batches are lists with one entry per field: tensors for images, labels, indexes and numeric
      fields of one shape, lists for paths, text, JSON values and optional fields (`SampleCollate`).
    - `streaming=True`: each worker reads whole shards front to back (shards shuffled per epoch,
      samples mixed in a buffer of `shuffle_buffer`), downloading the next `prefetch_shards`
      shards (plus `interleave - 1`) in the background; the same batch counts, padding, eval masks and resume, with an
      order that also depends on `num_workers`. `shuffle_window` does not apply. Each worker
      reads `interleave` shards at once, interleaved, so batches mix shards; a `cache_limit`
      must hold `interleave` of the largest shards per worker (of every rank on the node sharing
      the cache, $LOCAL_WORLD_SIZE), checked here: an `interleave` given that does not fit is
      refused; by default it is the widest that fits, up to 4 (a narrower one is logged), and a
      resumed state's width is taken where it fits. Workers hand columns of bytes over through
      shared memory (`readers.handover`), where /dev/shm has room for it.
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"make_loader needs a dataset from readers.open_dataset or readers.mix, "
                        f"not {type(dataset).__name__}")
    rank, world_size = distributed(rank, world_size)
    if shuffle is None:
        shuffle = mode == "train"
    workers = default_num_workers() if num_workers is None else num_workers
    if workers < 0:
        raise ValueError(f"num_workers must be >= 0, not {workers}")
    if collate_fn is None and "image" in dataset.fields and dataset.decode == "pil" and any(
            source.transform is None for source in sources_of(dataset)):
        raise ValueError('PIL images (decode="pil", the default) cannot be stacked into a batch: open the dataset '
                         'with decode="tensor" (and a transform= that makes one size), or give a transform= that '
                         'returns tensors, or a collate_fn')
    shard_sizes = np.array([shard.num_samples for shard in dataset.shards], dtype=np.int64)
    collate = collate_fn or SampleCollate(dataset, scalars_as_lists=workers > 0)
    sampler: ShardWindowBatchSampler | ShardStream
    if streaming:
        widest = widest_interleave(dataset, max(1, workers)) if interleave is None else None
        sampler = ShardStream(
            dataset, batch_size=batch_size, collate_fn=collate, seed=seed, shuffle=shuffle,
            shuffle_buffer=shuffle_buffer, rank=rank, world_size=world_size,
            drop_last=drop_last and mode == "train", mode=mode, num_workers=workers, prefetch_shards=prefetch_shards,
            interleave=interleave if widest is None else widest, scalars_as_lists=workers > 0,
            ring_slots=(2 if prefetch_factor is None else prefetch_factor) + 1 if workers > 0 else 0,
        )
        check_cache_room(dataset, sampler.interleave, max(1, workers))
        if widest is not None and shuffle:
            sampler.widest_interleave = widest
            if widest < DEFAULT_INTERLEAVE:
                log_narrow_interleave(dataset, widest, max(1, workers))
        if shuffle and mode == "train":
            for source in sources_of(dataset):
                warn_class_sorted(source)
    else:
        sampler = ShardWindowBatchSampler(
            shard_sizes, batch_size, rank=rank, world_size=world_size, seed=seed, shuffle=shuffle,
            shuffle_window=shuffle_window, drop_last=drop_last and mode == "train", mode=mode,
            orders=dataset.orders(),
        )
    # stacklevel 3: the caller's line, past `renamed_arguments`
    if sampler.num_batches == 0:
        warnings.warn(f"{dataset.root}: {sampler.num_samples} samples fill no batch of {batch_size} on each of "
                      f"{world_size} ranks with drop_last=True: the loader yields nothing", stacklevel=3)
    if streaming and mode == "train" and len(shard_sizes) < world_size * max(1, workers):
        warnings.warn(
            f"{dataset.root}: {len(shard_sizes)} shards for {world_size} ranks x {max(1, workers)} workers: "
            "streaming workers share shard files and the shard shuffle has little to mix; pack with a "
            "smaller shard size for at least one shard per worker", stacklevel=3,
        )
    args: dict[str, Any] = {
        "num_workers": workers,
        "collate_fn": None if streaming else collate,  # streaming workers collate themselves
        "pin_memory": torch.cuda.is_available() if pin_memory is None else pin_memory,
        "worker_init_fn": _WorkerInit(worker_init_fn),
    }
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0, not {timeout}")
    if workers > 0:  # the wait for a worker's batch: DataLoader refuses it (an assert) without workers
        check_picklable(dataset, start_method(multiprocessing_context),
                        {"collate_fn": collate_fn, "worker_init_fn": worker_init_fn})
        args["timeout"] = timeout
        args["persistent_workers"] = True if persistent_workers is None else persistent_workers
        args["prefetch_factor"] = prefetch_factor
        args["multiprocessing_context"] = multiprocessing_context
    log.info("loader: rank %d/%d, %d workers, %d batches of %d per rank%s", rank, world_size, workers,
             sampler.num_batches, batch_size, ", streaming" if streaming else "")
    return (StreamingLoader if streaming else PackedLoader)(dataset, sampler, **args)
