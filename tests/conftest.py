from __future__ import annotations

import random
from pathlib import Path

import pytest

from imagefolders import add_non_utf8_file, image_bytes, make_image_folder


@pytest.fixture
def image_folder(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A seeded ImageFolder with nested folders, odd names and a non-UTF-8 file name."""
    root = tmp_path / "src"
    files = make_image_folder(root)
    odd = image_bytes(random.Random(99))
    files[add_non_utf8_file(root, odd)] = odd
    return root, files
