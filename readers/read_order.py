"""Every read order: which samples each rank reads in an epoch and in what order, the order a
streaming worker reads its shards in, and a mix's merge of its sources. Imports no torch.

The order of an epoch is computed from the manifest's shard sizes alone: shuffle the shards,
cut the shuffled shard list into windows of `shuffle_window` consecutive shards, shuffle the
samples inside each window. The result is a permutation of every index that depends only on
(seed, epoch); ranks then take equal contiguous slices of it, so the split depends only on the
world size. Any loader (the map-style one in `readers.loader`, or `readers.streaming`, which
reads whole shards in `stream_order`) gets its order and the same equal-share rule from here.

A streaming worker reads `interleave` runs of its span at once (`interleaved_order`), through a
shuffle buffer (`buffer_order`); a mix of datasets (`readers.mix`) merges its sources' runs at an
even pace (`MixOrders`). Every order here is a function of its arguments alone (sizes, seed,
epoch, rank, worker), never of data.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any, Callable, Literal, Protocol, Sequence, TypeVar

import numpy as np

LoaderMode = Literal["train", "eval"]
LOADER_MODES: tuple[str, ...] = ("train", "eval")
""""train": equal shares padded or trimmed to whole batches; "eval": every sample exactly once."""
DEFAULT_SHUFFLE_WINDOW = 32
"""Shards whose samples are mixed together; 32 default shards of 10k samples = 320k samples."""
RENAMED = {"mix_shards": "interleave"}
"""Old names of the loaders' arguments and loader states' keys -> their names now: "mix" is
`readers.mix` (several datasets), the shards a streaming worker reads at once are its interleave."""
F = TypeVar("F", bound=Callable[..., Any])


def renamed_arguments(function: F) -> F:
    """`function` taking the old names of RENAMED as well, with a DeprecationWarning that says the new one."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        for old, new in RENAMED.items():
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(f"{function.__qualname__}() got {old}= and {new}=, its new name: pass {new}= alone")
                warnings.warn(f"{old}= is now called {new}=; the old name will go", DeprecationWarning, stacklevel=2)
                kwargs[new] = kwargs.pop(old)
        return function(*args, **kwargs)

    return call  # type: ignore[return-value]


def renamed_state(state: dict[str, Any]) -> dict[str, Any]:
    """A saved loader state with the old key names of RENAMED under their new ones."""
    return {RENAMED.get(key, key): value for key, value in state.items()}


def check_split_args(num_samples: int, *, batch_size: int, rank: int, world_size: int, seed: int,
                     shuffle_window: int | None, mode: str) -> None:
    """Refuse arguments no order or split is defined for, with the argument's name in the message."""
    if num_samples == 0:
        raise ValueError("cannot sample from an empty dataset")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, not {seed}")
    if shuffle_window is not None and shuffle_window < 1:
        raise ValueError(f"shuffle_window must be at least 1 shard (or None), not {shuffle_window}")
    if mode not in LOADER_MODES:
        raise ValueError(f"mode must be one of {', '.join(LOADER_MODES)}, not {mode!r}")


def concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + n) for each (s, n), without a Python loop."""
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    block_starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    return np.arange(total, dtype=np.int64) + np.repeat(starts - block_starts, lengths)


def _epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, epoch]))


def shard_order(num_shards: int, *, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The order in which `epoch_order` visits shards, for loaders that read whole shards."""
    if not shuffle:
        return np.arange(num_shards, dtype=np.int64)
    return _epoch_rng(seed, epoch).permutation(num_shards)


def stream_order(shard_sizes: Sequence[int] | np.ndarray, *, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """All sample indices as a streaming loader reads them: whole shards front to back, in `shard_order`."""
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(sizes)))[:-1]
    shards = shard_order(len(sizes), seed=seed, epoch=epoch, shuffle=shuffle)
    return concat_ranges(offsets[shards], sizes[shards])


def epoch_order(
    shard_sizes: Sequence[int] | np.ndarray,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    shuffle_window: int | None = DEFAULT_SHUFFLE_WINDOW,
) -> np.ndarray:
    """The permutation of all sample indices read in one epoch (int64 array).

    With `shuffle`, the shard order is shuffled (`shard_order`), then samples are shuffled within
    each window of `shuffle_window` consecutive shards of that order (None: one window, a global
    shuffle). Without it, samples come in stored order. Depends on nothing but the arguments.
    """
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    if not shuffle:
        return np.arange(offsets[-1], dtype=np.int64)
    rng = _epoch_rng(seed, epoch)
    shards = rng.permutation(len(sizes))  # the same draw as shard_order's, then the windows' shuffles
    order = concat_ranges(offsets[shards], sizes[shards])
    shuffle_windows(order, sizes[shards], shuffle_window, rng)
    return order


def shuffle_windows(order: np.ndarray, lengths: np.ndarray, window: int | None, rng: np.random.Generator) -> None:
    """Shuffle `order` (runs of `lengths`, in reading order) in place within each window of
    `window` consecutive runs (None: one window, a global shuffle)."""
    window = len(lengths) if window is None else window
    ends = np.cumsum(lengths)
    start = 0
    for first in range(0, len(lengths), max(1, window)):
        end = int(ends[min(first + window, len(lengths)) - 1])
        rng.shuffle(order[start:end])
        start = end


def buffer_order(count: int, buffer: int, rng: np.random.Generator) -> np.ndarray:
    """The output order of a shuffle buffer of `buffer` samples over a stream of `count`:
    output i is input `order[i]`. Depends on the generator only, so it can be replayed without data."""
    if buffer <= 1 or count <= 1:
        return np.arange(count, dtype=np.int64)
    pool = list(range(min(buffer, count)))
    arriving = len(pool)
    order = []
    # Python floats and a list: numpy scalars made it 1.5x slower (a span of 5,000: 1.2 ms)
    for draw in rng.random(count).tolist():
        slot = int(draw * len(pool))
        order.append(pool[slot])
        if arriving < count:
            pool[slot] = arriving
            arriving += 1
        else:
            pool[slot] = pool[-1]
            pool.pop()
    return np.array(order, dtype=np.int64)


def interleaved_order(run_lengths: Sequence[int] | np.ndarray, width: int, rng: np.random.Generator) -> np.ndarray:
    """The order a worker reads the positions of its span in, when its span is `run_lengths`
    consecutive runs of one shard each: `width` lanes, each a queue of whole runs (every run joins
    the lane with the fewest samples so far, in span order), interleaved at random in proportion
    to their lengths. Each run is read front to back, at most `width` are open at once (one per
    lane), and `width=1` is the span in order. Output i is span position `order[i]`."""
    lengths = np.asarray(run_lengths, dtype=np.int64)
    total = int(lengths.sum())
    if width <= 1 or len(lengths) <= 1:
        return np.arange(total, dtype=np.int64)
    lanes = min(width, len(lengths))
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    members: list[list[int]] = [[] for _ in range(lanes)]
    sizes = [0] * lanes
    for run, length in enumerate(lengths.tolist()):
        lane = sizes.index(min(sizes))
        members[lane].append(run)
        sizes[lane] += length
    labels = rng.permutation(np.repeat(np.arange(lanes), sizes))  # which lane each read takes from
    order = np.empty(total, dtype=np.int64)
    for lane, runs in enumerate(members):
        order[labels == lane] = concat_ranges(starts[runs], lengths[runs])
    return order


def share_size(num_samples: int, *, world_size: int, batch_size: int, drop_last: bool, mode: LoaderMode) -> int:
    """Samples every rank reads per epoch: the same on all ranks, padding included."""
    if mode == "train" and drop_last:
        return num_samples // world_size // batch_size * batch_size
    return math.ceil(num_samples / world_size)


def real_share_size(num_samples: int, *, rank: int, world_size: int, batch_size: int, drop_last: bool,
                    mode: LoaderMode) -> int:
    """Samples of this rank's share that are not padding: all of them in "train" (padding repeats
    samples that train anyway), only those before the end of the order in "eval"."""
    per_rank = share_size(num_samples, world_size=world_size, batch_size=batch_size, drop_last=drop_last, mode=mode)
    if mode == "train":
        return per_rank
    start = min(rank * per_rank, num_samples)
    return min(per_rank, num_samples - start)


def split_for_rank(
    order: np.ndarray, *, rank: int, world_size: int, batch_size: int, drop_last: bool, mode: LoaderMode
) -> tuple[np.ndarray, int]:
    """This rank's contiguous share of an epoch's order, and how many of its samples are real.

    Every rank gets `share_size` samples. "train": pad by repeating the order from its start
    (drop_last=False) or drop the tail that does not fill a batch on every rank (True).
    "eval": each sample exactly once over all ranks, then padding at the end of a rank's share.
    """
    total = len(order)
    per_rank = share_size(total, world_size=world_size, batch_size=batch_size, drop_last=drop_last, mode=mode)
    if mode == "train":
        padded = np.resize(order, per_rank * world_size) if per_rank * world_size > total else order
        return padded[rank * per_rank : (rank + 1) * per_rank], per_rank
    start = min(rank * per_rank, total)
    real = order[start : min(start + per_rank, total)]
    return np.concatenate((real, np.resize(order, per_rank - len(real)))), len(real)


class EpochOrders(Protocol):
    """What an epoch of a dataset is: how many samples it reads and in which order, map-style
    (`epoch_order`) and for streaming (`stream_order`, whole runs of a shard front to back), as
    global sample indices. `ShardOrders` for one dataset, `MixOrders` for a mix."""

    sources: list[list[int]] | None
    """What a saved loader state records of the sources (None: one dataset)."""

    def epoch_size(self, mode: LoaderMode) -> int: ...
    def epoch_order(self, *, seed: int, epoch: int, shuffle: bool, shuffle_window: int | None,
                    mode: LoaderMode) -> np.ndarray: ...
    def stream_order(self, *, seed: int, epoch: int, shuffle: bool, mode: LoaderMode) -> np.ndarray: ...


class ShardOrders:
    """The epochs of one dataset: every sample once, in `epoch_order` or `stream_order` of its shard sizes."""

    sources = None

    def __init__(self, shard_sizes: Sequence[int] | np.ndarray) -> None:
        self.shard_sizes = np.asarray(shard_sizes, dtype=np.int64)

    def epoch_size(self, mode: LoaderMode) -> int:
        return int(self.shard_sizes.sum())

    def epoch_order(self, *, seed: int, epoch: int, shuffle: bool, shuffle_window: int | None,
                    mode: LoaderMode) -> np.ndarray:
        return epoch_order(self.shard_sizes, seed=seed, epoch=epoch, shuffle=shuffle, shuffle_window=shuffle_window)

    def stream_order(self, *, seed: int, epoch: int, shuffle: bool, mode: LoaderMode) -> np.ndarray:
        return stream_order(self.shard_sizes, seed=seed, epoch=epoch, shuffle=shuffle)


class RankSplit:
    """One rank's epoch in numbers, for any loader: the checked arguments, the samples it reads
    (`samples_per_rank`, padding included), how many are real, and its batch count. `orders`
    says what an epoch is (default: every sample of `shard_sizes` once)."""

    def __init__(self, shard_sizes: Sequence[int] | np.ndarray, batch_size: int, *, rank: int, world_size: int,
                 seed: int, shuffle: bool, drop_last: bool, mode: LoaderMode, shuffle_window: int | None = None,
                 orders: EpochOrders | None = None) -> None:
        self.shard_sizes = np.asarray(shard_sizes, dtype=np.int64)
        self.orders: EpochOrders = ShardOrders(self.shard_sizes) if orders is None else orders
        self.sources = self.orders.sources
        self.num_samples = self.orders.epoch_size(mode)
        check_split_args(self.num_samples, batch_size=batch_size, rank=rank, world_size=world_size, seed=seed,
                         shuffle_window=shuffle_window, mode=mode)
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.mode: LoaderMode = mode
        self.samples_per_rank = share_size(self.num_samples, world_size=world_size, batch_size=batch_size,
                                           drop_last=drop_last, mode=mode)
        self.num_real = real_share_size(self.num_samples, rank=rank, world_size=world_size, batch_size=batch_size,
                                        drop_last=drop_last, mode=mode)
        self.num_batches = math.ceil(self.samples_per_rank / batch_size)


_MIX_KEY = 0x6D6978  # keeps a mix's draws apart from those of one dataset with the same seed
_PASS, _MERGE, _WINDOWS = 0, 1, 2


def _rng(*keys: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([_MIX_KEY, *keys]))


class MixOrders:
    """The epochs of a mix (`EpochOrders`; `readers.mixed`): `counts[s]` samples of source s per
    training epoch, every sample of every source once in "eval" mode (the counts ignored)."""

    def __init__(self, shard_sizes: Sequence[Sequence[int]], counts: Sequence[int]) -> None:
        self.source_shards = [np.asarray(sizes, dtype=np.int64) for sizes in shard_sizes]
        self.sizes = [int(sizes.sum()) for sizes in self.source_shards]
        self.counts = list(counts)
        self.sources: list[list[int]] | None = [[size, count] for size, count in zip(self.sizes, self.counts)]
        self._first_shard = np.cumsum([0] + [len(sizes) for sizes in self.source_shards])
        every = np.concatenate(self.source_shards) if self.source_shards else np.empty(0, dtype=np.int64)
        self._shard_starts = np.concatenate(([0], np.cumsum(every)))

    def epoch_size(self, mode: LoaderMode) -> int:
        return sum(self.sizes) if mode == "eval" else sum(self.counts)

    def source_runs(self, source: int, first: int, count: int, *, seed: int, shuffle: bool) -> tuple[np.ndarray, np.ndarray]:
        """Positions [first, first + count) of the source's stream of passes, as runs: the global
        index each starts at, and their lengths."""
        sizes = self.source_shards[source]
        size = self.sizes[source]
        starts, lengths = [], []
        position, end = first, first + count
        while position < end:
            number = position // size
            shards = _rng(seed, _PASS, source, number).permutation(len(sizes)) if shuffle else np.arange(len(sizes))
            bounds = np.concatenate(([0], np.cumsum(sizes[shards])))
            low = np.maximum(bounds[:-1], position - number * size)
            high = np.minimum(bounds[1:], end - number * size)
            keep = high > low
            global_shards = self._first_shard[source] + shards[keep]
            starts.append(self._shard_starts[global_shards] + (low - bounds[:-1])[keep])
            lengths.append((high - low)[keep])
            position = number * size + int(high[-1])
        if not starts:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        return np.concatenate(starts), np.concatenate(lengths)

    def runs(self, *, seed: int, epoch: int, shuffle: bool, mode: LoaderMode) -> tuple[np.ndarray, np.ndarray]:
        """The epoch as runs (global start, length), in reading order: the sources' parts merged at
        an even pace when shuffled, else one after another."""
        starts, lengths, keys = [], [], []
        merge = _rng(seed, _MERGE, epoch)
        for source, (size, count) in enumerate(zip(self.sizes, self.counts)):
            count = size if mode == "eval" else count
            if count == 0:
                continue
            source_starts, source_lengths = self.source_runs(source, epoch * count, count, seed=seed, shuffle=shuffle)
            before = np.concatenate(([0], np.cumsum(source_lengths)[:-1]))
            starts.append(source_starts)
            lengths.append(source_lengths)
            keys.append((before + merge.random(len(source_lengths)) * source_lengths) / count)
        all_starts, all_lengths = np.concatenate(starts), np.concatenate(lengths)
        if not shuffle:
            return all_starts, all_lengths
        order = np.argsort(np.concatenate(keys), kind="stable")
        return all_starts[order], all_lengths[order]

    def stream_order(self, *, seed: int, epoch: int, shuffle: bool, mode: LoaderMode) -> np.ndarray:
        return concat_ranges(*self.runs(seed=seed, epoch=epoch, shuffle=shuffle, mode=mode))

    def epoch_order(self, *, seed: int, epoch: int, shuffle: bool, shuffle_window: int | None,
                    mode: LoaderMode) -> np.ndarray:
        """The stream order with the samples shuffled within windows of `shuffle_window` runs (None: all)."""
        starts, lengths = self.runs(seed=seed, epoch=epoch, shuffle=shuffle, mode=mode)
        order = concat_ranges(starts, lengths)
        if shuffle:
            shuffle_windows(order, lengths, shuffle_window, _rng(seed, _WINDOWS, epoch))
        return order
