"""Every way of labelling gives the same (path, class) pairs (issue #35): class names that are
prefixes of each other or look like integers, a class folder aliased inside another, and the
summary's words for what was left out."""

from __future__ import annotations

import random
from pathlib import Path

from clirun import run
from imagefolders import image_bytes

import readers


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def pairs(out: Path) -> set[tuple[str, str | int]]:
    """(path, class name) of every packed sample; the bare label where the dataset has no class names."""
    ds = readers.open_dataset(out, fields=("path", "label"))
    classes = ds.manifest.classes
    return {(path, classes[label] if classes and label >= 0 else label) for path, label in ds}


def test_files_from_labels_a_class_whose_name_is_a_prefix_of_another(tmp_path: Path) -> None:
    rng = random.Random(2)
    write_tree(tmp_path / "src", {f"{name}/1.jpg": image_bytes(rng) for name in ("sea", "sea lion", "zebra", "n01",
                                                                                 "n01-a")})
    (tmp_path / "list.txt").write_text("".join(f"./{name}/1.jpg\n" for name in ("sea", "sea lion", "zebra", "n01",
                                                                                  "n01-a")))
    expected = {(f"{name}/1.jpg", name) for name in ("sea", "sea lion", "zebra", "n01", "n01-a")}
    code, output = run("lmdb", tmp_path / "src", tmp_path / "walked", "-q")
    assert code == 0, output
    assert pairs(tmp_path / "walked") == expected
    code, output = run("lmdb", tmp_path / "src", tmp_path / "listed", "--files-from", tmp_path / "list.txt", "-q")
    assert code == 0, output
    assert pairs(tmp_path / "listed") == expected
    code, output = run("lmdb", tmp_path / "src", tmp_path / "fixed", "--files-from", tmp_path / "list.txt",
                       "--classes", tmp_path / "walked", "-q")
    assert code == 0 and "0 rejected" in output, output
    assert pairs(tmp_path / "fixed") == expected
