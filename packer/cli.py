"""The `pack` command: parse options, call the library, print a summary. Nothing else."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from typing import Any

import click
from tqdm import tqdm

from readers.manifest import DatasetError

from . import __version__
from .encode import STORES
from .errors import PackError
from .pipeline import Summary, pack
from .plan import DEFAULT_SHARD_BYTES, DEFAULT_SHARD_SIZE, PackOptions
from .scan import ScanError
from .writers import WRITERS

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


class ByteSize(click.ParamType):
    """Sizes like 4GB, 512MiB or 1000000."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
        unit = match.group(2).lower() if match else ""
        if not match or unit not in _UNITS:
            self.fail(f"{value!r} is not a size (examples: 4GB, 512MiB, 1000000)", param, ctx)
        size = int(float(match.group(1)) * _UNITS[unit])
        if size < 1:
            self.fail(f"{value!r} must be positive", param, ctx)
        return size


def human_bytes(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def print_summary(summary: Summary) -> None:
    resumed = f", {summary.resumed_shards} resumed" if summary.resumed_shards else ""
    click.echo(
        f"packed {summary.num_samples} samples ({human_bytes(summary.bytes)}) into "
        f"{summary.num_shards} shards{resumed} in {summary.elapsed:.1f}s "
        f"({summary.files_per_second:.0f} files/s); {summary.rejects} rejected "
        f"(see {Path(summary.out) / 'rejects.jsonl'}), {summary.ignored} non-image entries ignored"
    )


def make_pack_command(fmt: str) -> click.Command:
    @click.command(name=fmt, help=f"Pack the images under SRC into {fmt} shards in directory OUT.")
    @click.argument("src", type=click.Path(path_type=Path))
    @click.argument("out", type=click.Path(path_type=Path))
    @click.option("--store", type=click.Choice(STORES), default="original", show_default=True,
                  help="What to store per image: the file's bytes unchanged, or a decoded form.")
    @click.option("--shard-size", type=click.IntRange(min=1), default=DEFAULT_SHARD_SIZE, show_default=True,
                  help="Most samples per shard.")
    @click.option("--shard-bytes", type=ByteSize(), default=DEFAULT_SHARD_BYTES, show_default="1GiB",
                  help="Most source bytes per shard (e.g. 4GB, 512MiB).")
    @click.option("--workers", type=click.IntRange(min=1), default=None,
                  help="Parallelism; default: the CPUs this job may use.")
    @click.option("--overwrite", is_flag=True, help="Replace an existing packed dataset in OUT.")
    @click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
    def command(src: Path, out: Path, store: str, shard_size: int, shard_bytes: int,
                workers: int | None, overwrite: bool, quiet: bool) -> None:
        options = PackOptions(format=fmt, store=store, shard_size=shard_size, shard_bytes=shard_bytes)
        # In a batch job's log (not a terminal) the bar still shows, but rarely.
        interval = 0.2 if sys.stderr.isatty() else 30.0
        with tqdm(desc=f"pack {fmt}", unit="img", file=sys.stderr, disable=quiet,
                  mininterval=interval, dynamic_ncols=True) as bar:
            summary = pack(src, out, options, overwrite=overwrite, workers=workers, progress=bar.update)
        print_summary(summary)

    return command


class PackGroup(click.Group):
    """Turns the library's expected failures into one-line errors instead of tracebacks."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (PackError, ScanError, DatasetError) as exc:
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            raise click.ClickException("interrupted; rerun the same command to resume") from None
        except OSError as exc:
            where = exc.filename or "pack"
            raise click.ClickException(f"{where}: {exc.strerror or exc}") from None


@click.group(cls=PackGroup)
@click.version_option(__version__, prog_name="pack")
@click.option("--verbose", "-v", is_flag=True, help="Log what the library does to stderr.")
def main(verbose: bool) -> None:
    """Pack folders of images into LMDB, HDF5 or WebDataset shards for fast PyTorch training."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


for _name, _writer in WRITERS.items():
    main.add_command(make_pack_command(_name))
    for _alias in _writer.aliases:
        main.add_command(make_pack_command(_name), name=_alias)


if __name__ == "__main__":
    main()
