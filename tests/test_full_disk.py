"""A full disk while packing, in every format: one clean error line, exit 1, no manifest.

h5py can crash the process after a failed HDF5 write, so the HDF5 writer must notice the full
disk before HDF5 does; LMDB sometimes reports it as EIO, which the pipeline names correctly.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from packer.run import pipeline
from packer.stores import outdir, output
from packer.errors import PackError
from packer.plan.options import PackOptions
from packer.write.writers import WRITERS

PACK = [sys.executable, "-m", "packer.cli"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
@pytest.mark.parametrize("fmt", sorted(WRITERS))
@pytest.mark.parametrize("workers", ["1", "2"])
def test_full_disk_is_a_clear_error(fmt: str, workers: str, image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, _ = image_folder
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        out = disk / "out"
        result = subprocess.run([*PACK, fmt, str(root), str(out), "-q", "--shard-size", "5", "--workers", workers],
                                capture_output=True, text=True)
        assert result.returncode == 1, result.stderr
        assert result.stderr.startswith(f"Error: {out}: cannot write shard-") and result.stderr.count("\n") == 1
        assert "No space left on device" in result.stderr
        assert not (out / "index.json").exists()
        failed = result.stderr.split("cannot write ")[1].split(" ")[0]
        assert not (out / failed).exists()  # shards finished before the disk filled may stay: resume keeps them
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_disk_full_at_the_marker_takes_the_shard_back(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The race the small tmpfs hits now and then: the shard fits, its marker does not."""
    root, _ = image_folder
    out = tmp_path / "out"
    real_write = output.atomic_write_text

    def no_room_for_markers(path: Path, text: str) -> None:
        if path.parent.name == outdir.DONE_DIR:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(path, text)

    monkeypatch.setattr(output, "atomic_write_text", no_room_for_markers)
    with pytest.raises(PackError, match=r": cannot write shard-000000\.tar \(No space left on device\); nothing was published"):
        pipeline.pack(root, out, PackOptions(format="wds", shard_size=5), workers=1)
    assert sorted(path.name for path in out.glob("shard-*")) == []
    assert not (out / "index.json").exists()
    monkeypatch.setattr(output, "atomic_write_text", real_write)
    assert pipeline.pack(root, out, PackOptions(format="wds", shard_size=5), workers=1).published
