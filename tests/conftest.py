from __future__ import annotations

import random
from pathlib import Path

import pytest
from imagefolders import add_non_utf8_file, image_bytes, make_image_folder

from packer.pipeline import pack
from packer.plan import PackOptions
from packer.writers import WRITERS


@pytest.fixture
def image_folder(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A seeded ImageFolder with nested folders, odd names and a non-UTF-8 file name."""
    root = tmp_path / "src"
    files = make_image_folder(root)
    odd = image_bytes(random.Random(99))
    files[add_non_utf8_file(root, odd)] = odd
    return root, files


@pytest.fixture(params=sorted(WRITERS))
def packed(request: pytest.FixtureRequest, image_folder: tuple[Path, dict[str, bytes]],
           tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """`image_folder` packed in 4 shards of 5 (one of 4), once per registered format."""
    root, files = image_folder
    out = tmp_path / "out"
    pack(root, out, PackOptions(format=request.param, shard_size=5))
    return out, files
