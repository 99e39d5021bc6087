"""Run the `pack` command in-process, the way every CLI test does."""

from __future__ import annotations

from click.testing import CliRunner

from packer.cli import main


def run(*args: object) -> tuple[int, str]:
    """Exit code and the combined output of `pack ARGS...`."""
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    return result.exit_code, result.output
