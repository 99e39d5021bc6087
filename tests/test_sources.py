"""Input kinds from the CLI: sidecar files, metadata and labels files, class lists, file lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import webdataset
from clirun import run
from imagefolders import make_caption_folder

import readers
from packer.writers import WRITERS


def rejects(out: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_sidecars_round_trip(fmt: str, tmp_path: Path) -> None:
    samples = make_caption_folder(tmp_path / "src")
    code, output = run(fmt, tmp_path / "src", tmp_path / "out", "--sidecars", "txt,json", "--shard-size", "4", "-q")
    assert code == 0, output
    assert "0 rejected" in output and ", 0 non-image entries ignored" in output  # sidecars are not "ignored"
    ds = readers.open_dataset(tmp_path / "out", decode="bytes", fields=("image", "path", "txt", "json", "label"))
    assert [spec.to_dict() for spec in ds.manifest.fields] == [
        {"name": "txt", "type": "str", "optional": False, "dtype": None, "shape": None},
        {"name": "json", "type": "json", "optional": False, "dtype": None, "shape": None}]
    assert [path for _, path, *_ in ds] == sorted(samples)
    for data, path, caption, meta, label in ds:
        assert (data, caption, meta) == samples[path]
        assert label == ["00000", "00001"].index(path[:5])  # without --no-classes, folders are classes
    code, output = run("info", tmp_path / "out")
    assert "fields       txt (str), json (json)" in output


def test_sidecars_as_webdataset_sees_them(tmp_path: Path) -> None:
    samples = make_caption_folder(tmp_path / "src", folders=1)
    code, output = run("wds", tmp_path / "src", tmp_path / "out", "--sidecars", "txt,json", "-q")
    assert code == 0, output
    seen = list(webdataset.WebDataset(str(tmp_path / "out" / "shard-000000.tar"), shardshuffle=False).decode())
    assert [(s["txt"], s["json"]) for s in seen] == [samples[path][1:] for path in sorted(samples)]
    raw = next(iter(webdataset.WebDataset(str(tmp_path / "out" / "shard-000000.tar"), shardshuffle=False)))
    first = sorted(samples)[0]
    assert raw["json"] == (tmp_path / "src" / first).with_suffix(".json").read_bytes()  # stored as written


def test_missing_sidecar_is_a_reject_unless_optional(tmp_path: Path) -> None:
    samples = make_caption_folder(tmp_path / "src", folders=1)
    lacking = sorted(samples)[1]
    (tmp_path / "src" / lacking).with_suffix(".txt").unlink()
    code, output = run("lmdb", tmp_path / "src", tmp_path / "strict", "--sidecars", "txt", "-q")
    assert code == 0 and "1 rejected" in output
    stem = lacking[:-4]
    assert rejects(tmp_path / "strict") == [
        {"path": lacking, "reason": f"missing sidecar {stem}.txt (--sidecars-optional packs the sample without it)"}]
    code, output = run("lmdb", tmp_path / "src", tmp_path / "lenient", "--sidecars", "txt", "--sidecars-optional", "-q")
    assert code == 0 and "0 rejected" in output
    ds = readers.open_dataset(tmp_path / "lenient", fields=("path", "txt"))
    assert ds.field_spec("txt").optional  # type: ignore[union-attr]
    assert [caption for path, caption in ds] == [None if path == lacking else samples[path][1] for path in sorted(samples)]
    code, output = run("lmdb", tmp_path / "src", tmp_path / "fail", "--sidecars", "txt", "--on-error", "fail", "-q")
    assert code == 1 and f"{lacking}: missing sidecar {stem}.txt" in output


@pytest.mark.parametrize("args, message", [
    (["--sidecars", "png"], "--sidecars png: an image extension"),
    (["--sidecars", "txt,txt"], "--sidecars names an extension twice: txt,txt"),
    (["--sidecars", "cls"], "--sidecars cls: reserved"),
    (["--sidecars", "a.b"], "--sidecars a.b: a field name is 1-64 letters"),
    (["--sidecars-optional"], "--sidecars-optional needs --sidecars"),
])
def test_bad_sidecar_options_are_usage_errors(args: list[str], message: str, tmp_path: Path) -> None:
    make_caption_folder(tmp_path / "src", folders=1, per_folder=1)
    code, output = run("lmdb", tmp_path / "src", tmp_path / "out", *args)
    assert code == 2 and message in output
