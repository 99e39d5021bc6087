"""The `pack` command through click's CliRunner and as the installed console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from clirun import run

import readers
from packer.write.writers import WRITERS


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_pack_prints_summary_and_reads_back(fmt: str, image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, files = image_folder
    out = tmp_path / "out"
    code, output = run(fmt, root, out, "--shard-size", "7", "-q")
    assert code == 0, output
    assert f"packed {len(files)} samples" in output and "into 3 shards" in output
    assert "0 rejected" in output and "files/s" in output
    ds = readers.open_dataset(out, decode="bytes", fields=("image", "path"))
    assert {path: data for data, path in ds} == files


def test_existing_dataset_is_up_to_date_or_needs_overwrite(image_folder: tuple[Path, dict[str, bytes]],
                                                           tmp_path: Path) -> None:
    root, files = image_folder
    out = tmp_path / "out"
    assert run("lmdb", root, out, "-q")[0] == 0
    before = (out / "index.json").read_bytes()
    code, output = run("lmdb", root, out, "-q")  # a requeued batch job: the same command again
    assert code == 0, output
    assert output.strip() == (f"{out}: up to date, {len(files)} samples in 1 shard packed from the same SRC with "
                              "the same options; nothing to do (--overwrite packs it again)")
    code, output = run("lmdb", root, out, "-q", "--shard-size", "2")
    assert code == 1
    assert output.strip() == (f"Error: {out}: already holds a packed dataset of other options (--shard-size: 10000 "
                              "before, 2 now); pass --overwrite to replace it")
    other = shutil.copytree(root, tmp_path / "other")
    code, output = run("lmdb", other, out, "-q")
    assert code == 1 and f"already holds a packed dataset of another SRC ({root} before, {other} now)" in output
    assert (out / "index.json").read_bytes() == before
    code, output = run("lmdb", root, out, "-q", "--overwrite", "--shard-size", "2")
    assert code == 0, output
    assert json.loads((out / "index.json").read_text())["options"]["shard_size"] == 2
    assert len(list(out.glob("shard-*.lmdb"))) == 10  # 20 files, 2 per shard: the old shards are gone


def test_foreign_directory_is_refused(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, _ = image_folder
    out = tmp_path / "out"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    code, output = run("lmdb", root, out, "-q", "--overwrite")
    assert code == 0, output  # --overwrite removes only pack's own files
    assert (out / "thesis.tex").read_text() == "precious"
    shutil.rmtree(out / ".pack")
    for name in os.listdir(out):
        if name != "thesis.tex":
            os.remove(out / name)
    code, output = run("lmdb", root, out, "-q")
    assert code == 1 and "not empty and not a pack output" in output and "thesis.tex" in output


@pytest.mark.parametrize(
    "args, message",
    [
        (["lmdb", "{tmp}/missing", "{tmp}/out"], "{tmp}/missing: does not exist"),
        (["lmdb", "{src}", "{src}/inside"], "must not be inside SRC"),
        (["lmdb", "{src}", "{tmp}/out", "--shard-size", "0"], "Invalid value for '--shard-size'"),
        (["lmdb", "{src}", "{tmp}/out", "--shard-bytes", "lots"], "'lots' is not a size"),
        (["lmdb", "{src}", "{tmp}/file.txt"], "{tmp}/file.txt: exists and is not a directory"),
        (["lmdb", "{tmp}/empty", "{tmp}/out"], "{tmp}/empty: no image files found"),
    ],
)
def test_misuse_is_one_line_error(args: list[str], message: str, image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, _ = image_folder
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    fill = {"tmp": str(tmp_path), "src": str(root)}
    code, output = run(*(arg.format(**fill) for arg in args))
    assert code == 2 if "Invalid value" in message or "is not a size" in message else code == 1
    assert message.format(**fill) in output
    assert "Traceback" not in output
    assert not (tmp_path / "out" / "index.json").exists()
    assert not (root / "inside").exists()


def test_shard_bytes_splits_by_size(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, files = image_folder
    limit = max(len(data) for data in files.values()) * 3
    code, output = run("lmdb", root, tmp_path / "out", "-q", "--shard-bytes", limit)
    assert code == 0, output
    manifest = readers.load_manifest(tmp_path / "out")
    assert sum(shard.num_samples for shard in manifest.shards) == len(files)
    sizes = [len(data) for data, in readers.open_dataset(tmp_path / "out", decode="bytes", fields=("image",))]
    starts = np.cumsum([0] + [shard.num_samples for shard in manifest.shards])
    shards = [sizes[start:end] for start, end in zip(starts[:-1], starts[1:])]
    assert all(sum(shard) <= limit for shard in shards)  # no shard over the limit...
    assert all(sum(shard) + following[0] > limit for shard, following in zip(shards, shards[1:]))  # ...nor cut early


def test_installed_console_script(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, files = image_folder
    script = Path(sys.executable).with_name("pack")
    result = subprocess.run([str(script), "lmdb", str(root), str(tmp_path / "out")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert f"packed {len(files)} samples" in result.stdout
    assert "pack lmdb" in result.stderr  # the progress bar goes to stderr
    version = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert version.stdout.startswith("pack, version ")


def test_overwrite_removes_the_descriptors_and_split_names_the_split(image_folder: tuple[Path, dict[str, bytes]],
                                                                      tmp_path: Path) -> None:
    root, files = image_folder
    out = tmp_path / "out"
    assert run("wds", root, out, "-q", "--split", "validation")[0] == 0
    info = json.loads((out / "_info.json").read_text())
    assert info["splits"]["validation"]["num_samples"] == len(files)
    assert "split: \"validation\"" in (out / "README.md").read_text()
    code, output = run("lmdb", root, out, "-q", "--overwrite")
    assert code == 0, output
    assert not {"_info.json", "wids.json", "README.md"} & set(os.listdir(out))  # LMDB gets none


def test_a_users_readme_is_not_taken_for_a_dataset_card(image_folder: tuple[Path, dict[str, bytes]],
                                                        tmp_path: Path) -> None:
    """README.md, _info.json and wids.json are pack's only where pack has written before."""
    root, _ = image_folder
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("my notes")
    code, output = run("wds", root, out, "-q")
    assert code == 1 and output.strip() == f"Error: {out}: not empty and not a pack output (found 'README.md'); choose another OUT"
    assert (out / "README.md").read_text() == "my notes"


def test_a_run_killed_while_publishing_resumes(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    """atomic_write_text's temp sibling of index.json (or of a descriptor), left by a kill -9 in
    merge, is pack's own leftover: the rerun publishes instead of calling OUT foreign."""
    root, _ = image_folder
    out = tmp_path / "out"
    assert run("wds", root, out, "-q")[0] == 0
    (out / "index.json").rename(out / ".index.json.tmp-12345")
    (out / "README.md").rename(out / ".README.md.tmp-12345")
    code, output = run("wds", root, out, "-q")
    assert code == 0, output
    assert (out / "index.json").exists() and (out / "README.md").exists()
    assert run("wds", root, out, "-q", "--overwrite")[0] == 0
    assert not [name for name in os.listdir(out) if ".tmp-" in name]  # --overwrite clears the leftovers
