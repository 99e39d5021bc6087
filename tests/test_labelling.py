"""Every way of labelling gives the same (path, class) pairs (issue #35): class names that are
prefixes of each other or look like integers, a class folder aliased inside another, and the
summary's words for what was left out."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest
from clirun import run
from imagefolders import image_bytes
from PIL import Image

import readers
from packer.errors import RejectedFile
from packer.write.validate import check_image


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


@pytest.fixture
def numbered_classes(tmp_path: Path) -> Path:
    """Train class folders '0'..'11' (sorted as strings: '0', '1', '10', '11', '2', ...), packed."""
    rng = random.Random(3)
    write_tree(tmp_path / "train", {f"{number}/t{number}.jpg": image_bytes(rng) for number in range(12)})
    write_tree(tmp_path / "val", {f"v{number}.JPEG": image_bytes(rng) for number in range(12)})
    code, output = run("lmdb", tmp_path / "train", tmp_path / "train.lmdb", "-q")
    assert code == 0, output
    assert readers.open_dataset(tmp_path / "train.lmdb").manifest.classes == sorted(str(n) for n in range(12))
    return tmp_path


@pytest.mark.parametrize("kind", ["txt", "csv", "jsonl"])
def test_integer_looking_class_names_in_a_label_file_are_names(kind: str, numbered_classes: Path) -> None:
    base = numbered_classes
    rows = [(f"v{number}.JPEG", number) for number in range(12)]
    labels = base / f"val.{kind}"
    if kind == "txt":
        labels.write_text("".join(f"{name} {label}\n" for name, label in rows))
    elif kind == "csv":
        labels.write_text("file_name,label\n" + "".join(f"{name},{label}\n" for name, label in rows))
    else:
        labels.write_text("".join(json.dumps({"file_name": name, "label": label}) + "\n" for name, label in rows))
    expected = {(name, str(label)) for name, label in rows}
    code, output = run("lmdb", base / "val", base / "val.lmdb", "--metadata", labels, "--classes",
                       base / "train.lmdb" / "index.json", "-q")
    assert code == 0 and "0 rejected" in output, output
    assert pairs(base / "val.lmdb") == expected
    code, output = run("lmdb", base / "val", base / "train.lmdb", "--append", "--metadata", labels, "--classes",
                       base / "train.lmdb", "-q")
    assert code == 0, output
    appended = pairs(base / "train.lmdb")
    assert {pair for pair in appended if pair[0].startswith("v")} == expected


def test_a_label_file_mixing_class_names_and_indexes_is_refused(numbered_classes: Path) -> None:
    base = numbered_classes
    (base / "val.txt").write_text("v4.JPEG 4\nv5.JPEG 12\n")  # '4' is a class name, 12 is not: indexes or names?
    code, output = run("lmdb", base / "val", base / "val.lmdb", "--metadata", base / "val.txt", "--classes",
                       base / "train.lmdb", "-q")
    assert code == 1 and not (base / "val.lmdb" / "index.json").exists()
    assert output.strip().splitlines()[-1] == (
        f"Error: {base / 'val.txt'}: labels are class names (4, line 1) and integers that are not (12, line 2); "
        "a label file holds class names or class indexes, not both")


def test_a_label_file_of_names_and_integers_without_a_class_list_is_refused(numbered_classes: Path) -> None:
    base = numbered_classes
    (base / "val.txt").write_text("v0.JPEG cat\nv1.JPEG 3\n")  # was: cat 0, and 3 an index beyond the 1 class
    write_tree(base / "two", {"v0.JPEG": (base / "val" / "v0.JPEG").read_bytes(),
                              "v1.JPEG": (base / "val" / "v1.JPEG").read_bytes()})
    code, output = run("lmdb", base / "two", base / "two.lmdb", "--metadata", base / "val.txt", "-q")
    assert code == 1, output
    assert output.strip().splitlines()[-1] == (
        f"Error: {base / 'val.txt'}: labels are class names (cat, line 1) and integers that are not (3, line 2); "
        "a label file holds class names or class indexes, not both (--classes FILE says which integers are class "
        "names)")


def test_integer_labels_that_are_no_class_names_are_indexes(numbered_classes: Path) -> None:
    base = numbered_classes
    (base / "classes.txt").write_text("cat\ndog\n")
    (base / "val.txt").write_text("v0.JPEG 1\nv1.JPEG 0\n")
    write_tree(base / "two", {"v0.JPEG": (base / "val" / "v0.JPEG").read_bytes(),
                              "v1.JPEG": (base / "val" / "v1.JPEG").read_bytes()})
    code, output = run("lmdb", base / "two", base / "two.lmdb", "--metadata", base / "val.txt", "--classes",
                       base / "classes.txt", "-q")
    assert code == 0, output
    assert pairs(base / "two.lmdb") == {("v0.JPEG", "dog"), ("v1.JPEG", "cat")}


@pytest.mark.parametrize("link", ["cat/see_also", "dog/see_also"])
def test_a_class_folder_aliased_inside_another_class_keeps_its_own_label(link: str, tmp_path: Path) -> None:
    rng = random.Random(5)
    write_tree(tmp_path / "al", {f"{name}/{k}.jpg": image_bytes(rng) for name in ("cat", "dog") for k in range(2)})
    target = "dog" if link.startswith("cat") else "cat"
    (tmp_path / "al" / link).symlink_to(Path("..") / target)
    listed = [f"{name}/{k}.jpg" for name in ("cat", "dog", link) for k in range(2)]  # as `find -L` lists them
    (tmp_path / "list.txt").write_text("\n".join(listed) + "\n")
    for way in ([], ["--files-from", tmp_path / "list.txt"]):
        code, output = run("lmdb", tmp_path / "al", tmp_path / "out", "--overwrite", *way)
        assert code == 0, output
        assert pairs(tmp_path / "out") == {(f"{name}/{k}.jpg", name) for name in ("cat", "dog") for k in range(2)}
        assert f"{link} -> {target}: alias of class folder {target}, packed once under {target}" in output


def test_a_jpeg_with_bytes_after_its_end_marker_is_packed_unchanged(tmp_path: Path) -> None:
    rng = random.Random(6)
    photo = image_bytes(rng) + b"\x00\x00ftypmp42" + bytes(range(256)) * 8  # a motion photo's video after EOI
    truncated = image_bytes(rng)[:-40]
    Image.open(io.BytesIO(photo)).load()  # Pillow decodes it
    for validate in ("quick", "full"):
        assert check_image(photo, validate=validate) == "jpeg"
    whole = image_bytes(rng)
    thumbnail = b"Exif\x00\x00" + image_bytes(rng, size=(8, 8))  # its own end marker, inside an APP1 segment
    with_thumbnail = whole[:2] + b"\xff\xe1" + (len(thumbnail) + 2).to_bytes(2, "big") + thumbnail + whole[2:]
    assert check_image(with_thumbnail) == "jpeg"
    with pytest.raises(RejectedFile, match="truncated JPEG"):
        check_image(with_thumbnail[:-40])
    write_tree(tmp_path / "src", {"a/photo.jpg": photo, "a/truncated.jpg": truncated})
    code, output = run("lmdb", tmp_path / "src", tmp_path / "out", "--validate", "full", "-q")
    assert code == 0 and "1 rejected" in output, output
    ds = readers.open_dataset(tmp_path / "out", decode="bytes", fields=("path", "image"))
    assert list(ds) == [("a/photo.jpg", photo)]
    rejected = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [reject["path"] for reject in rejected] == ["a/truncated.jpg"]


def test_the_summary_names_an_image_outside_the_class_folders(tmp_path: Path) -> None:
    rng = random.Random(7)
    write_tree(tmp_path / "src", {"a/1.jpg": image_bytes(rng), "stray.jpg": image_bytes(rng), "notes.txt": b"x"})
    for files_from in ([], ["--files-from", tmp_path / "list.txt"]):
        (tmp_path / "list.txt").write_text("a/1.jpg\nstray.jpg\nnotes.txt\n")
        code, output = run("lmdb", tmp_path / "src", tmp_path / "out", "--overwrite", *files_from)
        assert code == 0, output
        summary = output.strip().splitlines()[-1]
        assert summary.endswith("1 image outside any class folder skipped (stray.jpg), "
                                "1 non-image entry ignored (notes.txt)"), summary


NAME_STEMS = ("sea", "n01", "ünï", "名前", "a.b", "x")
BEFORE_SLASH_TAILS = (" lion", "-a", ".b", "(2)")  # each sorts before "/": "sea lion/..." < "sea/..."
NAME_TAILS = BEFORE_SLASH_TAILS + ("0", "_x", "é")


def random_tree(rng: random.Random) -> dict[str, str]:
    """{relative path: class name}: 4 to 6 classes, one name a prefix of another, one looking like
    an integer (never 0..5, which stay indexes of the class list), the others from stems and tails
    with spaces, dashes, dots, digits and unicode; one to three images each, some in subfolders."""
    stems = rng.sample(NAME_STEMS, 3)
    names = {stems[0], stems[0] + rng.choice(BEFORE_SLASH_TAILS), rng.choice(["7", "10", "42"])}
    wanted = rng.randint(4, 6)
    while len(names) < wanted:
        names.add(rng.choice(stems) + rng.choice(NAME_TAILS))
    tree = {}
    for name in sorted(names):
        for number in range(rng.randint(1, 3)):
            folder = rng.choice(["", "", "sub/", "sub dir/"])
            stem = rng.choice(["img", "a b", "x-1", "ü"])
            tree[f"{name}/{folder}{stem} {number}.{rng.choice(['jpg', 'png'])}"] = name
    return tree


def label_files(base: Path, tree: dict[str, str], classes: list[str]) -> dict[str, Path]:
    """The tree's labels in every metadata format; txt of indexes when a class name holds a space
    (a `name label` line's label is its last word)."""
    rows = sorted(tree.items())
    files = {"csv": base / "labels.csv", "jsonl": base / "labels.jsonl", "txt": base / "labels.txt"}
    files["csv"].write_text("file_name,label\n" + "".join(f'"{path}","{name}"\n' for path, name in rows))
    files["jsonl"].write_text("".join(json.dumps({"file_name": path, "label": name}) + "\n" for path, name in rows))
    spaced = any(" " in name for name in classes)
    files["txt"].write_text("".join(f"{path} {classes.index(name) if spaced else name}\n" for path, name in rows))
    return files


@pytest.mark.parametrize("seed", range(3))
def test_every_way_of_labelling_gives_the_same_pairs(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    tree = random_tree(rng)
    images = {path: image_bytes(rng, "PNG" if path.endswith("png") else "JPEG", size=(8, 8)) for path in tree}
    write_tree(tmp_path / "src", images)
    expected = set(tree.items())
    packs: dict[str, list[object]] = {"walk": []}

    def pack(name: str, *args: object, src: Path = tmp_path / "src") -> None:
        code, output = run("lmdb", src, tmp_path / name, "--shard-size", "3", "--workers", "1", "-q", *args)
        assert code == 0 and "0 rejected" in output, (name, output)
        packs[name] = list(args)

    pack("walk")
    walked = tmp_path / "walk"
    classes = readers.open_dataset(walked).manifest.classes
    assert classes == sorted(set(tree.values()))
    listed = [f"./{path}" for path in tree]
    rng.shuffle(listed)
    (tmp_path / "list.txt").write_text("\n".join(listed) + "\n")
    pack("files-from", "--files-from", tmp_path / "list.txt")
    pack("files-from-classes", "--files-from", tmp_path / "list.txt", "--classes", walked)
    pack("walk-classes", "--classes", walked / "index.json")
    for kind, labels in label_files(tmp_path, tree, classes).items():
        pack(f"{kind}-classes", "--metadata", labels, "--classes", walked)
    pack("jsonl", "--metadata", tmp_path / "labels.jsonl")  # string labels: the class names, sorted
    halves = {path: ("first", "second")[number % 2] for number, path in enumerate(sorted(tree))}
    for half in ("first", "second"):  # two SRCs, each holding part of most classes, the second appended
        write_tree(tmp_path / half, {path: data for path, data in images.items() if halves[path] == half})
    for name, args in {"append": [], "append-classes": ["--classes", walked]}.items():
        pack(name, *args, src=tmp_path / "first")
        pack(name, "--append", *args, src=tmp_path / "second")
    for name in packs:
        assert pairs(tmp_path / name) == expected, (name, tree)
