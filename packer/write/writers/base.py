"""The interface every format's shard writer fills in; the pipeline owns the mechanics."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Mapping, Sequence

from readers.fields import FieldSpec
from readers.formats import FORMATS


@dataclass(frozen=True)
class Sample:
    """One accepted sample; `key` (`readers.manifest.sample_key`) names it where a format shows keys.

    `crc32` is the payload's, computed by the reader thread that loaded it (off the writer's
    serial path); it lets readers and `pack verify` name a damaged sample. `fields` maps a field's
    name to its stored bytes (`readers.fields.encode_value`, also made in the reader thread); an
    absent optional field has no entry.
    """

    key: str
    label: int
    path: str
    payload: bytes
    meta: dict[str, Any]
    extension: str
    crc32: int
    fields: Mapping[str, bytes] = field(default_factory=dict)

    def record_meta(self) -> dict[str, Any]:
        return {"label": self.label, "path": self.path, **self.meta, "crc32": self.crc32}


class ShardWriter(ABC):
    """Writes one shard file at `path` (a temporary name; the pipeline renames it when done).

    `expected_bytes` is the sum of the source files' sizes; `classes` the dataset's class names,
    for formats whose shards describe themselves; `sample_shape` the (H, W, C) of every payload
    when the options guarantee one (raw pixels with a center crop), for fixed-shape layouts; `fields`
    the per-sample fields, in index.json's order. Subclasses set
    `format` (its file extensions come from the row in `readers.formats`), and implement `add`, `close` and `abort`. `close` must leave the file
    complete and written to the OS (the pipeline syncs it, while it hashes the file for writers
    that leave `sha256` unset); `abort` only lets go of open handles, after an error. Used as a
    context manager, a writer closes on success and aborts on error (or when closing fails). A
    format that needs more files per shard (a tar's offset index) names their extensions in
    `sidecars` and writes each to `sidecar_path(self.path, ext)`; the pipeline publishes them as
    `shard-NNNNNN<ext>` before the shard itself and lists them in index.json.
    """

    format: ClassVar[str]
    extension: ClassVar[str]
    # What the format's library raises when writing fails (a full disk, say), besides OSError.
    write_errors: ClassVar[tuple[type[Exception], ...]] = ()
    sidecars: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        row = FORMATS[cls.format]  # the one place a format's file names are set: readers check them too
        cls.extension, cls.sidecars = row.extension, row.sidecars

    def __init__(self, path: Path, expected_bytes: int, classes: Sequence[str],
                 sample_shape: tuple[int, int, int] | None = None, fields: Sequence[FieldSpec] = ()) -> None:
        self.path = path
        self.expected_bytes = expected_bytes
        self.classes = list(classes)
        self.sample_shape = sample_shape
        self.fields = list(fields)

    @abstractmethod
    def add(self, sample: Sample) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def abort(self) -> None:
        """Release file handles without finishing the file (the caller deletes it); may follow a failed close."""

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if exc_type is not None:
            self.abort()
            return
        try:
            self.close()
        except BaseException:
            self.abort()
            raise

    # A writer that writes its file front to back may hash it on the way and set this in close(),
    # saving the pipeline a second read of the shard.
    sha256: str | None = None


def sidecar_path(shard_path: Path, extension: str) -> Path:
    """Where a writer puts sidecar `extension` of the shard it writes at `shard_path`."""
    return shard_path.with_name(shard_path.name + extension)
