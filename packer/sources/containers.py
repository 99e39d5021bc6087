"""Container inputs meet the plan: list a container SRC through its kind's module, and give a
shard's reader threads that kind's record reader (`packer.sources.inputs` describes the kinds)."""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from ..errors import RejectedFile
from ..plan import PackOptions, Plan
from .inputs import INPUT_KINDS, Record, RecordReader, Source
from .listing import MAX_LABEL, UNLABELLED, Listing, ScanError

FOLDER_OPTIONS = ("files_from", "metadata", "sidecars", "no_classes")
"""PackOptions that describe a folder of image files, meaningless for a container."""


def scan_container(source: Source, options: PackOptions) -> Listing:
    """The samples of a container SRC, listed by its kind's module."""
    given = [name for name in FOLDER_OPTIONS if getattr(options, name)]
    if given:
        raise ScanError(f"--{given[0].replace('_', '-')} applies to a folder of images, not to {source.kind} input")
    listing = _module(source.kind, source.inputs[0]).scan(source, options)
    listing.kind, listing.inputs = source.kind, list(source.inputs)
    return listing


def _module(kind: str, where: str) -> Any:
    module = INPUT_KINDS[kind].module
    if module is None:
        raise ScanError(f"{where}: {kind} input is recognised but not supported yet")
    return importlib.import_module(module)


def reads_in_line(kind: str) -> bool:
    """Whether passthrough reads this input kind's records in the shard's own thread (`InputKind.in_line`)."""
    return kind in INPUT_KINDS and INPUT_KINDS[kind].in_line


@contextmanager
def open_records(plan: Plan) -> Iterator[Callable[[int, int, int], Record | list[Record]] | None]:
    """The shard's record reader for a container plan (None for a folder), closed at the end. It
    checks labels against a `--classes` list: one outside it is a reject, as for a folder."""
    if plan.input_kind == "folder":
        yield None
        return
    reader: RecordReader = _module(plan.input_kind, plan.source).open_reader(plan)
    fixed = len(plan.classes) if plan.options.classes is not None else None

    def read(input: int, offset: int, length: int) -> Record | list[Record]:
        found = reader(input, offset, length)
        for record in found if isinstance(found, list) else [found]:
            if record.label != UNLABELLED and not 0 <= record.label <= MAX_LABEL:
                raise RejectedFile(f"label {record.label} is out of range (0 to {MAX_LABEL})")
            if fixed is not None and record.label != UNLABELLED and not 0 <= record.label < fixed:
                raise RejectedFile(f"label {record.label} is out of range for the {fixed} classes of {plan.options.classes}")
        return found

    try:
        yield read
    finally:
        reader.close()
