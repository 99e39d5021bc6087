"""The set-up scripts: setup.sh installs pack for use (demo.sh), setup-tests.sh adds what the tests
need (test.sh): the test extras, and chromium and fuse3 from apt-get when it can. Run on a copy of
scripts/ with a stand-in python and apt-get that write down how they were called."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOGGER = '#!/bin/sh\necho "$(basename "$0") $*" >> "{log}"\nexit {code}\n'


def stand_in(folder: Path, name: str, log: Path, code: int = 0) -> None:
    path = folder / name
    path.write_text(LOGGER.format(log=log, code=code))
    path.chmod(0o755)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A checkout's scripts/ with a .venv whose python logs its arguments (and has torch)."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "scripts", root / "scripts", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    (root / ".venv" / "bin").mkdir(parents=True)
    stand_in(root / ".venv" / "bin", "python", tmp_path / "calls")
    return root


def run_bash(script: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/bash", "-c", script], env={"PATH": str(path), "HOME": str(path)},
                          capture_output=True, text=True, timeout=60)


def bin_with(tmp_path: Path, *names: str, apt_code: int = 0, root: bool = True) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name in names:
        stand_in(folder, name, tmp_path / "calls")
    stand_in(folder, "apt-get", tmp_path / "calls", apt_code)
    (folder / "id").write_text(f"#!/bin/sh\necho {0 if root else 1000}\n")
    (folder / "id").chmod(0o755)
    for tool in ("bash", "dirname", "basename"):  # what the scripts and stand-ins use; nothing else of the system's
        (folder / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    return folder


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls"
    return log.read_text().splitlines() if log.exists() else []


def test_setup_installs_pack_for_use_and_setup_tests_adds_the_test_extras(copy: Path, tmp_path: Path) -> None:
    path = bin_with(tmp_path, "chromium", "fusermount3")
    result = run_bash(f"source {copy}/scripts/setup.sh", path)
    assert result.returncode == 0, result.stderr
    pip = "python -m pip install --quiet --disable-pip-version-check"
    assert calls(tmp_path) == ["python -c import torch", f"{pip} -e {copy}"]
    (tmp_path / "calls").unlink()
    result = run_bash(f"source {copy}/scripts/setup-tests.sh", path)
    assert result.returncode == 0, result.stderr
    assert calls(tmp_path) == ["python -c import torch", f"{pip} -e {copy}", f"{pip} -e {copy}[test,dask]"]
    # the two commands of the README's quickstart: demo.sh sets up for use, test.sh for the tests
    assert 'source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"' in (REPO / "scripts" / "demo.sh").read_text()
    assert 'source "$(dirname "${BASH_SOURCE[0]}")/setup-tests.sh"' in (REPO / "scripts" / "test.sh").read_text()


def test_the_test_packages_come_from_apt_get_when_missing(tmp_path: Path) -> None:
    result = run_bash(f"bash {REPO}/scripts/test-packages.sh", bin_with(tmp_path, "fusermount3"))
    assert result.returncode == 0 and result.stderr == ""
    apt = "apt-get -qq -o DPkg::Lock::Timeout=300"
    assert calls(tmp_path) == [f"{apt} update", f"{apt} install -y --no-install-recommends chromium"]


def test_present_test_packages_are_not_installed_again(tmp_path: Path) -> None:
    result = run_bash(f"bash {REPO}/scripts/test-packages.sh", bin_with(tmp_path, "chromium", "fusermount3"))
    assert result.returncode == 0 and result.stderr == "" and calls(tmp_path) == []


@pytest.mark.parametrize("apt_code, root", [(100, True), (0, False)])
def test_no_apt_get_leaves_the_run_going(tmp_path: Path, apt_code: int, root: bool) -> None:
    """apt-get failing (no network) or no root: the set-up goes on, saying which tests will skip."""
    result = run_bash(f"bash {REPO}/scripts/test-packages.sh", bin_with(tmp_path, apt_code=apt_code, root=root))
    assert result.returncode == 0
    if root:
        assert result.stderr == "test-packages: apt-get could not install chromium fuse3: their tests skip\n"
        assert calls(tmp_path) == ["apt-get -qq -o DPkg::Lock::Timeout=300 update"]
    else:
        assert result.stderr == ("test-packages: chromium fuse3 missing, and no apt-get as root here to install "
                                 "them: their tests skip\n")
        assert calls(tmp_path) == []
