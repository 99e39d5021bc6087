"""The `pack` command: parse options, call the library, print a summary. Nothing else."""

from __future__ import annotations

import io
import json
import logging
import os
import select
import signal
import sys
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import click
from tqdm import tqdm

from readers.cache import parse_size
from readers.manifest import DECODE_MODES, MANIFEST_NAME, ON_ERROR_MODES, REJECTS_NAME
from readers.remote import location

from .version import __version__
from .run.descriptors import DEFAULT_SPLIT
from .write.encode import DEFAULT_QUALITY, PIXEL_MODES, STORES
from .engines import ENGINES
from .errors import PackError
from .stores.fsutil import limit_malloc_arenas
from .api import EXPECTED_ERRORS, one_line, run, split_options
from .run.pipeline import RunOptions, Summary, ensure_plan, merge
from .plan.options import (DEFAULT_IMAGE_KEY, DEFAULT_LABEL_KEY, DEFAULT_ORDER, DEFAULT_SHARD_BYTES, DEFAULT_SHARD_SIZE,
                   MAX_SEED, ORDERS, PackOptions)
from .sources.inputs import CLI_INPUT_FORMATS
from .sources.metadata import DEFAULT_LABEL_COLUMN
from .engines.slurm import slurm_script
from .write.validate import DEFAULT_MAX_PIXELS, VALIDATE_MODES, ErrorPolicy
from .write.writers import WRITERS

if TYPE_CHECKING:
    from readers.bench import BenchResult

class ByteSize(click.ParamType):
    """Sizes like 4GB, 512MiB or 1000000: the readers' size syntax (readers.cache.parse_size)."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            size = parse_size(value if isinstance(value, int) else str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if not size:
            self.fail(f"{value!r} must be positive", param, ctx)
        return size


class PathOrURL(click.ParamType):
    """A local path, or a URL (s3://bucket/x, any fsspec URL) kept as written: a Path would fold its //."""

    name = "path"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path | str:
        return location(value)


def joined(root: Path | str, name: str) -> str:
    """`root/name` for a folder or a URL."""
    return f"{str(root).rstrip('/')}/{name}"


class ExtensionList(click.ParamType):
    """`txt,json` -> ("txt", "json")."""

    name = "extensions"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        return tuple(part.strip().lstrip(".") for part in str(value).split(",") if part.strip())


def human_bytes(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`1 shard`, `3 shards`; `1 class`, `0 classes`."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def print_summary(summary: Summary) -> None:
    for alias in summary.aliases:
        click.echo(alias)
    if summary.dataset is not None:
        appended(summary)
        return
    if summary.up_to_date:
        click.echo(f"{summary.out}: up to date, {counted(summary.num_samples, 'sample')} in "
                   f"{counted(summary.num_shards, 'shard')} packed from the same SRC with the same options; "
                   "nothing to do (--overwrite packs it again)")
        return
    resumed = f", {summary.resumed_shards} resumed" if summary.resumed_shards else ""
    shards = (counted(summary.num_shards, "shard") if summary.published
              else f"{summary.num_shards} of {counted(summary.planned_shards, 'shard')} (this task's)")
    ratio = (f", {summary.bytes / summary.source_bytes:.2f}x the {human_bytes(summary.source_bytes)} of source files"
             if summary.source_bytes else "")
    click.echo(
        f"packed {counted(summary.num_samples, 'sample')} ({human_bytes(summary.bytes)}{ratio}) into {shards}{resumed} "
        f"in {summary.elapsed:.1f}s ({summary.files_per_second:.0f} files/s); {summary.rejects} rejected "
        f"(see {joined(summary.out, REJECTS_NAME)}), {left_out(summary)}"
        + ("" if summary.published else f"; run `pack merge {summary.out}` when every task is done")
    )


def appended(summary: Summary) -> None:
    """The summary of an append: what it added, and what OUT holds now."""
    assert summary.dataset is not None
    samples, shards, classes = summary.dataset
    now = (f"{summary.out} now holds {counted(samples, 'sample')} in {counted(shards, 'shard')}, "
           f"{counted(classes, 'class', 'classes')}")
    if summary.up_to_date:
        click.echo(f"{summary.out}: already appended, {counted(summary.num_samples, 'sample')} in "
                   f"{counted(summary.num_shards, 'shard')} from the same SRC with the same options; nothing to do; {now}")
        return
    resumed = f", {summary.resumed_shards} resumed" if summary.resumed_shards else ""
    click.echo(f"appended {counted(summary.num_samples, 'sample')} ({human_bytes(summary.bytes)}) in "
               f"{counted(summary.num_shards, 'shard')}{resumed} in {summary.elapsed:.1f}s "
               f"({summary.files_per_second:.0f} files/s); {summary.rejects} rejected "
               f"(see {joined(summary.out, REJECTS_NAME)}), {left_out(summary)}; {now}")


def left_out(summary: Summary) -> str:
    """`1 image outside any class folder skipped (stray.jpg), 2 non-image entries ignored (...)`."""
    unclassed = (f"{counted(summary.unclassed, 'image')} outside any class folder skipped"
                 f"{ignored_examples(summary.unclassed, summary.unclassed_names)}, " if summary.unclassed else "")
    return (f"{unclassed}{counted(summary.ignored, 'non-image entry', 'non-image entries')} ignored"
            f"{ignored_examples(summary.ignored, summary.ignored_names)}")


def ignored_examples(count: int, names: list[str], shown: int = 3) -> str:
    """` (.DS_Store, notes.txt, ... -v names them all)`: the first ignored entries, by name."""
    if not names:
        return ""
    more = ", ... -v names them all" if count > shown else ""
    return " (" + ", ".join(printable(name) for name in names[:shown]) + more + ")"


def packing_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options that shape the packed result; their names are PackOptions' fields."""
    decorators = [
        click.option("--store", type=click.Choice(STORES), default=None,
                     help="original: the file's bytes unchanged; raw: decoded uint8 HWC pixels; bmp: lossless BMP; "
                          "jpeg: re-encoded JPEG (after --resize/--center-crop).  "
                          "[default: original; an append: OUT's]"),
        click.option("--mode", type=click.Choice(PIXEL_MODES, case_sensitive=False), default=None,
                     metavar="[" + "|".join(PIXEL_MODES) + "]",  # click would show the choices lower-cased
                     help="Pixel mode of decoding stores.  [default: RGB]"),
        click.option("--resize", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Decoding stores: scale the shorter side to N, keeping the aspect ratio."),
        click.option("--max-side", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Decoding stores: cap the longer side at N (after --resize; alone it only shrinks)."),
        click.option("--center-crop", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Decoding stores: crop the central N x N after resizing; smaller images are "
                          "padded with black."),
        click.option("--quality", type=click.IntRange(1, 100), default=None,
                     help=f"JPEG quality of --store jpeg.  [default: {DEFAULT_QUALITY}]"),
        click.option("--shard-size", type=click.IntRange(min=1), default=DEFAULT_SHARD_SIZE, show_default=True,
                     help="Most samples per shard."),
        click.option("--shard-bytes", type=ByteSize(), default=DEFAULT_SHARD_BYTES, show_default="1GiB",
                     help="Most source bytes per shard (e.g. 4GB, 512MiB)."),
        click.option("--order", type=click.Choice(ORDERS), default=DEFAULT_ORDER, show_default=True,
                     help="shuffled: samples in a pseudo-random order drawn from --seed, so every shard "
                          "mixes classes (container inputs: 16 MiB runs shuffled, interleaved 64 at a time, each "
                          "read front to back); sorted: as listed, in path order (e.g. evaluation sets)."),
        click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True,
                     help="The seed of --order shuffled: the same seed, the same order, on every run and task."),
        click.option("--validate", type=click.Choice(VALIDATE_MODES), default="quick", show_default=True,
                     help="quick: check content type, end markers and header size; full: also decode every image."),
        click.option("--max-pixels", type=click.IntRange(min=1), default=DEFAULT_MAX_PIXELS, show_default=True,
                     help="Reject images whose header claims more pixels (decompression bombs)."),
        click.option("--files-from", type=click.Path(dir_okay=False, allow_dash=True), default=None, metavar="FILE",
                     help="Pack the files this list names (paths relative to SRC, one per line; - reads "
                          "stdin) instead of walking SRC: the same shards as a walk finding those files."),
        click.option("--null", is_flag=True, help="--files-from names are NUL-separated (find -print0)."),
        click.option("--metadata", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                     help="Labels and fields from FILE (.csv, .tsv, .jsonl, or a .txt of 'name label' lines): "
                          "a file_name (or path) column relative to SRC, a label column, and other columns "
                          "as fields. Folders are then not classes."),
        click.option("--label-column", default=DEFAULT_LABEL_COLUMN, show_default=True,
                     help="The --metadata column holding a class name or index."),
        click.option("--classes", type=click.Path(), default=None, metavar="FILE",
                     help="The class list: one name per line, or a packed dataset's index.json, so "
                          "datasets packed apart (train, val) share label indexes."),
        click.option("--no-classes", is_flag=True, help="Subfolders are not classes: pack every image unlabelled (-1)."),
        click.option("--sidecars", type=ExtensionList(), default="", metavar="EXT,...",
                     help="Pack the file beside each image with the same name up to its extension as "
                          "field EXT (a/x.jpg + a/x.txt -> field txt); json sidecars are parsed as JSON, "
                          "others read as UTF-8 text. A missing one rejects the image."),
        click.option("--sidecars-optional", is_flag=True,
                     help="A missing sidecar leaves the field absent (read back as None) instead."),
        click.option("--input-format", type=click.Choice(CLI_INPUT_FORMATS), default=None,
                     help="What SRC is: a folder of images, WebDataset tar shards (a folder, a file or "
                          "a pattern like 'data-{000000..000127}.tar'), a RecordIO .rec, TFRecord files, "
                          "or a packed dataset (a folder with index.json).  [default: guessed from SRC]"),
        click.option("--image-key", default=DEFAULT_IMAGE_KEY, show_default=True,
                     help="TFRecord input: the Example feature holding the image bytes."),
        click.option("--label-key", default=DEFAULT_LABEL_KEY, show_default=True,
                     help="TFRecord input: the Example feature holding the integer label."),
        click.option("--label-offset", type=int, default=0, show_default=True,
                     help="TFRecord input: added to every label (-1 for ImageNet's 1-based labels)."),
    ]
    for decorator in reversed(decorators):
        command = decorator(command)
    return command


def split_params(fmt: str, params: dict[str, Any]) -> tuple[PackOptions, RunOptions]:
    """A command's parameters as the library's options (`packer.api.split_options`, which the
    Python API takes too); contradictory flags are a usage error (exit 2), like a bad value."""
    try:
        return split_options(fmt, params)
    except PackError as exc:
        raise click.UsageError(str(exc)) from None


def pack_options_from(fmt: str, params: dict[str, Any]) -> PackOptions:
    """Take PackOptions' fields out of a command's parameters."""
    names = [field.name for field in fields(PackOptions) if field.name != "format"]
    return split_params(fmt, {name: params.pop(name) for name in names})[0]


def option_args(options: PackOptions) -> list[str]:
    """PackOptions back to command-line flags, so generated job scripts pack exactly these options."""
    args: list[str] = []
    for field in fields(PackOptions):
        value = getattr(options, field.name)
        flag = f"--{field.name.replace('_', '-')}"
        if field.name == "format" or value is None or value is False or value == ():
            continue
        if value is True:
            args.append(flag)
        else:
            args += [flag, ",".join(value) if isinstance(value, tuple) else str(value)]
    return args


def error_policy_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """What to do with bad files; not part of the packed result, so not PackOptions."""
    command = click.option("--max-errors", type=click.IntRange(min=0), default=None,
                           help="Abort when more than this many files are rejected; default: no limit.")(command)
    return click.option("--on-error", type=click.Choice(ON_ERROR_MODES), default="skip", show_default=True,
                        help="skip: list bad files in rejects.jsonl and go on; fail: stop at the first.")(command)


def split_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """The split name the loader descriptors give the dataset: written at publish, never changes a
    shard, so not PackOptions (a shard-packing task ignores it; `pack merge` takes it too)."""
    return click.option("--split", default=DEFAULT_SPLIT, show_default=True,
                        help="Split name in _info.json (timm), wids.json and README.md (Hugging Face).")(command)


def make_pack_command(fmt: str) -> click.Command:
    @click.command(name=fmt, help=f"Pack the images under SRC into {fmt} shards in directory OUT.")
    @click.argument("src", type=PathOrURL())
    @click.argument("out", type=PathOrURL())
    @packing_options
    @error_policy_options
    @split_option
    @click.option("--workers", type=click.IntRange(min=1), default=None,
                  help="Shards packed at once; default: the CPUs this job may use.")
    @click.option("--overwrite", is_flag=True, help="Replace an existing packed dataset in OUT.")
    @click.option("--append", is_flag=True,
                  help="Add SRC's images to the packed dataset in OUT as new shards: OUT's files stay as they "
                       "are, new classes get the next indexes, index.json is replaced last. Shard sizes and store options "
                       "are OUT's unless given.")
    @click.option("--append-again", is_flag=True,
                  help="With --append: add SRC even when OUT holds its samples already, appended or packed from "
                       "another path (a copy, a symlink) with the same listing and options.")
    @click.option("--task-index", type=click.IntRange(min=0), default=None,
                  help="Pack only the shards of this task (shard k belongs to task k mod N).")
    @click.option("--task-count", type=click.IntRange(min=1), default=None, help="N, the number of tasks.")
    @click.option("--engine", type=click.Choice(tuple(ENGINES)), default="local", show_default=True,
                  help="Where shard tasks run.")
    @click.option("--scheduler", default=None, help="For --engine dask: 'local' or a scheduler address.")
    @click.option("--staging", type=click.Path(file_okay=False, path_type=Path), default=None,
                  help="A URL OUT: the local folder where shards wait for their upload (256 MiB or 2 shards, "
                       "whichever is more, beyond those being packed); default: a temporary folder.")
    @click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
    def command(src: Path | str, out: Path | str, quiet: bool, **params: Any) -> None:
        options, run_options = split_params(fmt, params)
        with PlannedBar(f"pack {fmt}", quiet) as bar:
            summary = run(src, out, options, run_options, progress=bar.update, planned=bar.start)
        print_summary(summary)

    return command


def progress_bar(desc: str, quiet: bool, total: int | None = None) -> tqdm:
    """On stderr; in a batch job's log (not a terminal) it still shows, but rarely."""
    interval = 0.2 if sys.stderr.isatty() else 30.0
    return tqdm(desc=desc, total=total, unit="img", file=sys.stderr, disable=quiet, mininterval=interval,
                dynamic_ncols=True)


class PlannedBar:
    """A progress bar drawn only once the plan gives its total (so a percentage and an ETA), never
    before an error that comes first (a missing SRC)."""

    def __init__(self, desc: str, quiet: bool) -> None:
        self.desc, self.quiet = desc, quiet
        self.bar: tqdm | None = None

    def start(self, total: int) -> None:
        self.bar = progress_bar(self.desc, self.quiet, total)

    def update(self, count: int) -> None:
        if self.bar is not None:
            self.bar.update(count)

    def __enter__(self) -> PlannedBar:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.bar is not None:
            self.bar.close()


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's preemption), raised like Ctrl-C so the run stops the same way."""


def raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


class Interrupted(click.ClickException):
    """Ctrl-C or SIGTERM: the shell's convention for death by a signal is exit 128 + its number."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


def stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (`| head`), as opposed to a broken
    pipe elsewhere (a socket to a bucket), which stays an error."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):  # CliRunner's capture: no descriptor
        return False
    poller = select.poll()
    poller.register(descriptor, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush does not fail on a closed pipe too."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


class PackGroup(click.Group):
    """Turns the library's expected failures into one-line errors instead of tracebacks."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            raise Interrupted("interrupted; nothing was published; rerun the same command to resume",
                              signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT) from None
        except EXPECTED_ERRORS as exc:
            if isinstance(exc, BrokenPipeError) and stdout_closed():  # `pack info OUT | head -2`: the reader has all it wanted
                silence_stdout()
                ctx.exit(0)
            raise click.ClickException(one_line(exc)) from None


@click.group(cls=PackGroup)
@click.version_option(__version__, prog_name="pack")
@click.option("--verbose", "-v", is_flag=True, help="Log what the library does to stderr.")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """Pack folders of images into LMDB, HDF5 or WebDataset shards for fast PyTorch training."""
    # A scheduler's preemption (SIGTERM) stops like Ctrl-C: temp files removed, resumable. For this
    # command only: an in-process caller (a test session, a notebook) gets its own handler back.
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    ctx.call_on_close(lambda: signal.signal(signal.SIGTERM, previous))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Dask reads this when first imported (by --engine dask): keep its INFO chatter out of the output.
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "info" if verbose else "warning")
    limit_malloc_arenas()


@main.command("plan")
@click.argument("src", type=PathOrURL())
@click.argument("out", type=PathOrURL())
@click.option("--format", "fmt", type=click.Choice(sorted(WRITERS)), required=True, help="The format tasks will pack.")
@packing_options
def plan_command(src: Path | str, out: Path | str, fmt: str, **params: Any) -> None:
    """Scan SRC once and write the shard plan into OUT, for the tasks of a batch job to share."""
    plan = ensure_plan(src, out, pack_options_from(fmt, params))
    click.echo(f"planned {counted(plan.num_listed, 'file')} into {counted(plan.num_shards, 'shard')} in {out}")


@main.command("merge")
@click.argument("out", type=PathOrURL())
@error_policy_options
@split_option
def merge_command(out: Path | str, on_error: str, max_errors: int | None, split: str) -> None:
    """Publish index.json once every planned shard in OUT is finished (an append's too); name what is missing if not."""
    manifest = merge(out, ErrorPolicy(on_error=on_error, max_errors=max_errors), split=split)
    click.echo(f"merged {counted(len(manifest.shards), 'shard')}, {counted(manifest.num_samples, 'sample')}: "
               f"{joined(out, MANIFEST_NAME)}")


@main.command("verify")
@click.argument("out", type=PathOrURL())
@click.option("--full", is_flag=True, help="Also decode every sample.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def verify_command(out: Path | str, full: bool, quiet: bool) -> None:
    """Check OUT's shards against index.json (presence, size, sha256, sample counts) and index.json against them."""
    from readers.stores import read_manifest  # only when asked
    from .inspect.verify import verify

    total = read_manifest(out).num_samples
    with progress_bar("verify", quiet) as bar:
        bar.total = total
        problems = verify(out, full=full, progress=bar.update)
    for problem in problems:
        click.echo(problem, err=True)
    if problems:
        raise click.ClickException(f"{out}: {counted(len(problems), 'problem')} found")
    click.echo(f"{out}: OK, {total} samples{', all decoded' if full else ''}")


@main.command("info")
@click.argument("out", type=PathOrURL())
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def info_command(out: Path | str, as_json: bool) -> None:
    """Describe a packed dataset: format, store, counts, classes, shard and image sizes, options."""
    from .inspect.info import (  # reads through `readers`, which imports torch: only when asked
        describe,
        non_default_options,
    )

    info = describe(out)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    sizes = info["image_sizes"]
    click.echo(f"{info['path']}: {info['format']} shards, store {info['store']}, {printable(info['tool_version'])}")
    click.echo(f"samples      {info['num_samples']} in {counted(len(info['classes']), 'class', 'classes')}")
    click.echo(f"shards       {info['shards']}, {human_bytes(info['bytes'])} in all; per shard "
               + " / ".join(human_bytes(info['shard_bytes'][k]) for k in ('min', 'median', 'max')) + " (min/median/max)")
    click.echo(f"per sample   {human_bytes(info['bytes_per_sample'])}")
    if info["source_bytes"]:
        click.echo(f"vs source    {info['bytes'] / info['source_bytes']:.2f}x the {human_bytes(info['source_bytes'])} "
                   "of the source files")
    if sizes:
        click.echo("image size   " + " / ".join(f"{sizes['width'][k]:.0f}x{sizes['height'][k]:.0f}"
                                                 for k in ("min", "median", "max"))
                   + f" (min/median/max width x height, {sizes['sampled']} sampled)")
    if info["fields"]:
        click.echo("fields       " + ", ".join(describe_field(spec) for spec in info["fields"]))
    mixing = info["class_mixing"]
    if mixing:
        verdict = (f"class-sorted: streamed batches hold few classes; `pack {info['format']} {info['path']} NEW_OUT` "
                   "packs it shuffled" if mixing["class_sorted"] else "mixed")
        click.echo(f"mixing       shards hold {mixing['shard_classes']:.0f} classes (median), a shuffled pack's "
                   f"{mixing['shuffled_classes']:.0f}: {verdict}")
    click.echo(f"read         {printable(info['read'])}")
    changed = non_default_options(info["options"])
    click.echo("options      " + (printable(", ".join(f"{key}={value}" for key, value in changed.items()))
                                  if changed else "all defaults"))
    for part in info["parts"]:
        click.echo(part_line(part))
    click.echo("classes")
    for entry in info["classes"]:
        click.echo(f"  {entry['index']:5d}  {entry['samples']:9d}  {printable(entry['name'])}")


@main.command("show")
@click.argument("out", type=PathOrURL())
@click.option("-o", "--output", "sheet_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the contact sheet here (PNG).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a page: the sheet, samples per class, stored image sizes, the rejects.")
@click.option("--per-class", type=click.IntRange(1, 100), default=8, show_default=True, help="Samples per class.")
@click.option("--classes", type=click.IntRange(min=1), default=20, show_default=True,
              help="Classes shown, drawn by --seed when there are more (rows, for an unlabelled set).")
@click.option("--field", default=None,
              help="Field printed under each image; default: the class name, or an unlabelled set's text field (else path).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Which classes and samples.")
def show_command(out: Path | str, sheet_path: Path | None, html_path: Path | None, per_class: int, classes: int,
                 field: str | None, seed: int) -> None:
    """Draw samples of OUT as the reader returns them, per class, into a PNG contact sheet and/or an HTML page."""
    if sheet_path is None and html_path is None:
        raise click.UsageError("nothing to write: give -o SHEET.png and/or --html PAGE.html")
    from .inspect.show import show  # reads through `readers`, which imports torch: only when asked

    sheet = show(out, sheet_path=sheet_path, html_path=html_path, per_class=per_class, classes=classes,
                 field=field, seed=seed)
    where = " and ".join(str(path) for path in (sheet_path, html_path) if path is not None)
    click.echo(f"{where}: {len(sheet.cells)} samples from {len(sheet.shards_read)} of "
               f"{len(sheet.manifest.shards)} shards")


def part_line(part: dict[str, Any]) -> str:
    """`part         shard 5 on: 15 samples in 4 shards from /data/new`: one pack or append of OUT
    (index.json's `parts`, untrusted: shown as text)."""
    try:
        first, shards, samples = int(part.get("first_shard", 0)), int(part.get("num_shards", 0)), \
            int(part.get("num_samples", 0))
    except (TypeError, ValueError):
        return "part         (unreadable)"
    return printable(f"part         shard {first} on: {counted(samples, 'sample')} in {counted(shards, 'shard')} "
                     f"from {part.get('source') or 'an unrecorded source'}")


def printable(text: str) -> str:
    """`text` with control characters escaped (`\\x1b`): a stranger's index.json cannot drive the terminal."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def describe_field(spec: dict[str, Any]) -> str:
    """`bbox (array float64 [4])`, `json (json, optional)`: a field as `pack info` lists it."""
    kind = spec["type"]
    if kind == "array":
        kind += f" {spec['dtype']} " + ("[" + ", ".join(map(str, spec["shape"])) + "]" if spec["shape"] is not None
                                         else "(shapes vary)")
    return f"{spec['name']} ({kind}{', optional' if spec['optional'] else ''})"


@main.command("slurm-script")
@click.argument("fmt", metavar="FORMAT", type=click.Choice(sorted(WRITERS)))
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@packing_options
@click.option("--tasks", type=click.IntRange(min=1), required=True, help="Array tasks to split the shards over.")
@click.option("--cpus-per-task", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--time", "time_limit", default="04:00:00", show_default=True, help="Time limit per task.")
@click.option("--partition", default=None, help="Slurm partition.")
@click.option("--mem", default=None, help="Memory per task, e.g. 4G.")
@click.option("--append", is_flag=True, help="The tasks append SRC to the packed dataset in OUT (pack --append); "
                                             "the merge job publishes it.")
@error_policy_options
@split_option
def slurm_script_command(fmt: str, src: Path, out: Path, tasks: int, cpus_per_task: int, time_limit: str,
                         partition: str | None, mem: str | None, append: bool, on_error: str, max_errors: int | None,
                         split: str, **params: Any) -> None:
    """Print a Slurm script: an sbatch array packing FORMAT shards (or appending them to OUT), then a
    merge job (afterok)."""
    options = pack_options_from(fmt, params)
    if options.files_from == "-":
        raise click.UsageError("--files-from - reads standard input, which batch jobs do not have; save the list to a file")
    policy_args = ["--on-error", on_error] + (["--max-errors", str(max_errors)] if max_errors is not None else [])
    pack_args = [fmt, str(src.resolve()), str(out.resolve()), *option_args(options), *policy_args,
                 *(["--append"] if append else [])]
    click.echo(slurm_script([sys.executable, "-m", "packer.cli"], pack_args, out,
                            merge_args=[*policy_args, "--split", split],
                            tasks=tasks, cpus_per_task=cpus_per_task, time_limit=time_limit,
                            partition=partition, mem=mem, job_name=f"pack-{fmt}"), nl=False)


@main.command(help="Measure loader throughput on the packed dataset OUT and recommend num_workers.")
@click.argument("out", type=PathOrURL())
@click.option("--batch-size", "batch_sizes", type=click.IntRange(min=1), multiple=True, default=(32, 128),
              show_default=True, help="Batch size to try; repeat the option for several.")
@click.option("--max-workers", type=click.IntRange(min=0), default=None,
              help="Highest num_workers to try; default: make_loader's, this rank's CPUs less one for training.")
@click.option("--decode", type=click.Choice(DECODE_MODES), default="tensor", show_default=True,
              help="What each sample is decoded to, as in open_dataset (the README trains with tensor).")
@click.option("--seconds", type=click.FloatRange(min=0.01), default=3.0, show_default=True,
              help="Time spent on each setting.")
def bench(out: Path, batch_sizes: tuple[int, ...], max_workers: int | None, decode: str, seconds: float) -> None:
    from readers.bench import MIN_GAIN, bench_loader, default_note  # torch loads only for this command

    rows: list[BenchResult] = []

    def row(result: BenchResult) -> None:
        if not rows:
            click.echo(f"{'batch':>6} {'workers':>8} {'samples/s':>10}")
        rows.append(result)
        click.echo(f"{result.batch_size:>6} {result.num_workers:>8} {result.samples_per_second:>10.0f}")

    report = bench_loader(out, batch_sizes=batch_sizes, max_workers=max_workers, decode=decode,
                          seconds=seconds, on_result=row)
    for batch_size, result in report.recommended.items():
        click.echo(f"batch {batch_size}: num_workers={result.num_workers} ({result.samples_per_second:.0f} samples/s)")
        if report.untried[batch_size]:
            last = [r for r in report.results if r.batch_size == batch_size][-1]
            click.echo(f"  {last.num_workers} workers gained under {MIN_GAIN:.0%} over {result.num_workers}, so "
                       f"{', '.join(map(str, report.untried[batch_size]))} were not tried")
    click.echo(f"reading: {printable(report.read)}")
    best = report.best
    click.echo(f"recommended: batch {best.batch_size}, num_workers={best.num_workers} "
               f"({best.samples_per_second:.0f} samples/s, decode={decode!r})")
    click.echo(default_note(best.num_workers))


for _name in WRITERS:
    main.add_command(make_pack_command(_name))
for _alias, _name in WRITERS.aliases.items():
    main.add_command(make_pack_command(_name), name=_alias)


if __name__ == "__main__":
    main()
