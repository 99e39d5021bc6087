"""What README.md tells a new user; its Python blocks run in tests/test_doc_blocks.py."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_tells_pip_users_how_to_get_the_cpu_torch_the_scripts_pin() -> None:
    """A plain `pip install torch` takes a CUDA build of several GB: the README says how to get the
    CPU build, within the range pyproject asks for, which includes the version setup.sh pins."""
    text = README.read_text(encoding="utf-8")
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in " ".join(text.split())
    pyproject = (README.parent / "pyproject.toml").read_text(encoding="utf-8")
    assert '"torch>=2.1,<3"' in pyproject and "`torch>=2.1`" in text
    assert '"torch==2.13.0"' in (README.parent / "scripts" / "setup.sh").read_text(encoding="utf-8")


def test_the_readme_says_which_set_up_is_for_use_and_which_for_the_tests() -> None:
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert "`scripts/setup.sh` (which demo.sh runs) sets up for use" in text
    assert "`scripts/setup-tests.sh` (which test.sh runs) adds the test extras" in text
    assert "`chromium` and `fuse3`" in text
