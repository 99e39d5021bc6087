"""Seeded synthetic image folders for tests: classes, nested folders, odd names, mixed formats."""

from __future__ import annotations

import io
import json
import os
import random
from pathlib import Path

from PIL import Image


def image_bytes(rng: random.Random, fmt: str = "JPEG", size: tuple[int, int] | None = None, mode: str = "RGB") -> bytes:
    width, height = size or (rng.randint(16, 64), rng.randint(16, 64))
    color = tuple(rng.randrange(256) for _ in range(len(mode))) if mode != "L" else rng.randrange(256)
    image = Image.new(mode, (width, height), color)
    # A few random pixels so no two images are byte-identical.
    for _ in range(8):
        value = tuple(rng.randrange(256) for _ in range(len(mode))) if mode != "L" else rng.randrange(256)
        image.putpixel((rng.randrange(width), rng.randrange(height)), value)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def make_image_folder(root: Path, *, classes: int = 3, per_class: int = 5, seed: int = 0) -> dict[str, bytes]:
    """An ImageFolder tree; returns {relative posix path: file bytes} of every image in it."""
    rng = random.Random(seed)
    files: dict[str, bytes] = {}
    for c in range(classes):
        for i in range(per_class):
            nested = "sub/deeper/" if i % 4 == 3 else ""
            rel = f"class_{c:02d}/{nested}img {i:03d}.jpg"
            files[rel] = image_bytes(rng)
    if classes >= 3:
        files["class_00/pic.PNG"] = image_bytes(rng, "PNG")
        files["class_01/ünïcode-名前.jpeg"] = image_bytes(rng)
        files["class_01/dots.in.name.jpg"] = image_bytes(rng)
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    if classes >= 3:
        (root / "class_00" / "notes.txt").write_text("not an image")
        (root / "class_02" / ".hidden.jpg").write_bytes(image_bytes(rng))
        (root / ".git").mkdir()
    return files


def add_non_utf8_file(root: Path, data: bytes) -> str:
    """A file whose name is not valid UTF-8; returns its path in os.fsdecode form."""
    raw = os.fsencode(root / "class_02") + b"/bad-\xff\xfe.jpg"
    with open(raw, "wb") as handle:
        handle.write(data)
    return "class_02/" + os.fsdecode(b"bad-\xff\xfe.jpg")


def make_caption_folder(root: Path, *, folders: int = 2, per_folder: int = 3, seed: int = 0) -> dict[str, tuple[bytes, str, dict]]:
    """img2dataset's `files` layout: `00000/000000000.jpg` + `.txt` (caption) + `.json` (metadata);
    returns {image path: (image bytes, caption, metadata)}."""
    rng = random.Random(seed)
    samples: dict[str, tuple[bytes, str, dict]] = {}
    for folder in range(folders):
        for row in range(per_folder):
            key = f"{folder:05d}/{folder:05d}{row:04d}"
            caption = f"a photo of thing {folder}-{row}, ünïcode 名前"
            meta = {"url": f"https://example.com/{key}.jpg", "caption": caption, "status": "success",
                    "width": 64, "height": 48, "extra": {"tags": ["a", row], "score": row / 7}}
            data = image_bytes(rng)
            (root / key).parent.mkdir(parents=True, exist_ok=True)
            (root / f"{key}.jpg").write_bytes(data)
            (root / f"{key}.txt").write_text(caption, encoding="utf-8")
            (root / f"{key}.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
            samples[f"{key}.jpg"] = (data, caption, meta)
    return samples
