"""Bad and odd input files, in every format: what is packed, what is rejected and why, and the error policy."""

from __future__ import annotations

import io
import json
import os
import random
import struct
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import pytest
from clirun import run
from imagefolders import add_non_utf8_file, image_bytes
from PIL import Image

import readers
from packer.errors import PackError, RejectedFile
from packer.run.pipeline import pack
from packer.plan.options import PackOptions
from packer.write.validate import ErrorPolicy, check_image, header_size
from packer.write.writers import WRITERS


def encoded(image: Image.Image, fmt: str, **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def bomb_png(width: int, height: int) -> bytes:
    """A tiny, well-formed PNG whose IHDR claims width x height RGB pixels."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", zlib.compress(b""))
            + png_chunk(b"IEND", b""))


def corrupt_middle_jpeg(data: bytes) -> bytes:
    """Header and end marker intact, Huffman table destroyed: only decoding the pixels notices."""
    table = data.find(b"\xff\xc4")
    return data[:table + 5] + b"\xff" * 20 + data[table + 25:]


def rotated_jpeg() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    return encoded(Image.new("RGB", (40, 20), (200, 10, 10)), "JPEG", exif=exif.tobytes())


def palette_png() -> bytes:
    image = Image.new("P", (20, 10), 1)
    image.putpalette([0, 0, 0, 255, 0, 0] * 128)
    return encoded(image, "PNG", transparency=0)


def odd_files(rng: random.Random) -> dict[str, bytes]:
    """Valid files a naive packer gets wrong."""
    good_jpeg = image_bytes(rng)
    return {
        "class_00/plain.jpg": image_bytes(rng),
        "class_00/cmyk.jpg": encoded(Image.open(io.BytesIO(image_bytes(rng))).convert("CMYK"), "JPEG"),
        "class_00/sixteen-bit.png": encoded(Image.new("I;16", (20, 10), 40000), "PNG"),
        "class_00/palette-transparent.png": palette_png(),
        "class_00/grey-alpha.png": encoded(Image.new("LA", (20, 10), (100, 50)), "PNG"),
        "class_00/rgba.png": encoded(Image.new("RGBA", (20, 10), (1, 2, 3, 255)), "PNG"),
        "class_00/exif-rotated.jpg": rotated_jpeg(),
        "class_00/really-a-png.jpg": image_bytes(rng, "PNG"),
        "class_00/padded.jpg": good_jpeg + b"\x00\x00\r\n",
        "class_02/corrupt-middle.jpg": corrupt_middle_jpeg(image_bytes(rng)),
    }


BAD_REASONS = {
    "class_01/truncated.jpg": "truncated JPEG (no end-of-image marker)",
    "class_01/error-page.jpg": "not an image (unrecognised content)",
    "class_01/empty.jpg": "empty file",
    "class_01/truncated.png": "truncated PNG (no IEND chunk)",
    "class_01/bomb.png": "decompression bomb: 30000x30000 pixels > --max-pixels 100000000",
    "class_01/loop.jpg": "cannot stat: Too many levels of symbolic links",
}


@pytest.fixture
def bad_folder(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """An ImageFolder holding every kind of bad and odd file; returns it and the valid files."""
    rng = random.Random(8)
    root = tmp_path / "src"
    good = odd_files(rng)
    whole = image_bytes(rng)
    bad = {
        "class_01/truncated.jpg": whole[: len(whole) // 2],
        "class_01/error-page.jpg": b"<!DOCTYPE html><html><body>404 Not Found</body></html>\n",
        "class_01/empty.jpg": b"",
        "class_01/truncated.png": image_bytes(rng, "PNG")[:-20],
        "class_01/bomb.png": bomb_png(30000, 30000),
    }
    for rel, data in {**good, **bad}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    os.symlink("loop.jpg", root / "class_01" / "loop.jpg")
    odd_name = image_bytes(rng)
    good[add_non_utf8_file(root, odd_name)] = odd_name
    return root, good


def rejects(out: Path) -> dict[str, str]:
    lines = (out / "rejects.jsonl").read_text().splitlines()
    return {record["path"]: record["reason"] for record in map(json.loads, lines)}


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_good_files_packed_bad_files_listed(fmt: str, bad_folder: tuple[Path, dict[str, bytes]],
                                            tmp_path: Path) -> None:
    root, good = bad_folder
    out = tmp_path / "out"
    code, output = run(fmt, root, out, "--shard-size", "4", "-q")
    assert code == 0, output
    assert f"packed {len(good)} samples" in output and f"{len(BAD_REASONS)} rejected" in output
    assert rejects(out) == BAD_REASONS
    ds = readers.open_dataset(out, decode="bytes", fields=("image", "path"))
    assert {path: data for data, path in ds} == good
    paths = [path for (path,) in readers.open_dataset(out, decode="bytes", fields=("path",))]
    images = readers.open_dataset(out, decode="pil", fields=("image",))
    # Only --validate full decodes pixels, so the quick check lets the corrupt-middle JPEG through.
    decoded = {path: images[i][0] for i, path in enumerate(paths) if path != "class_02/corrupt-middle.jpg"}
    assert all(image.mode == "RGB" for image in decoded.values())
    assert decoded["class_00/exif-rotated.jpg"].size == (20, 40)
    assert decoded["class_00/rgba.png"].getpixel((0, 0)) == (1, 2, 3)
    assert decoded["class_00/palette-transparent.png"].getpixel((0, 0)) == (255, 0, 0)
    formats = {path: images.record(i)[0]["format"] for i, path in enumerate(paths)}
    assert formats["class_00/really-a-png.jpg"] == "png" and formats["class_00/cmyk.jpg"] == "jpeg"


def test_png_behind_jpg_name_is_a_png_member_in_tar(bad_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, good = bad_folder
    out = tmp_path / "out"
    pack(root, out, PackOptions(format="wds", shard_size=1000))
    with tarfile.open(out / "shard-000000.tar") as tar:
        extensions = [name.split(".", 1)[1] for name in tar.getnames()]
    assert extensions.count("png") == sum(data.startswith(b"\x89PNG") for data in good.values())


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_validate_full_decodes_every_image(fmt: str, bad_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, good = bad_folder
    out = tmp_path / "out"
    code, output = run(fmt, root, out, "--validate", "full", "-q")
    assert code == 0, output
    found = rejects(out)
    assert found.pop("class_02/corrupt-middle.jpg").startswith("cannot decode (jpeg): ")
    assert found == BAD_REASONS
    ds = readers.open_dataset(out, decode="bytes", fields=("path",))
    assert sorted(path for (path,) in ds) == sorted(set(good) - {"class_02/corrupt-middle.jpg"})


@pytest.mark.parametrize("fmt", sorted(WRITERS))
@pytest.mark.parametrize("workers", ["1", "2"])
def test_on_error_fail_stops_cleanly(fmt: str, workers: str, bad_folder: tuple[Path, dict[str, bytes]],
                                     tmp_path: Path) -> None:
    root, _ = bad_folder
    out = tmp_path / "out"
    os.unlink(root / "class_01" / "loop.jpg")  # a scan-time reject would stop the run before any shard
    code, output = run(fmt, root, out, "--on-error", "fail", "--shard-size", "3", "--workers", workers, "-q")
    assert code == 1
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {root}/class_01/") and "(--on-error fail)" in lines[0]
    rel = lines[0].split(f"{root}/", 1)[1].split(": ", 1)[0]
    assert lines[0].endswith(f"{BAD_REASONS[rel]} (--on-error fail)")
    assert not (out / "index.json").exists()


def test_on_error_fail_on_a_scan_time_reject(bad_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, _ = bad_folder
    code, output = run("lmdb", root, tmp_path / "out", "--on-error", "fail", "-q")
    assert code == 1
    assert output.strip() == f"Error: {root}/class_01/loop.jpg: {BAD_REASONS['class_01/loop.jpg']} (--on-error fail)"


def test_on_error_fail_as_a_subprocess(bad_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, _ = bad_folder
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "packer.cli", "hdf5", str(root), str(out), "--on-error", "fail",
                             "-q"], capture_output=True, text=True)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"Error: {root}/class_01/")
    assert "Traceback" not in result.stderr and not (out / "index.json").exists()


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_max_errors_both_ways(fmt: str, bad_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, good = bad_folder
    bad = len(BAD_REASONS)
    code, output = run(fmt, root, tmp_path / "within", "--max-errors", bad, "-q")
    assert code == 0 and f"packed {len(good)} samples" in output and f"{bad} rejected" in output
    out = tmp_path / "over"
    code, output = run(fmt, root, out, "--max-errors", bad - 1, "-q")
    assert code == 1 and output.count("\n") == 1
    assert f"{bad} files rejected, more than --max-errors {bad - 1}" in output
    assert not (out / "index.json").exists()
    assert rejects(out) == BAD_REASONS  # still written, so the bad files can be looked at


def test_one_shard_over_max_errors_stops_early(bad_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, _ = bad_folder
    out = tmp_path / "out"
    with pytest.raises(PackError, match=r"2 files rejected, more than --max-errors 1 \(first: class_01/"):
        pack(root, out, PackOptions(format="lmdb", shard_size=1000), policy=ErrorPolicy(max_errors=1))
    assert not (out / "rejects.jsonl").exists() and not list((out / ".pack").glob("done/*"))


def test_merge_applies_max_errors(bad_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, _ = bad_folder
    out = tmp_path / "out"
    for task in range(2):
        code, output = run("lmdb", root, out, "--shard-size", "3", "--task-index", task, "--task-count", 2, "-q")
        assert code == 0, output
    code, output = run("merge", out, "--max-errors", 2)
    assert code == 1 and "more than --max-errors 2" in output and not (out / "index.json").exists()
    code, output = run("merge", out, "--max-errors", len(BAD_REASONS))
    assert code == 0 and (out / "index.json").exists()


def test_max_pixels_is_a_pack_option(tmp_path: Path) -> None:
    bomb = bomb_png(30000, 30000)
    with pytest.raises(RejectedFile, match=r"^decompression bomb: 20x10 pixels > --max-pixels 100$"):
        check_image(bomb_png(20, 10), max_pixels=100)
    assert check_image(bomb, max_pixels=30000 * 30000) == "png"
    assert check_image(bomb_png(20, 10), max_pixels=200) == "png"


def test_header_size_agrees_with_pillow() -> None:
    rng = random.Random(3)
    base = Image.open(io.BytesIO(image_bytes(rng, size=(37, 21))))
    samples = [*odd_files(rng).values(), encoded(base, "JPEG", progressive=True), encoded(base, "GIF"),
               encoded(base.convert("L"), "JPEG")]
    for data in samples:
        kind = check_image(data)
        with Image.open(io.BytesIO(data)) as image:
            assert header_size(data, kind) == image.size


@pytest.mark.parametrize("fmt", ["JPEG", "GIF"])
def test_bomb_claimed_by_a_jpeg_or_gif_header(fmt: str) -> None:
    data = bytearray(encoded(Image.new("RGB", (20, 10)), fmt))
    if fmt == "JPEG":
        frame = data.find(b"\xff\xc0")
        data[frame + 5:frame + 9] = struct.pack(">HH", 30000, 30000)
    else:
        data[6:10] = struct.pack("<HH", 30000, 30000)
    with pytest.raises(RejectedFile, match=r"^decompression bomb: 30000x30000 pixels > --max-pixels 100000000$"):
        check_image(bytes(data))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--shard-size", "-3"], "Invalid value for '--shard-size'"),
        (["--max-pixels", "0"], "Invalid value for '--max-pixels'"),
        (["--max-errors", "-1"], "Invalid value for '--max-errors'"),
        (["--store", "pickle"], "Invalid value for '--store'"),
        (["--validate", "paranoid"], "Invalid value for '--validate'"),
        (["--on-error", "ignore"], "Invalid value for '--on-error'"),
    ],
)
def test_invalid_option_values_are_usage_errors(args: list[str], message: str,
                                                bad_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, _ = bad_folder
    code, output = run("lmdb", root, tmp_path / "out", *args)
    assert code == 2 and message in output and "Traceback" not in output
    assert not (tmp_path / "out").exists()


def test_slurm_script_carries_the_error_policy(bad_folder: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, _ = bad_folder
    code, script = run("slurm-script", "lmdb", root, tmp_path / "out", "--tasks", 2, "--max-errors", 3,
                       "--validate", "full")
    assert code == 0, script
    pack_line = next(line for line in script.splitlines() if " lmdb " in line)
    merge_line = next(line for line in script.splitlines() if " merge " in line)
    assert "--validate full" in pack_line and "--on-error skip --max-errors 3" in pack_line
    assert merge_line.endswith("--on-error skip --max-errors 3 --split train")


@pytest.mark.parametrize("store", ["raw", "jpeg"])
def test_decoding_stores_reject_the_same_files(store: str, bad_folder: tuple[Path, dict[str, bytes]],
                                               tmp_path: Path) -> None:
    root, good = bad_folder
    out = tmp_path / "out"
    code, output = run("lmdb", root, out, "--store", store, "-q")
    assert code == 0, output
    found = rejects(out)
    assert found.pop("class_02/corrupt-middle.jpg").startswith("cannot decode")  # decoding it to store pixels
    assert found == BAD_REASONS
    images = readers.open_dataset(out, decode="pil", fields=("image", "path"))
    assert sorted(path for _, path in images) == sorted(set(good) - {"class_02/corrupt-middle.jpg"})
    assert all(image.mode == "RGB" for image, _ in images)
