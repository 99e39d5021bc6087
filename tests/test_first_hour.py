"""Issue #31, "the first hour without surprises": each old surprise, shown gone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
from clirun import run

import packer.cli

REPO = Path(__file__).resolve().parents[1]


def pack_command(*args: object) -> list[str]:
    return [sys.executable, "-m", "packer.cli", *map(str, args)]


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def test_ctrl_c_exits_130_with_its_message(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(packer.cli, "run", interrupted)
    code, output = run("wds", image_folder[0], tmp_path / "out", "-q")
    assert code == 130, output
    assert output.strip() == "Error: interrupted; nothing was published; rerun the same command to resume"


def test_info_into_a_closed_pipe_ends_quietly(packed_as: Callable[[str], tuple[Path, dict[str, bytes]]]) -> None:
    out, _ = packed_as("wds")
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head -2` that has already exited: the first write fails with EPIPE
    try:
        result = subprocess.run(pack_command("info", out), stdout=write_end, stderr=subprocess.PIPE,
                                env=subprocess_env(), timeout=120)
    finally:
        os.close(write_end)
    assert result.returncode == 0 and result.stderr == b"", result.stderr


def test_info_lists_only_options_that_differ_and_counts_in_the_singular(
        image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, output = run("wds", image_folder[0], out, "-q", "--shard-size", "50")
    assert code == 0 and "into 1 shard " in output, output
    code, output = run("info", out)
    options = next(line for line in output.splitlines() if line.startswith("options"))
    assert options.split(None, 1)[1] == "shard_size=50"  # no image_key, label_offset, None values


def test_mode_choices_are_spelled_as_in_the_readme() -> None:
    code, output = run("wds", "--help")
    assert code == 0 and "--mode [RGB|L]" in output
    assert "`--mode RGB\\|L`" in (REPO / "README.md").read_text()


def test_progress_bar_has_a_total_and_is_not_drawn_before_an_early_error(
        image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, files = image_folder
    code, output = run("wds", root, tmp_path / "out")
    assert code == 0 and f"100%" in output and f"{len(files)}/{len(files)}" in output, output
    out = tmp_path / "missing-out"
    code, output = run("wds", tmp_path / "missing", out)
    assert code == 1 and output == f"Error: {tmp_path / 'missing'}: does not exist\n"  # no `0img [00:00, ?img/s]`
    assert not out.exists()  # no OUT/.pack/plan.lock left behind either


def test_a_failed_plan_leaves_an_existing_out_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    assert run("wds", tmp_path / "missing", out, "-q")[0] == 1
    assert out.is_dir() and os.listdir(out) == []


def readme_option_table() -> str:
    """The rows of README's option table (the one whose header is `| option | meaning |`)."""
    text = (REPO / "README.md").read_text()
    start = text.index("| option | meaning |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return "\n".join(rows)


def test_readme_option_table_names_every_flag_of_pack_wds_and_no_other() -> None:
    command = packer.cli.main.commands["wds"]
    flags = {flag for param in command.params for flag in getattr(param, "opts", ()) if flag.startswith("--")}
    documented = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", readme_option_table()))
    assert documented == flags - {"--help"}
