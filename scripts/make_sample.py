"""Write a small seeded ImageFolder of JPEGs (and one PNG) for the demo and benchmarks."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from PIL import Image, ImageDraw


def make_sample(root: Path, classes: int, per_class: int, size: tuple[int, int], seed: int = 0) -> int:
    rng = random.Random(seed)
    count = 0
    for c in range(classes):
        folder = root / f"class_{c:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            image = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))
            draw = ImageDraw.Draw(image)
            for _ in range(12):
                x0, y0 = rng.randrange(size[0]), rng.randrange(size[1])
                box = (x0, y0, x0 + rng.randrange(1, size[0] // 2), y0 + rng.randrange(1, size[1] // 2))
                draw.ellipse(box, fill=tuple(rng.randrange(256) for _ in range(3)))
            name, fmt = (f"{i:05d}.png", "PNG") if i == 0 else (f"{i:05d}.jpg", "JPEG")
            image.save(folder / name, format=fmt, quality=90)
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("root", type=Path)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--per-class", type=int, default=25)
    parser.add_argument("--width", type=int, default=500)
    parser.add_argument("--height", type=int, default=375)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    count = make_sample(args.root, args.classes, args.per_class, (args.width, args.height), args.seed)
    print(f"wrote {count} images in {args.classes} classes under {args.root}")


if __name__ == "__main__":
    main()
