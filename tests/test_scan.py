from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from imagefolders import image_bytes, make_image_folder

from packer.plan.scan import UNLABELLED, ScanError, scan


def test_classes_sorted_and_paths_sorted(image_folder: tuple[Path, dict[str, bytes]]) -> None:
    root, files = image_folder
    listing = scan(root)
    assert listing.classes == ["class_00", "class_01", "class_02"]
    assert listing.paths == sorted(files)
    for path, label in zip(listing.paths, listing.labels):
        assert label == listing.classes.index(path.split("/")[0])
    assert list(listing.sizes) == [len(files[path]) for path in listing.paths]
    # notes.txt is "other"; .hidden.jpg and .git are hidden.
    assert listing.ignored_other == 1
    assert listing.ignored_hidden == 2


def test_extensions_case_insensitive_and_nested(image_folder: tuple[Path, dict[str, bytes]]) -> None:
    root, _ = image_folder
    paths = scan(root).paths
    assert "class_00/pic.PNG" in paths
    assert "class_00/sub/deeper/img 003.jpg" in paths


def test_flat_folder_is_unlabelled(tmp_path: Path) -> None:
    rng = random.Random(1)
    for name in ("b.jpg", "a.png", "c.txt"):
        (tmp_path / name).write_bytes(image_bytes(rng))
    listing = scan(tmp_path)
    assert listing.classes == []
    assert listing.paths == ["a.png", "b.jpg"]
    assert list(listing.labels) == [UNLABELLED, UNLABELLED]
    assert listing.ignored_other == 1


def test_non_utf8_name_round_trips(image_folder: tuple[Path, dict[str, bytes]]) -> None:
    root, files = image_folder
    odd = [path for path in scan(root).paths if "bad-" in path]
    assert len(odd) == 1
    assert (root / odd[0]).read_bytes() == files[odd[0]]
    assert os.fsencode(odd[0]).endswith(b"bad-\xff\xfe.jpg")


def test_symlink_loop_terminates(tmp_path: Path) -> None:
    make_image_folder(tmp_path, classes=1, per_class=2)
    (tmp_path / "class_00" / "loop").symlink_to(tmp_path / "class_00", target_is_directory=True)
    (tmp_path / "class_00" / "up").symlink_to(tmp_path, target_is_directory=True)
    listing = scan(tmp_path)
    assert listing.paths == ["class_00/img 000.jpg", "class_00/img 001.jpg"]


def test_symlinked_files_are_followed(tmp_path: Path) -> None:
    make_image_folder(tmp_path, classes=1, per_class=1)
    (tmp_path / "class_00" / "link.jpg").symlink_to(tmp_path / "class_00" / "img 000.jpg")
    (tmp_path / "class_00" / "broken.jpg").symlink_to(tmp_path / "missing.jpg")
    listing = scan(tmp_path)
    assert "class_00/link.jpg" in listing.paths
    assert [path for path, _ in listing.rejects] == ["class_00/broken.jpg"]


def test_missing_and_non_directory_sources(tmp_path: Path) -> None:
    with pytest.raises(ScanError, match="does not exist"):
        scan(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ScanError, match="not a directory"):
        scan(tmp_path / "file")


def test_special_files_are_rejects_not_a_hang(tmp_path: Path) -> None:
    """A named pipe with an image name would block the reader that opens it forever."""
    src = tmp_path / "src"
    (src / "cats").mkdir(parents=True)
    (src / "cats" / "a.jpg").write_bytes(image_bytes(random.Random(1)))
    os.mkfifo(src / "cats" / "pipe.jpg")
    listing = scan(src)
    assert listing.paths == ["cats/a.jpg"]
    assert listing.rejects == [("cats/pipe.jpg", "not a regular file")]


def tricky_tree(root: Path) -> Path:
    """Classes with nested folders, hidden and other files, a pipe, a broken link, a symlink loop,
    a folder that aliases another class, and entries beside the classes."""
    make_image_folder(root, classes=4, per_class=9)
    (root / "class_00" / "sub" / ".hidden.jpg").write_bytes(b"x")
    (root / "class_00" / "notes.txt").write_text("x")
    (root / "class_01" / "a-b").mkdir()
    (root / "class_01" / "a-b" / "z.jpg").write_bytes(image_bytes(random.Random(2)))
    (root / "class_01" / "a.jpg").write_bytes(image_bytes(random.Random(3)))
    os.mkfifo(root / "class_02" / "pipe.jpg")
    (root / "class_02" / "broken.jpg").symlink_to(root / "missing.jpg")
    (root / "class_02" / "loop").symlink_to(root / "class_02", target_is_directory=True)
    (root / "class_03" / "same-as-1").symlink_to(root / "class_01", target_is_directory=True)
    (root / "beside.jpg").write_bytes(b"x")
    (root / ".cache").mkdir()
    return root


def listing_state(listing: object) -> dict[str, object]:
    return {name: value if value is None or isinstance(value, (int, str)) else list(value)
            for name, value in vars(listing).items()}


@pytest.mark.parametrize("flat", [False, True], ids=["classes", "flat"])
def test_a_walk_with_calls_in_flight_lists_exactly_what_the_walk_in_line_lists(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, flat: bool) -> None:
    """Once stats are measured to wait on storage, directories are read ahead on threads; the
    listing, its rejects, aliases and ignored entries, and the warnings must not change."""
    from packer.sources import inflight, walk

    src = tricky_tree(tmp_path / "src")
    caplog.set_level("INFO")
    monkeypatch.setattr(inflight, "ROUND_TRIP_SECONDS", float("inf"))  # no call "waits": all in line
    in_line = walk.walk(src, folders_are_classes=not flat, times=True)
    in_line_logs = [(record.levelname, record.getMessage()) for record in caplog.records]
    caplog.clear()
    monkeypatch.setattr(inflight, "ROUND_TRIP_SECONDS", -1.0)  # every call "waits": threads from the first
    monkeypatch.setattr(inflight, "PROBE_CALLS", 2)
    monkeypatch.setattr(walk, "DIRS_AHEAD", 3)
    ahead = walk.walk(src, folders_are_classes=not flat, times=True)
    ahead_logs = [(record.levelname, record.getMessage()) for record in caplog.records]
    assert any("stats in flight" in message for _, message in ahead_logs)
    assert listing_state(ahead) == listing_state(in_line)
    assert len(in_line) > 30 and in_line.rejects and (flat or in_line.aliases)
    assert [log for log in ahead_logs if "in flight" not in log[1] and "each" not in log[1]] == in_line_logs
