"""`pack bench`: the worker ladder, the stopping rule, and the command end to end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from clirun import run

import readers
import readers.mounts
from readers.bench import BenchResult, bench_loader, climb, default_note, worker_ladder


def test_worker_ladder() -> None:
    assert worker_ladder(0) == [0]
    assert worker_ladder(1) == [0, 1]
    assert worker_ladder(2) == [0, 1, 2]
    assert worker_ladder(6) == [0, 1, 2, 4, 6]
    assert worker_ladder(8) == [0, 1, 2, 4, 8]


def test_climb_stops_when_throughput_stops_rising() -> None:
    speeds = {0: 100, 1: 180, 2: 300, 4: 310, 8: 900}
    asked = []

    def measure(workers: int) -> BenchResult:
        asked.append(workers)
        return BenchResult(batch_size=32, num_workers=workers, samples=speeds[workers], seconds=1.0)

    results, best = climb(measure, [0, 1, 2, 4, 8])
    assert asked == [0, 1, 2, 4]  # 310 is not 5% above 300: no need to try 8
    assert best.num_workers == 2 and [r.num_workers for r in results] == asked


def test_bench_loader_measures_every_batch_size(packed: tuple[Path, dict[str, bytes]]) -> None:
    report = bench_loader(packed[0], batch_sizes=(2, 4), max_workers=1, decode="bytes", seconds=0.05)
    assert sorted(report.recommended) == [2, 4]
    assert {r.batch_size for r in report.results} == {2, 4}
    assert all(r.samples > 0 and r.num_workers in (0, 1) for r in report.results)
    assert report.best in report.recommended.values()


def test_bench_command(packed: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    code, output = run("bench", packed[0], "--batch-size", "4", "--max-workers", "1", "--seconds", "0.05")
    assert code == 0, output
    lines = output.splitlines()
    assert lines[0].split() == ["batch", "workers", "samples/s"]
    assert lines[1].split()[:2] == ["4", "0"]
    assert lines[-3] == f"reading: read in place (filesystem {readers.mounts.filesystem_type(packed[0])})"
    assert lines[-2].startswith("recommended: batch 4, num_workers=")
    assert "decode='tensor'" in lines[-2]  # as the README trains
    code, output = run("bench", tmp_path / "nowhere")
    assert code == 1 and output.startswith("Error: ") and "nowhere" in output
    assert len(output.strip().splitlines()) == 1


def test_bench_says_which_worker_counts_it_did_not_try(packed: tuple[Path, dict[str, bytes]]) -> None:
    """--max-workers 4 climbs 0, 1, 2, 4; where a step gains too little, the rest are named."""
    code, output = run("bench", packed[0], "--batch-size", "4", "--max-workers", "4", "--seconds", "0.05",
                       "--decode", "bytes")
    assert code == 0, output
    tried = [int(line.split()[1]) for line in output.splitlines()[1:] if line.split()[:1] == ["4"]]
    assert tried == [0, 1, 2, 4][:len(tried)] and ("were not tried" in output) == (len(tried) < 4)
    if len(tried) < 4:  # the climb stopped: which step gained too little, and what it left out
        assert re.search(rf"  {tried[-1]} workers gained under 5% over \d, so "
                         f"{', '.join(map(str, [0, 1, 2, 4][len(tried):]))} were not tried", output), output


def test_bench_and_make_loader_share_one_worker_rule(packed: tuple[Path, dict[str, bytes]],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """On 2 CPUs make_loader defaults to 1 worker (one CPU stays with the training loop); bench
    climbs no higher, and says how its recommendation stands to that default, and why."""
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "2")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    dataset = readers.open_dataset(packed[0], decode="bytes")
    assert readers.make_loader(dataset, batch_size=4, collate_fn=list).num_workers == readers.default_num_workers() == 1
    code, output = run("bench", packed[0], "--batch-size", "4", "--seconds", "0.05", "--decode", "bytes")
    assert code == 0, output
    tried = [int(line.split()[1]) for line in output.splitlines()[1:] if line.split()[:1] == ["4"]]
    assert tried in ([0], [0, 1])
    best = int(re.search(r"recommended: batch 4, num_workers=(\d)", output).group(1))  # type: ignore[union-attr]
    last = output.splitlines()[-1]
    if best == 1:
        assert last == ("make_loader's default here is the same: num_workers=1 (this rank's 2 CPUs less one for "
                        "the training loop)")
    else:
        assert last == ("make_loader's default here is num_workers=1 (this rank's 2 CPUs less one for the training "
                        "loop); bench ran no training loop: measured alone, reading was fastest with 0, so pass "
                        "num_workers=0 if your loop leaves the CPU idle")


def test_the_note_on_make_loaders_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert default_note(0) == ("make_loader's default here is the same: num_workers=0 (this rank's one CPU runs the "
                               "training loop)")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "2")
    assert default_note(2) == ("make_loader's default here is num_workers=1 (this rank's 2 CPUs less one for the "
                               "training loop); --max-workers let bench climb past it: pass num_workers=2 to "
                               "make_loader if your loop leaves CPUs idle")
