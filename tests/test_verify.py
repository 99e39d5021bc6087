"""`pack verify`, `pack info`, and readers facing damaged shards."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from clirun import run

import readers


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
    code, text = run("info", out)
    assert code == 0
    assert f"samples      {len(files)} in 3 classes" in text and "class_01" in text


def test_info_and_verify_on_something_else_are_one_line_errors(tmp_path: Path) -> None:
    code, output = run("info", tmp_path)
    assert code == 1 and output.strip() == f"Error: {tmp_path / 'index.json'}: no manifest (packing unfinished, or not a packed dataset)"
    code, output = run("verify", tmp_path / "nope")
    assert code == 1 and output.strip() == f"Error: {tmp_path / 'nope'}: not a packed dataset directory"


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
