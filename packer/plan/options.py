"""PackOptions: everything that changes the packed result, recorded in the plan and the manifest.

Three groups, each checked where it is declared: how samples are encoded (`ENCODE_OPTIONS`,
`packer.write.encode`), how they are cut into shards and ordered (`SHARD_OPTIONS`), and where they come
from (`SOURCE_OPTIONS`: the folder's options, and those an input kind declares in
`packer.sources.inputs.INPUT_KINDS`, checked against SRC's kind by `check_kind_options`). The
fields stay one flat record, as plan.json and index.json have always stored them.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Iterable

from ..write.encode import DEFAULT_QUALITY, ENCODE_OPTIONS, PIXEL_MODES, STORES
from ..errors import PackError
from ..sources.inputs import INPUT_FORMATS
from ..sources.metadata import DEFAULT_LABEL_COLUMN
from ..sources.sidecars import extension_problem
from ..write.validate import DEFAULT_MAX_PIXELS, VALIDATE_MODES

DEFAULT_ORDER = "shuffled"
ORDERS = ("shuffled", "sorted")
"""`--order`: how `packer.plan.pack_order.arrange` puts the listing in packing order."""
MAX_SEED = 2**64 - 1

DEFAULT_SHARD_SIZE = 10_000
DEFAULT_IMAGE_KEY = "image/encoded"  # TFRecord features (packer.sources.tfrecord): ImageNet's names
DEFAULT_LABEL_KEY = "image/class/label"
DEFAULT_SHARD_BYTES = 1 << 30


SHARD_OPTIONS = ("shard_size", "shard_bytes", "order", "seed")
SOURCE_OPTIONS = ("files_from", "null", "metadata", "label_column", "classes", "no_classes", "sidecars",
                  "sidecars_optional", "input_format", "image_key", "label_key", "label_offset")


@dataclass(frozen=True)
class PackOptions:
    """Everything that changes the packed result; recorded in the plan and the manifest."""

    format: str
    store: str = "original"
    shard_size: int = DEFAULT_SHARD_SIZE
    shard_bytes: int = DEFAULT_SHARD_BYTES
    mode: str | None = None
    resize: int | None = None
    max_side: int | None = None
    center_crop: int | None = None
    quality: int | None = None
    validate: str = "quick"
    max_pixels: int = DEFAULT_MAX_PIXELS
    # Where samples, labels and fields come from (packer.sources); files by absolute path.
    files_from: str | None = None  # "-": standard input
    null: bool = False
    metadata: str | None = None
    label_column: str = DEFAULT_LABEL_COLUMN
    classes: str | None = None
    no_classes: bool = False
    sidecars: tuple[str, ...] = ()
    sidecars_optional: bool = False
    input_format: str | None = None  # None: what SRC looks like (packer.sources.inputs.resolve_source)
    image_key: str = DEFAULT_IMAGE_KEY  # TFRecord features (packer.sources.tfrecord)
    label_key: str = DEFAULT_LABEL_KEY
    label_offset: int = 0
    # The order samples are packed in (packer.plan.pack_order): a seeded shuffle, or the listing's sorted order.
    order: str = DEFAULT_ORDER
    seed: int = 0

    def __post_init__(self) -> None:
        """Reject contradictory options; fill in the defaults of decoding stores (RGB, quality 90)."""
        object.__setattr__(self, "sidecars", tuple(self.sidecars))  # a list, when read back from plan.json
        self._check_sources()
        if self.shard_size < 1:
            raise PackError(f"--shard-size must be at least 1, not {self.shard_size}")
        if self.shard_bytes < 1:
            raise PackError(f"--shard-bytes must be positive, not {self.shard_bytes}")
        if self.store not in STORES:
            raise PackError(f"--store must be one of {', '.join(STORES)}, not {self.store!r}")
        sizes = {"--resize": self.resize, "--max-side": self.max_side, "--center-crop": self.center_crop}
        for flag, value in sizes.items():
            if value is not None and value < 1:
                raise PackError(f"{flag} must be at least 1, not {value}")
        if self.store == "original":
            given = [flag for flag, value in {**sizes, "--mode": self.mode}.items() if value is not None]
            if given:
                raise PackError(f"{given[0]} needs a store that decodes (--store raw, bmp or jpeg); original keeps file bytes")
        elif self.mode is None:
            object.__setattr__(self, "mode", "RGB")
        if self.mode is not None and self.mode not in PIXEL_MODES:
            raise PackError(f"--mode must be one of {', '.join(PIXEL_MODES)}, not {self.mode!r}")
        if self.resize is not None and self.max_side is not None and self.max_side < self.resize:
            raise PackError(f"--max-side {self.max_side} is smaller than --resize {self.resize}")
        if self.store != "jpeg":
            if self.quality is not None:
                raise PackError("--quality applies only to --store jpeg")
        elif self.quality is None:
            object.__setattr__(self, "quality", DEFAULT_QUALITY)
        elif not 1 <= self.quality <= 100:
            raise PackError(f"--quality must be between 1 and 100, not {self.quality}")
        if self.validate not in VALIDATE_MODES:
            raise PackError(f"--validate must be one of {', '.join(VALIDATE_MODES)}, not {self.validate!r}")
        if self.max_pixels < 1:
            raise PackError(f"--max-pixels must be at least 1, not {self.max_pixels}")
        if self.order not in ORDERS:
            raise PackError(f"--order must be one of {', '.join(ORDERS)}, not {self.order!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise PackError(f"--seed must be an integer from 0 to {MAX_SEED}, not {self.seed!r}")

    def _check_sources(self) -> None:
        for name in ("files_from", "metadata", "classes"):
            value = getattr(self, name)
            if value is not None and value != "-":
                object.__setattr__(self, name, os.path.abspath(value))  # the plan outlives the working directory
        if self.metadata == "-" or self.classes == "-":
            raise PackError("only --files-from reads standard input (-)")
        if self.null and self.files_from is None:
            raise PackError("--null needs --files-from")
        if self.label_column != DEFAULT_LABEL_COLUMN and self.metadata is None:
            raise PackError("--label-column needs --metadata")
        if self.no_classes and (self.metadata is not None or self.classes is not None):
            raise PackError("--no-classes contradicts " + ("--metadata (its labels come from the label column)"
                                                           if self.metadata is not None else "--classes"))
        for extension in self.sidecars:
            problem = extension_problem(extension)
            if problem:
                raise PackError(f"--sidecars {extension}: {problem}")
        if len(set(self.sidecars)) != len(self.sidecars):
            raise PackError(f"--sidecars names an extension twice: {','.join(self.sidecars)}")
        if self.sidecars_optional and not self.sidecars:
            raise PackError("--sidecars-optional needs --sidecars")
        if self.input_format is not None and self.input_format not in INPUT_FORMATS:
            raise PackError(f"--input-format must be one of {', '.join(INPUT_FORMATS)}, not {self.input_format!r}")

    def is_given(self, name: str) -> bool:
        """Whether option `name` differs from its default."""
        return getattr(self, name) != PackOptions.__dataclass_fields__[name].default

    @property
    def encoding(self) -> dict[str, Any]:
        """The keyword arguments of `encode.encode` (unset ones left to its defaults)."""
        return {key: getattr(self, key) for key in ENCODE_OPTIONS if getattr(self, key) is not None}

    @property
    def sample_shape(self) -> tuple[int, int, int] | None:
        """The (H, W, C) every sample has when the options guarantee one: raw pixels, center-cropped."""
        if self.store != "raw" or self.center_crop is None or self.mode is None:
            return None
        return (self.center_crop, self.center_crop, len(self.mode))


STORE_FILLED = ("mode", "quality")
"""Options `PackOptions` fills in from --store when not given (RGB, quality 90) and leaves unset for
a store they do not apply to: where the stores differ, so do they, and the store names the change."""


def option_flag(name: str) -> str:
    return "format" if name == "format" else "--" + name.replace("_", "-")


def shown_value(value: Any) -> str:
    """An option's effective value as a message shows it: an option never set is `not set`, not None."""
    return "not set" if value is None else str(value)


def differing_options(old: dict[str, Any], new: dict[str, Any], names: Iterable[str]) -> list[str]:
    """The options among `names` whose values differ, leaving out those that differ only because
    --store does (`STORE_FILLED`)."""
    stores_differ = old.get("store") != new.get("store")
    return [name for name in names if old.get(name) != new.get(name)
            and not (stores_differ and name in STORE_FILLED and None in (old.get(name), new.get(name)))]


def option_differences(before: PackOptions, now: PackOptions) -> list[str]:
    """`--shard-size: 2 before, 4 now` for each option that differs, named as its flag."""
    old, new = asdict(before), asdict(now)
    return [f"{option_flag(name)}: {shown_value(old[name])} before, {shown_value(new[name])} now"
            for name in differing_options(old, new, old)]
