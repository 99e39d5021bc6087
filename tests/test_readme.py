"""The Python snippets in README.md run as written, on a small dataset packed the way they expect."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from packer.pipeline import pack
from packer.plan import PackOptions

README = Path(__file__).resolve().parents[1] / "README.md"


def python_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_the_readme_shows_reading_and_training() -> None:
    snippets = python_snippets()
    assert any("readers.open_dataset(" in code for code in snippets)
    assert any("readers.make_loader(" in code and "loss.backward()" in code for code in snippets)


@pytest.mark.parametrize("index", range(len(python_snippets())))
def test_readme_snippet_runs(index: int, image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Each snippet names its datasets out.lmdb / out.wds in the current directory; they are packed
    pre-decoded to one size, so batches stack as the training loop's comment asks."""
    root, files = image_folder
    for fmt, name in (("lmdb", "out.lmdb"), ("wds", "out.wds")):
        pack(root, tmp_path / name, PackOptions(format=fmt, store="raw", resize=24, center_crop=24))
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(python_snippets()[index], f"README.md snippet {index}", "exec"), namespace)
    assert len(namespace["ds"]) == len(files)  # type: ignore[arg-type]
