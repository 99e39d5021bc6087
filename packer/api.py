"""The Python API: `packer.pack(src, out, format=..., **options)` does what `pack FORMAT SRC OUT`
does, with the CLI's flags as keyword arguments in snake_case (`--shard-size 5000` ->
`shard_size=5000`), and returns the run's `Summary`; `packer.pack_samples(fn, inputs, out, ...)`
packs the samples `fn` makes from each input (`packer.sources.samples`). Expected failures are
`PackError` with the CLI's one-line messages.

The CLI builds its call through the same `split_options`, so a flag and its keyword can never
mean different things.
"""

from __future__ import annotations

import os
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from readers.cache import parse_size
from readers.manifest import DatasetError, Manifest

from .run.append import append_run
from .run.descriptors import DEFAULT_SPLIT
from .write.encode import ENCODE_OPTIONS
from .errors import PackError
from .stores.outdir import check_out, prepare_output, work_dir
from .run.pipeline import RunOptions, Summary, merge as merge_shards, pack_run
from .plan.options import PackOptions
from .sources.listing import ScanError
from .sources.samples import save_samples
from .write.validate import ErrorPolicy

T = TypeVar("T")


PACK_OPTION_NAMES = tuple(field.name for field in fields(PackOptions) if field.name != "format")
RUN_OPTION_NAMES = tuple(field.name for field in fields(RunOptions) if field.name != "given_encoding")


def split_options(format: str, options: dict[str, Any]) -> tuple[PackOptions, RunOptions]:
    """Keyword options -> what shapes the result, and how the run goes. An unknown name or a bad
    or contradictory value is a PackError naming the flag."""
    unknown = sorted(set(options) - set(PACK_OPTION_NAMES) - set(RUN_OPTION_NAMES))
    if unknown:
        raise PackError(f"unknown option {unknown[0]!r}; options: {', '.join(PACK_OPTION_NAMES + RUN_OPTION_NAMES)}")
    options = dict(options)
    if isinstance(options.get("shard_bytes"), str):  # "2GB", as the flag takes it
        try:
            options["shard_bytes"] = parse_size(options["shard_bytes"])
        except ValueError as exc:
            raise PackError(f"--shard-bytes: {exc}") from None
    if isinstance(options.get("sidecars"), str):  # "txt,json", as the flag takes it
        options["sidecars"] = tuple(part.strip().lstrip(".") for part in options["sidecars"].split(",") if part.strip())
    if options.get("store") is None:  # not given: original, or an append's OUT's
        options.pop("store", None)
    given_encoding = None
    if options.get("append"):
        given_encoding = {name: options[name] for name in ENCODE_OPTIONS if options.get(name) is not None}
        if "store" not in given_encoding:  # OUT's store decides what the others may be (`with_outs_defaults`)
            options = {name: value for name, value in options.items() if name not in ENCODE_OPTIONS}
    try:
        pack_options = PackOptions(format=format, **{name: options[name] for name in PACK_OPTION_NAMES if name in options})
    except TypeError as exc:  # a value of the wrong kind that a check compared (None < 1)
        raise PackError(f"invalid option value: {exc}") from None
    return pack_options, RunOptions(**{name: options[name] for name in RUN_OPTION_NAMES if name in options},
                                    given_encoding=given_encoding)


EXPECTED_ERRORS = (PackError, ScanError, DatasetError, OSError)
"""The failures a user can meet (bad input or options, a missing or unreadable SRC, a damaged
dataset, an OS error naming its file): one line each, never a traceback."""


def one_line(exc: BaseException) -> str:
    """The one line the CLI prints, and the API's PackError says, for one of EXPECTED_ERRORS."""
    if isinstance(exc, OSError):
        return f"{exc.filename or 'pack'}: {exc.strerror or exc}"
    return str(exc)


def one_line_errors(call: Callable[[], T]) -> T:
    """Run `call`, turning the library's expected failures into PackError with `one_line`'s message."""
    try:
        return call()
    except PackError:
        raise
    except EXPECTED_ERRORS as exc:
        raise PackError(one_line(exc)) from None


def run(src: str | os.PathLike[str], out: str | os.PathLike[str], options: PackOptions, run_options: RunOptions,
        progress: Callable[[int], None] | None = None, planned: Callable[[int], None] | None = None) -> Summary:
    """Pack with options already split (the CLI's path after parsing); `planned(total)` once the
    plan says how many samples this run packs, before the first `progress`. `run_options.append`:
    add to the dataset in OUT (`packer.run.append`) instead of packing it."""
    pack_or_append = append_run if run_options.append else pack_run
    return one_line_errors(lambda: pack_or_append(src, out, options, run_options, progress=progress, planned=planned))


def pack(src: str | os.PathLike[str], out: str | os.PathLike[str], format: str, *,
         progress: Callable[[int], None] | None = None, **options: Any) -> Summary:
    """Pack SRC into `format` shards in OUT, as `pack FORMAT SRC OUT --option value ...` does.

    `options` are the CLI's flags in snake_case (`shard_size=5000`, `store="raw"`, `workers=4`,
    `on_error="fail"`, `task_index=0, task_count=8`, ...); `progress(n)` is called as samples are
    done. Returns the Summary the CLI prints; raises PackError with the CLI's one-line message.
    """
    if not isinstance(src, (str, os.PathLike)):
        raise PackError(f"src must be one path, URL, glob or brace pattern, not a {type(src).__name__}; for several "
                        "input files use a pattern ('train-*-of-01024', 'data-{000000..000127}.tar')")
    pack_options, run_options = split_options(format, options)
    return run(src, out, pack_options, run_options, progress)


def merge(out: str | os.PathLike[str], *, on_error: str = "skip", max_errors: int | None = None,
          split: str = DEFAULT_SPLIT) -> Manifest:
    """`pack merge OUT` (a directory or a URL): publish index.json once every task's shards are in
    OUT; returns the manifest."""
    return one_line_errors(lambda: merge_shards(out, ErrorPolicy(on_error=on_error, max_errors=max_errors),
                                                split=split))


def pack_samples(fn: Callable[[Any], Any], inputs: Sequence[Any], out: str | os.PathLike[str], format: str, *,
                 progress: Callable[[int], None] | None = None, **options: Any) -> Summary:
    """Pack the samples `fn(input)` returns for each of `inputs`, called in the spawned worker
    processes: a dict (`image` as bytes, a PIL image or a uint8 array; `label`; other keys are
    fields) or a list of them. Options, shards, resume, engines and rejects are `pack`'s; `fn`
    must be importable there (a module-level function), and `fn` and `inputs` picklable.
    """
    if "input_format" in options:
        raise PackError("pack_samples: input_format does not apply (the inputs are fn's)")
    if options.get("append"):
        raise PackError("pack_samples: append is not supported (fn and its inputs are saved with the first pack); "
                        "pack the new samples into another OUT and append that (input_format='pack')")
    if "shard_bytes" in options:  # the plan is made before fn runs: a sample's size is not known then
        raise PackError("pack_samples: shard_bytes does not apply (samples are made in the workers, after the "
                        "shards are planned); shards are cut at shard_size samples")
    pack_options, run_options = split_options(format, {**options, "input_format": "samples"})
    out_path = Path(out)

    def call() -> Path:
        # OUT is checked (and with overwrite emptied of pack's files) before fn and inputs are saved in it.
        run_options.check(out_path, run_options.partition())
        check_out(out_path)
        prepare_output(out_path, overwrite=run_options.overwrite)
        return Path(save_samples(work_dir(out_path), fn, inputs))

    src = one_line_errors(call)
    return run(src, out_path, pack_options, replace(run_options, overwrite=False), progress)
