"""Several packed datasets read as one: `readers.mix`, with a share of every epoch per source.

A mix's samples are its sources' samples one after another (global index = the source's offset +
its index there; shard numbers likewise), so `make_loader` reads a mix as it reads one dataset,
map-style or streaming, with the epochs of `readers.read_order.MixOrders`: a function of the sources' shard sizes,
the counts per epoch and (seed, epoch) alone.

An epoch takes `counts[s]` samples of source s: a slice of the source's endless stream of passes
(pass p: each shard of the source once, in a shard order drawn from (seed, s, p), each front to
back); epoch e takes positions [e * count, (e + 1) * count). A source given fewer samples than it
holds is read without replacement, each epoch going on where the last one stopped; a source
given more is read whole, then again in another shard order. The sources' runs (consecutive
samples of one shard) are merged so that every source goes through its part of the epoch at the
same pace (each run placed at a random point of the stretch of its source's part it covers): any
stretch of the epoch (a rank's share, a worker's span, a shuffle window) holds the sources in
the proportions of the counts, to within a run.
"""

from __future__ import annotations

import bisect
import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Sequence

import numpy as np
from torch.utils.data import Dataset as TorchDataset

from .base import Dataset, DeferredRecord, Fields, PackedDataset, Record, sample_index
from .cache import Ahead, CachedFile, Lease
from .fields import FieldSpec
from .manifest import DatasetError, ShardInfo
from .read_order import LoaderMode, MixOrders
from .remote import ShardFiles

LabelMode = Literal["same", "merged", "per_source"]
LABEL_MODES: tuple[str, ...] = ("same", "merged", "per_source")
SOURCE_FIELD = "source"
"""The field that says which source a sample of a mix came from: its index in `datasets`."""
SOURCE_INDEX_FIELD = "source_index"
"""The field that says a mix's sample's index inside its source (its `index` field is the mix's)."""
MIX_FIELDS = (SOURCE_FIELD, SOURCE_INDEX_FIELD)
def epoch_counts(sizes: Sequence[int], *, weights: Sequence[float] | None = None, repeat: Sequence[float] | None = None,
                 choose: Sequence[int] | None = None, epoch_size: int | None = None) -> list[int]:
    """Samples of each source per training epoch. `weights`: shares of `epoch_size` (default: the
    sources' samples together); `repeat`: times each source is read (1.5 = once and a half);
    `choose`: samples of each; none of them: every sample once (or, with `epoch_size`, shares in
    proportion to the sources' sizes). A ValueError names the argument that is wrong."""
    given = {name: values for name, values in (("weights", weights), ("repeat", repeat), ("choose", choose))
             if values is not None}
    if len(given) > 1:
        raise ValueError(f"pass one of weights, repeat and choose, not {' and '.join(given)}")
    if epoch_size is not None and ("repeat" in given or "choose" in given):
        raise ValueError(f"epoch_size is the sum of the {next(iter(given))} counts; pass weights= to set it")
    if epoch_size is not None and (isinstance(epoch_size, bool) or not isinstance(epoch_size, numbers.Integral)
                                   or epoch_size < 1):
        raise ValueError(f"epoch_size must be an integer of at least 1, not {epoch_size!r}")
    name, values = next(iter(given.items()), ("weights", list(sizes)))
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or not hasattr(values, "__iter__"):
        raise ValueError(f"{name} must be one number per dataset (a list), not {values!r}")
    # numpy's and torch's numbers (an array's items) count as numbers: compare them as Python's
    values = [value.item() if hasattr(value, "item") and not isinstance(value, (int, float)) else value
              for value in values]
    if len(values) != len(sizes):
        raise ValueError(f"{name} has {len(values)} values for {len(sizes)} datasets")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be non-negative numbers, not {values}")
        if name == "choose" and not isinstance(value, int):
            raise ValueError(f"choose must be whole numbers of samples, not {values}")
    if not any(values):
        raise ValueError(f"{name} are all zero: no dataset would be read")
    if name == "choose":
        counts = [int(value) for value in values]
    elif name == "repeat":
        counts = [round(value * size) for value, size in zip(values, sizes)]
    else:
        counts = apportion(np.asarray(values, dtype=np.float64), sum(sizes) if epoch_size is None else int(epoch_size))
    for source, (count, size) in enumerate(zip(counts, sizes)):
        if count and not size:
            raise ValueError(f"datasets[{source}] has no samples to take {count} from ({name} {values[source]})")
    if not sum(counts):
        raise ValueError(f"{name} {values} take no sample at all")
    return counts


def apportion(weights: np.ndarray, total: int) -> list[int]:
    """`total` split in proportion to `weights`, in whole numbers that add up to it (largest remainders)."""
    exact = weights / weights.sum() * total
    counts = np.floor(exact).astype(np.int64)
    left = int(total - counts.sum())
    counts[np.argsort(-(exact - counts), kind="stable")[:left]] += 1
    return [int(count) for count in counts]


@dataclass(frozen=True)
class SourceShard:
    """A shard of one of a mix's sources: what the cache needs of it, and the source that holds it."""

    source: int
    info: ShardInfo

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def bytes(self) -> int:
        return self.info.bytes

    @property
    def sha256(self) -> str:
        return self.info.sha256

    @property
    def num_samples(self) -> int:
        return self.info.num_samples


class MixFiles:
    """The files of a mix's shards (`readers.remote.ShardFiles`): each source's own, local or
    through its own cache."""

    cache = None  # each source's own: `loader.sources_of` asks them

    def __init__(self, sources: Sequence[ShardFiles], root: str) -> None:
        self.sources = list(sources)
        self.root = root
        self.strategy = "; ".join(files.strategy for files in self.sources)

    def _of(self, file: CachedFile) -> tuple[ShardFiles, CachedFile]:
        if not isinstance(file, SourceShard):
            raise TypeError(f"a mix's files are SourceShard, not {type(file).__name__}")
        return self.sources[file.source], file.info

    def path(self, file: CachedFile) -> Path:
        files, info = self._of(file)
        return files.path(info)

    def present(self, file: CachedFile) -> bool:
        files, info = self._of(file)
        return files.present(info)

    def lease(self, file: CachedFile, *, make_room: Callable[[], bool] | None = None,
              ahead: Ahead | None = None, sequential: bool = False) -> Lease:
        files, info = self._of(file)
        return files.lease(info, make_room=make_room, ahead=ahead, sequential=sequential)


class MixedDataset(TorchDataset):
    """Several datasets from `open_dataset` as one (made by `readers.mix`): map-style over every
    sample of every source (`len()`), read by `make_loader` in epochs of `epoch_size` samples
    with `counts[s]` from source s. Each source keeps its own files, cache, transform and
    `on_error`; a sample is the source's, its label remapped by `labels="merged"`, its `index`
    the mix's (as `loader.indices()` counts) and the `source` and `source_index` fields inserted
    where `fields` puts them."""

    def __init__(self, datasets: Sequence[PackedDataset], counts: Sequence[int], *, labels: LabelMode,
                 names: Sequence[str], fields: Sequence[str]) -> None:
        self.sources = list(datasets)
        self.counts = list(counts)
        self.epoch_size = sum(self.counts)
        self.labels = labels
        self.names = list(names)
        self.fields = tuple(fields)
        self.decode = self.sources[0].decode
        self.root = f"mix({', '.join(self.names)})"
        self.files = MixFiles([source.files for source in self.sources], self.root)
        self.shards = [SourceShard(number, info) for number, source in enumerate(self.sources)
                       for info in source.manifest.shards]
        self._first_shard = np.cumsum([0] + [len(source.manifest.shards) for source in self.sources]).tolist()
        self._starts = np.cumsum([0] + [len(source) for source in self.sources]).tolist()
        self._orders = MixOrders([[shard.num_samples for shard in source.manifest.shards] for source in self.sources],
                                 self.counts)
        self.source_classes = [list(source.classes) for source in self.sources]
        self._classes, self._lookup = class_table(self.source_classes, labels, self.names)
        stored = self.sources[0].fields
        # (position in `fields`, mix field), in order: inserted one by one, each lands where `fields` puts it
        self._inserts = [(at, name) for at, name in enumerate(self.fields) if name in MIX_FIELDS]
        self._label_at = stored.index("label") if self._lookup is not None and "label" in stored else None
        self._index_at = stored.index("index") if "index" in stored else None
        self._changes = bool(self._inserts) or self._label_at is not None or self._index_at is not None

    @property
    def classes(self) -> list[str]:
        """The class names the labels index: the sources' (labels="same") or all of them joined
        ("merged"); with labels="per_source" each source's labels index its own `source_classes`."""
        if self._classes is None:
            raise ValueError('labels="per_source": each source\'s labels index its own class list, '
                             "mix.source_classes[sample's source]")
        return self._classes

    def orders(self) -> MixOrders:
        return self._orders

    def field_spec(self, name: str) -> FieldSpec | None:
        return None if name in MIX_FIELDS else self.sources[0].field_spec(name)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def locate_source(self, index: int) -> tuple[int, int]:
        """Global sample index -> (source number, index in that source)."""
        source = bisect.bisect_right(self._starts, index) - 1
        return source, index - self._starts[source]

    def _shard(self, shard: int) -> tuple[PackedDataset, int]:
        source = bisect.bisect_right(self._first_shard, shard) - 1
        return self.sources[source], shard - self._first_shard[source]

    def _finish(self, source: int, local: int, sample: tuple[Any, ...]) -> tuple[Any, ...]:
        """Source `source`'s sample `local` as the mix gives it: label remapped, index made the
        mix's, `source` and `source_index` inserted. A sample that stands in for an unreadable one
        (on_error="skip") says its own index, where the source gives it."""
        if not self._changes:
            return sample
        values = list(sample)
        if self._index_at is not None:
            local = values[self._index_at]
            values[self._index_at] = self._starts[source] + local
        if self._label_at is not None and self._lookup is not None:
            label, table = values[self._label_at], self._lookup[source]
            if label >= len(table):  # a dataset that names no classes may hold any label
                raise DatasetError(f"{self.names[source]}: label {label} has no class name to merge (the dataset "
                                   f'names {len(table)} classes); mix it with labels="per_source"')
            if label >= 0:  # -1: unlabelled, in every class list
                values[self._label_at] = table[label]
        for at, name in self._inserts:
            values.insert(at, source if name == SOURCE_FIELD else local)
        return tuple(values)

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        index = sample_index(index, len(self))
        source, local = self.locate_source(index)
        return self._finish(source, local, self.sources[source][local])

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, ...]]:
        """A batch's samples, each source's asked for together (its read-ahead sees them all). In
        plain Python: for a batch's few dozen indices, numpy's calls cost more than the loop."""
        groups: dict[int, tuple[list[int], list[int]]] = {}
        starts, size, find = self._starts, len(self), bisect.bisect_right
        for position, index in enumerate(indices):
            index = int(index)
            if not 0 <= index < size:
                return [self[index] for index in indices]  # negative ones count from the end; the others raise
            source = find(starts, index) - 1
            positions, local = groups.setdefault(source, ([], []))
            positions.append(position)
            local.append(index - starts[source])
        out: list[tuple[Any, ...]] = [()] * len(indices)
        for source, (positions, local) in groups.items():
            samples = self.sources[source].__getitems__(local)
            if self._changes:
                samples = [self._finish(source, index, sample) for index, sample in zip(local, samples)]
            for position, sample in zip(positions, samples):
                out[position] = sample
        return out

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        for number, source in enumerate(self.sources):
            for local, sample in enumerate(source):
                yield self._finish(number, local, sample)

    # What the streaming loader reads through (global shard numbers and sample indices).

    def stream_records(self, shard: int, start: int, stop: int
                       ) -> Iterator[tuple[int, Record | DeferredRecord | DatasetError]]:
        source, local = self._shard(shard)
        return source.stream_records(local, start, stop)

    def close_shard(self, shard: int) -> None:
        source, local = self._shard(shard)
        source.close_shard(local)

    def decode_sample(self, index: int, meta: dict[str, Any], payload: memoryview, fields: Fields) -> tuple[Any, ...]:
        source, local = self.locate_source(index)
        return self._finish(source, local, self.sources[source].decode_sample(local, meta, payload, fields))

    def close(self) -> None:
        for source in self.sources:
            source.close()

    def __repr__(self) -> str:
        parts = ", ".join(f"{name!r}: {count}/{len(source)}"
                          for name, count, source in zip(self.names, self.counts, self.sources))
        return f"MixedDataset({{{parts}}}, epoch_size={self.epoch_size}, labels={self.labels!r})"


def sources_of(dataset: Dataset) -> list[PackedDataset]:
    """The datasets a loader reads: a mix's sources, or the dataset itself."""
    return dataset.sources if isinstance(dataset, MixedDataset) else [dataset]


def class_table(source_classes: list[list[str]], labels: LabelMode,
                names: list[str]) -> tuple[list[str] | None, list[list[int]] | None]:
    """The mix's class list and, for labels="merged", each source's label -> merged label;
    labels="same" with class lists that differ is a ValueError naming the first difference."""
    if labels == "per_source":
        return None, None
    if labels == "same":
        first = source_classes[0]
        for number, classes in enumerate(source_classes[1:], 1):
            if classes != first:
                at = next((i for i, (a, b) in enumerate(zip(first, classes)) if a != b), min(len(first), len(classes)))
                seen = [repr(cls[at]) if at < len(cls) else "nothing" for cls in (first, classes)]
                raise ValueError(
                    f"datasets[{number}] ({names[number]}) has other classes than datasets[0] ({names[0]}): "
                    f"{len(classes)} against {len(first)}, class {at} is {seen[1]} against {seen[0]}; pass "
                    'labels="merged" (one class list, labels remapped) or labels="per_source" (with the source field)')
        return list(first), None
    merged: dict[str, int] = {}
    for classes in source_classes:
        for name in classes:
            merged.setdefault(name, len(merged))
    return list(merged), [[merged[name] for name in classes] for classes in source_classes]


def mix(
    datasets: Sequence[PackedDataset],
    weights: Sequence[float] | None = None,
    *,
    repeat: Sequence[float] | None = None,
    choose: Sequence[int] | None = None,
    epoch_size: int | None = None,
    labels: LabelMode = "same",
    names: Sequence[str] | None = None,
    fields: Sequence[str] | None = None,
) -> MixedDataset:
    """Datasets from `open_dataset` (any format, local or URL) read as one by `make_loader`.

    Each training epoch takes a number of samples of every source, given by one of:
    `weights` (shares of `epoch_size`, which defaults to all the sources' samples together),
    `repeat` (times each source is read per epoch, 0.5 = half of it) or `choose` (samples of
    each); none: every sample once. A source is read without replacement until it is used up
    (the next epochs go on from there), and again in a new order when its share exceeds it.
    `mode="eval"` ignores them: every sample of every source once.

    `labels`: "same" (default) requires one class list; "merged" joins the class lists in order
    of first appearance and remaps each source's labels into it; "per_source" leaves every
    source's labels as they are (tell them apart by the source field). `fields`: the sources'
    fields with "source" (the sample's index in `datasets`) and "source_index" (its index in
    that dataset) inserted where they should come, e.g. ("image", "label", "source"); a mix's
    "index" field counts the mix's samples (the sources one after another, as `mix[i]` and
    `loader.indices()`). `names` (default: each dataset's root) name the sources.
    """
    sources = list(datasets)
    if not sources:
        raise ValueError("mix needs at least one dataset")
    for number, source in enumerate(sources):
        if not isinstance(source, PackedDataset):
            raise TypeError(f"datasets[{number}] is a {type(source).__name__}, not a dataset from readers.open_dataset")
    if labels not in LABEL_MODES:
        raise ValueError(f"labels must be one of {', '.join(LABEL_MODES)}, not {labels!r}")
    if isinstance(names, str):
        raise ValueError(f"names must be one name per dataset, not the string {names!r}")
    source_names = [str(source.root) for source in sources] if names is None else [str(name) for name in names]
    if len(source_names) != len(sources):
        raise ValueError(f"names has {len(source_names)} names for {len(sources)} datasets")
    check_alike(sources, labels)
    stored = sources[0].fields
    mixed_fields = tuple(stored) if fields is None else tuple(fields)
    if [name for name in mixed_fields if name not in MIX_FIELDS] != list(stored) or any(
            mixed_fields.count(name) > 1 for name in MIX_FIELDS):
        raise ValueError(f"fields {mixed_fields} must be the datasets' fields {tuple(stored)} with "
                         f"{SOURCE_FIELD!r} and {SOURCE_INDEX_FIELD!r} added (each once) where they should come")
    if labels == "per_source" and "label" in stored and SOURCE_FIELD not in mixed_fields:
        raise ValueError(f'labels="per_source" leaves label 0 of one dataset and of another apart only by the '
                         f'{SOURCE_FIELD!r} field: add it to fields, e.g. {(*stored, SOURCE_FIELD)}')
    counts = epoch_counts([len(source) for source in sources], weights=weights, repeat=repeat, choose=choose,
                          epoch_size=epoch_size)
    return MixedDataset(sources, counts, labels=labels, names=source_names, fields=mixed_fields)


def check_alike(sources: list[PackedDataset], labels: LabelMode) -> None:
    """Sources must give samples of one shape: the same fields, of the same types, decoded alike."""
    first = sources[0]
    for number, source in enumerate(sources[1:], 1):
        for setting in ("fields", "decode", "decode_size"):
            if getattr(source, setting) != getattr(first, setting):
                raise ValueError(f"datasets[{number}] was opened with {setting}={getattr(source, setting)!r}, "
                                 f"datasets[0] with {getattr(first, setting)!r}: open every dataset of a mix alike")
        for name in first.fields:
            if source.field_spec(name) != first.field_spec(name):
                raise ValueError(f"field {name!r} is {source.field_spec(name)} in datasets[{number}] and "
                                 f"{first.field_spec(name)} in datasets[0]")
    if labels == "merged":
        for number, source in enumerate(sources):
            if source.target_transform is not None and "label" in source.fields:
                raise ValueError(f'datasets[{number}] has a target_transform: labels="merged" remaps the labels it '
                                 "reads, so transform them after the mix (open the datasets without one)")
