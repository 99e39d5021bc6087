"""The local engine stops on an error or Ctrl-C whatever its workers are doing, and never waits forever.

Each test forces its interleaving by stopping workers with SIGSTOP (a worker stuck in
uninterruptible I/O, or one that does not die from SIGTERM, behaves the same to the parent).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

from clirun import run
from imagefolders import image_bytes
from workers import signal_all, stop_workers_as_they_start

PACK = [sys.executable, "-m", "packer.cli"]


def folder_with_a_bad_file_per_shard(root: Path) -> Path:
    """Two classes of three files, each class's first file empty: with --shard-size 3 every shard
    starts with a bad file, so whichever worker runs first fails at once."""
    rng = random.Random(5)
    for label in ("class_00", "class_01"):
        (root / label).mkdir(parents=True)
        (root / label / "a-empty.jpg").write_bytes(b"")
        for name in ("b.jpg", "c.jpg"):
            (root / label / name).write_bytes(image_bytes(rng))
    return root


def test_on_error_fail_with_the_other_worker_stopped_names_the_bad_file(tmp_path: Path) -> None:
    """The interleaving behind the 'interrupted' flake: worker A fails while worker B cannot die
    from SIGTERM. multiprocessing.Pool.terminate() joined B with no time limit and hung until
    something outside (a CI timeout) signalled the run, which then said 'interrupted'."""
    src = folder_with_a_bad_file_per_shard(tmp_path / "src")
    out = tmp_path / "out"
    process = subprocess.Popen([*PACK, "lmdb", str(src), str(out), "--on-error", "fail", "--shard-size", "3",
                                "--order", "sorted", "--workers", "2", "-q"],  # every shard starts with a bad file
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped = stop_workers_as_they_start(process, 2)
    try:
        signal_all(stopped[:1], signal.SIGCONT)
        _, stderr = process.communicate(timeout=30)
    finally:
        signal_all(stopped, signal.SIGKILL)
    assert process.returncode == 1
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {src}/class_0"), stderr
    assert lines[0].endswith("/a-empty.jpg: empty file (--on-error fail)")
    assert not (out / "index.json").exists()


def test_the_cli_leaves_the_callers_signal_handlers_as_they_were(tmp_path: Path) -> None:
    """`main()` maps SIGTERM to Ctrl-C for the run only: an in-process caller (a test session, a
    notebook) keeps its own handler afterwards."""
    src = folder_with_a_bad_file_per_shard(tmp_path / "src")
    before = signal.getsignal(signal.SIGTERM)
    code, _ = run("lmdb", src, tmp_path / "out", "-q")
    assert code == 0
    assert signal.getsignal(signal.SIGTERM) is before
