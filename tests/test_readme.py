"""The Python snippets in README.md run as written, on a small dataset packed the way they expect."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from imagefolders import make_image_folder

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
def test_readme_snippet_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each snippet names its datasets out.lmdb / out.wds in the current directory: out.lmdb holds
    pixels pre-decoded to one size, so batches stack as the training loop's comment asks; out.wds
    the JPEGs as they are, for the other loaders."""
    root = tmp_path / "src"
    files = make_image_folder(root)
    pack(root, tmp_path / "out.lmdb", PackOptions(format="lmdb", store="raw", resize=24, center_crop=24))
    pack(root, tmp_path / "out.wds", PackOptions(format="wds"))
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(python_snippets()[index], f"README.md snippet {index}", "exec"), namespace)
    for name in ("ds", "hf"):
        if name in namespace:
            assert len(namespace[name]) == len(files)  # type: ignore[arg-type]
    if "sample" in namespace:
        assert namespace["sample"]["__key__"] == "000000_0000000000"  # type: ignore[index]


def test_the_readme_tells_pip_users_how_to_get_the_cpu_torch_the_scripts_pin() -> None:
    """A plain `pip install torch` takes a CUDA build of several GB: the README says how to get the
    CPU build, within the range pyproject asks for, which includes the version setup.sh pins."""
    text = README.read_text(encoding="utf-8")
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in " ".join(text.split())
    pyproject = (README.parent / "pyproject.toml").read_text(encoding="utf-8")
    assert '"torch>=2.1,<3"' in pyproject and "`torch>=2.1`" in text
    assert '"torch==2.13.0"' in (README.parent / "scripts" / "setup.sh").read_text(encoding="utf-8")
