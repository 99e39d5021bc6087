"""`pack verify`, `pack info`, and readers facing damaged shards."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
from clirun import run

import readers
import readers.mounts


def flip_byte_in_sample(out: Path, shard: int, files: dict[str, bytes]) -> str:
    """Flip one byte inside the stored image bytes of a sample of `shard`; return that sample's path."""
    path = out / readers.load_manifest(out).shards[shard].name
    data = bytearray(path.read_bytes())
    ds = readers.open_dataset(out, fields=("path",))
    first = sum(s.num_samples for s in readers.load_manifest(out).shards[:shard])
    (victim,) = ds[first + 1]
    start = data.find(files[victim])  # stored unchanged and contiguous in every format
    assert start > 0
    data[start + len(files[victim]) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return victim


def test_verify_passes_on_a_sound_dataset(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, files = packed
    code, output = run("verify", out, "--full", "-q")
    assert code == 0, output
    assert f"{out}: OK, {len(files)} samples, all decoded" in output


def test_verify_names_shard_and_sample_of_a_flipped_byte(packed_copy: tuple[Path, dict[str, bytes]]) -> None:
    out, files = packed_copy
    flip_byte_in_sample(out, 1, files)
    name = readers.load_manifest(out).shards[1].name
    code, output = run("verify", out, "-q")
    assert code == 1
    assert f"{out / name}: sha256 does not match the manifest (the file is damaged)" in output
    assert f"{out / name}: sample 1: damaged (checksum mismatch)" in output
    assert output.strip().splitlines()[-1] == f"Error: {out}: 2 problems found"


def test_verify_reports_missing_and_truncated_shards(packed_copy: tuple[Path, dict[str, bytes]]) -> None:
    out, _ = packed_copy
    shards = readers.load_manifest(out).shards
    (out / shards[0].name).unlink()
    last = out / shards[-1].name
    last.write_bytes(last.read_bytes()[:-100])
    code, output = run("verify", out, "-q")
    assert code == 1
    assert f"{out / shards[0].name}: missing" in output
    assert f"{last}: {shards[-1].bytes - 100} bytes, the manifest says {shards[-1].bytes}" in output


def test_reader_raises_naming_shard_and_sample_or_skips(packed_copy: tuple[Path, dict[str, bytes]]) -> None:
    out, files = packed_copy
    victim = flip_byte_in_sample(out, 1, files)
    name = readers.load_manifest(out).shards[1].name
    strict = readers.open_dataset(out, decode="bytes", fields=("image", "path"))
    with pytest.raises(readers.DatasetError, match=f"{name}: sample 1: damaged"):
        strict[5]
    lenient = readers.open_dataset(out, decode="bytes", fields=("image", "path"), on_error="skip")
    samples = [lenient[i] for i in range(len(lenient))]
    assert lenient.skipped == 1
    assert len(samples) == len(files)
    assert victim not in {path for _, path in samples}
    assert all(files[path] == data for data, path in samples)


def test_reader_on_error_speaks_the_packers_words(packed_copy: tuple[Path, dict[str, bytes]]) -> None:
    out, files = packed_copy
    flip_byte_in_sample(out, 1, files)
    assert readers.open_dataset(out).on_error == "fail"
    with pytest.warns(DeprecationWarning, match='on_error="raise" is deprecated; use "fail"'):
        alias = readers.open_dataset(out, decode="bytes", on_error="raise")
    assert alias.on_error == "fail"
    with pytest.raises(readers.DatasetError, match="sample 1: damaged"):
        alias[5]
    with pytest.raises(ValueError, match=r"on_error must be one of \('skip', 'fail'\), not 'ignore'"):
        readers.open_dataset(out, on_error="ignore")


def test_info_text_and_json(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, files = packed
    code, output = run("info", out, "--json")
    assert code == 0, output
    info = json.loads(output)
    assert info["num_samples"] == len(files) and info["store"] == "original"
    by_class = {entry["name"]: entry["samples"] for entry in info["classes"]}
    assert by_class == {name: sum(1 for path in files if path.startswith(name + "/")) for name in by_class}
    assert info["shards"] == 5 and info["bytes"] == sum(s.bytes for s in readers.load_manifest(out).shards)
    assert info["image_sizes"]["width"]["min"] >= 16 and info["image_sizes"]["width"]["max"] <= 64
    assert info["options"]["shard_size"] == 4
    # as open_dataset would read it: storage="auto", this machine's disk
    assert info["read"] == f"read in place (filesystem {readers.mounts.filesystem_type(out)})"
    code, text = run("info", out)
    assert code == 0
    assert f"samples      {len(files)} in 3 classes" in text and "class_01" in text
    assert f"read         {info['read']}\n" in text


def test_info_and_verify_on_something_else_are_one_line_errors(tmp_path: Path) -> None:
    code, output = run("info", tmp_path)
    assert code == 1 and output.strip() == f"Error: {tmp_path / 'index.json'}: no manifest (packing unfinished, or not a packed dataset)"
    (tmp_path / "a-file").write_text("x")
    code, output = run("verify", tmp_path / "a-file")
    assert code == 1 and output.strip() == f"Error: {tmp_path / 'a-file'}: not a packed dataset directory"


def damage_sidecar(path: Path, how: str) -> None:
    if how == "deleted":
        path.unlink()
    elif how == "replaced":
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        path.write_bytes(path.read_bytes() + b"\0")


@pytest.mark.parametrize("how", ["deleted", "replaced", "grown"])
@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("extension", [".packidx", ".idx"])
def test_verify_names_a_damaged_sidecar_once(packed_as, tmp_path: Path, how: str, full: bool, extension: str) -> None:
    source, _ = packed_as("wds")
    out = tmp_path / "out"
    shutil.copytree(source, out)
    (sidecar,) = [s for s in readers.load_manifest(out).shards[2].sidecars if s.name.endswith(extension)]
    path = out / sidecar.name
    damage_sidecar(path, how)
    code, output = run("verify", out, "-q", *(["--full"] if full else []))
    assert code == 1
    expected = {"deleted": f"{path}: missing",
                "replaced": f"{path}: sha256 does not match the manifest (the file is damaged)",
                "grown": f"{path}: {sidecar.bytes + 1} bytes, the manifest says {sidecar.bytes}"}[how]
    lines = output.strip().splitlines()
    assert lines.count(expected) == 1
    assert sum(str(path) in line for line in lines) == 1, output
    assert lines[-1] == f"Error: {out}: 1 problem found"


@pytest.mark.parametrize("name", ["_info.json", "wids.json", "README.md"])
def test_verify_covers_the_loader_descriptors(packed_as, tmp_path: Path, name: str) -> None:
    source, _ = packed_as("wds")
    out = tmp_path / "out"
    shutil.copytree(source, out)
    assert name in {info.name for info in readers.load_manifest(out).descriptors}
    (out / name).write_text((out / name).read_text().replace("train", "tRain"))
    code, output = run("verify", out, "-q")
    assert code == 1
    assert output.strip().splitlines() == [f"{out / name}: sha256 does not match the manifest (the file is damaged)",
                                           f"Error: {out}: 1 problem found"]


def test_a_damaged_dali_index_does_not_hide_a_damaged_sample(packed_as, tmp_path: Path) -> None:
    """The samples are read through pack's .packidx: a broken DALI .idx beside a damaged shard is
    reported, and the damaged sample is still named."""
    source, files = packed_as("wds")
    out = tmp_path / "out"
    shutil.copytree(source, out)
    flip_byte_in_sample(out, 1, files)
    shard = readers.load_manifest(out).shards[1]
    (dali,) = [s for s in shard.sidecars if s.name.endswith(".idx")]
    damage_sidecar(out / dali.name, "deleted")
    code, output = run("verify", out, "-q")
    assert code == 1
    assert f"{out / dali.name}: missing" in output
    assert f"{out / shard.name}: sample 1: damaged (checksum mismatch)" in output


def edit_manifest(out: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads((out / "index.json").read_text())
    change(data)
    (out / "index.json").write_text(json.dumps(data, indent=2))


def swap_class_names(data: dict[str, Any]) -> None:
    data["classes"][0], data["classes"][1] = data["classes"][1], data["classes"][0]
    data["class_counts"][0], data["class_counts"][1] = data["class_counts"][1], data["class_counts"][0]


def shift_class_counts(data: dict[str, Any]) -> None:
    data["class_counts"][0] -= 1
    data["class_counts"][1] += 1


def rename_class(data: dict[str, Any]) -> None:
    data["classes"][0] = "kitten"


def store_raw(data: dict[str, Any]) -> None:
    data["store"] = "raw"


def swap_shards(data: dict[str, Any]) -> None:
    data["shards"][0], data["shards"][1] = data["shards"][1], data["shards"][0]


FORGED_REJECT = '{"path": "class_00/img 000.jpg", "reason": "not an image"}\n'
# (id, damage to OUT, whether plain `verify` (not --full) must see it too, what the line says)
LIES: list[tuple[str, Callable[[Path], None], bool, str]] = [
    ("class-names-swapped", lambda out: edit_manifest(out, swap_class_names), True,
     "{index}: classes disagree with the folders of the samples' paths: label 0 is named 'class_01', its samples "
     "lie in class_00/"),
    ("class-renamed", lambda out: edit_manifest(out, rename_class), True,
     "{index}: classes disagree with the folders of the samples' paths: label 0 is named 'kitten', its samples "
     "lie in class_00/"),
    ("class-counts-shifted", lambda out: edit_manifest(out, shift_class_counts), False,
     "{index}: class_counts disagree with the labels the shards hold: 'class_00' {c0} (index.json {c0m1}), "
     "'class_01' {c1} (index.json {c1p1})"),
    ("store-raw", lambda out: edit_manifest(out, store_raw), True,
     "{index}: store 'raw' disagrees with the payloads: {shard0} sample 0 holds a jpeg file as packed"),
    ("shards-reordered", lambda out: edit_manifest(out, swap_shards), True,
     "{index}: shards[1].name: 'shard-000000.{ext}' is listed after 'shard-000001.{ext}' (shards are listed in the "
     "order of their numbers)"),
    ("rejects-grown", lambda out: (out / "rejects.jsonl").write_text(FORGED_REJECT), True,
     "{rejects}: %d bytes, the manifest says 0" % len(FORGED_REJECT)),
    ("rejects-deleted", lambda out: (out / "rejects.jsonl").unlink(), True, "{rejects}: missing"),
]


LIE_CASES = [(lie, full) for lie in LIES for full in (False, True) if lie[2] or full]


@pytest.mark.parametrize(("lie", "full"), LIE_CASES, ids=[f"{lie[0]}-{'full' if full else 'quick'}"
                                                          for lie, full in LIE_CASES])
def test_verify_checks_index_json_against_what_the_shards_hold(packed_copy: tuple[Path, dict[str, bytes]],
                                                                lie: tuple, full: bool) -> None:
    """A manifest edited to say something else of the shards (class names, counts, the store, the
    shard order) or a rejects.jsonl that is not the one published is one line naming the file."""
    out, files = packed_copy
    _, damage, _, expected = lie
    manifest = readers.load_manifest(out)
    counts = [sum(path.startswith(f"{name}/") for path in files) for name in manifest.classes]
    damage(out)
    code, output = run("verify", out, "-q", *(["--full"] if full else []))
    line = expected.format(index=out / "index.json", rejects=out / "rejects.jsonl",
                           shard0=out / manifest.shards[0].name,
                           ext=manifest.shards[0].name.split(".")[1], c0=counts[0], c0m1=counts[0] - 1,
                           c1=counts[1], c1p1=counts[1] + 1)
    assert code == 1, output
    lines = output.strip().splitlines()
    assert any(line in printed for printed in lines), output
    assert lines[-1].startswith("Error: ")  # each problem names the file that is wrong
    named = ("index.json", "rejects.jsonl", "README.md", "_info.json", "wids.json")
    assert all(printed.startswith(tuple(f"{out / name}: " for name in named)) for printed in lines[:-1]), output


def test_verify_checks_the_loader_descriptors_against_index_json(packed_as: Callable, tmp_path: Path) -> None:
    """Every class renamed in index.json (no path lies in a folder of the new names, so the paths
    cannot tell), or its shard counts moved: the published descriptors, intact, say otherwise."""
    out = tmp_path / "out"
    shutil.copytree(packed_as("wds")[0], out)
    edit_manifest(out, lambda data: data.__setitem__("classes", ["cat", "dog", "fox"]))
    code, output = run("verify", out, "-q")
    assert code == 1
    assert output.strip().splitlines() == [f"{out / 'README.md'}: names class 0 'class_00', index.json 'cat'",
                                           f"Error: {out}: 1 problem found"]

    def move_a_sample(data: dict[str, Any]) -> None:
        data["shards"][0]["num_samples"] -= 1
        data["shards"][1]["num_samples"] += 1

    edit_manifest(out, move_a_sample)
    code, output = run("verify", out, "-q")
    assert code == 1
    assert f"{out / '_info.json'}: lists other shards or sample counts than index.json" in output
    assert f"{out / 'wids.json'}: lists other shards or sample counts than index.json" in output


def test_verify_holds_index_json_classes_against_those_hdf5_shards_record(packed_as: Callable,
                                                                          tmp_path: Path) -> None:
    """Every class renamed: no path lies in a folder of the new names and flat HDF5 has no card,
    but each HDF5 shard records the class names it was packed with."""
    out = tmp_path / "out"
    shutil.copytree(packed_as("hdf5")[0], out)
    edit_manifest(out, lambda data: data.__setitem__("classes", ["cat", "dog", "fox"]))
    code, output = run("verify", out, "-q")
    assert code == 1
    assert output.strip().splitlines() == [
        f"{out / 'index.json'}: classes disagree with the shards': {out / 'shard-000000.h5'} names class 0 "
        "'class_00', index.json 'cat' (and 4 more shards)", f"Error: {out}: 1 problem found"]
