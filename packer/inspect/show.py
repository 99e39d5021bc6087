"""`pack show`: a contact sheet of a packed dataset, and an HTML page around it.

Users check a pack by looking at it: are the labels right, did the crop cut off heads, is each
caption on its image? Every cell is drawn from what `open_dataset(out, decode="pil")` returns for
that sample, so a pre-decoded store shows the pixels training gets. Samples are drawn by a seed
and read from as few shards as the manifest's class counts allow (a URL through a small temporary
cache, as `pack info` does). Everything the dataset says (class names, captions, rejects) is
untrusted text: the page escapes all of it.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from readers.base import PackedDataset
from readers.datasets import open_dataset
from readers.manifest import REJECTS_NAME, DatasetError, Manifest
from readers.remote import UrlFilesystem, is_url
from readers.stores import read_manifest

from .dataset import small_cache, stored_size

log = logging.getLogger(__name__)

CELL = 96
"""Side of a cell's image box in pixels: larger images are shrunk into it, small ones enlarged by
a whole factor (nearest neighbour), so every stored pixel stays visible as it is."""
GAP = 6
MARGIN = 10
LINE = 14
TEXT_LINES = 3
"""Lines of text under a cell (a caption wraps; the rest is cut, '...' marking the cut)."""
SIZE_SAMPLE = 1000
"""Stored sizes read for the page's histogram, only from the shards the sheet reads anyway."""
REJECTS_BYTES = 1 << 20
"""rejects.jsonl is read up to this size: a stranger's file may be huge."""
REJECTS_SHOWN = 1000
PAPER, BOX, INK, MUTED = (255, 255, 255), (224, 224, 224), (0, 0, 0), (96, 96, 96)


@dataclass(frozen=True)
class Cell:
    """One sample on the sheet: its dataset index, the box its image fills, the text under it."""

    index: int
    box: tuple[int, int, int, int]
    text: str


@dataclass
class Sheet:
    image: Image.Image
    cells: list[Cell]
    manifest: Manifest
    shards_read: list[int]
    sizes: list[tuple[int, int]]
    """(width, height) of stored images among the records read, for the page's histogram."""


@dataclass
class _Row:
    title: str | None  # a class's header; None for the rows of an unlabelled set
    samples: list[tuple[int, Image.Image, str]]  # (index, reader's image, text)


def show(out: str | os.PathLike[str], *, sheet_path: str | os.PathLike[str] | None = None,
         html_path: str | os.PathLike[str] | None = None, per_class: int = 8, classes: int = 20,
         field: str | None = None, seed: int = 0) -> Sheet:
    """Draw the sheet of `out` (a folder or URL) and write it as PNG and/or an HTML page."""
    manifest = read_manifest(out)
    with small_cache(out, manifest, "show") as remote:
        sheet = make_sheet(out, manifest, per_class=per_class, classes=classes, field=field, seed=seed,
                           sizes=html_path is not None, **remote)
    if sheet_path is not None:
        sheet.image.save(sheet_path, format="PNG")
    if html_path is not None:
        Path(html_path).write_text(page(str(out), sheet, read_rejects(out)), encoding="utf-8")
    return sheet


def make_sheet(out: str | os.PathLike[str], manifest: Manifest, *, per_class: int = 8, classes: int = 20,
               field: str | None = None, seed: int = 0, sizes: bool = False, **remote: Any) -> Sheet:
    """Up to `classes` classes drawn by `seed` (rows of an unlabelled set), `per_class` samples each,
    under each the class name or `field` (an unlabelled set: its first text field, else the path)."""
    if field is None and not manifest.classes:
        field = next((spec.name for spec in manifest.fields if spec.type == "str"), "path")
    dataset = open_dataset(out, decode="pil", fields=("image", "label", *((field,) if field else ())), **remote)
    try:
        rows, shards_read, stored = _pick(dataset, per_class, classes, seed, sizes)
    finally:
        dataset.close()
    if not any(row.samples for row in rows):
        raise DatasetError(f"{out}: no samples to show")
    log.info("%s: %d samples from %d of %d shards", out, sum(len(row.samples) for row in rows),
             len(shards_read), len(manifest.shards))
    title = (f"{out}: {manifest.format}, store {manifest.store}, {manifest.num_samples} samples, "
             + (f"{len(manifest.classes)} classes" if manifest.classes else "unlabelled"))
    image, cells = _draw(title, rows, per_class)
    return Sheet(image, cells, manifest, shards_read, stored)


def _pick(dataset: PackedDataset, per_class: int, classes: int, seed: int,
          sizes: bool) -> tuple[list[_Row], list[int], list[tuple[int, int]]]:
    """Read shards, the likeliest to hold a still-missing class first, each in a seeded order of
    its samples, until every shown class has its samples; decode those while their shard is open
    (a URL's cache may drop it later)."""
    manifest = dataset.manifest
    rng = random.Random(seed)
    labelled = bool(manifest.classes)
    counts: list[int | None] = list(manifest.class_counts) or [None] * len(manifest.classes)
    if labelled:
        candidates = [label for label, count in enumerate(counts) if count != 0]
        shown = sorted(rng.sample(candidates, min(classes, len(candidates))))
        need = {label: per_class if counts[label] is None else min(per_class, counts[label] or 0) for label in shown}
    else:
        need = {-1: min(classes * per_class, manifest.num_samples)}
    got: dict[int, list[tuple[int, Image.Image, str]]] = {label: [] for label in need}
    starts = [0]
    for shard in manifest.shards:
        starts.append(starts[-1] + shard.num_samples)
    likely = _likely_classes(manifest, starts) if labelled else [{} for _ in manifest.shards]
    order_key = {shard: rng.random() for shard in range(len(manifest.shards))}
    left = [shard for shard, info in enumerate(manifest.shards)
            if info.num_samples and not (labelled and info.num_classes == 0)]
    stored: list[tuple[int, int]] = []
    shards_read: list[int] = []

    def missing() -> dict[int, int]:
        return {label: wanted - len(got[label]) for label, wanted in need.items() if len(got[label]) < wanted}

    def expected(shard: int) -> int:
        """Samples of still-missing classes the shard would give a class-sorted pack."""
        return sum(min(held, wanted) for label, wanted in missing().items() if (held := likely[shard].get(label)))

    while left and missing():
        shard = max(left, key=lambda s: (expected(s), order_key[s]))
        left.remove(shard)
        shards_read.append(shard)
        order = list(range(manifest.shards[shard].num_samples))
        rng.shuffle(order)
        for local in order:
            index = starts[shard] + local
            meta, payload = dataset.record(index)
            if sizes and len(stored) < SIZE_SAMPLE and (size := stored_size(meta, payload)) is not None:
                stored.append(size)
            label = int(meta.get("label", -1)) if labelled else -1
            if label in need and len(got[label]) < need[label]:
                image, label_value, *rest = dataset[index]
                text = _text(rest[0]) if rest else manifest.classes[label_value]
                got[label].append((index, image, text))
            if not missing() and not (sizes and len(stored) < SIZE_SAMPLE):
                break
        dataset.close_shard(shard)
    if labelled:
        rows_out = [_Row(f"{label}  {manifest.classes[label]}"
                         + (f"  ({counts[label]} samples)" if counts[label] is not None else ""), got[label])
                    for label in need]
    else:
        samples = got[-1]
        rows_out = [_Row(None, samples[start:start + per_class]) for start in range(0, len(samples), per_class)]
    return rows_out, shards_read, stored


def _likely_classes(manifest: Manifest, starts: list[int]) -> list[dict[int, int]]:
    """Per shard, class -> samples it would hold if the pack were sorted by class (class folders
    in sorted order: class c fills the samples after those of classes < c). Right for such a pack,
    harmless for a shuffled one, whose every shard holds most classes anyway."""
    likely: list[dict[int, int]] = [{} for _ in manifest.shards]
    first = 0
    for label, count in enumerate(manifest.class_counts):
        for shard in range(len(manifest.shards)):
            overlap = min(first + count, starts[shard + 1]) - max(first, starts[shard])
            if overlap > 0:
                likely[shard][label] = overlap
        first += count
    return likely


def _text(value: Any) -> str:
    """A field's value as one line of text: strings as they are, the rest as JSON."""
    if value is None:
        text = "(none)"
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value.tolist() if hasattr(value, "tolist") else value, ensure_ascii=False, default=str)
    return "".join(char if char.isprintable() else " " for char in text)


def fit(image: Image.Image, side: int = CELL) -> Image.Image:
    """The image as an RGB cell of at most side x side: shrunk (aspect kept) or enlarged by the
    largest whole factor, so a small pre-decoded image shows its exact pixels."""
    image = image.convert("RGB")
    width, height = image.size
    if max(width, height) > side:
        image = image.copy()
        image.thumbnail((side, side))
        return image
    factor = side // max(width, height, 1)
    return image.resize((width * factor, height * factor), Image.Resampling.NEAREST) if factor > 1 else image


def _fitting(draw: ImageDraw.ImageDraw, text: str, width: int, font: Any) -> int:
    """How many leading characters of `text` fit in `width` pixels (a binary search: captions run long)."""
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if draw.textlength(text[:middle], font=font) <= width:
            low = middle
        else:
            high = middle - 1
    return low


def _fitted_text(draw: ImageDraw.ImageDraw, text: str, width: int, font: Any) -> str:
    """`text` cut to `width` pixels, '...' marking the cut."""
    if draw.textlength(text, font=font) <= width:
        return text
    return text[:_fitting(draw, text, width - draw.textlength("...", font=font), font)] + "..."


def _wrapped(draw: ImageDraw.ImageDraw, text: str, width: int, font: Any) -> list[str]:
    """`text` in at most TEXT_LINES lines of `width` pixels, broken at spaces where it can be."""
    lines: list[str] = []
    while text and len(lines) < TEXT_LINES - 1:
        cut = _fitting(draw, text, width, font) or 1
        if cut < len(text) and (space := text.rfind(" ", 0, cut + 1)) > 0:
            cut = space
        lines.append(text[:cut])
        text = text[cut:].lstrip()
    return [*lines, _fitted_text(draw, text, width, font)] if text else lines


def _draw(title: str, rows: list[_Row], per_class: int) -> tuple[Image.Image, list[Cell]]:
    font = ImageFont.load_default()
    width = max(2 * MARGIN + per_class * (CELL + GAP) - GAP, 320)
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    texts = [[_wrapped(measure, text[:500], CELL, font) for _, _, text in row.samples] for row in rows]
    heights = [(LINE if row.title is not None else 0) + CELL + LINE * max(map(len, lines), default=1) + GAP
               for row, lines in zip(rows, texts)]
    sheet = Image.new("RGB", (width, MARGIN + LINE + GAP + sum(heights) + MARGIN), PAPER)
    draw = ImageDraw.Draw(sheet)
    draw.text((MARGIN, MARGIN), _fitted_text(draw, _text(title), width - 2 * MARGIN, font), fill=INK, font=font)
    y = MARGIN + LINE + GAP
    cells: list[Cell] = []
    for row, lines, row_height in zip(rows, texts, heights):
        top_of_row = y
        if row.title is not None:
            draw.text((MARGIN, y), _fitted_text(draw, _text(row.title), width - 2 * MARGIN, font), fill=INK, font=font)
            y += LINE
        for column, ((index, image, text), cell_lines) in enumerate(zip(row.samples, lines)):
            x = MARGIN + column * (CELL + GAP)
            draw.rectangle((x, y, x + CELL - 1, y + CELL - 1), fill=BOX)
            thumb = fit(image)
            left, top = x + (CELL - thumb.width) // 2, y + (CELL - thumb.height) // 2
            sheet.paste(thumb, (left, top))
            for number, line in enumerate(cell_lines):
                draw.text((x, y + CELL + 1 + number * LINE), line, fill=MUTED, font=font)
            cells.append(Cell(index, (left, top, left + thumb.width, top + thumb.height), text))
        y = top_of_row + row_height
    return sheet, cells


def read_rejects(out: str | os.PathLike[str]) -> tuple[list[str], bool]:
    """The lines of OUT's rejects.jsonl (none if it has none), and whether it went on past REJECTS_BYTES."""
    try:
        if is_url(out):
            fs, base = UrlFilesystem(str(out)).filesystem()
            with fs.open(f"{base}/{REJECTS_NAME}", "rb") as handle:
                data = handle.read(REJECTS_BYTES + 1)
        else:
            with open(Path(out) / REJECTS_NAME, "rb") as handle:
                data = handle.read(REJECTS_BYTES + 1)
    except FileNotFoundError:
        return [], False
    cut = len(data) > REJECTS_BYTES
    lines = data[:REJECTS_BYTES].decode("utf-8", "replace").splitlines()
    return [line for line in (lines[:-1] if cut else lines) if line.strip()], cut


def page(out: str, sheet: Sheet, rejects: tuple[list[str], bool]) -> str:
    """A self-contained HTML page: the sheet (a data: URI), samples per class, stored sizes, rejects."""
    e = html.escape
    manifest = sheet.manifest
    buffer = io.BytesIO()
    sheet.image.save(buffer, format="PNG")
    png = base64.b64encode(buffer.getvalue()).decode("ascii")
    lines, cut = rejects
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>pack show: {e(out)}</title>",
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;font-size:small}"
        "svg text{font-size:11px;font-family:sans-serif}</style>",
        "</head><body>",
        f"<h1>{e(out)}</h1>",
        f"<p>{e(manifest.format)} shards, store {e(manifest.store)}, {manifest.num_samples} samples, "
        f"{len(manifest.classes)} classes, {len(manifest.shards)} shards ({len(sheet.shards_read)} read for this page).</p>",
        "<h2>Samples</h2>",
        f'<p><img src="data:image/png;base64,{png}" width="{sheet.image.width}" height="{sheet.image.height}" '
        'alt="contact sheet: samples as the reader returns them"></p>',
        "<h2>Samples per class</h2>",
        _bars(manifest) if manifest.classes and manifest.class_counts else "<p>No class counts: an unlabelled set.</p>",
        "<h2>Stored image sizes</h2>",
        (f"<p>{len(sheet.sizes)} records of the {len(sheet.shards_read)} shards read.</p>"
         + _histogram([w for w, _ in sheet.sizes], "width") + _histogram([h for _, h in sheet.sizes], "height"))
        if sheet.sizes else "<p>No image sizes read.</p>",
        f"<h2>Rejects: {'at least ' if cut else ''}{len(lines)}</h2>",
        _rejects_table(lines[:REJECTS_SHOWN]) if lines else "<p>None.</p>",
        f"<p>The first {REJECTS_SHOWN} are listed.</p>" if len(lines) > REJECTS_SHOWN else "",
        "</body></html>",
    ]
    return "\n".join(part for part in parts if part) + "\n"


def _bars(manifest: Manifest) -> str:
    """Inline SVG: one horizontal bar per class, its name (escaped) and count."""
    e = html.escape
    row, label_width, bar_width = 14, 200, 400
    most = max(manifest.class_counts, default=0) or 1
    height = row * len(manifest.classes) + 4
    items = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_width + bar_width + 80}" height="{height}" '
             'role="img" aria-label="samples per class">']
    for label, (name, count) in enumerate(zip(manifest.classes, manifest.class_counts)):
        y = label * row + 2
        short = name if len(name) <= 32 else name[:31] + "..."
        items.append(f'<g><title>{label} {e(name)}: {count}</title>'
                     f'<text x="{label_width - 6}" y="{y + 10}" text-anchor="end">{e(short)}</text>'
                     f'<rect x="{label_width}" y="{y}" width="{count / most * bar_width:.1f}" height="{row - 3}" fill="#4a7ab5"/>'
                     f'<text x="{label_width + count / most * bar_width + 4:.1f}" y="{y + 10}">{count}</text></g>')
    items.append("</svg>")
    return "\n".join(items)


def _histogram(values: list[int], name: str, bins: int = 20) -> str:
    """Inline SVG: a histogram of `values` (pixels) in up to `bins` equal bins from min to max."""
    low, high = min(values), max(values)
    step = max(1, -(-(high - low + 1) // bins))
    counts = [0] * (-(-(high - low + 1) // step))
    for value in values:
        counts[(value - low) // step] += 1
    width, height, bar = 420, 120, 400 / len(counts)
    most = max(counts)
    items = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 30}" role="img" '
             f'aria-label="histogram of stored {name}">']
    for number, count in enumerate(counts):
        top = height - count / most * (height - 14)
        start = low + number * step
        items.append(f'<g><title>{name} {start}-{start + step - 1}: {count}</title>'
                     f'<rect x="{10 + number * bar:.1f}" y="{top:.1f}" width="{max(bar - 1, 1):.1f}" '
                     f'height="{height - top:.1f}" fill="#4a7ab5"/></g>')
    items.append(f'<text x="10" y="{height + 14}">{low}</text>'
                 f'<text x="410" y="{height + 14}" text-anchor="end">{low + len(counts) * step - 1}</text>'
                 f'<text x="210" y="{height + 28}" text-anchor="middle">{name} (px), {most} at most per bar</text>')
    items.append("</svg>")
    return "\n".join(items)


def _rejects_table(lines: list[str]) -> str:
    """One row per rejects.jsonl line: path and reason, escaped; a line that is not JSON as it is."""
    e = html.escape
    rows = ["<table><tr><th>path</th><th>reason</th></tr>"]
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if isinstance(entry, dict):
            path, reason = str(entry.get("path", "")), str(entry.get("reason", ""))
        else:
            path, reason = line, "(not a rejects.jsonl entry)"
        rows.append(f"<tr><td>{e(path)}</td><td>{e(reason)}</td></tr>")
    rows.append("</table>")
    return "\n".join(rows)
