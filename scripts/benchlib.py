"""What the benchmark scripts share: generated source folders, page-cache dropping, child processes.

The scripts run as `python scripts/NAME.py`, which puts this folder on sys.path: `import benchlib`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterable

from torch.utils.data import Dataset

SOURCE_MARKER = ".bench-source.json"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def make_source(root: Path, count: int, images: Iterable[bytes], *, classes: int, recipe: dict[str, Any]) -> Path:
    """`count` of `images` as ImageNet-style n########/img_########.JPEG in `classes` folders.

    A marker holding the count, classes and `recipe` lets a later run reuse the folder instead of
    generating it again; `images` is only iterated when the folder is (re)made.
    """
    marker = root / SOURCE_MARKER
    wanted = {"count": count, "classes": classes, **recipe}
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return root
    shutil.rmtree(root, ignore_errors=True)
    for index, data in zip(range(count), images):
        folder = root / f"n{index % classes:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img_{index:08d}.JPEG").write_bytes(data)
    marker.write_text(json.dumps(wanted))
    return root


def drop_page_cache() -> bool:
    """Empty the whole page cache; False where this machine does not let us (not root on Linux)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def drop_cache(files: Iterable[Path]) -> str:
    """Empty the page cache, or at least these files' pages; returns how, or why it could not."""
    if drop_page_cache():
        return "dropped with /proc/sys/vm/drop_caches"
    try:
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "dropped per file with posix_fadvise(DONTNEED) (not root)"
    except (OSError, AttributeError) as exc:
        return f"NOT dropped ({exc}): cold numbers are warm numbers"


def children(pid: int) -> list[int]:
    """The child processes of every thread of `pid`; none once it has ended."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return []
    pids = []
    for task in tasks:
        try:
            pids += [int(child) for child in (task / "children").read_text().split()]
        except FileNotFoundError:  # a thread (a DataLoader's, say) that ended since the listing
            continue
    return pids


class LooseFiles(Dataset):
    """The baseline a user writes, as torchvision's ImageFolder does it: list the class folders
    (names and types from the listing, no stat per file), then open + read one file per sample."""

    def __init__(self, root: Path) -> None:
        classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
        self.samples = [(os.path.join(folder, name), label) for label, cls in enumerate(classes)
                        for folder, _, names in sorted(os.walk(root / cls))
                        for name in sorted(names) if name.lower().endswith(IMAGE_EXTENSIONS)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        path, label = self.samples[index]
        with open(path, "rb") as handle:
            return handle.read(), label
