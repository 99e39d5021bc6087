"""`pack show`: each cell of the sheet is the reader's sample, as few shards as possible are read,
and the page escapes what the dataset says and shows its images (parsed, and drawn by headless chromium,
which scripts/setup-tests.sh installs)."""

from __future__ import annotations

import base64
import html
import html.parser
import io
import math
import random
import re
import shutil
import subprocess
import urllib.parse
from pathlib import Path
from typing import Callable

import click
import numpy as np
import pytest
from clirun import run
from conftest import PackedAs
from imagefolders import image_bytes, make_caption_folder, make_image_folder
from loopback import LoopbackHTTP
from PIL import Image

import readers
from packer.run.pipeline import pack
from packer.plan.options import PackOptions
from packer.inspect.show import CELL, fit, show

ROOT = Path(__file__).resolve().parents[1]


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


def test_cells_are_the_readers_samples(packed: tuple[Path, dict[str, bytes]]) -> None:
    out, _ = packed
    sheet = show(out, per_class=3, seed=1)
    dataset = readers.open_dataset(out, decode="pil")
    per_class: dict[int, set[int]] = {}
    for cell in sheet.cells:
        image, label = dataset[cell.index]
        assert cell.text == dataset.classes[label]
        assert np.array_equal(pixels(sheet.image.crop(cell.box)), pixels(fit(image)))
        per_class.setdefault(label, set()).add(cell.index)
    assert {label: len(indices) for label, indices in per_class.items()} == {0: 3, 1: 3, 2: 3}
    assert show(out, per_class=3, seed=1).cells == sheet.cells  # seeded
    assert show(out, per_class=3, seed=2).cells != sheet.cells


def test_a_predecoded_store_shows_the_stored_pixels(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "src", classes=2, per_class=3)
    out = tmp_path / "raw"
    pack(tmp_path / "src", out, PackOptions(format="lmdb", store="raw", resize=20, center_crop=20))
    sheet = show(out, per_class=3)
    dataset = readers.open_dataset(out, decode="bytes")
    factor = CELL // 20
    assert len(sheet.cells) == 6
    for cell in sheet.cells:
        meta, payload = dataset.record(cell.index)
        stored = np.frombuffer(payload, np.uint8).reshape(meta["shape"])
        assert np.array_equal(pixels(sheet.image.crop(cell.box)), stored.repeat(factor, 0).repeat(factor, 1))


def test_an_unlabelled_set_shows_its_captions_or_a_field(tmp_path: Path) -> None:
    samples = make_caption_folder(tmp_path / "src")
    out = tmp_path / "caps"
    pack(tmp_path / "src", out, PackOptions(format="wds", sidecars=("txt", "json"), no_classes=True))
    sheet = show(out, per_class=2, classes=2)
    paths = readers.open_dataset(out, fields=("path",))
    captions = {path: caption for path, (_, caption, _) in samples.items()}
    assert len(sheet.cells) == 4
    assert [cell.text for cell in sheet.cells] == [captions[paths[cell.index][0]] for cell in sheet.cells]
    urls = [cell.text for cell in show(out, per_class=2, field="json").cells]
    assert all(text.startswith('{"url": "https://example.com/') for text in urls)


def test_a_url_reads_only_the_shards_it_needs(serve: Callable[[str], str], http_server: LoopbackHTTP,
                                              packed_as: PackedAs, tmp_path: Path) -> None:
    """The shared pack is sorted by class (6, 7, 7 samples in shards of 4): one class's two samples
    are in one shard, one of each class in at most three of the five. The page reads its rejects there too."""
    url = serve("lmdb")
    names = [f"shard-{number:06d}.lmdb" for number in range(5)]
    base = urllib.parse.urlsplit(url).path

    def fetched() -> list[int]:
        return [http_server.gets[f"{base}/{name}"] for name in names]

    sheet = show(url, per_class=2, classes=1, seed=3)
    assert len(sheet.cells) == 2 and len(sheet.shards_read) == 1
    assert fetched() == [int(number in sheet.shards_read) for number in range(5)]
    before = fetched()
    sheet = show(url, per_class=1)
    assert len(sheet.cells) == 3 and len(sheet.shards_read) <= 3
    assert [now - then for now, then in zip(fetched(), before)] == [int(n in sheet.shards_read) for n in range(5)]
    local = show(packed_as("lmdb")[0], per_class=1)
    assert [cell.index for cell in local.cells] == [cell.index for cell in sheet.cells]
    (http_server.directory / base.strip("/") / "rejects.jsonl").write_text('{"path": "x<y>.jpg", "reason": "truncated"}\n')
    show(url, html_path=tmp_path / "page.html", per_class=1)
    assert "<td>x&lt;y&gt;.jpg</td><td>truncated</td>" in (tmp_path / "page.html").read_text(encoding="utf-8")


class Page(html.parser.HTMLParser):
    """What a browser would make of the page: its tags, image sources and text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.images: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs)["src"] or "")

    def handle_data(self, data: str) -> None:
        self.text.append(data)


HOSTILE_CLASS = "<img src=x onerror=alert(1)>"
REJECT = "<b onclick=alert(2)>bad.jpg"


@pytest.fixture
def hostile_page(tmp_path: Path) -> tuple[Path, Path]:
    """A pack whose class name and reject are HTML, shown as a sheet and a page."""
    src = tmp_path / "src"
    make_image_folder(src, classes=2, per_class=3)
    (src / HOSTILE_CLASS).mkdir()
    (src / HOSTILE_CLASS / "ok.jpg").write_bytes(image_bytes(random.Random(5)))
    (src / HOSTILE_CLASS / REJECT).write_bytes(b"<html>not an image</html>")
    pack(src, tmp_path / "out", PackOptions(format="hdf5"))
    code, output = run("show", tmp_path / "out", "-o", tmp_path / "sheet.png", "--html", tmp_path / "page.html",
                       "--per-class", "2")
    assert code == 0, output
    assert output == f"{tmp_path / 'sheet.png'} and {tmp_path / 'page.html'}: 5 samples from 1 of 1 shards\n"
    return tmp_path / "sheet.png", tmp_path / "page.html"


def test_the_page_escapes_the_dataset_and_embeds_the_sheet(hostile_page: tuple[Path, Path]) -> None:
    sheet, page_path = hostile_page
    page = Page()
    page.feed(page_path.read_text(encoding="utf-8"))
    assert "script" not in page.tags and len(page.images) == 1  # the class name made no tag
    text = "".join(page.text)
    assert HOSTILE_CLASS in text and REJECT in text  # shown as text: in the bars and the rejects
    assert page.tags.count("svg") == 3 and page.tags.count("rect") >= 3  # bars, width and height histograms
    prefix = "data:image/png;base64,"
    assert page.images[0].startswith(prefix)
    embedded = Image.open(io.BytesIO(base64.b64decode(page.images[0][len(prefix):])))
    assert np.array_equal(pixels(embedded), pixels(Image.open(sheet)))


CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
            "--force-device-scale-factor=1", "--window-size=1000,1400", "--virtual-time-budget=10000"]
"""Headless Chromium that reaches nothing outside the page, at one pixel per CSS pixel."""


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="no chromium here: scripts/setup-tests.sh installs it (apt-get, as root)")
def test_the_page_loads_in_a_headless_browser(hostile_page: tuple[Path, Path], tmp_path: Path) -> None:
    """The page as a user opens it: its sheet decodes and is drawn, pixel for pixel, where the
    page lays it out; the hostile class name and reject are text, no element."""
    sheet, page_path = hostile_page
    probe = tmp_path / "probe.html"  # the page, plus a script that says whether its images decoded, and where
    probe.write_text(page_path.read_text(encoding="utf-8").replace("</body>", (
        "<script>addEventListener('load', () => { const all = [...document.images]; const box = "
        "all[0].getBoundingClientRect(); document.title = 'loaded ' + all.filter(image => image.complete && "
        "image.naturalWidth > 0).length + '/' + all.length + ' at ' + box.left + ',' + box.top; });"
        "</script></body>")), encoding="utf-8")

    def chromium(*args: str) -> str:
        result = subprocess.run([*CHROMIUM, f"--user-data-dir={tmp_path / 'profile'}", *args, probe.as_uri()],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout

    dom = chromium("--dump-dom")
    loaded = re.search(r"<title>loaded 1/1 at ([\d.]+),([\d.]+)</title>", dom)
    assert loaded, dom[:2000]
    assert "<img src=\"x\"" not in dom and "<b onclick" not in dom  # no element made of them
    assert html.escape(HOSTILE_CLASS, quote=False) in dom and "class_01" in dom  # the bars name the classes
    chromium(f"--screenshot={tmp_path / 'shot.png'}")
    shot = pixels(Image.open(tmp_path / "shot.png"))
    drawn = pixels(Image.open(sheet))
    x, y = float(loaded.group(1)), float(loaded.group(2))
    assert shot.shape == (1400, 1000, 3)
    # an image is drawn on whole pixels, at its box's place rounded one way or the other
    assert any(np.array_equal(shot[top:top + drawn.shape[0], left:left + drawn.shape[1]], drawn)
               for top in {math.floor(y), math.ceil(y)} for left in {math.floor(x), math.ceil(x)})


def test_errors_are_one_line(tmp_path: Path, packed_as: PackedAs) -> None:
    out, _ = packed_as("lmdb")
    code, output = run("show", tmp_path / "nowhere", "-o", tmp_path / "x.png")
    assert code == 1 and output.count("\n") == 1 and output.startswith("Error: ")
    code, output = run("show", out, "-o", tmp_path / "x.png", "--field", "caption")
    assert (code, output) == (1, f"Error: {out}: no field 'caption'; available: image, label, path, index\n")
    code, output = run("show", out)
    assert code == 2 and "nothing to write: give -o SHEET.png and/or --html PAGE.html" in output
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "x.jpg").write_bytes(b"not an image")
    pack(tmp_path / "src", tmp_path / "empty", PackOptions(format="lmdb"))
    code, output = run("show", tmp_path / "empty", "-o", tmp_path / "x.png")
    assert (code, output) == (1, f"Error: {tmp_path / 'empty'}: no samples to show\n")
    assert not (tmp_path / "x.png").exists()


def test_the_docs_describe_every_option() -> None:
    from packer.cli import show_command

    docs = (ROOT / "README.md").read_text(encoding="utf-8") + (ROOT / "docs" / "reading.md").read_text(encoding="utf-8")
    assert "pack show OUT" in docs
    for option in show_command.params:
        if isinstance(option, click.Option):
            assert any(name in docs for name in option.opts if name.startswith("--")), option.opts
