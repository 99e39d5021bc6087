"""What a streaming DataLoader worker hands the main process, and how, cheaper than torch's way.

DataLoader pickles every batch a worker yields into its result pipe, where the main process reads
and unpickles it. Two kinds of batch column cost most on that way, and cross otherwise:

- Columns of plain numbers (labels, indexes, eval masks) leave a worker as lists (`Scalars`) and
  become tensors in the main process: a tensor sent from a worker costs a shared-memory file and a
  socket handshake with an HMAC challenge per batch.
- Columns of bytes (images with decode="bytes") are copied into a ring of shared memory the worker
  made (`RingWriter`), and the pipe carries where each value lies (`RingColumn`); the main process
  copies them out into bytes objects (`Handover.settle`). Through the pipe a 33 KB image was copied
  six times (pickle, pipe write, pipe read, the reader's buffer, unpickle) at 30-37 us of CPU per
  sample in the two processes; through the ring twice, at 11-12 us (docs/benchmarks.md, "Streaming
  against the peers").
- A batch of any other shape (a custom collate_fn's list of samples, a dict) is converted as
  DataLoader's fetcher converts what a worker yields (`default_convert`: tuples become lists,
  numeric arrays tensors), then pickled in the worker with its bytes values left out and copied
  into the ring (`RingPickle`); the main process unpickles it with those values copied out, so
  the batch comes out as DataLoader would have given it (same containers, types and order)
  without its images crossing the pipe.

A ring holds `slots` batches. DataLoader asks a worker for its batch k only once the main process
has taken the worker's batch k - prefetch_factor from the DataLoader, and the loader copies each
batch out before it takes the next: with prefetch_factor + 1 slots a batch is copied out before
its slot is written again. The worker checks it all the same (the ring's header counts the batches
copied out), and a batch that would overwrite one not yet copied crosses the pipe as before.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch
from torch.utils.data._utils.collate import default_collate, default_convert
from torch.utils.data._utils.pin_memory import pin_memory

RING_HEADER = 64
"""Bytes before a ring's slots: an int64, how many of its batches the main process copied out."""
MIN_SLOT_BYTES = 1 << 16
MIN_RING_VALUE = 512
"""Bytes values of a `RingPickle` shorter than this stay in its pickle: their bounds cost about as
much to send as they do."""
SHM_DIR = "/dev/shm"  # where torch's shared memory lives on Linux (a small tmpfs in many containers)


class Scalars(list):  # type: ignore[type-arg]
    """A batch column of Python numbers (labels, indexes, an eval mask) as a DataLoader worker hands
    it over; `Handover.settle` makes the tensor in the main process, as default_collate would have."""


class RingColumn:
    """A batch column of bytes values waiting in a worker's ring: the ring's id, the batch's number
    in it, the values' bounds (value i is bytes [bounds[i], bounds[i + 1]) of the ring), and the
    ring's memory itself the first time the ring is named (torch shares it once)."""

    __slots__ = ("ring", "batch", "bounds", "memory", "replaces")

    def __init__(self, ring: int, batch: int, bounds: list[int], memory: torch.Tensor | None,
                 replaces: int | None) -> None:
        self.ring, self.batch, self.bounds, self.memory, self.replaces = ring, batch, bounds, memory, replaces

    def __reduce__(self) -> tuple[Any, ...]:
        return RingColumn, (self.ring, self.batch, self.bounds, self.memory, self.replaces)


class RingPickle(RingColumn):
    """A batch of another shape than a list of columns, pickled in the worker (`pickled`) with its
    bytes values in the ring (persistent ids 0, 1, ...: value i is bytes [bounds[i], bounds[i + 1]))
    and the objects DataLoader's pickler shares itself, tensors above all, left `aside` (ids -1,
    -2, ...) to cross as DataLoader sends them."""

    __slots__ = ("pickled", "aside")

    def __init__(self, ring: int, batch: int, bounds: list[int], memory: torch.Tensor | None,
                 replaces: int | None, pickled: bytes, aside: list[Any]) -> None:
        super().__init__(ring, batch, bounds, memory, replaces)
        self.pickled, self.aside = pickled, aside

    def __reduce__(self) -> tuple[Any, ...]:
        return RingPickle, (self.ring, self.batch, self.bounds, self.memory, self.replaces, self.pickled, self.aside)


class _LeavingBytes(pickle.Pickler):
    """Pickles a batch with its bytes values (of MIN_RING_VALUE or more) and the objects DataLoader's
    pickler has its own reduction for (tensors, storages) replaced by persistent ids."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.values: list[bytes] = []
        self.aside: list[Any] = []
        self._ids: dict[int, int] = {}  # id(obj) -> its persistent id: a value met twice is sent once

    def persistent_id(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is bytes:
            if len(obj) < MIN_RING_VALUE:
                return None
            found = self._ids.get(id(obj))
            if found is None:
                found = self._ids[id(obj)] = len(self.values)
                self.values.append(obj)
            return found
        if kind in ForkingPickler._extra_reducers:
            found = self._ids.get(id(obj))
            if found is None:
                self.aside.append(obj)
                found = self._ids[id(obj)] = -len(self.aside)
            return found
        return None


class _TakingBytes(pickle.Unpickler):
    """Unpickles a `RingPickle`'s batch with the values copied out of the ring (by persistent id, or
    as its out-of-band buffers: `out_of_band`) and the objects set aside."""

    def __init__(self, pickled: bytes, values: list[bytes], aside: list[Any]) -> None:
        super().__init__(io.BytesIO(pickled), buffers=values)
        self.values, self.aside = values, aside

    def persistent_load(self, pid: Any) -> Any:
        return self.values[pid] if pid >= 0 else self.aside[-pid - 1]


PLAIN_VALUES = frozenset({int, float, bool, str, type(None)})
"""Types `default_convert` hands back as they are, and pickle writes itself."""


class _NotPlain(Exception):
    """A batch holds a value `out_of_band` leaves to `_LeavingBytes` (a tensor, an array, a subclass)."""


def out_of_band(value: Any, buffers: dict[int, pickle.PickleBuffer]) -> Any:
    """`default_convert(value)` for a batch of plain values alone (lists, tuples and dicts of exactly
    those types, numbers, text, None, bytes), each bytes value of MIN_RING_VALUE or more a
    PickleBuffer, which pickle's own code hands out of band, with no Python call per object
    pickled where `_LeavingBytes.persistent_id` is one (a list of 64 (image, label) tuples: 2.4 ->
    0.6 us per sample). _NotPlain for a batch holding anything else, or one bytes value twice (out
    of band, it would come out as two objects; through the pipe it is one)."""
    kind = type(value)
    if kind is bytes:
        if len(value) < MIN_RING_VALUE:
            return value
        if id(value) in buffers:
            raise _NotPlain
        buffer = buffers[id(value)] = pickle.PickleBuffer(value)
        return buffer
    if kind is list or kind is tuple:
        return [out_of_band(item, buffers) for item in value]
    if kind is dict:
        return {key: out_of_band(item, buffers) for key, item in value.items()}
    if kind in PLAIN_VALUES:
        return value
    raise _NotPlain


def shared_bytes(size: int) -> torch.Tensor | None:
    """A uint8 tensor of `size` bytes of fresh (zeroed) shared memory, or None where the shared
    memory filesystem has not twice that much free (writing past its end would kill the worker
    with SIGBUS) or torch cannot make it."""
    if os.path.isdir(SHM_DIR) and shutil.disk_usage(SHM_DIR).free < 2 * size:
        return None
    try:
        new_shared = getattr(torch.UntypedStorage, "_new_shared", None)  # no copy of a private tensor
        if new_shared is not None:
            return torch.empty(0, dtype=torch.uint8).set_(new_shared(size))
        return torch.zeros(size, dtype=torch.uint8).share_memory_()
    except RuntimeError:
        return None


class ByteRing:
    """`slots` slots of `slot_bytes` in one shared tensor, after the header."""

    def __init__(self, memory: torch.Tensor, slots: int, slot_bytes: int) -> None:
        self.memory = memory
        array = memory.numpy()
        self.view = memoryview(array)
        self.copied = array[:8].view(np.int64)  # written by the main process
        self.id = int.from_bytes(os.urandom(8), "little") >> 1
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.batches = 0  # written so far
        self.named = False  # whether a batch that names it with its memory has been handed out

    def free(self) -> bool:
        """Whether the next batch's slot was copied out (or never used)."""
        return self.batches < self.slots or int(self.copied[0]) > self.batches - self.slots


class RingWriter:
    """A worker's side for one pass (one `iter()` of the loader): the bytes of each batch into its
    ring, made at the first batch and remade twice as large for a batch that outgrows it."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.ring: ByteRing | None = None
        self.off = slots < 1

    def pack(self, batch: Any) -> Any:
        """`batch` with its bytes in the ring, if there is room: a list of columns with its columns
        of bytes as `RingColumn`s, any other batch holding bytes values as a `RingPickle`."""
        if self.off:
            return batch
        if type(batch) is list:
            columns = [k for k, column in enumerate(batch)
                       if type(column) is list and column and all(type(value) is bytes for value in column)]
            if columns:
                placed = self._place([batch[k] for k in columns])
                if placed is None:
                    return batch
                ring, number, bounds, memory, replaces = placed
                packed = list(batch)
                for k, column_bounds in zip(columns, bounds):
                    packed[k] = RingColumn(ring, number, column_bounds, memory, replaces)
                    memory = replaces = None
                return packed
        buffers: dict[int, pickle.PickleBuffer] = {}
        try:
            plain = out_of_band(batch, buffers)
        except (_NotPlain, RecursionError):
            plain = None
        values: list[Any]
        if plain is not None:
            if not buffers:
                return batch
            values = []
            pickled = pickle.dumps(plain, pickle.HIGHEST_PROTOCOL, buffer_callback=lambda buffer: values.append(buffer.raw()))
            aside: list[Any] = []
        else:
            buffer = io.BytesIO()
            pickler = _LeavingBytes(buffer)
            try:
                pickler.dump(default_convert(batch))  # as DataLoader's fetcher would have converted it (tuples to lists)
            except (pickle.PicklingError, TypeError, AttributeError):  # DataLoader's own pickling says what it says
                return batch
            if not pickler.values:
                return batch
            values, pickled, aside = pickler.values, buffer.getvalue(), pickler.aside
        placed = self._place([values])
        if placed is None:
            return batch
        ring, number, bounds, memory, replaces = placed
        return RingPickle(ring, number, bounds[0], memory, replaces, pickled, aside)

    def _place(self, groups: list[list[Any]]) -> tuple[int, int, list[list[int]], torch.Tensor | None,
                                                         int | None] | None:
        """Copies `groups` of bytes values into the next slot: the ring's id, the batch's number in
        it, each group's bounds, the ring's memory when it is named for the first time and the ring
        it replaces; None when the slot waits to be copied out or shared memory is short."""
        size = sum(len(value) for group in groups for value in group)
        ring = self.ring
        replaces = None
        if ring is None or size > ring.slot_bytes:
            slot_bytes = max(MIN_SLOT_BYTES, 2 * size)
            memory = shared_bytes(RING_HEADER + self.slots * slot_bytes)
            if memory is None:
                self.off = True
                return None
            replaces = ring.id if ring is not None else None
            ring = self.ring = ByteRing(memory, self.slots, slot_bytes)
        if not ring.free():
            return None
        position = RING_HEADER + (ring.batches % ring.slots) * ring.slot_bytes
        view = ring.view
        bounds = []
        for group in groups:
            group_bounds = [position]
            for value in group:
                end = position + len(value)
                view[position:end] = value
                position = end
                group_bounds.append(end)
            bounds.append(group_bounds)
        named = None if ring.named else ring.memory
        ring.named = True
        ring.batches += 1
        return ring.id, ring.batches - 1, bounds, named, replaces


class Handover:
    """The main process's side for one pass: turns what a worker handed over back into the batch
    DataLoader would have given (`settle`), and tells each ring which batches it may overwrite."""

    def __init__(self) -> None:
        self._rings: dict[int, tuple[memoryview, np.ndarray]] = {}

    def settle(self, batch: Any, pin: bool = False) -> Any:
        """`batch` with each Scalars a tensor (pinned if asked), each RingColumn a list of bytes and
        each RingPickle its batch (its tensors pinned if asked), within lists and tuples; the rings
        read from may then reuse the batch's slot."""
        copied: dict[int, int] = {}
        settled = self._settle(batch, pin, copied)
        for ring, number in copied.items():
            self._rings[ring][1][0] = number + 1
        return settled

    def _settle(self, batch: Any, pin: bool, copied: dict[int, int]) -> Any:
        if isinstance(batch, Scalars):
            tensor = default_collate(list(batch))
            return tensor.pin_memory() if pin else tensor
        if isinstance(batch, RingPickle):
            aside = [pin_memory(value) for value in batch.aside] if pin else batch.aside
            return _TakingBytes(batch.pickled, self._copy_out(batch, copied), aside).load()
        if isinstance(batch, RingColumn):
            return self._copy_out(batch, copied)
        if type(batch) in (list, tuple) and any(isinstance(item, (Scalars, RingColumn, list, tuple)) for item in batch):
            return type(batch)(self._settle(item, pin, copied) if isinstance(item, (list, tuple, RingColumn)) else item
                               for item in batch)
        return batch

    def _copy_out(self, column: RingColumn, copied: dict[int, int]) -> list[bytes]:
        if column.memory is not None:
            if column.replaces is not None:
                self._rings.pop(column.replaces, None)
            array = column.memory.numpy()
            self._rings[column.ring] = (memoryview(array), array[:8].view(np.int64))
        view = self._rings[column.ring][0]
        bounds = column.bounds
        copied[column.ring] = column.batch
        return [bytes(view[start:end]) for start, end in zip(bounds[:-1], bounds[1:])]
