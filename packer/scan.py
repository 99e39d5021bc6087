"""SRC -> the listing to pack: the input kinds of `packer.sources`, composed as the options say.

The folder walk lists the images (labelled by top-level folder, an ImageFolder); `--sidecars`
adds fields read beside each image when it is packed.
"""

from __future__ import annotations

import os

from .plan import PackOptions
from .sources.listing import UNLABELLED, Listing, ScanError
from .sources.sidecars import sidecar_specs
from .sources.walk import walk

__all__ = ["UNLABELLED", "Listing", "ScanError", "scan"]


def scan(src: str | os.PathLike[str], options: PackOptions | None = None) -> Listing:
    """List what `options` says to pack from `src`, sorted by relative path (no options: the walk)."""
    if options is None:
        return walk(src)
    companions = frozenset("." + extension for extension in options.sidecars)
    listing = walk(src, companions=companions)
    listing.fields += sidecar_specs(options.sidecars, options.sidecars_optional)
    return listing
