"""Container inputs read by byte range (`packer.sources.ranges`): once reads wait on storage, the
blocks of all a shard's inputs are kept together within one bound, and a shuffled pack's places
read in turn each keep the block they are in."""

from __future__ import annotations

import random
from pathlib import Path
import pytest

import packer.sources.ranges as ranges
from packer.plan.pack_order import WINDOW_RUNS
from packer.sources.ranges import InputFiles, RangeFile

BLOCK = 4096


@pytest.fixture
def small_waiting_blocks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """4 KiB blocks; every read counts as waiting on storage (as on a mount), so the inputs go to
    blocks after PROBE_CALLS reads. Returns the (file, block) of every block fetched."""
    monkeypatch.setattr(ranges, "BLOCK_BYTES", BLOCK)
    monkeypatch.setattr(ranges, "WALK_WAITED_S", 0.0)
    fetched: list[tuple[int, int]] = []
    fetch = RangeFile.fetch

    def counted(self: RangeFile, number: int) -> bytes:
        fetched.append((self.number, number))
        return fetch(self, number)

    monkeypatch.setattr(RangeFile, "fetch", counted)
    return fetched


def write_inputs(root: Path, count: int, size: int) -> list[tuple[str, bytes]]:
    rng = random.Random(count)
    inputs = []
    for number in range(count):
        data = rng.randbytes(size)
        path = root / f"input-{number}.bin"
        path.write_bytes(data)
        inputs.append((str(path), data))
    return inputs


def test_the_blocks_of_many_inputs_are_kept_within_one_bound(
        tmp_path: Path, small_waiting_blocks: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each file kept up to 64 blocks of its own: a shard reading a few hundred MiB from many
    inputs on a mount kept all of it (a 134 MB source of 16 tars: 179 MB peak RSS, 45 MB from
    local disk). Now the inputs' blocks are kept together, KEPT_BLOCKS at most."""
    monkeypatch.setattr(ranges, "KEPT_BLOCKS", 8)
    inputs = write_inputs(tmp_path, 12, 10 * BLOCK)
    files = InputFiles([path for path, _ in inputs])
    rng = random.Random(0)
    positions = [0] * len(inputs)
    most_kept = 0
    try:
        while any(position < 10 * BLOCK for position in positions):
            number = rng.choice([n for n, position in enumerate(positions) if position < 10 * BLOCK])
            length = rng.randrange(1, 1500)
            offset = positions[number]
            assert files.read(number, offset, length) == inputs[number][1][offset:offset + length]
            positions[number] += length
            most_kept = max(most_kept, len(files._blocks))
    finally:
        files.close()
    assert small_waiting_blocks, "the reads never went to blocks"
    assert most_kept == 8


def test_places_read_in_turn_each_keep_their_block(tmp_path: Path, small_waiting_blocks: list[tuple[int, int]]) -> None:
    """A shuffled pack reads 64 places of its inputs in turn, each front to back: with the blocks
    read ahead made recent again by every read before them, 64 places would need 256 kept blocks
    and evict each other's (7,000 fetches of 384 blocks); with blocks read ahead of every
    place, or past the end of its run into blocks the next run had already read, 1.2-3 times each.
    Now almost every block is fetched once (a few read ahead are dropped before use, 3 in 100)."""
    runs, run_blocks = WINDOW_RUNS, 16
    (path, data), = write_inputs(tmp_path, 1, runs * run_blocks * BLOCK)
    files = InputFiles([path])
    rng = random.Random(1)
    positions = [run * run_blocks * BLOCK for run in range(runs)]
    try:
        while True:
            open_runs = [run for run in range(runs) if positions[run] < (run + 1) * run_blocks * BLOCK]
            if not open_runs:
                break
            run = rng.choice(open_runs)
            offset, length = positions[run], min(BLOCK // 30, (run + 1) * run_blocks * BLOCK - positions[run])
            assert files.read(0, offset, length) == data[offset:offset + length]
            positions[run] += length
    finally:
        files.close()
    assert runs * run_blocks // 2 < len(set(small_waiting_blocks)) <= len(small_waiting_blocks) <= 1.1 * runs * run_blocks


def test_a_walk_front_to_back_keeps_only_the_blocks_around_it(
        tmp_path: Path, small_waiting_blocks: list[tuple[int, int]]) -> None:
    """A scan reads each block once, keeping the one it is in and those ahead (not 128 MiB)."""
    (path, data), = write_inputs(tmp_path, 1, 200 * BLOCK)
    with RangeFile(path) as file:
        pieces, most_kept = [], 0
        while piece := file.read(sum(map(len, pieces)), 999):
            pieces.append(piece)
            most_kept = max(most_kept, len(file.blocks))
    assert b"".join(pieces) == data
    numbers = sorted(number for _, number in small_waiting_blocks)
    assert numbers == list(range(numbers[0], 200)) and numbers[0] < 100  # after the first reads, timed
    assert ranges.BLOCKS_AHEAD + 1 <= most_kept <= ranges.WALK_KEPT_BLOCKS
