from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Callable

import pytest
from imagefolders import add_non_utf8_file, image_bytes, make_image_folder

from packer.pipeline import pack
from packer.plan import PackOptions
from packer.writers import WRITERS

pytest_plugins = ["timeouts"]

PackedAs = Callable[[str], tuple[Path, dict[str, bytes]]]


def make_test_folder(root: Path) -> dict[str, bytes]:
    """19 seeded images with nested folders, odd names and a non-UTF-8 file name; returns
    {relative path: bytes}."""
    files = make_image_folder(root)
    odd = image_bytes(random.Random(99))
    files[add_non_utf8_file(root, odd)] = odd
    return files


@pytest.fixture
def image_folder(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """The test's own copy of the seeded image folder, to pack or to change."""
    root = tmp_path / "src"
    return root, make_test_folder(root)


@pytest.fixture(scope="session")
def packed_as(tmp_path_factory: pytest.TempPathFactory) -> PackedAs:
    """format -> (dataset, files): the seeded image folder packed in shards of 4 (5 shards, the
    last one short), on first use per format and session; the dataset must only be read."""
    root = tmp_path_factory.mktemp("packed-source") / "src"
    files = make_test_folder(root)
    outs: dict[str, Path] = {}

    def packed_as(fmt: str) -> tuple[Path, dict[str, bytes]]:
        if fmt not in outs:
            outs[fmt] = tmp_path_factory.mktemp(f"packed-{fmt}") / "out"
            pack(root, outs[fmt], PackOptions(format=fmt, shard_size=4))
        return outs[fmt], dict(files)

    return packed_as


@pytest.fixture(scope="session", params=sorted(WRITERS))
def packed(request: pytest.FixtureRequest, packed_as: PackedAs) -> tuple[Path, dict[str, bytes]]:
    """The seeded image folder packed once per registered format, shared by the whole session:
    tests only read it (use `packed_copy` to change it)."""
    return packed_as(request.param)


@pytest.fixture(params=sorted(WRITERS))
def packed_copy(request: pytest.FixtureRequest, packed_as: PackedAs, tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """The test's own copy of `packed`, for one registered format, to damage."""
    out, files = packed_as(request.param)
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    return copy, files

