"""SRC -> the listing to pack: the input kinds of `packer.sources`, composed as the options say.

The images come from the folder walk, or from a file list (`--files-from`); their labels from
their top-level folders (an ImageFolder), from a metadata file (`--metadata`, which adds its other
columns as fields) or nowhere (`--no-classes`), through a fixed class list when `--classes` names
one; `--sidecars` adds fields read beside each image when it is packed. A SRC that is a container
input (tar shards, a packed dataset, ...: `packer.sources.inputs`) is listed by its kind's module.
"""

from __future__ import annotations

import os
import time

from ..errors import PackError
from .options import PackOptions
from ..sources.classes import ClassMap, read_classes, relabel_folders
from ..sources.containers import scan_container
from ..sources.filelist import list_files
from ..sources.inputs import Source, check_kind_options, resolve_source
from ..sources.listing import UNLABELLED, Listing, ScanError
from ..sources.metadata import apply_metadata, read_metadata
from ..sources.remote import walk_url
from ..sources.sidecars import sidecar_specs
from ..sources.walk import walk

__all__ = ["UNLABELLED", "Listing", "ScanError", "scan", "scan_source"]


def scan(src: str | os.PathLike[str] | Source, options: PackOptions | None = None, *, times: bool = False) -> Listing:
    """List what `options` says to pack from `src` (resolved already, or a path or URL), sorted by
    relative path (no options: the walk). The listing records when the scan began (`listed_at`),
    and with `times` each file's modification time where the source tells it (`Listing.mtimes`)."""
    listed_at = time.time_ns()
    listing = scan_listing(src, options, times)
    listing.listed_at = listed_at
    return listing


def scan_listing(src: str | os.PathLike[str] | Source, options: PackOptions | None, times: bool) -> Listing:
    """`scan` less the time it began."""
    if options is None:
        return walk(src.location if isinstance(src, Source) else src)
    source = src if isinstance(src, Source) else resolve_source(src, options.input_format)
    check_kind_options(source.kind, options)
    if source.kind != "folder":
        return scan_container(source, options)
    companions = frozenset("." + extension for extension in options.sidecars)
    folders_are_classes = options.metadata is None and not options.no_classes
    src = source.location
    if source.is_url:
        if options.files_from is not None or options.sidecars:
            raise ScanError(f"{src}: --files-from and --sidecars need a local SRC")
        listing = walk_url(source.root, folders_are_classes=folders_are_classes, companions=companions, times=times)
    elif options.files_from is not None:
        listing = list_files(src, options.files_from, null=options.null, folders_are_classes=folders_are_classes,
                             companions=companions)
    else:
        listing = walk(src, folders_are_classes=folders_are_classes, companions=companions, times=times)
    classes = ClassMap(read_classes(options.classes), options.classes) if options.classes is not None else None
    if options.metadata is not None:
        apply_metadata(listing, read_metadata(options.metadata, options.label_column), options.label_column, classes)
    elif classes is not None:
        relabel_folders(listing, classes)
    sidecars = sidecar_specs(options.sidecars, options.sidecars_optional)
    clash = {spec.name for spec in listing.fields} & {spec.name for spec in sidecars}
    if clash:
        raise ScanError(f"{options.metadata}: column {sorted(clash)[0]!r} is also a --sidecars field; rename one")
    listing.fields += sidecars
    return listing


def scan_source(source: Source, options: PackOptions, *, times: bool = False) -> Listing:
    """`scan` of a resolved SRC, refused when it holds nothing to pack."""
    listing = scan(source, options, times=times)
    if not len(listing):
        first = f" (rejected: {listing.rejects[0][0]}: {listing.rejects[0][1]})" if listing.rejects else ""
        raise PackError(f"{source.named}: no image files found{first}")
    return listing
