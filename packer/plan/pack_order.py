"""The order samples are packed in, applied to the listing before shards are cut (`plan.write_plan`),
so every task, rerun and resume packs the same order.

`sorted`: the listing as the scan gives it (relative paths; inputs by name, samples as stored).
`shuffled` (the default): a permutation drawn from the seed alone, so that each shard holds many
classes even when SRC is sorted by class. Files of a folder are each read whole, so they are
permuted fully. A container's samples (tar members, records) are byte ranges of large inputs: a
full permutation would turn reading them into random reads over the whole source, so they are
shuffled in windows instead: each input is cut into runs of about RUN_BYTES (less for a small
source), the runs are permuted, and WINDOW_RUNS consecutive runs are interleaved at random, each run's samples kept in
their order, so a shard reads a few dozen byte ranges, each front to back. docs/FORMAT.md
("Sample order") gives the rule exactly; the keys come from SplitMix64 (`splitmix64`), which any
language reproduces in a few lines.

numpy is imported here, and this module only where a plan is made: shard workers never load it.
"""

from __future__ import annotations

import numpy as np

from ..sources.inputs import INPUT_KINDS
from ..sources.listing import Listing

RUN_BYTES = 16 << 20
"""A container input is cut into runs of this many bytes of samples, each read front to back."""
WINDOW_RUNS = 64
"""Runs interleaved together: about one default shard (1 GiB) of source, a few dozen places in it."""

GAMMA = np.uint64(0x9E3779B97F4A7C15)
MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
MIX_2 = np.uint64(0x94D049BB133111EB)


def splitmix64(seed: int, start: int, count: int) -> np.ndarray:
    """Outputs start+1 .. start+count of SplitMix64 seeded with `seed` (uint64; distinct, since
    the step is odd and the mix a bijection): state_k = seed + k * GAMMA mod 2**64, mixed."""
    return splitmix64_at(seed, np.arange(start + 1, start + count + 1, dtype=np.uint64))


def splitmix64_at(seed: int, steps: np.ndarray) -> np.ndarray:
    """Outputs number `steps` (uint64) of SplitMix64 seeded with `seed`."""
    z = np.uint64(seed) + steps * GAMMA  # arrays wrap mod 2**64, as the algorithm wants
    z = (z ^ (z >> np.uint64(30))) * MIX_1
    z = (z ^ (z >> np.uint64(27))) * MIX_2
    return z ^ (z >> np.uint64(31))


KEY_CHUNK = 1 << 16
"""Keys made (and positions copied out) this many at a time: a few hundred KB of temporaries."""


def full_permutation(seed: int, count: int) -> np.ndarray:
    """`argsort(splitmix64(seed, 0, count))`, the positions int32 where they fit, holding 8 bytes
    a file at the peak instead of ~32 (keys, argsort's int64 result, the mix's temporaries): each
    key's top bits and its position share one uint64, sorted in place; positions whose top bits
    tie (about count**2 / 2**(65 - position bits): a few dozen at ten million) are then put in
    their full keys' order, which is the order argsort gives (the keys are distinct)."""
    bits = max(1, (count - 1).bit_length())
    mask = np.uint64((1 << bits) - 1)
    packed = np.empty(count, dtype=np.uint64)
    for first in range(0, count, KEY_CHUNK):
        chunk = packed[first:first + KEY_CHUNK]
        chunk[:] = splitmix64(seed, first, len(chunk))
        chunk &= ~mask
        chunk |= np.arange(first, first + len(chunk), dtype=np.uint64)
    packed.sort()
    tied = []
    for first in range(0, count - 1, KEY_CHUNK):  # slots whose top bits equal the next slot's
        here = packed[first:first + KEY_CHUNK + 1]
        same = np.flatnonzero((here[:-1] ^ here[1:]) <= mask) + first
        tied.append(np.union1d(same, same + 1))
    slots = np.unique(np.concatenate(tied)) if tied else np.zeros(0, dtype=np.int64)
    if len(slots):
        positions = packed[slots] & mask
        packed[slots] = positions[np.argsort(splitmix64_at(seed, positions + np.uint64(1)))]
    if count >= 2**31:
        packed &= mask
        return packed.view(np.int64)
    # The positions as int32 into the buffer's first half, a chunk at a time (a chunk's bytes are
    # computed before they land, on slots already read), then the buffer shrunk in place.
    positions = packed.view(np.int32)
    for first in range(0, count, KEY_CHUNK):
        end = min(first + KEY_CHUNK, count)
        positions[first:end] = packed[first:end] & mask
    del positions
    packed.resize((count + 1) // 2, refcheck=False)  # realloc: the second half goes back to the OS
    return packed.view(np.int32)[:count]


def permutation(listing: Listing, seed: int) -> np.ndarray:
    """Listing positions in shuffled packing order: windowed for container inputs read as byte
    ranges, a full permutation otherwise."""
    kind = INPUT_KINDS.get(listing.kind)
    if listing.locations is not None and kind is not None and kind.windowed:
        locations = np.frombuffer(listing.locations, dtype=np.int64).reshape(-1, 3)
        return windowed_permutation(locations[:, 0], locations[:, 2], seed)
    return full_permutation(seed, len(listing))


def run_bytes(lengths: np.ndarray) -> int:
    """RUN_BYTES, or less for a source under WINDOW_RUNS runs of it, which then still mixes over
    WINDOW_RUNS runs instead of staying in the order of its few inputs."""
    return max(1, min(RUN_BYTES, -(-int(lengths.sum()) // WINDOW_RUNS)))


def run_numbers(inputs: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Each sample's run, numbered in listing order: a run is the samples of one input whose
    bytes before them (in that input, in listing order) fall in the same `run_bytes` span."""
    count = len(inputs)
    if not count:
        return np.zeros(0, dtype=np.int64)
    new_input = np.ones(count, dtype=bool)
    new_input[1:] = inputs[1:] != inputs[:-1]
    before = np.cumsum(lengths) - lengths  # bytes before each sample, over the whole listing
    segment_start = np.maximum.accumulate(np.where(new_input, np.arange(count), 0))
    span = (before - before[segment_start]) // run_bytes(lengths)
    new_run = new_input.copy()
    new_run[1:] |= span[1:] != span[:-1]
    return np.cumsum(new_run) - 1


def windowed_permutation(inputs: np.ndarray, lengths: np.ndarray, seed: int) -> np.ndarray:
    """Runs permuted (keys: SplitMix64 outputs 1..R), cut into windows of WINDOW_RUNS; in each
    window the samples' keys (outputs R+1..R+N) sorted give each slot a run, filled with that
    run's samples in listing order: a uniformly random interleaving of the window's runs."""
    count = len(inputs)
    runs = run_numbers(inputs, lengths)
    run_count = int(runs[-1]) + 1 if count else 0
    run_rank = np.empty(run_count, dtype=np.int64)
    run_rank[np.argsort(splitmix64(seed, 0, run_count))] = np.arange(run_count)
    windows = run_rank[runs] // WINDOW_RUNS
    slots = np.lexsort((splitmix64(seed, run_count, count), windows))  # listing positions, by window then key
    slot_runs = runs[slots]
    order = np.empty(count, dtype=np.int64)
    # A run's slots in ascending order take its samples in listing order (they are consecutive there).
    order[np.argsort(slot_runs, kind="stable")] = np.arange(count)
    return order


def arrange(listing: Listing, order: str, seed: int) -> None:
    """Put the listing in packing order; paths, labels, sizes, values and locations move together."""
    if order == "shuffled" and len(listing):
        listing.keep(permutation(listing, seed))
