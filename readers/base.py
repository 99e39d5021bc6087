"""What every packed dataset shares: the manifest, index arithmetic, decoding and fields."""

from __future__ import annotations

import bisect
import os
import warnings
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np
from PIL import Image
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import get_worker_info

from .cache import CachedFile, Lease
from .decode import get_decoder
from .fields import BUILTIN_FIELDS, FieldSpec
from .manifest import (ON_ERROR_MODES, DatasetChanged, DatasetError, FileInfo, Manifest, ShardInfo, load_manifest,
                       payload_crc32)
from .read_order import EpochOrders, ShardOrders
from .remote import LocalFiles, ShardFiles

Fields = dict[str, Any]  # a sample's stored fields, by name: the values of `PackedDataset.wanted`
Record = tuple[dict[str, Any], memoryview, Fields]
"""A stored sample before decoding: its meta, a view of its payload and its wanted fields' values."""


class DeferredRecord:
    """A record a stream has read in part, its payload still in the open shard: read when the sample
    is handed out (`load`), or all at once before the shard is closed (`settle`), so a streaming
    worker reads the payloads of the samples it hands out first, not of everything its shuffle
    buffer holds."""

    __slots__ = ()

    def load(self) -> Record:
        """The checked record (a damaged one raises its DatasetError)."""
        raise NotImplementedError

    def settle(self) -> None:
        """Read what `load` would, now: the shard is about to be closed."""
        raise NotImplementedError


SPAN_READ_BYTES = 1 << 20
"""The most a batch's rows of a per-sample table (HDF5 columns, a tar's .packidx) read as one span."""


def read_as_span(first: int, stop: int, row_bytes: int) -> bool:
    """Whether rows first..stop-1 of a per-sample table, which a batch's rows lie between, are read
    in one pread (a shuffled batch's rows of a 10k-sample shard: 80-320 KB), not a pread a row."""
    return (stop - first) * row_bytes <= SPAN_READ_BYTES


def meta_problem(meta: Any, classes: int, payload_bytes: int) -> str | None:
    """What is wrong with a record's meta (FORMAT.md "Per-sample record"), read from a shard and so
    untrusted, before decoding uses it; None if nothing. A label must index `classes` (or be -1,
    or any index when the dataset names no classes); a shape must fit the payload of a raw sample."""
    if not isinstance(meta, dict):
        return "damaged record meta (not a JSON object)"
    label = meta.get("label")
    if not isinstance(label, int) or isinstance(label, bool) or label < -1 or (classes and label >= classes):
        return f"damaged record meta (label {label!r} is not a class index)"
    if not isinstance(meta.get("format"), str) or not isinstance(meta.get("path", ""), str):
        return "damaged record meta (format and path must be text)"
    crc = meta.get("crc32")
    if crc is not None and (not isinstance(crc, int) or isinstance(crc, bool)):
        return "damaged record meta (crc32 must be an integer)"
    shape = meta.get("shape")
    if shape is not None:
        if not (isinstance(shape, list) and len(shape) == 3 and all(
                isinstance(side, int) and not isinstance(side, bool) and side > 0 for side in shape)):
            return f"damaged record meta (shape {shape!r} is not [height, width, channels])"
        if meta["format"] == "raw" and shape[0] * shape[1] * shape[2] != payload_bytes:
            return f"damaged record meta (shape {shape} does not fit {payload_bytes} bytes of pixels)"
    elif meta["format"] == "raw":
        return "damaged record meta (raw pixels without a shape)"
    if meta.get("mode", "RGB") not in ("RGB", "L") or meta.get("dtype", "uint8") != "uint8":
        return "damaged record meta (mode must be RGB or L, dtype uint8)"
    return None


def sample_index(index: int, size: int) -> int:
    """`index` of `size` samples as a list takes it (negative from the end), else IndexError."""
    position = int(index)
    if position < 0:
        position += size
    if not 0 <= position < size:
        raise IndexError(f"sample index {position} out of range for {size} samples")
    return position


class Shard(CachedFile, Protocol):
    """A shard as the loaders see it: what the cache needs of its file, and how many samples it holds."""

    @property
    def num_samples(self) -> int: ...


@runtime_checkable
class Dataset(Protocol):
    """What the loaders (`readers.loader`, `readers.streaming`) need of a dataset: one from
    `open_dataset` (a `PackedDataset`) and several read as one (`readers.mix`, a MixedDataset)
    alike. Global sample indices and shard numbers; `orders()` says what an epoch reads."""

    root: str | Path
    files: ShardFiles
    fields: tuple[str, ...]
    decode: str

    @property
    def shards(self) -> Sequence[Shard]: ...
    def orders(self) -> EpochOrders: ...
    def field_spec(self, name: str) -> FieldSpec | None: ...
    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> tuple[Any, ...]: ...
    def stream_records(self, shard: int, start: int, stop: int
                       ) -> Iterator[tuple[int, Record | DeferredRecord | DatasetError]]: ...
    def close_shard(self, shard: int) -> None: ...
    def decode_sample(self, index: int, meta: dict[str, Any], payload: memoryview,
                      fields: Fields) -> tuple[Any, ...]: ...


class PackedDataset(TorchDataset):
    """Map-style dataset over the shards of one manifest.

    Subclasses implement `_read(shard, local_index) -> (meta, payload, fields)`, `fields` holding
    the values of the stored fields in `wanted` (None for an absent one). Handles to shard files
    are opened lazily, per process, so a dataset can be pickled to spawn workers or inherited
    through fork; `__getstate__` drops whatever the parent opened. `files` says where the shard
    files are (a local directory, or a URL through the cache); an open handle holds a lease on
    its files, so a shared cache never evicts them while they are open.
    """

    format: ClassVar[str] = ""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        manifest: Manifest | None = None,
        files: ShardFiles | None = None,
        decode: str = "pil",
        fields: Sequence[str] = ("image", "label"),
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        on_error: str = "fail",
        decode_size: tuple[int, int] | None = None,
    ) -> None:
        self.files = files if files is not None else LocalFiles(root)
        self.root = self.files.root
        self.manifest = manifest if manifest is not None else load_manifest(self.root)
        if files is None:
            self.files.sizes(self.manifest)  # the files' identities: a lease on a replaced one fails
        self.decode = decode
        self.decode_size = decode_size
        self._decoder = get_decoder(decode, decode_size)
        if not fields:
            raise ValueError("fields must name at least one field")
        specs = {spec.name: spec for spec in self.manifest.fields}
        unknown = [name for name in fields if name not in BUILTIN_FIELDS and name not in specs]
        if unknown:
            raise DatasetError(f"{self.root}: no field {unknown[0]!r}; available: "
                               + ", ".join((*BUILTIN_FIELDS, *specs)))
        self.fields = tuple(fields)
        # The stored fields asked for: the format hooks read only these.
        self.wanted = [specs[name] for name in dict.fromkeys(fields) if name in specs]
        self.transform = transform
        self.target_transform = target_transform
        if on_error == "raise":  # the readers' word for "fail" before both sides used the packer's
            warnings.warn('on_error="raise" is deprecated; use "fail"', DeprecationWarning, stacklevel=3)
            on_error = "fail"
        if on_error not in ON_ERROR_MODES:
            raise ValueError(f"on_error must be one of {ON_ERROR_MODES}, not {on_error!r}")
        self.on_error = on_error
        self.skipped = 0
        counts = np.array([shard.num_samples for shard in self.manifest.shards], dtype=np.int64)
        self._offsets = np.concatenate(([0], np.cumsum(counts)))
        self._starts = self._offsets.tolist()  # the same as ints: `locate` bisects it ~10x faster
        self._pid = os.getpid()
        self._handles: dict[int, Any] = {}
        self._leases: dict[int, list[Lease]] = {}
        self._in_place: set[int] = set()  # shards whose leases a copy may supersede (`Lease.provisional`)
        self._largest: int | None = None  # `largest_lease()`, worked out on first use

    @property
    def classes(self) -> list[str]:
        return self.manifest.classes

    @property
    def shards(self) -> list[ShardInfo]:
        """The manifest's shards, in the order shard numbers count them."""
        return self.manifest.shards

    def orders(self) -> ShardOrders:
        """What an epoch is (for the loaders): every sample once."""
        return ShardOrders([shard.num_samples for shard in self.manifest.shards])

    def field_spec(self, name: str) -> FieldSpec | None:
        """The stored field `name` as index.json describes it; None for a built-in field."""
        return next((spec for spec in self.manifest.fields if spec.name == name), None)

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def shard_path(self, shard: int) -> Path:
        """The shard's local file (in the cache for a URL: there while a lease on it is held)."""
        return self.files.path(self.manifest.shards[shard])

    def locate(self, index: int) -> tuple[int, int]:
        """Global sample index (0 <= index < len) -> (shard number, index inside that shard)."""
        shard = bisect.bisect_right(self._starts, index) - 1
        return shard, index - self._starts[shard]

    def handle(self, shard: int, *, sequential: bool = False) -> Any:
        """The open handle for a shard in this process, opened on first use (`sequential`: to be
        read front to back, see `ShardFiles.lease`)."""
        if self._pid != os.getpid():
            self._handles = {}
            self._leases = {}
            self._in_place = set()
            self._pid = os.getpid()
        handle = self._handles.get(shard)
        if handle is not None and shard in self._in_place and any(lease.superseded() for lease in self._leases[shard]):
            self.close_shard(shard)  # read in place while its copy was made: the copy is there now
            handle = None
        if handle is None:
            leases = self._leases[shard] = self._lease(shard, sequential)
            if any(lease.provisional for lease in leases):
                self._in_place.add(shard)
            try:
                handle = self._handles[shard] = self._open(shard)
            except BaseException:
                self.close_shard(shard)
                raise
        return handle

    def read_sidecars(self, shard: int) -> tuple[FileInfo, ...]:
        """The shard's sidecar files this reader opens (a format may keep some for other tools)."""
        return self.manifest.shards[shard].sidecars

    def largest_lease(self) -> int:
        """The most cache room one shard takes while a handle holds it: the shard with the sidecars
        its reader reads (never a wds shard's DALI index); what a cache limit is measured in."""
        return max((info.bytes + sum(sidecar.bytes for sidecar in self.read_sidecars(shard))
                    for shard, info in enumerate(self.manifest.shards)), default=0)

    def _lease(self, shard: int, sequential: bool = False) -> list[Lease]:
        """Leases on the shard's file and the sidecars it reads; when the cache is full, this
        process's own oldest open shards are closed first."""
        info = self.manifest.shards[shard]
        leases: list[Lease] = []
        try:
            for file in (info, *self.read_sidecars(shard)):
                leases.append(self.files.lease(file, make_room=lambda: self._close_oldest(keep=shard),
                                               sequential=sequential))
        except BaseException:
            for lease in leases:
                lease.release()
            raise
        return leases

    def _close_oldest(self, keep: int) -> bool:
        for shard in self._handles:
            if shard != keep:
                self.close_shard(shard)
                return True
        return False

    def close_shard(self, shard: int) -> None:
        """Close one shard's handle in this process and release its leases."""
        handle = self._handles.pop(shard, None)
        if handle is not None:
            self._close(handle)
        self._in_place.discard(shard)
        for lease in self._leases.pop(shard, ()):
            lease.release()

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        for index in range(len(self)):
            yield self[index]

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        index = sample_index(index, len(self))
        try:
            return self.load(index)
        except DatasetChanged:
            raise
        except DatasetError:
            if self.on_error == "fail":
                raise
        # on_error="skip": stand in the next readable sample, so batches keep their size.
        for step in range(1, len(self)):
            try:
                sample = self.load((index + step) % len(self))
            except DatasetChanged:
                raise
            except DatasetError:
                continue
            self.skipped += step
            return sample
        raise DatasetError(f"{self.root}: no readable sample left")

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, ...]]:
        """The samples of one batch (DataLoader calls this with a batch's indices), each as
        `self[index]` gives it. The format hears first which samples follow (`_will_read`), so it can
        ask the kernel for all their bytes at once rather than wait on each read in turn: I/O depth
        from a single thread, which is what random reads from a cold disk need.

        Through a capped cache shared with other readers, the batch's oldest shards are closed after
        it down to this reader's share (`_give_back_room`)."""
        try:
            if type(self)._will_read is not PackedDataset._will_read:  # LMDB maps its files: no read-ahead
                self._read_ahead(indices)
            return [self[index] for index in indices]
        finally:
            self._give_back_room()

    def _read_ahead(self, indices: Sequence[int]) -> None:
        wanted = np.asarray(indices, dtype=np.int64)
        wanted = wanted[(wanted >= 0) & (wanted < len(self))]  # the rest raise below, as self[i] does
        shards = np.searchsorted(self._offsets, wanted, side="right") - 1
        for shard in np.unique(shards).tolist():
            try:
                self._will_read(shard, wanted[shards == shard] - self._offsets[shard])
            except Exception:  # noqa: BLE001 - only a hint: the reads themselves report damage, each as on_error says
                pass

    def _give_back_room(self) -> None:
        """Close this process's oldest open shards until what it holds of a capped cache leaves room
        for one largest shard of each other reader on the node (DataLoader workers times
        $LOCAL_WORLD_SIZE): a worker idle between batches must not hold the room another worker's
        batch waits for (the main process waits for that batch first, so the idle one gets no more
        work: two workers in a 3-shard cache hung so)."""
        cache = self.files.cache
        if cache is None or cache.limit is None:
            return
        info = get_worker_info()
        readers = (info.num_workers if info is not None else 1) * int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        if readers <= 1:
            return  # alone: a full cache closes its own oldest shard (`_lease`)
        if self._largest is None:
            self._largest = self.largest_lease()
        share = (cache.limit - self._largest) // (readers - 1)
        while self._handles and cache.leased_here() > share:
            self.close_shard(next(iter(self._handles)))

    def record(self, index: int) -> tuple[dict[str, Any], memoryview]:
        """The stored meta and payload of one sample, checked against its CRC-32."""
        meta, payload, _ = self._checked_read(index)
        return meta, payload

    def load_with_meta(self, index: int) -> tuple[dict[str, Any], tuple[Any, ...]]:
        """`load`, with the stored meta beside the sample: for `pack verify`, which checks the labels,
        paths and codecs the shards hold against index.json."""
        record = self._checked_read(index)
        return record[0], self.decode_sample(index, *record)

    def _checked_read(self, index: int) -> Record:
        """The sample's record (meta, payload and wanted fields), the payload checked against its CRC-32."""
        shard, local = self.locate(index)
        try:
            meta, payload, fields = self._read(shard, local)
        except DatasetError:
            raise
        except Exception as exc:  # noqa: BLE001 - format libraries raise many types on damaged files
            raise DatasetError(f"{self.shard_path(shard)}: sample {local}: unreadable ({exc})") from None
        self.check(shard, local, meta, payload)
        return meta, payload, fields

    def check(self, shard: int, local: int, meta: dict[str, Any], payload: memoryview) -> None:
        """Check the record's meta (`meta_problem`) and compare the payload with the CRC-32 the
        packer recorded; damage names shard and sample."""
        problem = meta_problem(meta, len(self.manifest.classes), len(payload))
        if problem:
            raise DatasetError(f"{self.shard_path(shard)}: sample {local}: {problem}")
        expected = meta.get("crc32")
        if expected is not None and payload_crc32(payload) != expected:
            raise DatasetError(f"{self.shard_path(shard)}: sample {local}: damaged (checksum mismatch)")

    def load(self, index: int) -> tuple[Any, ...]:
        """Read, check and decode one sample; any damage is a DatasetError naming shard and sample."""
        return self.decode_sample(index, *self._checked_read(index))

    def stream_records(self, shard: int, start: int, stop: int
                       ) -> Iterator[tuple[int, Record | DeferredRecord | DatasetError]]:
        """Samples `start`..`stop`-1 of one shard, front to back, as checked records (for streaming);
        a damaged one comes as its DatasetError, so the caller decides what `on_error` says. A
        format may hand DeferredRecords, which the stream settles before it closes the generator."""
        first = int(self._offsets[shard])
        try:
            self.handle(shard, sequential=True)  # opened to be read front to back: see ShardFiles.lease
        except DatasetError:
            pass  # each read below says why, as `on_error` decides
        for local in range(start, stop):
            try:
                yield local, self._checked_read(first + local)
            except DatasetError as exc:
                yield local, exc

    def decode_sample(self, index: int, meta: dict[str, Any], payload: memoryview,
                      fields: Fields) -> tuple[Any, ...]:
        """The sample's fields from its record; bytes that do not decode are a DatasetError."""
        try:
            return self._sample(index, meta, payload, fields)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:  # Pillow and numpy on bad bytes
            shard, local = self.locate(index)
            raise DatasetError(f"{self.shard_path(shard)}: sample {local}: cannot decode ({exc})") from None

    def _sample(self, index: int, meta: dict[str, Any], payload: memoryview, fields: Fields) -> tuple[Any, ...]:
        out: list[Any] = []
        for name in self.fields:
            if name == "image":
                image = self._decoder(payload, meta)
                out.append(self.transform(image) if self.transform else image)
            elif name == "label":
                label = int(meta["label"])
                out.append(self.target_transform(label) if self.target_transform else label)
            elif name == "path":
                out.append(meta["path"])
            elif name == "index":
                out.append(index)
            else:
                out.append(fields[name])
        return tuple(out)

    def close(self) -> None:
        for shard in list(self._handles):
            self.close_shard(shard)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = {}
        state["_leases"] = {}
        state["_in_place"] = set()
        return state

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({str(self.root)!r}, samples={len(self)}, "
            f"shards={len(self.manifest.shards)}, store={self.manifest.store!r}, decode={self.decode!r})"
        )

    # Format hooks -----------------------------------------------------------------------------

    def _open(self, shard: int) -> Any:
        raise NotImplementedError

    def _close(self, handle: Any) -> None:
        raise NotImplementedError

    def _read(self, shard: int, local: int) -> Record:
        raise NotImplementedError

    def _will_read(self, shard: int, locals_: np.ndarray) -> None:
        """A hint that these samples of the shard are read next (for read-ahead); by default none."""

    def stored_samples(self, shard: int) -> int:
        """How many samples the shard file itself holds (for `pack verify`), read from the file."""
        raise NotImplementedError

    def stored_classes(self, shard: int) -> list[str] | None:
        """The class names the shard file itself records, where its format keeps them (HDF5), for
        `pack verify` to hold index.json's against; None where it does not."""
        return None
