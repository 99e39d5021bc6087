"""Issue #31, "the first hour without surprises": each old surprise, shown gone."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
from clirun import run
from recordfiles import recordio_payload, write_recordio

import packer.cli
import packer.run.pipeline
import readers

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


def flat_images(root: Path, names: list[str], files: dict[str, bytes]) -> dict[str, bytes]:
    """Images of the test folder copied under `names` into the flat folder `root`."""
    root.mkdir()
    copied = dict(zip(names, files.values()))
    for name, data in copied.items():
        (root / name).write_bytes(data)
    return copied


def test_name_label_lines_with_spaces_in_the_class_name(image_folder: tuple[Path, dict[str, bytes]],
                                                        tmp_path: Path) -> None:
    """Was: each `x.JPEG sea turtle` image rejected twice (no row; no such image `x.JPEG sea`), exit 0."""
    copied = flat_images(tmp_path / "flat", ["a.JPEG", "b.JPEG", "c.JPEG", "my photo.jpg"], image_folder[1])
    (tmp_path / "val.txt").write_text("a.JPEG sea turtle\nb.JPEG tench\nc.JPEG sea turtle\nmy photo.jpg tench\n")
    out = tmp_path / "out"
    code, output = run("wds", tmp_path / "flat", out, "--metadata", tmp_path / "val.txt", "-q")
    assert code == 0 and "packed 4 samples" in output and "0 rejected" in output, output
    ds = readers.open_dataset(out, decode="bytes", fields=("image", "label", "path"))
    assert ds.classes == ["sea turtle", "tench"]
    assert sorted((path, ds.classes[label], image) for image, label, path in ds) == sorted(
        (name, "tench" if name in ("b.JPEG", "my photo.jpg") else "sea turtle", data) for name, data in copied.items())


def test_integer_labels_give_a_class_count(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    """Was: labels 0..7, `ds.classes == []`, `pack info`: "in 0 classes"."""
    flat_images(tmp_path / "flat", [f"{index}.jpg" for index in range(5)], image_folder[1])
    (tmp_path / "labels.txt").write_text("".join(f"{index}.jpg {index * 7 // 4}\n" for index in range(5)))
    out = tmp_path / "out"
    assert run("lmdb", tmp_path / "flat", out, "--metadata", tmp_path / "labels.txt", "-q")[0] == 0
    ds = readers.open_dataset(out, fields=("label",))
    assert ds.classes == [str(index) for index in range(8)] and sorted(label for (label,) in ds) == [0, 1, 3, 5, 7]
    code, output = run("info", out)
    assert "samples      5 in 8 classes" in output, output


def test_a_rejected_first_record_does_not_decide_the_label_layout(image_folder: tuple[Path, dict[str, bytes]],
                                                                    tmp_path: Path) -> None:
    """Was: record 0 (3 labels, the first -1) rejected as not a class index, and records 1 and 2
    (a scalar label) as '0 labels, where the first image record has 3': nothing packed."""
    images = list(image_folder[1].values())[:3]
    write_recordio(tmp_path / "train.rec", [recordio_payload(images[0], [-1.0, 2.0, 3.0]),
                                            recordio_payload(images[1], 4.0), recordio_payload(images[2], 1.0)])
    out = tmp_path / "out"
    code, output = run("wds", tmp_path / "train.rec", out, "--order", "sorted", "-q")
    assert code == 0 and "packed 2 samples" in output and "1 rejected" in output, output
    ds = readers.open_dataset(out, decode="bytes", fields=("image", "label"))
    assert list(ds) == [(images[1], 4), (images[2], 1)]
    assert "label -1.0 is not a class index" in (out / "rejects.jsonl").read_text()


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_tiny_shard_bytes_warn_and_no_empty_shard_is_published(fmt: str, image_folder: tuple[Path, dict[str, bytes]],
                                                                tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Was: `--shard-bytes 10` taken silently, and a rejected file's shard published with 0 samples."""
    root, files = image_folder
    (root / "class_01" / "bad.jpg").write_bytes(b"not an image")
    out = tmp_path / "out"
    code, output = run(fmt, root, out, "--shard-bytes", "10", "--order", "sorted", "-q")
    assert code == 0 and "1 rejected" in output, output
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 1 and "one shard per sample" in warnings[0] and "--shard-bytes 10 " in warnings[0]
    manifest = json.loads((out / "index.json").read_text())
    names = [shard["name"] for shard in manifest["shards"]]
    assert len(names) == len(set(names)) == len(files) and all(shard["num_samples"] == 1 for shard in manifest["shards"])
    assert all(re.fullmatch(r"shard-\d{6}\." + ("tar" if fmt == "wds" else "lmdb"), name) for name in names)
    assert len(list(out.glob("shard-*." + ("tar" if fmt == "wds" else "lmdb")))) == len(files)  # no empty file either
    assert run("verify", out, "-q") == (0, f"{out}: OK, {len(files)} samples\n")
    assert run("info", out)[0] == 0
    ds = readers.open_dataset(out, decode="bytes", fields=("image", "path"))
    assert {path: image for image, path in ds} == files
    if fmt == "wds":
        assert {path: image for image, path in ds.stream()} == files
    (out / "index.json").unlink()
    code, output = run("merge", out)
    assert code == 0 and f"merged {len(files)} shards" in output, output


def test_the_summary_names_what_it_ignored_and_v_names_all(image_folder: tuple[Path, dict[str, bytes]],
                                                         tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root, _ = image_folder
    (root / ".DS_Store").write_bytes(b"x")
    (root / "notes.txt").write_text("about\n")
    (root / "class_00" / "readme.md").write_text("hi\n")
    (root / "class_01" / ".hidden.jpg").write_bytes(b"x")
    code, output = run("lmdb", root, tmp_path / "out", "--order", "sorted")
    assert code == 0, output
    summary = output.strip().splitlines()[-1]
    with caplog.at_level("INFO", logger="packer.plan.plan"):
        code, output = run("hdf5", root, tmp_path / "out2", "--order", "sorted")
    assert code == 0
    logged = [record.getMessage()[len("ignored: "):] for record in caplog.records
              if record.getMessage().startswith("ignored: ")]
    assert {".DS_Store", "notes.txt", "class_00/readme.md", "class_01/.hidden.jpg"} <= set(logged)
    assert summary.endswith(f", {len(logged)} non-image entries ignored ({', '.join(logged[:3])}, ... -v names them all)")


# --- Issue #36, "what it says holds": the first-hour papercuts ---------------------------------


@pytest.mark.parametrize("command", [["info"], ["verify"], ["show", "-o", "sheet.png"]])
def test_inspecting_a_path_that_does_not_exist_says_so(command: list[str], tmp_path: Path) -> None:
    code, output = run(*command, tmp_path / "nosuch")
    assert code == 1 and output == f"Error: {tmp_path / 'nosuch'}: no such file or directory\n"


def test_a_rerun_with_another_store_names_the_options_given_not_those_never_set(
        image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = image_folder
    out = tmp_path / "out"

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(packer.run.pipeline, "pack_shards", interrupted)  # the plan stays, unfinished
    code, output = run("lmdb", root, out, "-q")
    assert code == 130, output
    monkeypatch.undo()
    code, output = run("lmdb", root, out, "-q", "--store", "jpeg", "--resize", "32")
    assert code == 1
    assert "other options (--store: original before, jpeg now; --resize: not set before, 32 now)" in output, output
    assert "None" not in output and "--mode" not in output and "--quality" not in output


def test_a_pack_written_tar_as_src_keeps_its_paths_and_ignores_no_pack_json(
        image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, files = image_folder
    code, output = run("wds", root, tmp_path / "s.wds", "-q", "--order", "sorted")
    assert code == 0, output
    code, output = run("lmdb", tmp_path / "s.wds" / "shard-000000.tar", tmp_path / "out", "-q", "--order", "sorted")
    assert code == 0 and output.rstrip().endswith(" 0 non-image entries ignored"), output
    dataset = readers.open_dataset(tmp_path / "out")
    records = [dataset.record(i) for i in range(len(dataset))]
    assert {meta["path"]: bytes(payload) for meta, payload in records} == files
