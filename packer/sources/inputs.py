"""Container inputs: samples that live inside files (tar shards, record files, packed datasets).

A folder of images is listed file by file (`walk`, `filelist`). A container kind lists samples
inside its input files instead, each at a location `(input number, offset, length)`: a byte range
(a tar sample's members, a record) or, for a packed dataset, a sample index. Shards are planned
from those locations exactly as from files, so workers, tasks, merge, resume and reruns behave
the same, and nothing is extracted to disk.

A kind is one module under `packer.sources` and one line in `INPUT_KINDS` (the file suffixes
that make `resolve_source` recognise it, and the PackOptions only it reads, refused for any other
SRC); `packer.sources.containers` calls it. The module imports `packer.plan.options`, never the plan,
and provides:

    scan(source: Source, options: PackOptions) -> Listing
        the samples in packing order, with `locations`, `fields` and `classes`; labels may be
        UNLABELLED there when only reading the sample tells them
    open_reader(plan: ShardPlan) -> RecordReader
        called once per shard; `reader(input, offset, length) -> Record` is called from reader
        threads at once (so it must be thread-safe: `packer.sources.ranges.InputFiles` reads with pread), and raises
        RejectedFile naming the member or record and the problem for a bad sample
"""

from __future__ import annotations

import glob
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Literal, Protocol

from readers.fields import FieldSpec
from readers.manifest import MANIFEST_NAME, DatasetError, MissingFile
from readers.remote import RemoteStore, is_url, location

from ..errors import PackError, RejectedFile
from .listing import ScanError, is_image_name


@dataclass(frozen=True)
class InputKind:
    """A container kind: the file suffixes that identify its inputs, and the module reading them
    (None: recognised, but no reader yet); `python_only`: made by the Python API, never a CLI SRC;
    `in_line`: passthrough reads its records in the shard's own thread (byte ranges of a file in
    order, which the kernel reads ahead by itself), not in reader threads that would only pass the
    GIL around; not for code of the user's, which may wait on I/O. `windowed`: a shuffled pack
    mixes its samples in windows of nearby byte ranges (`packer.plan.pack_order`), so reads stay nearly
    sequential; not for inputs that are each one call of the user's code, permuted fully."""

    suffixes: tuple[str, ...]
    module: str | None
    python_only: bool = False
    in_line: bool = True
    windowed: bool = True
    options: tuple[str, ...] = ()
    """PackOptions fields only this kind reads: given for another SRC, an error (`check_kind_options`)."""
    title: str = ""
    """The kind's name in those errors."""


INPUT_KINDS: dict[str, InputKind] = {
    "tar": InputKind((".tar",), "packer.sources.tars"),
    "recordio": InputKind((".rec",), "packer.sources.recordio"),
    "tfrecord": InputKind((".tfrecord", ".tfrecords"), "packer.sources.tfrecord",
                          options=("image_key", "label_key", "label_offset"), title="TFRecord"),
    "pack": InputKind((), "packer.sources.packed"),  # a directory holding index.json
    "samples": InputKind((), "packer.sources.samples", python_only=True, in_line=False,
                         windowed=False),  # packer.pack_samples' fn + inputs
}
INPUT_FORMATS = ("folder", *INPUT_KINDS)
CLI_INPUT_FORMATS = ("folder", *(name for name, kind in INPUT_KINDS.items() if not kind.python_only))


@dataclass(frozen=True)
class Source:
    """What SRC is, resolved once at the run's entry (`resolve_source`) and then handed down
    instead of SRC: its kind, the folder sample paths are relative to (as given, or absolute for
    container inputs), the container inputs, and SRC as the user named it (`given`; empty in a
    Source rebuilt from a plan, `Plan.planned_source`). Small and picklable."""

    kind: str
    root: str
    inputs: tuple[str, ...] = ()
    given: str = field(default="", compare=False)

    @property
    def is_url(self) -> bool:
        return is_url(self.root)

    @property
    def named(self) -> Path | str:
        """SRC as messages name it and OUT is checked against it: as given (a URL stays a string)."""
        return location(self.given or self.root)

    @property
    def location(self) -> Path | str:
        """The root as walks and loaders take it: a URL stays a string."""
        return location(self.root)

    @property
    def name(self) -> str:
        """How a plan names SRC: a URL as given (less a trailing slash), a local path absolute."""
        return self.root.rstrip("/") if self.is_url else os.path.abspath(self.root)


@dataclass
class Record:
    """One container sample as read: the image's bytes, its label, its fields' stored bytes, what
    names the image in a reject (`x.jpg` of a tar, a record number), and the path to store where
    the input keeps one (a packed dataset's samples keep theirs; None: the listing's)."""

    image: bytes
    label: int
    fields: dict[str, bytes] = field(default_factory=dict)
    image_name: str = "image"
    path: str | None = None


ReadMode = Literal["in-line", "files", "fetch", "threads"]


def read_mode(source: Source) -> ReadMode:
    """How a passthrough shard reads this SRC's samples: "in-line", a container kind's records in
    the shard's own thread (`InputKind.in_line`); "files", local files opened ahead by a few
    threads; "fetch", files behind a URL, fetched in concurrent batches; "threads", reader threads
    (pack_samples' calls, which may wait on I/O). Decoding stores always use reader threads."""
    if source.kind in INPUT_KINDS:
        return "in-line" if INPUT_KINDS[source.kind].in_line else "threads"
    return "fetch" if source.is_url else "files"


class ShardPlan(Protocol):
    """What a kind's reader is given of the plan (`packer.plan.plan.Plan`)."""

    source: str
    input_kind: str
    inputs: list[str]
    fields: list[FieldSpec]
    classes: list[str]
    options: Any  # packer.plan.options.PackOptions


def check_kind_options(kind: str, options: Any) -> None:
    """Refuse options that another input kind declares (`InputKind.options`), given for SRC of
    `kind`: elsewhere they would do nothing."""
    for name, other in INPUT_KINDS.items():
        if name != kind:
            for option in other.options:
                if options.is_given(option):
                    raise ScanError(f"--{option.replace('_', '-')} applies to {other.title} input "
                                    f"(--input-format {name}) only")


class RecordError(ValueError):
    """A record of a container input that cannot be read; the message says where and why."""


class RecordReader(Protocol):
    def __call__(self, input: int, offset: int, length: int) -> Record | list[Record]: ...

    def close(self) -> None: ...


def resolve_source(src: str | os.PathLike[str], input_format: str | None = None) -> Source:
    """The kind of SRC and its inputs, from what it is or as `input_format` says.

    A directory holding index.json is a packed dataset; a directory whose files are all of one
    container kind (and no images, no subfolders) is that kind's inputs; a file is known by its
    suffix; a glob or brace pattern (`data-{000000..000127}.tar`) names input files. Anything
    else is a folder of images, as before.
    """
    text = os.fspath(src)
    return replace(_resolved(text, input_format), given=text)


def _resolved(text: str, input_format: str | None) -> Source:
    """`resolve_source` of SRC as text, less the name it was given by."""
    if input_format == "folder":
        return Source("folder", text)
    if is_url(text):
        return _url_source(text, input_format)
    path = Path(text)
    if path.is_dir():
        if input_format in (None, "pack") and (path / MANIFEST_NAME).is_file():
            return Source("pack", os.path.abspath(text), (os.path.abspath(text),))
        if input_format == "pack":
            raise ScanError(f"{text}: no {MANIFEST_NAME}; not a packed dataset")
        return _directory(text, input_format)
    if path.is_file():
        if path.name == MANIFEST_NAME and input_format in (None, "pack"):
            root = os.path.abspath(path.parent)
            return Source("pack", root, (root,))
        return _files(text, [os.path.abspath(text)], input_format)
    if not path.exists() and _is_pattern(text):
        files = expand_pattern(text)
        if not files:
            raise ScanError(f"{text}: matches no file")
        return _files(text, files, input_format)
    if input_format is not None:
        raise ScanError(f"{text}: does not exist")
    return Source("folder", text)  # the walk names what is wrong with it


def _url_source(text: str, input_format: str | None) -> Source:
    """A URL SRC: one input file where its name (or --input-format) says a file kind, read by
    ranged requests as a local one is; else a packed dataset where an index.json answers there,
    else a folder of images (`walk_url` says when it is none of these)."""
    url = text.rstrip("/")
    kind = kind_of(url) if input_format is None else input_format
    if kind is not None and INPUT_KINDS[kind].suffixes:
        if kind_of(url) != kind and not _is_url_file(url):  # a folder, or nothing, given with --input-format
            raise ScanError(f"{text}: not a {kind} file; {URL_SOURCES}")
        return Source(kind, url.rsplit("/", 1)[0], (url,))
    if input_format in (None, "pack"):
        try:
            RemoteStore(url).manifest()
            return Source("pack", url, (url,))
        except MissingFile as exc:  # no index.json there: a folder of images
            if input_format == "pack":
                raise ScanError(str(exc)) from None
        except DatasetError as exc:  # an index.json that is not sound is never taken for a folder
            raise ScanError(str(exc)) from None
    elif input_format is not None:
        raise ScanError(f"{text}: {input_format} input must be local; {URL_SOURCES}")
    return Source("folder", text)


URL_SOURCES = "a URL SRC is a packed dataset, a folder of images or one tar, .rec or .tfrecord file"


def _is_url_file(url: str) -> bool:
    try:
        return is_file(url)
    except OSError as exc:
        raise ScanError(f"{url}: cannot read ({exc})") from None


def is_file(path: str) -> bool:
    """Whether there is a file at `path`, local or a URL (an object of the store)."""
    if not is_url(path):
        return os.path.isfile(path)
    from .remote import filesystem

    with fsspec_errors():
        fs, key = filesystem(path)
        return bool(fs.isfile(key))


def _directory(text: str, input_format: str | None) -> Source:
    try:
        entries = sorted(os.scandir(text), key=lambda entry: entry.name)
    except OSError as exc:
        raise ScanError(f"{text}: cannot list ({exc.strerror})") from None
    visible = [entry for entry in entries if not entry.name.startswith(".")]
    files = [entry for entry in visible if _is_file(entry)]
    if input_format is not None:
        # Files with the kind's suffix; where none has it, the files without any (ImageNet's
        # `train-00000-of-01024`), all of one name before their numbers: never a README, a label
        # file or an index, nor two splits packed together.
        kind = INPUT_KINDS[input_format]
        names = [entry.name for entry in files]
        chosen = [name for name in names if kind.suffixes and name.lower().endswith(kind.suffixes)] or \
            [name for name in names if "." not in name]
        if not chosen:
            raise ScanError(f"{text}: no {input_format} files in this folder")
        stems = sorted({re.sub(r"[-_.]?\d.*$", "", name) for name in chosen})
        if len(stems) > 1:
            raise ScanError(f"{text}: holds {input_format} files of several names ({', '.join(stems)}); "
                            "choose one with a pattern, e.g. '" + os.path.join(text, stems[0]) + "-*'")
        inputs = [os.path.abspath(os.path.join(text, name)) for name in chosen]
        return _files(text, inputs, input_format)
    kinds = {kind_of(entry.name) for entry in files} - {None}
    plain_folder = any(is_image_name(entry.name) for entry in files) or len(files) < len(visible)
    if not kinds or plain_folder:
        return Source("folder", text)
    if len(kinds) > 1:
        raise ScanError(f"{text}: holds inputs of several kinds ({', '.join(sorted(map(str, kinds)))}); "
                        "choose one with --input-format or a pattern")
    kind = kinds.pop()
    return _files(text, [os.path.abspath(entry.path) for entry in files if kind_of(entry.name) == kind], kind)


def _files(text: str, inputs: list[str], input_format: str | None) -> Source:
    """Input files of one kind: the kind from their suffixes unless given; sorted by path."""
    kind = input_format
    if kind is None:
        kinds = {kind_of(name) for name in inputs}
        if None in kinds or len(kinds) > 1:
            odd = next(name for name in inputs if kind_of(name) is None) if None in kinds else inputs[0]
            raise ScanError(f"{odd}: cannot tell what kind of input this is; say it with --input-format "
                            f"({'|'.join(CLI_INPUT_FORMATS)})")
        kind = kinds.pop()
    assert kind is not None
    if kind == "folder":
        raise ScanError(f"{text}: --input-format folder needs a directory of images")
    inputs = sorted(set(inputs))
    return Source(kind, os.path.commonpath([os.path.dirname(name) for name in inputs]), tuple(inputs))


def kind_of(name: str) -> str | None:
    """The container kind a file name's suffix says, or None."""
    for kind, spec in INPUT_KINDS.items():
        if spec.suffixes and name.lower().endswith(spec.suffixes):
            return kind
    return None


def _is_file(entry: os.DirEntry[str]) -> bool:
    """A regular file, or a link to one: from the listing's d_type (a stat only for a link), since
    on a network mount each stat is a round trip, and SRC's top level may hold 1,000 class folders."""
    try:
        return entry.is_file()
    except OSError:
        return False


_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(\d+)\.\.(\d+)")


def _is_pattern(text: str) -> bool:
    return bool(_BRACE.search(text)) or glob.has_magic(text)


def expand_braces(text: str) -> list[str]:
    """`a-{000..002}.tar` -> a-000.tar, a-001.tar, a-002.tar (zero-padded as written); `{x,y}` -> x, y."""
    match = _BRACE.search(text)
    if match is None:
        return [text]
    inner = match.group(1)
    numbers = _RANGE.fullmatch(inner)
    if numbers:
        first, last = numbers.groups()
        width = len(first) if first.startswith("0") else 0
        step = 1 if int(last) >= int(first) else -1
        choices = [str(number).zfill(width) for number in range(int(first), int(last) + step, step)]
    else:
        choices = inner.split(",")
    head, tail = text[:match.start()], text[match.end():]
    return [expanded for choice in choices for expanded in expand_braces(head + choice + tail)]


def expand_pattern(text: str) -> list[str]:
    """The files a brace and/or glob pattern names, absolute; a braced name that is missing is an error."""
    files: list[str] = []
    for name in expand_braces(text):
        if glob.has_magic(name):
            files += [match for match in glob.glob(name) if os.path.isfile(match)]
        elif os.path.isfile(name):
            files.append(name)
        else:
            raise ScanError(f"{name}: does not exist (named by {text})")
    return sorted({os.path.abspath(name) for name in files})


@contextmanager
def fsspec_errors() -> Iterator[None]:
    """An fsspec back end's own exception types (aiohttp's, botocore's) as OSError; pack's own
    errors, raised by the code that reads through it, pass unchanged."""
    try:
        yield
    except (OSError, ImportError, AssertionError, PackError, RejectedFile, ScanError, RecordError):
        raise
    except Exception as exc:  # noqa: BLE001 - each back end raises its own types
        raise OSError(f"{type(exc).__name__}: {exc}") from None
