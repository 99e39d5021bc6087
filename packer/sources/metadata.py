"""A metadata file (`--metadata FILE`): one row per image, with its label and any other columns.

By extension: `.csv`, `.tsv` (a header row, then rows), `.jsonl` (one JSON object per line), or
`.txt`, the classic `val.txt` of `name label` lines. The image is named by the `file_name` column
(Hugging Face ImageFolder's) or `path`, relative to SRC; the label column (`label` by default)
holds a class name or an integer index; every other column becomes a field, typed from all its
values (`infer_spec`). Line problems (a malformed line, a path that leaves SRC) become rejects
naming the file and line; a row given twice is an error naming both lines.
"""

from __future__ import annotations

import csv
import json
import os
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from readers.fields import FieldSpec, check_field_name

from .classes import ClassMap
from .listing import Listing, ScanError

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".txt": "names"}
PATH_COLUMNS = ("file_name", "path")
DEFAULT_LABEL_COLUMN = "label"
INT64 = (-(2**63), 2**63 - 1)
# No leading zeros: "007" or "02139" (IDs, zip codes) stay text instead of losing digits.
_INTEGER = re.compile(r"[+-]?(0|[1-9]\d*)")
_FLOAT = re.compile(r"[+-]?((0|[1-9]\d*)(\.\d*)?|\.\d+)([eE][+-]?\d+)?|[+-]?(nan|inf|infinity)", re.IGNORECASE)


@dataclass
class Row:
    line: int
    label: str | int | None  # a class name, an index, or None when the file has no label column
    values: dict[str, Any]


@dataclass
class Metadata:
    """The rows of a metadata file by normalised path, its field columns, and its line rejects."""

    path: str
    rows: dict[str, Row] = field(default_factory=dict)
    columns: list[str] = field(default_factory=list)
    has_labels: bool = False
    text_cells: bool = False  # CSV/TSV: every value is text until its column's type is inferred
    rejects: list[tuple[str, str]] = field(default_factory=list)
    malformed: set[str] = field(default_factory=set)  # images whose row was rejected: no second reject
    # `name label` lines of 3+ words: the line read as `first-word label words` (first word, label),
    # by the path its last-word reading gave; `apply_metadata` takes it when that first word is listed
    first_word_readings: dict[str, tuple[str, str]] = field(default_factory=dict)

    def reject(self, line: int, problem: str) -> None:
        self.rejects.append((self.path, f"line {line}: {problem}"))


def read_metadata(path: str, label_column: str) -> Metadata:
    """Parse a metadata file; ScanError for a file that cannot be used at all."""
    kind = FORMATS.get(os.path.splitext(path)[1].lower())
    if kind is None:
        raise ScanError(f"{path}: unknown metadata format; use .csv, .tsv, .jsonl or a .txt of 'name label' lines")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ScanError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ScanError(f"{path}: line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x})") from None
    metadata = Metadata(path=os.path.abspath(path))
    rows = {"csv": _table_rows, "tsv": _table_rows, "jsonl": _jsonl_rows, "names": _name_rows}[kind]
    for line, name, record in rows(text, kind, metadata, label_column):
        _add_row(metadata, line, name, record, label_column)
    metadata.has_labels = label_column in metadata.columns
    if label_column != DEFAULT_LABEL_COLUMN and not metadata.has_labels:
        raise ScanError(f"{path}: no column {label_column!r} (--label-column); columns: {', '.join(metadata.columns)}")
    return metadata


Rows = Iterator[tuple[int, Any, dict[str, Any]]]  # (line, image name, the row's other columns)


def _table_rows(text: str, kind: str, metadata: Metadata, label_column: str) -> Rows:
    reader = csv.reader(text.splitlines(keepends=True), delimiter="\t" if kind == "tsv" else ",", strict=True)
    try:
        header = next(reader)
    except StopIteration:
        raise ScanError(f"{metadata.path}: empty") from None
    except csv.Error as exc:
        raise ScanError(f"{metadata.path}: line 1: malformed header ({exc})") from None
    metadata.text_cells = True
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise ScanError(f"{metadata.path}: line 1: column {repeated[0]!r} appears more than once")
    path_column = _path_column(metadata, header)
    metadata.columns = [name for name in header if name != path_column]
    while True:
        line = reader.line_num + 1
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            metadata.reject(line, f"malformed {kind.upper()} line ({exc})")
            continue
        if not cells:
            continue
        if len(cells) != len(header):
            metadata.reject(line, f"{len(cells)} fields, the header has {len(header)}")
            if header.index(path_column) < len(cells):
                metadata.malformed.add(posixpath.normpath(cells[header.index(path_column)]))
            continue
        record = {name: cell if cell != "" else None for name, cell in zip(header, cells)}
        yield line, record.pop(path_column), record


def _jsonl_rows(text: str, kind: str, metadata: Metadata, label_column: str) -> Rows:
    columns: dict[str, None] = {}  # every key of every row, in order of first appearance
    for line, content in enumerate(text.splitlines(), 1):
        if not content.strip():
            continue
        try:
            record = json.loads(content)
        except ValueError as exc:
            metadata.reject(line, f"invalid JSON ({exc})")
            continue
        if not isinstance(record, dict):
            metadata.reject(line, f"not a JSON object but {type(record).__name__}")
            continue
        column = next((column for column in PATH_COLUMNS if column in record), None)
        if column is None:
            metadata.reject(line, f"no {' or '.join(PATH_COLUMNS)} naming the image")
            continue
        name = record.pop(column)
        columns.update(dict.fromkeys(record))
        metadata.columns = list(columns)
        yield line, name, record


def _name_rows(text: str, kind: str, metadata: Metadata, label_column: str) -> Rows:
    """`name label` lines (ImageNet's val.txt). With more words, either the name or the label holds
    spaces (`my photo.jpg 3`, `x.JPEG sea turtle`): the label is the last word, unless the first word
    names a listed image (`first_word_readings`)."""
    metadata.columns = [label_column]
    metadata.text_cells = True  # a label is text until apply_metadata knows whether it names a class
    for line, content in enumerate(text.splitlines(), 1):
        if not content.strip():
            continue
        parts = content.rsplit(None, 1)
        if len(parts) != 2:
            metadata.reject(line, "expected 'name label'")
            continue
        name, label = parts
        first, rest = content.split(None, 1)
        if first != name.strip():
            metadata.first_word_readings[posixpath.normpath(name.strip())] = (posixpath.normpath(first), rest.strip())
        yield line, name.strip(), {label_column: label}


def _prefer_first_word_readings(metadata: Metadata, listed: set[str]) -> None:
    """Re-read a `name label` line as `first-word label words` where its last-word name is not a
    listed image and its first word is: `x.JPEG sea turtle` is x.JPEG of class 'sea turtle'."""
    for path, (first, label) in metadata.first_word_readings.items():
        row = metadata.rows.get(path)
        if row is not None and path not in listed and first in listed and first not in metadata.rows:
            del metadata.rows[path]
            metadata.rows[first] = Row(line=row.line, label=label, values=row.values)


def _path_column(metadata: Metadata, header: list[str]) -> str:
    for column in PATH_COLUMNS:
        if column in header:
            return column
    raise ScanError(f"{metadata.path}: no {' or '.join(PATH_COLUMNS)} column naming each image "
                    f"(columns: {', '.join(header)})")


def _add_row(metadata: Metadata, line: int, name: Any, record: dict[str, Any], label_column: str) -> None:
    if not isinstance(name, str) or not name:
        metadata.reject(line, f"the image name must be a non-empty string, not {name!r}")
        return
    path = posixpath.normpath(name)
    if name.startswith("/") or path == ".." or path.startswith("../"):
        metadata.rejects.append((name, f"{metadata.path} line {line}: leaves SRC (paths are relative to SRC)"))
        return
    label = record.pop(label_column, None)
    earlier = metadata.rows.get(path)
    if earlier is not None:
        raise ScanError(f"{metadata.path}: lines {earlier.line} and {line} both describe {path!r}")
    metadata.rows[path] = Row(line=line, label=label, values=record)


def field_columns(metadata: Metadata, label_column: str) -> list[str]:
    """The columns that become fields, checked as field names."""
    columns = [name for name in metadata.columns if name != label_column]
    for name in columns:
        problem = check_field_name(name)
        if problem:
            raise ScanError(f"{metadata.path}: column {name!r} cannot be a field: {problem}")
    return columns


def typed_column(values: list[Any], text_cells: bool) -> list[Any]:
    """A CSV/TSV column's cells as numbers or booleans when every one of them reads as such."""
    if not text_cells:
        return values
    present = [value for value in values if value is not None]
    if not present:
        return values
    if all(_INTEGER.fullmatch(value) for value in present):
        return [None if value is None else int(value) for value in values]
    if all(_FLOAT.fullmatch(value) for value in present):
        return [None if value is None else float(value) for value in values]
    if all(value.lower() in ("true", "false") for value in present):
        return [None if value is None else value.lower() == "true" for value in values]
    return values


def infer_spec(name: str, values: list[Any]) -> tuple[FieldSpec, list[Any]]:
    """A column's type from all its values (None: absent), and the values in that type (ints of a
    float column as floats, so every format gives back the same)."""
    present = [value for value in values if value is not None]
    optional = len(present) < len(values)
    if not present:
        return FieldSpec(name, "json", optional=True), values
    if all(isinstance(value, bool) for value in present):
        return FieldSpec(name, "bool", optional), values
    if all(_is_int(value) for value in present):
        return FieldSpec(name, "int", optional), values
    if all(_is_number(value) for value in present):
        return FieldSpec(name, "float", optional), [None if value is None else float(value) for value in values]
    if all(isinstance(value, str) for value in present):
        return FieldSpec(name, "str", optional), values
    if all(isinstance(value, list) for value in present):
        arrays = [_array_kind(value) for value in present]
        found = [kind for kind in arrays if kind is not None]
        elements = frozenset().union(*(kinds for _, kinds in found))
        if len(found) == len(arrays) and not ("bool" in elements and len(elements) > 1):
            dtype = "bool" if elements == {"bool"} else "float64" if "float" in elements or not elements else "int64"
            shapes = {shape for shape, _ in found}
            return FieldSpec(name, "array", optional, dtype, shapes.pop() if len(shapes) == 1 else None), values
    return FieldSpec(name, "json", optional), values


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and INT64[0] <= value <= INT64[1]


def _is_number(value: Any) -> bool:
    return isinstance(value, float) or _is_int(value)


def _array_kind(value: Any) -> tuple[tuple[int, ...], frozenset[str]] | None:
    """(shape, element kinds) of nested lists of numbers of a regular shape; None otherwise."""
    if isinstance(value, bool):
        return (), frozenset({"bool"})
    if _is_int(value):
        return (), frozenset({"int"})
    if isinstance(value, float):
        return (), frozenset({"float"})
    if not isinstance(value, list):
        return None
    inner = [_array_kind(item) for item in value]
    found = [kind for kind in inner if kind is not None]
    shapes = {shape for shape, _ in found}
    if len(found) < len(inner) or len(shapes) > 1:
        return None
    return (len(value), *(shapes.pop() if shapes else ())), frozenset().union(*(kinds for _, kinds in found))


def label_values(metadata: Metadata, rows: list[Row], classes: ClassMap | None) -> tuple[list[Any], ClassMap]:
    """The rows' labels as class names or as indexes, and the class map they index.

    A label that is a class name (of `classes`, else of the file's non-integer labels) is that
    class, even when it looks like an integer ('4' of classes '0'..'11'); an integer that is no
    class name is an index. A file with both could mean either, so it is refused.
    """
    raw = [row.label for row in rows]
    labels = typed_column(raw, metadata.text_cells)
    numbers = [label if _is_int(label) else int(text) if metadata.text_cells and isinstance(text, str)
               and _INTEGER.fullmatch(text) else None for text, label in zip(raw, labels)]
    texts = [str(text) if number is not None else None for text, number in zip(raw, numbers)]
    if classes is None:
        names = {label for label, number in zip(labels, numbers) if number is None and isinstance(label, str)}
    else:
        names = set(classes.classes)
    named = next(((text, row.line) for text, row in zip(texts, rows) if text is not None and text in names), None)
    unnamed = next(((text, row.line) for text, row in zip(texts, rows) if text is not None and text not in names),
                   None)
    if unnamed is not None and named is None and classes is None and names:  # the file's names beside integers
        named = next((label, row.line) for label, row in zip(labels, rows) if isinstance(label, str) and label in names)
    if unnamed is not None and named is not None:
        hint = "" if classes is not None else " (--classes FILE says which integers are class names)"
        raise ScanError(f"{metadata.path}: labels are class names ({named[0]}, line {named[1]}) and integers that "
                        f"are not ({unnamed[0]}, line {unnamed[1]}); a label file holds class names or class indexes, "
                        f"not both{hint}")
    if named is not None:
        labels = [text if text is not None else label for text, label in zip(texts, labels)]
    else:
        labels = [number if number is not None else label for number, label in zip(numbers, labels)]
    return labels, classes if classes is not None else ClassMap(sorted(names))


def apply_metadata(listing: Listing, metadata: Metadata, label_column: str, classes: ClassMap | None) -> None:
    """Join the listed images with their rows: labels and field values from the file.

    An image with no row, and a row whose image is not listed, are rejects; so is a label that
    `classes` cannot index. Without `classes`, the classes are the sorted names the file uses.
    """
    name = os.path.basename(metadata.path)
    if metadata.first_word_readings:
        _prefer_first_word_readings(metadata, set(listing.paths))
    listing.rejects += metadata.rejects  # first: the line to fix, when --on-error fail names one
    rows: list[Row] = []
    keep: list[int] = []
    for position, path in enumerate(listing.paths):
        row = metadata.rows.pop(path, None)
        if row is not None:
            rows.append(row)
            keep.append(position)
        elif path not in metadata.malformed:
            listing.rejects.append((path, f"no row in {name}"))
    listing.rejects += [(path, f"{metadata.path} line {row.line}: no such image under SRC")
                        for path, row in metadata.rows.items()]
    listing.keep(keep)
    if metadata.has_labels:
        labels, classes = label_values(metadata, rows, classes)
        keep = []
        indexes = listing.labels_to_set()
        for position, (path, row, label) in enumerate(zip(listing.paths, rows, labels)):
            index = f"no {label_column}" if label is None else classes.index(label)
            if isinstance(index, str):
                listing.rejects.append((path, f"{metadata.path} line {row.line}: {index}"))
            else:
                indexes[position] = index
                keep.append(position)
        rows = [rows[position] for position in keep]
        listing.keep(keep)
    listing.classes = classes.classes if classes is not None else []
    columns = field_columns(metadata, label_column)
    listing.values = [{} for _ in rows]
    for column in columns:
        spec, values = infer_spec(column, typed_column([row.values.get(column) for row in rows], metadata.text_cells))
        listing.fields.append(spec)
        for record, value in zip(listing.values, values):
            if value is not None:
                record[column] = value
