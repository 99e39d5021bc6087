"""The suite's own guard against hangs: a test past its limit fails the run with every stack."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HANGING_TEST = '''
import subprocess, sys, time

def test_waits_forever():
    subprocess.Popen([sys.executable, "-c", "import time\\ndef child_sleeps():\\n    time.sleep(600)\\nchild_sleeps()"])
    time.sleep(600)
'''


def test_a_hung_test_fails_the_run_with_every_process_stack(tmp_path: Path) -> None:
    (tmp_path / "test_hang.py").write_text(HANGING_TEST)
    tests = str(Path(__file__).parent)
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "timeouts", "-o", "timeout=2", "-p",
                             "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path / "test_hang.py")],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": tests})
    assert result.returncode != 0
    assert "Stacks of child process" in result.stdout and "child_sleeps" in result.stdout  # the child's stack
    assert "test_waits_forever" in result.stdout  # pytest's own main thread
