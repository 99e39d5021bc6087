"""Class lists: `--classes FILE` fixes the name -> index map, so train and val agree.

FILE is one class name per line (line order is index order, as timm's class map), or the
`index.json` of a packed dataset (or that dataset's folder), whose `classes` are taken. Labels
from folders and from metadata files are resolved through the same `ClassMap`.
"""

from __future__ import annotations

import json
import os
from array import array
from dataclasses import dataclass
from typing import Any

from readers.manifest import MANIFEST_NAME

from .listing import UNLABELLED, Listing, ScanError


def read_classes(path: str) -> list[str]:
    """The class names a `--classes` file (or packed dataset) gives, in index order."""
    if os.path.isdir(path):
        path = os.path.join(path, MANIFEST_NAME)
    try:
        with open(path, encoding="utf-8-sig") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ScanError(f"{path}: cannot read the class list ({getattr(exc, 'strerror', None) or exc})") from None
    if path.endswith(".json"):
        try:
            classes = json.loads(text)["classes"]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise ScanError(f"{path}: not the index.json of a packed dataset (no classes list)") from None
        if not isinstance(classes, list) or not all(isinstance(name, str) for name in classes):
            raise ScanError(f"{path}: classes must be a list of names")
        if len(set(classes)) != len(classes):  # readers refuse a dataset whose classes repeat a name
            twice = next(name for i, name in enumerate(classes) if name in classes[:i])
            raise ScanError(f"{path}: classes name {twice!r} twice")
        return list(classes)
    classes, lines = [], {}
    for line, name in enumerate(text.splitlines(), 1):
        name = name.strip()
        if not name:
            continue
        if name in lines:
            raise ScanError(f"{path}: lines {lines[name]} and {line} both name class {name!r}")
        lines[name] = line
        classes.append(name)
    return classes


@dataclass
class ClassMap:
    """Label -> index through `classes`: a fixed list (`--classes`, named by `source`), or, with no
    source, the names a metadata file uses (then integer labels are taken as they are)."""

    classes: list[str]
    source: str | None = None

    def __post_init__(self) -> None:
        self._index = {name: index for index, name in enumerate(self.classes)}

    def index(self, label: Any) -> int | str:
        """The label's index, or why it has none: a name not in the list, an index out of range."""
        if isinstance(label, str):
            found = self._index.get(label)
            return found if found is not None else f"label {label!r} is not a class of {self.source}"
        if not isinstance(label, int) or isinstance(label, bool):
            return f"label must be a class name or an integer index, not {label!r}"
        if label == UNLABELLED or (label >= 0 and (self.source is None or label < len(self.classes))):
            return label
        if self.source is None:
            return f"label {label} is not a class index"
        return f"label {label} is out of range for the {len(self.classes)} classes of {self.source}"


def relabel_folders(listing: Listing, classes: ClassMap) -> None:
    """Folder labels through a fixed class list; an image in a folder the list lacks is a reject."""
    folders = listing.classes
    keep = []
    labels = listing.labels_to_set()
    for position, (path, label) in enumerate(zip(listing.paths, labels)):
        index = classes.index(folders[label]) if label != UNLABELLED else UNLABELLED
        if isinstance(index, str):
            listing.rejects.append((path, f"class folder {folders[label]!r} is not in {classes.source}"))
        else:
            labels[position] = index
            keep.append(position)
    listing.keep(keep)
    listing.classes = classes.classes


def reindex(listing: Listing, classes: list[str]) -> None:
    """The listing's labels as indexes of `classes`, which names every class of it: the same
    classes, numbered as another list numbers them (an append's: OUT's list, then SRC's new names)."""
    index = {name: position for position, name in enumerate(classes)}
    remap = [index[name] for name in listing.classes]
    listing.labels = array("q", (remap[label] if label >= 0 else label for label in listing.labels))
    listing.classes = list(classes)
