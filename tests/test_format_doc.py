"""The read-one-sample snippets in docs/FORMAT.md run against real shards and read sample 0."""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import pytest

from packer.pipeline import pack
from packer.plan import PackOptions
from packer.writers import WRITERS

DOC = Path(__file__).resolve().parents[1] / "docs" / "FORMAT.md"


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def snippet_format(code: str) -> str:
    return "lmdb" if "lmdb" in code else "hdf5" if "h5py" in code else "wds"


def test_every_format_has_a_snippet() -> None:
    assert {snippet_format(code) for code in snippets()} == set(WRITERS)


@pytest.mark.parametrize("code", snippets(), ids=lambda code: code.splitlines()[0])
def test_snippet_reads_sample_zero(code: str, image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, files = image_folder
    fmt = snippet_format(code)
    out = tmp_path / "OUT"
    pack(root, out, PackOptions(format=fmt, shard_size=6))
    namespace: dict = {}
    exec(code.replace('"OUT/', f'"{out}/'), namespace)
    first = sorted(files)[0]
    assert bytes(namespace["image_bytes"]) == files[first]
    if "meta" in namespace:
        assert namespace["meta"] == {"label": 0, "path": first, "format": "jpeg", "crc32": zlib.crc32(files[first])}
    else:
        assert namespace["path"] == first and namespace["label"] == 0
