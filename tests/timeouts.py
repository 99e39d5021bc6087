"""Every test has a time limit (`timeout` in pyproject.toml, through pytest-timeout): past it, the
log gets the Python stacks of every process the test started (pack's workers, DataLoader workers,
DDP ranks, `pack` subprocesses) and of every thread of pytest's own process, then the run ends,
so a hang fails CI in minutes instead of running into its limit."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import pytest_timeout
from workers import children


def descendants(pid: int) -> list[int]:
    found = children(pid)
    for child in list(found):
        found += descendants(child)
    return found


def stacks_of(pid: int) -> str:
    """Every thread's Python stack in process `pid` (py-spy reads it from outside, whatever it is doing)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"process {pid} is gone\n"
    try:
        py_spy = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or "py-spy"
        dump = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
        stacks = dump.stdout + dump.stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        try:
            wait_channel = Path(f"/proc/{pid}/wchan").read_text()
        except OSError:
            wait_channel = "(gone)"
        stacks = f"(no py-spy dump: {exc}); kernel wait channel: {wait_channel}\n"
    return f"{cmdline}\n{stacks}"


def time_out(item: pytest.Item, settings: Any) -> None:
    """A test ran past its limit: log the stacks of every process it started, kill them, then let
    pytest-timeout log this process's threads and end the run (os._exit), so CI fails in minutes."""
    try:
        capture = item.config.pluginmanager.getplugin("capturemanager")
        if capture:
            capture.suspend_global_capture(item)
        terminal = item.config.get_terminal_writer()
        for pid in descendants(os.getpid()):
            terminal.sep("~", title=f"Stacks of child process {pid}")
            terminal.write(stacks_of(pid))
        for pid in descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    finally:  # whatever went wrong above, the run still ends
        pytest_timeout.timeout_timer(item, settings)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool:
    """Every test has a time limit (`timeout` in pyproject.toml; pytest-timeout's thread method,
    plus the stacks of child processes: pack's workers, DataLoader workers, DDP ranks)."""
    timer = threading.Timer(settings.timeout, time_out, (item, settings))
    timer.name = f"timeout {item.nodeid}"
    timer.daemon = True

    def cancel() -> None:
        timer.cancel()
        timer.join()

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # what pytest-timeout's cancel hook calls
    timer.start()
    return True
