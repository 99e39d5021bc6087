"""The read-one-sample snippets in docs/FORMAT.md run against real shards and read sample 0."""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import pytest

from packer.run.pipeline import pack
from packer.plan.options import PackOptions
from readers.formats import FORMATS

DOC = Path(__file__).resolve().parents[1] / "docs" / "FORMAT.md"


def snippets() -> list[tuple[str, str]]:
    """(format, code) of every Python snippet; the format is the one its section's heading names."""
    found = []
    for section in re.split(r"^## ", DOC.read_text(encoding="utf-8"), flags=re.M)[1:]:
        heading = section.splitlines()[0]
        named = re.findall(r'`format: "(\w+)"`', heading)
        for code in re.findall(r"```python\n(.*?)```", section, re.S):
            assert len(named) == 1, f"a snippet under '## {heading}', which names no single format"
            found.append((named[0], code))
    return found


def test_every_format_has_a_snippet() -> None:
    assert {fmt for fmt, _ in snippets()} == set(FORMATS)


@pytest.mark.parametrize("fmt, code", snippets(), ids=lambda value: value.splitlines()[0])
def test_snippet_reads_sample_zero(fmt: str, code: str, image_folder: tuple[Path, dict[str, bytes]],
                                   tmp_path: Path) -> None:
    root, files = image_folder
    out = tmp_path / "OUT"
    pack(root, out, PackOptions(format=fmt, shard_size=6))  # shuffled: sample 0 is whichever file came first
    namespace: dict = {}
    exec(code.replace('"OUT/', f'"{out}/'), namespace)
    first = namespace["meta"]["path"] if "meta" in namespace else namespace["path"]
    label = int(first.split("/")[0].removeprefix("class_"))
    assert bytes(namespace["image_bytes"]) == files[first]
    if "meta" in namespace:
        codec = "png" if first.endswith(".PNG") else "jpeg"
        assert namespace["meta"] == {"label": label, "path": first, "format": codec, "crc32": zlib.crc32(files[first])}
    else:
        assert namespace["label"] == label
