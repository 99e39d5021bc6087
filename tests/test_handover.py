"""readers.handover: what streaming workers hand the main process comes out as DataLoader would
have given it, and a ring never overwrites a batch the main process has not copied out."""

from __future__ import annotations

import pickle
from collections import namedtuple
from multiprocessing.reduction import ForkingPickler

import numpy as np

import torch
import torch.multiprocessing  # noqa: F401 - registers how tensors cross processes
from torch.utils.data._utils.collate import default_convert

from readers.handover import MIN_RING_VALUE, Handover, RingColumn, RingPickle, RingWriter, Scalars


def handed(batch: object) -> object:
    """`batch` as it crosses the result pipe (torch's pickler shares tensors' memory)."""
    return pickle.loads(bytes(ForkingPickler.dumps(batch)))


def batch_of(seed: int, count: int = 3, size: int = 100) -> list[object]:
    images = [bytes([seed + k]) * (size + k) for k in range(count)]
    return [images, Scalars(range(seed, seed + count)), [f"path{k}" for k in range(count)], [b"x", b"yz", b""][:count]]


def test_a_batch_comes_out_as_it_went_in() -> None:
    writer, handover = RingWriter(slots=3), Handover()
    for seed in range(7):
        batch = batch_of(seed)
        packed = writer.pack(batch)
        assert isinstance(packed[0], RingColumn) and isinstance(packed[3], RingColumn)
        assert packed[2] == batch[2]  # text stays a list
        settled = handover.settle(handed(packed))
        assert settled[0] == batch[0] and settled[3] == batch[3] and settled[2] == batch[2]
        assert all(type(image) is bytes for image in settled[0])
        assert torch.equal(settled[1], torch.tensor(list(batch[1])))
    # eval batches arrive as (batch, mask)
    columns, mask = handover.settle(handed((writer.pack(batch_of(9)), Scalars([True, False, True]))))
    assert columns[0] == batch_of(9)[0] and mask.tolist() == [True, False, True]


def test_a_slot_not_copied_out_is_never_written_again() -> None:
    writer, handover = RingWriter(slots=2), Handover()
    first, second = writer.pack(batch_of(1)), writer.pack(batch_of(2))
    third = batch_of(3)
    assert writer.pack(third) is third  # both slots wait to be copied out: the batch crosses as it is
    assert handover.settle(handed(first))[0] == batch_of(1)[0]
    fourth = writer.pack(batch_of(4))  # the first's slot
    assert isinstance(fourth[0], RingColumn)
    assert handover.settle(handed(second))[0] == batch_of(2)[0]
    assert handover.settle(handed(fourth))[0] == batch_of(4)[0]


def test_a_batch_larger_than_a_slot_gets_a_larger_ring() -> None:
    writer, handover = RingWriter(slots=2), Handover()
    small = writer.pack(batch_of(1, size=10))
    large = writer.pack(batch_of(2, size=200_000))
    assert large[0].ring != small[0].ring and large[0].replaces == small[0].ring and large[0].memory is not None
    assert handover.settle(handed(small))[0] == batch_of(1, size=10)[0]
    assert handover.settle(handed(large))[0] == batch_of(2, size=200_000)[0]


def test_without_slots_nothing_goes_through_a_ring() -> None:
    batch = batch_of(1)
    assert RingWriter(slots=0).pack(batch) is batch
    assert RingWriter(slots=0).pack([(image, 1) for image in batch[0]]) == [(image, 1) for image in batch[0]]


Sample = namedtuple("Sample", "image label")


def test_a_custom_collates_batch_of_any_shape_comes_out_as_pickling_makes_it() -> None:
    """collate_fn=list and the like: the items as the user's collate returned them (same containers,
    types, order, shared objects), with the large bytes values through the ring, not the pipe."""
    writer, handover = RingWriter(slots=3), Handover()
    big = bytes(range(256)) * 8
    tensor, array = torch.arange(6).reshape(2, 3), np.arange(4, dtype=np.uint8)
    batches = [
        [(bytes([seed]) * (MIN_RING_VALUE + seed), seed) for seed in range(5)],  # collate_fn=list
        {"images": [big, big[:MIN_RING_VALUE - 1], b""], "labels": (1, 2)},
        [Sample(big, 3), Sample(big[1:], 4)],
        big,
    ]
    for batch in batches:
        packed = writer.pack(batch)
        assert isinstance(packed, RingPickle) and len(packed.pickled) < 2 * MIN_RING_VALUE  # the images left out
        settled = handover.settle(handed(packed))
        # the same types, values and order throughout, as DataLoader converts a worker's batch
        assert pickle.dumps(settled) == pickle.dumps(default_convert(batch))
    assert all(type(sample) is Sample for sample in handover.settle(handed(writer.pack(batches[2]))))
    assert handover.settle(handed(writer.pack(batches[0])))[0] == [bytes(MIN_RING_VALUE), 0]  # tuples: lists
    with_arrays = handover.settle(handed(writer.pack({"images": [big], "tensor": tensor, "array": array})))
    assert with_arrays["images"] == [big] and torch.equal(with_arrays["tensor"], tensor)
    assert type(with_arrays["array"]) is torch.Tensor and with_arrays["array"].tolist() == array.tolist()
    twice = handover.settle(handed(writer.pack([big, big])))
    assert twice == [big, big] and twice[0] is twice[1]  # one value met twice is one object, as pickle keeps it
    evaluated = handover.settle(handed((writer.pack(batches[0]), Scalars([True, False]))))
    assert evaluated[0] == default_convert(batches[0]) and evaluated[1].tolist() == [True, False]


def test_a_batch_of_plain_values_is_pickled_without_a_python_call_per_object(monkeypatch) -> None:
    """collate_fn=list's batch of (image, label) tuples, lists of dicts and the like: pickled by
    pickle's own code, the images out of band into the ring; they come out as the pipe gives them."""
    def called(self: object, obj: object) -> None:
        raise AssertionError(f"persistent_id({type(obj).__name__})")

    monkeypatch.setattr("readers.handover._LeavingBytes.persistent_id", called)
    writer, handover = RingWriter(slots=3), Handover()
    big = bytes(range(256)) * 8
    batches = [
        [(bytes([seed]) * (MIN_RING_VALUE + seed), seed) for seed in range(64)],  # collate_fn=list
        [{"image": big[seed:], "label": seed, "path": f"p{seed}", "score": seed / 2, "box": None, "ok": True}
         for seed in range(3)],
        ([big, [big[1:], (b"small", -1)]], {3: big[2:]}),
    ]
    for batch in batches:
        packed = writer.pack(batch)
        assert isinstance(packed, RingPickle) and len(packed.pickled) < 2 * MIN_RING_VALUE * len(batch)
        assert pickle.dumps(handover.settle(handed(packed))) == pickle.dumps(default_convert(batch))


def test_a_batch_without_large_bytes_or_that_does_not_pickle_crosses_as_it_is() -> None:
    writer = RingWriter(slots=3)
    batch = [(b"small", 1, torch.zeros(2)), (b"", 2, torch.ones(2))]
    assert writer.pack(batch) is batch
    unpicklable = [(bytes(MIN_RING_VALUE), lambda: 0)]  # DataLoader's pickler reports it, as before
    assert writer.pack(unpicklable) is unpicklable
