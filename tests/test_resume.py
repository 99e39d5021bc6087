"""Crash safety: kill -9 or Ctrl-C at any instant, rerun, and get what an uninterrupted run gives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from imagefolders import make_image_folder
from workers import signal_all, stop_workers_as_they_start

import readers
from packer.errors import PackError
from packer.run.pipeline import pack
from packer.plan.options import PackOptions

PACK = [sys.executable, "-m", "packer.cli"]


def manifest_without_version(out: Path) -> dict:
    index = json.loads((out / "index.json").read_text())
    index.pop("tool_version")
    return index


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(out.glob("shard-*"))}


@pytest.fixture(scope="module")
def big_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Enough files that a packing run takes a while; and the uninterrupted reference result."""
    root = tmp_path_factory.mktemp("big")
    src = root / "src"
    make_image_folder(src, classes=4, per_class=150, seed=3)
    reference = root / "reference"
    subprocess.run([*PACK, "lmdb", str(src), str(reference), "--shard-size", "20", "-q"], check=True)
    paths = [path for (path,) in readers.open_dataset(reference, fields=("path",))]
    assert paths != sorted(paths)  # the default order, shuffled, is what the reruns must reproduce
    return src, reference


def wait_for(out: Path, process: subprocess.Popen, finished_shards: int) -> None:
    """Until the run has reached a point: the plan written (0) or k shard markers."""
    done = out / ".pack" / "done"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if (out / ".pack" / "plan.json").exists() and (
            finished_shards == 0 or (done.is_dir() and len(os.listdir(done)) >= finished_shards)
        ):
            return
        time.sleep(0.005)


def signal_when(process: subprocess.Popen, out: Path, finished_shards: int, signum: int) -> None:
    """Send `signum` once the run has reached a point (see wait_for)."""
    wait_for(out, process, finished_shards)
    process.send_signal(signum)


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("finished_shards", [0, 1, 12])
def test_sigkill_then_rerun_matches_clean_run(big_folder: tuple[Path, Path], tmp_path: Path, finished_shards: int,
                                              workers: str) -> None:
    src, reference = big_folder
    out = tmp_path / "out"
    command = [*PACK, "lmdb", str(src), str(out), "--shard-size", "20", "-q", "--workers", workers]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    signal_when(process, out, finished_shards, signal.SIGKILL)
    process.wait()
    assert not (out / "index.json").exists() and not (out / "rejects.jsonl").exists()
    rerun = subprocess.run(command, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert manifest_without_version(out) == manifest_without_version(reference)
    assert shard_bytes(out) == shard_bytes(reference)
    assert not (out / ".pack" / "tmp").exists() or not os.listdir(out / ".pack" / "tmp")


CTRL_C_AS_IN_A_TERMINAL = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                           "os.execv(sys.argv[1], sys.argv[1:])"]
"""Runs a command with Ctrl-C's default action, as a terminal starts it: a test session started in
the background of a shell (`pytest ... &`) ignores SIGINT, and so would the pack it starts."""


def test_ctrl_c_stops_with_message_and_resumes(big_folder: tuple[Path, Path], tmp_path: Path) -> None:
    src, reference = big_folder
    out = tmp_path / "out"
    command = [*PACK, "lmdb", str(src), str(out), "--shard-size", "20", "-q", "--workers", "2"]
    process = subprocess.Popen([*CTRL_C_AS_IN_A_TERMINAL, *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    workers = stop_workers_as_they_start(process, 2)
    try:
        signal_all(workers, signal.SIGCONT)
        wait_for(out, process, 1)
        signal_all(workers, signal.SIGSTOP)  # the run cannot finish before Ctrl-C, however slow the machine
        process.send_signal(signal.SIGINT)
        started = time.monotonic()
        _, stderr = process.communicate(timeout=30)
    finally:
        signal_all(workers, signal.SIGKILL)
    assert time.monotonic() - started < 10
    assert process.returncode == 130  # 128 + SIGINT, the shell convention
    assert stderr.strip().splitlines()[-1] == "Error: interrupted; nothing was published; rerun the same command to resume"
    assert "Traceback" not in stderr
    assert not (out / "index.json").exists()
    subprocess.run(command, check=True, capture_output=True)
    assert shard_bytes(out) == shard_bytes(reference)


def test_a_worker_killed_mid_shard_is_a_clear_error_not_a_hang(big_folder: tuple[Path, Path], tmp_path: Path) -> None:
    """multiprocessing.Pool replaces a dead worker but never finishes its task (the OOM killer's case)."""
    src, reference = big_folder
    out = tmp_path / "out"
    command = [*PACK, "lmdb", str(src), str(out), "--shard-size", "200", "-q", "--workers", "2"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tmp_dir = out / ".pack" / "tmp"
    victim = 0
    deadline = time.monotonic() + 60
    while not victim and time.monotonic() < deadline and process.poll() is None:
        for name in os.listdir(tmp_dir) if tmp_dir.is_dir() else ():
            victim = int(name.rsplit("-", 1)[1])  # shard-NNNNNN.lmdb.tmp-HOST-PID: a worker mid-shard
            os.kill(victim, signal.SIGKILL)
            break
        time.sleep(0.002)
    assert victim, "no worker was seen packing a shard"
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 1, stderr
    assert stderr.startswith(f"Error: {out}: the worker packing shard-") and stderr.count("\n") == 1
    assert f"(pid {victim}) died before finishing it" in stderr and "rerun the same command" in stderr
    assert not (out / "index.json").exists()
    subprocess.run(command, check=True, capture_output=True)
    assert manifest_without_version(out)["num_samples"] == manifest_without_version(reference)["num_samples"]


def test_sigterm_is_treated_like_ctrl_c(big_folder: tuple[Path, Path], tmp_path: Path) -> None:
    src, _ = big_folder
    out = tmp_path / "out"
    process = subprocess.Popen([*PACK, "lmdb", str(src), str(out), "--shard-size", "20", "-q", "--workers", "1"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    signal_when(process, out, 1, signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert process.returncode == 143  # 128 + SIGTERM, the shell convention
    assert not (out / "index.json").exists()
    assert not list((out / ".pack" / "tmp").glob("*"))  # the inline shard's temp file was removed


def test_damaged_finished_shard_is_redone(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, _ = image_folder
    out = tmp_path / "out"
    options = PackOptions(format="lmdb", shard_size=5)
    pack(root, out, options)
    reference = shard_bytes(out)
    (out / "index.json").unlink()  # as if the run died before publishing
    victim = out / "shard-000001.lmdb"
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    victim.write_bytes(bytes(data))
    summary = pack(root, out, options)
    assert summary.resumed_shards == len(reference) - 1
    assert shard_bytes(out) == reference


def test_changed_options_on_unfinished_run_is_an_error(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, _ = image_folder
    out = tmp_path / "out"
    pack(root, out, PackOptions(format="lmdb", shard_size=5))
    (out / "index.json").unlink()
    with pytest.raises(PackError, match="unfinished run .* pass --overwrite"):
        pack(root, out, PackOptions(format="lmdb", shard_size=6))
    pack(root, out, PackOptions(format="lmdb", shard_size=6), overwrite=True)
    assert json.loads((out / "index.json").read_text())["options"]["shard_size"] == 6


def test_shards_of_another_layout_version_are_not_resumed(image_folder: tuple[Path, dict[str, bytes]],
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's fingerprint includes the layout version: an unfinished run of an older pack is
    packed again, never finished with shards of two layouts under one manifest."""
    root, _ = image_folder
    out = tmp_path / "out"
    options = PackOptions(format="lmdb", shard_size=5)
    pack(root, out, options)
    (out / "index.json").unlink()
    assert pack(root, out, options).resumed_shards == 4
    (out / "index.json").unlink()
    monkeypatch.setattr("packer.plan.plan.FORMAT_VERSION", 3)  # in this process only: no worker processes
    assert pack(root, out, options, workers=1).resumed_shards == 0
