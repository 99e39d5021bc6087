"""Writers as context managers: a failure inside `with` leaves no open handle behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from packer.write.writers import WRITERS, Sample
from readers.manifest import payload_crc32, sample_key


def open_files(folder: Path) -> set[str]:
    """What this process holds open under `folder`."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the listing's own descriptor, closed by now
            continue
        if target.startswith(str(folder)):
            found.add(target)
    return found


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_an_error_inside_with_releases_every_handle(fmt: str, tmp_path: Path) -> None:
    payload = b"\xff\xd8\xff" + bytes(100)
    sample = Sample(key=sample_key(0, 0), label=0, path="a.jpg", payload=payload, meta={"format": "jpeg"},
                    extension="jpg", crc32=payload_crc32(payload))
    with pytest.raises(RuntimeError, match="stop"):
        with WRITERS[fmt](tmp_path / "shard", expected_bytes=len(payload), classes=["a"]) as writer:
            writer.add(sample)
            assert open_files(tmp_path), "the writer holds its file open while writing"
            raise RuntimeError("stop")
    assert not open_files(tmp_path)


def test_a_writer_that_fails_half_way_through_opening_releases_what_it_opened(tmp_path: Path) -> None:
    """The tar opens but its index cannot (a directory stands in its place): the constructor
    raises before `with` could abort it, and must close the tar itself."""
    (tmp_path / "shard.packidx").mkdir()
    with pytest.raises(IsADirectoryError) as caught:
        WRITERS["wds"](tmp_path / "shard", expected_bytes=100, classes=["a"])
    assert not open_files(tmp_path)  # while the traceback (and the half-made writer in it) is still alive
    del caught
