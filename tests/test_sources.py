"""Input kinds from the CLI: sidecar files, metadata and labels files, class lists, file lists.
Tests that expect samples in path order pack with --order sorted (tests/test_order.py: the shuffle)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import webdataset
from click.testing import CliRunner
from clirun import run
from imagefolders import make_caption_folder

import readers
from packer.cli import main
from packer.write.writers import WRITERS


def rejects(out: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_sidecars_round_trip(fmt: str, tmp_path: Path) -> None:
    samples = make_caption_folder(tmp_path / "src")
    code, output = run(fmt, "--order", "sorted", tmp_path / "src", tmp_path / "out", "--sidecars", "txt,json",
                       "--shard-size", "4", "-q")
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
    code, output = run("wds", "--order", "sorted", tmp_path / "src", tmp_path / "out", "--sidecars", "txt,json", "-q")
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
    code, output = run("lmdb", "--order", "sorted", tmp_path / "src", tmp_path / "strict", "--sidecars", "txt", "-q")
    assert code == 0 and "1 rejected" in output
    stem = lacking[:-4]
    assert rejects(tmp_path / "strict") == [
        {"path": lacking, "reason": f"missing sidecar {stem}.txt (--sidecars-optional packs the sample without it)"}]
    code, output = run("lmdb", "--order", "sorted", tmp_path / "src", tmp_path / "lenient", "--sidecars", "txt",
                       "--sidecars-optional", "-q")
    assert code == 0 and "0 rejected" in output
    ds = readers.open_dataset(tmp_path / "lenient", fields=("path", "txt"))
    assert ds.field_spec("txt").optional  # type: ignore[union-attr]
    assert [caption for path, caption in ds] == [None if path == lacking else samples[path][1] for path in sorted(samples)]
    code, output = run("lmdb", "--order", "sorted", tmp_path / "src", tmp_path / "fail", "--sidecars", "txt",
                       "--on-error", "fail", "-q")
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


def shards_of(out: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(out.glob("shard-*"))}


def copy_images(src: Path, dst: Path, names: dict[str, str]) -> None:
    """dst/new name <- src/old name, for {new: old}."""
    dst.mkdir(parents=True, exist_ok=True)
    for new, old in names.items():
        (dst / new).write_bytes((src / old).read_bytes())


def test_train_and_val_share_the_class_list(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, files = image_folder
    code, output = run("hdf5", "--order", "sorted", root, tmp_path / "train", "-q")
    assert code == 0, output
    # Val has no image of class_01; its labels come in a val.txt of names and indexes.
    copy_images(root, tmp_path / "val", {"v1.jpg": "class_02/img 000.jpg", "v2.jpg": "class_00/img 001.jpg"})
    (tmp_path / "val.txt").write_text("v1.jpg class_02\nv2.jpg 0\n")
    code, output = run("hdf5", "--order", "sorted", tmp_path / "val", tmp_path / "val-out", "--metadata",
                       tmp_path / "val.txt",
                       "--classes", tmp_path / "train" / "index.json", "-q")
    assert code == 0, output
    ds = readers.open_dataset(tmp_path / "val-out", decode="bytes", fields=("image", "label", "path"))
    assert ds.classes == ["class_00", "class_01", "class_02"]
    assert list(ds) == [(files["class_02/img 000.jpg"], 2, "v1.jpg"), (files["class_00/img 001.jpg"], 0, "v2.jpg")]
    # A folder packed with the class list of another: the folder names map through it.
    (tmp_path / "classes.txt").write_text("class_02\nclass_00\n")
    code, output = run("lmdb", "--order", "sorted", root, tmp_path / "mapped", "--classes", tmp_path / "classes.txt",
                       "-q")
    assert code == 0 and f"{len([p for p in files if p.startswith('class_01')])} rejected" in output
    ds = readers.open_dataset(tmp_path / "mapped", fields=("label", "path"))
    assert ds.classes == ["class_02", "class_00"]
    assert {path.split("/")[0]: label for label, path in ds} == {"class_02": 0, "class_00": 1}
    assert {reject["reason"] for reject in rejects(tmp_path / "mapped")} == {
        f"class folder 'class_01' is not in {tmp_path / 'classes.txt'}"}


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_hugging_face_metadata_jsonl(fmt: str, image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, files = image_folder
    src = tmp_path / "hf"
    copy_images(root, src / "train", {"a.jpg": "class_00/img 000.jpg", "b.jpg": "class_01/img 000.jpg",
                                      "c.png": "class_00/pic.PNG", "stray.jpg": "class_02/img 000.jpg"})
    rows = [
        {"file_name": "train/a.jpg", "label": "dog", "caption": "a dog", "bbox": [1, 2, 3, 4],
         "extra": {"k": [1, "x"]}, "score": 1, "ok": True, "split": "train"},
        {"file_name": "train/b.jpg", "label": "cat", "caption": "ünï", "bbox": [0.5, 2, 3, 4],
         "extra": None, "score": 0.25, "ok": False, "split": "train"},
        {"file_name": "./train/c.png", "label": "dog", "caption": "", "bbox": [9, 9, 9, 9],
         "extra": [1, 2], "score": 2, "ok": True, "split": "val"},
        {"file_name": "train/gone.jpg", "label": "cat", "caption": "no image", "bbox": [0, 0, 0, 0],
         "score": 1, "ok": True, "split": "x"},
    ]
    (src / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    code, output = run(fmt, "--order", "sorted", src, tmp_path / "out", "--metadata", src / "metadata.jsonl", "-q")
    assert code == 0 and "2 rejected" in output, output
    assert sorted((r["path"], r["reason"]) for r in rejects(tmp_path / "out")) == [
        ("train/gone.jpg", f"{src / 'metadata.jsonl'} line 4: no such image under SRC"),
        ("train/stray.jpg", "no row in metadata.jsonl")]
    names = ("caption", "bbox", "extra", "score", "ok", "split")
    ds = readers.open_dataset(tmp_path / "out", decode="bytes", fields=("image", "label", "path", *names))
    assert ds.classes == ["cat", "dog"]
    assert [(spec.name, spec.type, spec.optional, spec.dtype, spec.shape) for spec in ds.manifest.fields] == [
        ("caption", "str", False, None, None), ("bbox", "array", False, "float64", (4,)),
        ("extra", "json", True, None, None), ("score", "float", False, None, None),
        ("ok", "bool", False, None, None), ("split", "str", False, None, None)]
    got = [(image, label, path, caption, bbox.tolist(), extra, score, ok, split)
           for image, label, path, caption, bbox, extra, score, ok, split in ds]
    assert got == [
        (files["class_00/img 000.jpg"], 1, "train/a.jpg", "a dog", [1, 2, 3, 4], {"k": [1, "x"]}, 1.0, True, "train"),
        (files["class_01/img 000.jpg"], 0, "train/b.jpg", "ünï", [0.5, 2, 3, 4], None, 0.25, False, "train"),
        (files["class_00/pic.PNG"], 1, "train/c.png", "", [9, 9, 9, 9], [1, 2], 2.0, True, "val")]


def test_img2dataset_files_folder(tmp_path: Path) -> None:
    """Folders 00000/, 00001/ are not classes: --no-classes packs every image unlabelled."""
    samples = make_caption_folder(tmp_path / "src")
    code, output = run("wds", "--order", "sorted", tmp_path / "src", tmp_path / "out", "--sidecars", "txt,json",
                       "--no-classes", "-q")
    assert code == 0, output
    ds = readers.open_dataset(tmp_path / "out", decode="bytes", fields=("label", "path", "txt", "json"))
    assert ds.classes == []
    assert list(ds) == [(-1, path, samples[path][1], samples[path][2]) for path in sorted(samples)]


def test_csv_and_tsv_metadata_types_and_integer_labels(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, files = image_folder
    copy_images(root, tmp_path / "flat", {"x.jpg": "class_00/img 000.jpg", "y.jpg": "class_00/img 001.jpg"})
    (tmp_path / "meta.csv").write_text('path,cls,count,ratio,flag,note,code\n'
                                       'x.jpg,7,3,0.5,true,"a, quoted\nnote",007\n'
                                       'y.jpg,2,-1,1,FALSE,,x7\n')
    (tmp_path / "meta.tsv").write_text((tmp_path / "meta.csv").read_text().replace(",", "\t")
                                       .replace('"a\t quoted\nnote"', '"a, quoted\nnote"'))
    for meta in ("meta.csv", "meta.tsv"):
        out = tmp_path / f"out-{meta}"
        code, output = run("lmdb", "--order", "sorted", tmp_path / "flat", out, "--metadata", tmp_path / meta,
                           "--label-column", "cls", "-q")
        assert code == 0 and "0 rejected" in output, output
        ds = readers.open_dataset(out, fields=("label", "count", "ratio", "flag", "note", "code"))
        assert ds.classes == [str(index) for index in range(8)]  # integer labels as they are; 0..7: 8 classes
        assert [spec.type for spec in ds.manifest.fields] == ["int", "float", "bool", "str", "str"]
        assert list(ds) == [(7, 3, 0.5, True, "a, quoted\nnote", "007"), (2, -1, 1.0, False, None, "x7")]


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_files_from_is_byte_identical_to_the_walk(fmt: str, image_folder: tuple[Path, dict[str, bytes]],
                                                  tmp_path: Path) -> None:
    root, files = image_folder
    code, output = run(fmt, root, tmp_path / "walk", "--shard-size", "5", "-q")
    assert code == 0, output
    # find's order, ./ prefixes, a duplicate, and entries the walk skips: hidden, not images.
    listed = ["./" + path for path in reversed(sorted(files))] + ["class_00/img 000.jpg", "class_02/.hidden.jpg",
                                                                  "class_00/notes.txt", ""]
    data = b"\n".join(os.fsencode(path) for path in listed)
    (tmp_path / "list.txt").write_bytes(data)
    code, output = run(fmt, root, tmp_path / "list", "--files-from", tmp_path / "list.txt", "--shard-size", "5", "-q")
    assert code == 0 and "0 rejected" in output, output
    assert shards_of(tmp_path / "list") == shards_of(tmp_path / "walk")
    walked, listed_index = (json.loads((tmp_path / out / "index.json").read_text()) for out in ("walk", "list"))
    assert {**listed_index, "options": None} == {**walked, "options": None}
    (tmp_path / "list0").write_bytes(data.replace(b"\n", b"\0"))
    code, output = run(fmt, root, tmp_path / "null", "--files-from", tmp_path / "list0", "--null", "--shard-size",
                       "5", "-q")
    assert code == 0 and shards_of(tmp_path / "null") == shards_of(tmp_path / "walk")


def test_files_from_stdin_and_missing_files(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, files = image_folder
    listed = sorted(files)[:3] + ["class_00/missing.jpg", "../outside.jpg", "/etc/passwd.jpg"]
    result = CliRunner().invoke(main, ["lmdb", "--order", "sorted", str(root), str(tmp_path / "out"), "--files-from",
                                "-", "-q"],
                                input="\n".join(listed) + "\n")
    assert result.exit_code == 0 and "3 rejected" in result.output, result.output
    assert sorted((r["path"], r["reason"]) for r in rejects(tmp_path / "out")) == [
        ("../outside.jpg", "stdin line 5: leaves SRC (paths are relative to SRC)"),
        ("/etc/passwd.jpg", "stdin line 6: leaves SRC (paths are relative to SRC)"),
        ("class_00/missing.jpg", "missing (listed in stdin line 4)")]
    assert [path for (path,) in readers.open_dataset(tmp_path / "out", fields=("path",))] == sorted(files)[:3]


BAD_INPUT = {
    # name: (files to write beside x.jpg and y.jpg, pack arguments, the rejects, first the one that
    # --on-error fail reports; "{d}" stands for the test's folder)
    "csv fields": ({"m.csv": "file_name,label\nx.jpg,a\ny.jpg,b,extra\n"}, ["--metadata", "{d}/m.csv"],
                   [("{d}/m.csv", "line 3: 3 fields, the header has 2")]),
    "csv quote": ({"m.csv": 'file_name,label\nx.jpg,a\ny.jpg,"b"c\n'}, ["--metadata", "{d}/m.csv"],
                  [("{d}/m.csv", "line 3: malformed CSV line (',' expected after '\"')"),
                   ("y.jpg", "no row in m.csv")]),  # which image a line names is lost with the line
    "jsonl": ({"m.jsonl": '{"file_name": "x.jpg"}\n{"file_name": "y.jpg",\n'}, ["--metadata", "{d}/m.jsonl"],
              [("{d}/m.jsonl", "line 2: invalid JSON (Expecting property name enclosed in double quotes: "
                               "line 1 column 23 (char 22))"), ("y.jpg", "no row in m.jsonl")]),
    "leaves src": ({"m.txt": "x.jpg 0\ny.jpg 1\n../y.jpg 1\n"}, ["--metadata", "{d}/m.txt"],
                   [("../y.jpg", "{d}/m.txt line 3: leaves SRC (paths are relative to SRC)")]),
    "absolute": ({"m.txt": "x.jpg 0\ny.jpg 1\n/y.jpg 1\n"}, ["--metadata", "{d}/m.txt"],
                 [("/y.jpg", "{d}/m.txt line 3: leaves SRC (paths are relative to SRC)")]),
    "unknown class": ({"m.txt": "x.jpg a\ny.jpg c\n", "c.txt": "a\nb\n"},
                      ["--metadata", "{d}/m.txt", "--classes", "{d}/c.txt"],
                      [("y.jpg", "{d}/m.txt line 2: label 'c' is not a class of {d}/c.txt")]),
    "index range": ({"m.txt": "x.jpg 1\ny.jpg 2\n", "c.txt": "a\nb\n"},
                    ["--metadata", "{d}/m.txt", "--classes", "{d}/c.txt"],
                    [("y.jpg", "{d}/m.txt line 2: label 2 is out of range for the 2 classes of {d}/c.txt")]),
    "negative index": ({"m.txt": "x.jpg 1\ny.jpg -3\n"}, ["--metadata", "{d}/m.txt"],
                       [("y.jpg", "{d}/m.txt line 2: label -3 is not a class index")]),
    "txt not utf-8": ({"flat/x.txt": "fine", "flat/y.txt": b"caf\xe9"}, ["--sidecars", "txt"],
                      [("y.jpg", "y.txt: not UTF-8 text (byte 0xe9 at offset 3)")]),
    "invalid json": ({"flat/x.json": "{}", "flat/y.json": '{"a": }'}, ["--sidecars", "json"],
                     [("y.jpg", "y.json: invalid JSON (Expecting value: line 1 column 7 (char 6))")]),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_is_one_line_naming_file_and_line(case: str, image_folder: tuple[Path, dict[str, bytes]],
                                                    tmp_path: Path) -> None:
    root, _ = image_folder
    written, args, expected = BAD_INPUT[case]
    copy_images(root, tmp_path / "flat", {"x.jpg": "class_00/img 000.jpg", "y.jpg": "class_00/img 001.jpg"})
    for name, content in written.items():
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    args = [arg.format(d=tmp_path) for arg in args]
    expected = [(path.format(d=tmp_path), reason.format(d=tmp_path)) for path, reason in expected]
    code, output = run("lmdb", "--order", "sorted", tmp_path / "flat", tmp_path / "skip", *args, "-q")
    assert code == 0 and f"{len(expected)} rejected" in output, output
    assert sorted((r["path"], r["reason"]) for r in rejects(tmp_path / "skip")) == sorted(expected)
    packed = [path for (path,) in readers.open_dataset(tmp_path / "skip", fields=("path",))]
    assert packed == (["x.jpg", "y.jpg"] if case in ("leaves src", "absolute") else ["x.jpg"])
    code, output = run("lmdb", "--order", "sorted", tmp_path / "flat", tmp_path / "fail", *args, "--on-error",
                       "fail", "-q")
    path, reason = expected[0]
    where = path if path.startswith("/") else str(tmp_path / "flat" / path)
    assert code == 1 and output == f"Error: {where}: {reason} (--on-error fail)\n"


def test_repeated_row_and_bad_encoding_are_errors(image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, _ = image_folder
    copy_images(root, tmp_path / "flat", {"x.jpg": "class_00/img 000.jpg"})
    (tmp_path / "m.csv").write_text("file_name,label\nx.jpg,a\n./x.jpg,b\n")
    code, output = run("lmdb", tmp_path / "flat", tmp_path / "out", "--metadata", tmp_path / "m.csv", "-q")
    assert code == 1 and output == f"Error: {tmp_path / 'm.csv'}: lines 2 and 3 both describe 'x.jpg'\n"
    (tmp_path / "m.csv").write_bytes(b"file_name,label\nx.jpg,caf\xe9\n")
    code, output = run("lmdb", tmp_path / "flat", tmp_path / "out2", "--metadata", tmp_path / "m.csv", "-q")
    assert code == 1 and output == f"Error: {tmp_path / 'm.csv'}: line 2: not UTF-8 text (byte 0xe9)\n"
    (tmp_path / "m.csv").write_text("name,label\nx.jpg,a\n")
    code, output = run("lmdb", tmp_path / "flat", tmp_path / "out3", "--metadata", tmp_path / "m.csv")
    assert code == 1 and "no file_name or path column naming each image (columns: name, label)" in output


def test_column_types_are_inferred_from_every_value() -> None:
    from packer.sources.metadata import infer_spec, typed_column

    def kind(values: list) -> tuple:
        spec, _ = infer_spec("c", values)
        return spec.type, spec.optional, spec.dtype, spec.shape

    assert kind([1, 2, None]) == ("int", True, None, None)
    assert kind([1, 2.5]) == ("float", False, None, None) and infer_spec("c", [1, 2.5])[1] == [1.0, 2.5]
    assert kind([2**70, 1]) == ("json", False, None, None)  # past int64: kept exactly, as JSON
    assert kind([True, 1]) == ("json", False, None, None)
    assert kind([[[1, 2], [3, 4]], [[5, 6], [7, 8.5]]]) == ("array", False, "float64", (2, 2))
    assert kind([[1, 2], [3]]) == ("array", False, "int64", None)
    assert kind([[True], [False]]) == ("array", False, "bool", (1,))
    assert kind([[1, [2]], [3, 4]]) == ("json", False, None, None)
    assert kind([{"a": 1}, [1]]) == ("json", False, None, None)
    assert kind([None, None]) == ("json", True, None, None)
    assert typed_column(["1", None, "-2"], True) == [1, None, -2]
    assert typed_column(["1", "2.5e3", "nan"], True)[:2] == [1.0, 2500.0]
    assert typed_column(["TRUE", "false"], True) == [True, False]
    assert typed_column(["1", "x"], True) == ["1", "x"]  # one cell that is not a number: all text


def test_job_scripts_carry_the_source_options(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "m.jsonl").write_text("")
    code, output = run("slurm-script", "wds", tmp_path / "src", tmp_path / "out", "--tasks", "2",
                       "--metadata", tmp_path / "m.jsonl", "--sidecars", "txt,json", "--sidecars-optional")
    assert code == 0, output
    assert f"--metadata {tmp_path / 'm.jsonl'} --label-column label --sidecars txt,json --sidecars-optional" in output
    code, output = run("slurm-script", "wds", tmp_path / "src", tmp_path / "out", "--tasks", "2", "--files-from", "-")
    assert code == 2 and "--files-from - reads standard input, which batch jobs do not have" in output


def test_metadata_columns_keep_leading_zeros_and_name_their_problems(image_folder: tuple[Path, dict[str, bytes]],
                                                                      tmp_path: Path) -> None:
    """Numbers with leading zeros (IDs, zip codes) stay text; a repeated column or a --label-column
    the file does not have is one line naming the file."""
    root, _ = image_folder
    copy_images(root, tmp_path / "flat", {"x.jpg": "class_00/img 000.jpg", "y.jpg": "class_00/img 001.jpg"})
    (tmp_path / "zips.csv").write_text("path,zip,score\nx.jpg,02139,00.5\ny.jpg,10001,0.25\n")
    code, output = run("lmdb", "--order", "sorted", tmp_path / "flat", tmp_path / "out", "--metadata",
                       tmp_path / "zips.csv", "-q")
    assert code == 0, output
    ds = readers.open_dataset(tmp_path / "out", fields=("zip", "score"))
    assert list(ds) == [("02139", "00.5"), ("10001", "0.25")]
    (tmp_path / "twice.csv").write_text("path,zip,zip\nx.jpg,1,2\n")
    code, output = run("lmdb", "--order", "sorted", tmp_path / "flat", tmp_path / "out2", "--metadata",
                       tmp_path / "twice.csv", "-q")
    assert (code, output.strip()) == (1, f"Error: {tmp_path / 'twice.csv'}: line 1: column 'zip' appears more than once")
    code, output = run("lmdb", "--order", "sorted", tmp_path / "flat", tmp_path / "out3", "--metadata",
                       tmp_path / "zips.csv",
                       "--label-column", "cls", "-q")
    assert (code, output.strip()) == (1, f"Error: {tmp_path / 'zips.csv'}: no column 'cls' (--label-column); "
                                         "columns: zip, score")
