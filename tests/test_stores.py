"""Decoding stores (raw, bmp, jpeg), resizing, odd source modes, and decode/decode_size on read."""

from __future__ import annotations

import io
import json
from pathlib import Path

import click
import numpy as np
import pytest
import torch
from clirun import run
from PIL import Image
from torch.utils.data import DataLoader

import readers
from packer.write.encode import encode
from packer.errors import PackError
from packer.run.pipeline import pack
from packer.write.pixels import resized_size
from packer.plan.options import PackOptions
from packer.write.writers import WRITERS
from readers.decode import decode_numpy, decode_tensor, reduction

RNG = np.random.default_rng(7)


def textured(width: int, height: int, channels: int = 3) -> np.ndarray:
    """Gradients plus noise, so resampling and rotation mistakes show up in the pixels."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(1, width - 1), y * 255 // max(1, height - 1), (x + y) % 256], axis=-1)
    noisy = base[:, :, :channels] + RNG.integers(-20, 21, size=(height, width, channels))
    return np.clip(noisy, 0, 255).astype(np.uint8)


def saved(image: Image.Image, fmt: str, **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def over_white(rgb: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    a = alpha[:, :, None].astype(np.float64) / 255
    return np.round(rgb * a + 255 * (1 - a)).astype(np.uint8)


def odd_sources() -> dict[str, tuple[bytes, np.ndarray, np.ndarray]]:
    """{name: (file bytes, expected RGB pixels, expected L pixels)}, each computed without the packer."""
    sources: dict[str, tuple[bytes, np.ndarray, np.ndarray]] = {}

    def add(name: str, data: bytes, rgb: np.ndarray, gray: np.ndarray | None = None) -> None:
        if gray is None:
            gray = np.asarray(Image.fromarray(rgb).convert("L"))
        sources[name] = (data, rgb, gray)

    rgb = saved(Image.fromarray(textured(40, 30)), "JPEG", quality=95)
    add("rgb.jpg", rgb, np.asarray(Image.open(io.BytesIO(rgb)).convert("RGB")),
        np.asarray(Image.open(io.BytesIO(rgb)).convert("L")))
    png = saved(Image.fromarray(textured(33, 21)), "PNG")
    add("rgb.png", png, np.asarray(Image.open(io.BytesIO(png))))
    cmyk = saved(Image.fromarray(np.concatenate([textured(24, 20), textured(24, 20)[:, :, :1]], axis=2), "CMYK"), "JPEG")
    assert Image.open(io.BytesIO(cmyk)).mode == "CMYK"
    add("cmyk.jpg", cmyk, np.asarray(Image.open(io.BytesIO(cmyk)).convert("RGB")))
    # 16-bit grayscale spanning the whole range: Pillow's own convert("L") would clip it to 255.
    deep = (np.arange(20 * 30, dtype=np.uint32).reshape(20, 30) * 109 % 65536).astype(np.uint16)
    deep_png = saved(Image.fromarray(deep), "PNG")
    assert Image.open(io.BytesIO(deep_png)).mode == "I;16"
    deep8 = np.round(deep / 257).astype(np.uint8)
    add("gray16.png", deep_png, np.repeat(deep8[:, :, None], 3, axis=2), deep8)
    floats = Image.fromarray(np.linspace(-0.5, 1.5, 12 * 10, dtype=np.float32).reshape(10, 12))
    float8 = np.round(np.clip(np.asarray(floats, dtype=np.float64), 0, 1) * 255).astype(np.uint8)
    add("float.tif", saved(floats, "TIFF"), np.repeat(float8[:, :, None], 3, axis=2), float8)
    palette = Image.fromarray(RNG.integers(0, 4, size=(16, 18)).astype(np.uint8), "L").convert("P")
    palette.putpalette([200, 10, 10, 10, 200, 10, 10, 10, 200, 50, 60, 70] + [0] * 756)
    p_png = saved(palette, "PNG", transparency=3)
    index = np.asarray(Image.open(io.BytesIO(p_png)))
    colours = np.array([[200, 10, 10], [10, 200, 10], [10, 10, 200], [255, 255, 255]], dtype=np.uint8)
    add("palette.png", p_png, colours[index])
    rgba = np.concatenate([textured(22, 14), RNG.integers(0, 256, size=(14, 22, 1)).astype(np.uint8)], axis=2)
    add("rgba.png", saved(Image.fromarray(rgba, "RGBA"), "PNG"), over_white(rgba[:, :, :3], rgba[:, :, 3]))
    la = np.stack([textured(15, 17)[:, :, 0], RNG.integers(0, 256, size=(17, 15)).astype(np.uint8)], axis=2)
    la_gray = over_white(la[:, :, :1], la[:, :, 1])[:, :, 0]
    add("la.png", saved(Image.fromarray(la, "LA"), "PNG"), np.repeat(la_gray[:, :, None], 3, axis=2), la_gray)
    # EXIF orientation 6: stored 40 wide x 24 high, shown rotated 90 degrees clockwise (24 x 40).
    exif = Image.Exif()
    exif[0x0112] = 6
    upright = textured(24, 40)
    rotated = saved(Image.fromarray(np.rot90(upright, k=1).copy()), "JPEG", quality=95, exif=exif)
    turned = np.rot90(np.asarray(Image.open(io.BytesIO(rotated)).convert("RGB")), k=-1)
    add("exif6.jpg", rotated, np.ascontiguousarray(turned),
        np.ascontiguousarray(np.rot90(np.asarray(Image.open(io.BytesIO(rotated)).convert("L")), k=-1)))
    return sources


SOURCES = odd_sources()
TOLERANCE = {"palette.png": 0, "rgba.png": 1, "la.png": 1}


@pytest.fixture(scope="module")
def odd_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("odd") / "src"
    for name, (data, _, _) in SOURCES.items():
        path = root / "only" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def pack_to(root: Path, out: Path, fmt: str, **options: object) -> readers.PackedDataset:
    pack(root, out, PackOptions(format=fmt, **options))  # type: ignore[arg-type]
    return readers.open_dataset(out, decode="numpy", fields=("image", "path"))


def assert_close(actual: np.ndarray, expected: np.ndarray, tolerance: int, what: str) -> None:
    assert actual.shape == expected.shape, what
    worst = int(np.abs(actual.astype(np.int16) - expected.astype(np.int16)).max())
    assert worst <= tolerance, f"{what}: differs by up to {worst}"


@pytest.mark.parametrize("fmt", sorted(WRITERS))
@pytest.mark.parametrize("store", ["original", "raw", "bmp"])
def test_lossless_stores_match_a_pillow_decode(fmt: str, store: str, odd_folder: Path, tmp_path: Path) -> None:
    ds = pack_to(odd_folder, tmp_path / "out", fmt, store=store)
    assert len(ds) == len(SOURCES) and ds.manifest.store == store
    for image, path in ds:
        name = path.split("/")[-1]
        assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
        assert_close(image, SOURCES[name][1], TOLERANCE.get(name, 0), f"{store} {name}")


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_raw_gray_mode(fmt: str, odd_folder: Path, tmp_path: Path) -> None:
    ds = pack_to(odd_folder, tmp_path / "out", fmt, store="raw", mode="L")
    for image, path in ds:
        name = path.split("/")[-1]
        assert image.shape[2] == 1
        assert_close(image[:, :, 0], SOURCES[name][2], TOLERANCE.get(name, 0), f"L {name}")
    pil = readers.open_dataset(tmp_path / "out", fields=("image",))[0][0]
    assert pil.mode == "L"


def test_raw_record_layout(odd_folder: Path, tmp_path: Path) -> None:
    ds = readers.open_dataset(pack_to(odd_folder, tmp_path / "out", "lmdb", store="raw").root, decode="bytes",
                              fields=("image", "path"))
    for payload, path in ds:
        expected = SOURCES[path.split("/")[-1]][1]
        assert len(payload) == expected.size  # nothing but the HWC pixels
    meta, _ = ds.record(0)
    assert meta["format"] == "raw" and meta["dtype"] == "uint8" and meta["mode"] == "RGB"
    assert meta["shape"] == list(SOURCES[meta["path"].split("/")[-1]][1].shape)


def test_rotated_file_is_stored_upright(odd_folder: Path, tmp_path: Path) -> None:
    ds = pack_to(odd_folder, tmp_path / "out", "lmdb", store="raw")
    shapes = {path.split("/")[-1]: image.shape for image, path in ds}
    assert shapes["exif6.jpg"] == (40, 24, 3)


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_jpeg_store_is_close_and_smaller_than_bmp(fmt: str, odd_folder: Path, tmp_path: Path) -> None:
    jpeg = pack_to(odd_folder, tmp_path / "jpeg", fmt, store="jpeg")
    assert jpeg.manifest.options["quality"] == 90
    for image, path in jpeg:
        name = path.split("/")[-1]
        assert image.shape == SOURCES[name][1].shape
        if name in ("rgb.jpg", "rgb.png", "exif6.jpg"):  # photo-like content; palette noise is not
            assert np.abs(image.astype(np.int16) - SOURCES[name][1]).mean() < 12, name
    bmp = pack_to(odd_folder, tmp_path / "bmp", fmt, store="bmp")
    low = pack_to(odd_folder, tmp_path / "low", fmt, store="jpeg", quality=20)

    def payload_bytes(ds: readers.PackedDataset) -> int:
        return sum(len(data) for (data,) in readers.open_dataset(ds.root, decode="bytes", fields=("image",)))

    assert payload_bytes(low) < payload_bytes(jpeg) < payload_bytes(bmp)
    assert jpeg.manifest.source_bytes == bmp.manifest.source_bytes == sum(len(v[0]) for v in SOURCES.values())


# (width, height) -> expected size for --resize 20, --max-side 30, both, worked out by hand.
RESIZES = [
    ((40, 30), dict(resize=20), (26, 20)),
    ((30, 40), dict(resize=20), (20, 26)),
    ((40, 30), dict(resize=60), (80, 60)),  # upscales, like torchvision's Resize
    ((40, 30), dict(max_side=30), (30, 22)),
    ((20, 10), dict(max_side=30), (20, 10)),  # max-side alone never enlarges
    ((100, 20), dict(resize=20, max_side=50), (50, 10)),
    ((33, 33), dict(resize=16), (16, 16)),
]


@pytest.mark.parametrize("size, options, expected", RESIZES)
def test_resized_size(size: tuple[int, int], options: dict[str, int], expected: tuple[int, int]) -> None:
    assert resized_size(*size, options.get("resize"), options.get("max_side")) == expected


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_resize_and_center_crop(fmt: str, odd_folder: Path, tmp_path: Path) -> None:
    ds = pack_to(odd_folder, tmp_path / "out", fmt, store="raw", resize=20, center_crop=16)
    images = {path.split("/")[-1]: image for image, path in ds}
    assert {image.shape for image in images.values()} == {(16, 16, 3)}
    # rgb.jpg is 40x30: resized (bilinear) to 26x20, then the middle 16x16: columns 5..21, rows 2..18.
    reference = Image.fromarray(SOURCES["rgb.jpg"][1]).resize((26, 20), Image.Resampling.BILINEAR)
    assert_close(images["rgb.jpg"], np.asarray(reference)[2:18, 5:21], 1, "resize+crop")
    batch = next(iter(DataLoader(readers.open_dataset(ds.root, decode="tensor"), batch_size=4)))
    assert batch[0].shape == (4, 3, 16, 16) and batch[0].dtype == torch.uint8


def test_center_crop_pads_small_images_with_black(tmp_path: Path) -> None:
    data = saved(Image.new("RGB", (10, 6), (200, 100, 50)), "PNG")
    encoded = encode(data, "raw", codec="png", center_crop=8)
    assert encoded.meta["shape"] == [8, 8, 3]
    pixels = np.frombuffer(encoded.payload, np.uint8).reshape(8, 8, 3)
    assert (pixels[:1] == 0).all() and (pixels[7:] == 0).all()  # one black row above and below
    assert (pixels[1:7] == (200, 100, 50)).all()  # width 10 cropped to the middle 8, no padding


def test_undecodable_file_is_rejected_with_a_reason(tmp_path: Path) -> None:
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    (root / "a" / "good.png").write_bytes(saved(Image.new("RGB", (4, 4)), "PNG"))
    # Cut short but with its end marker put back, so the quick input check passes it and decoding fails.
    (root / "a" / "broken.jpg").write_bytes(SOURCES["rgb.jpg"][0][:200] + b"\xff\xd9")
    summary = pack(root, tmp_path / "out", PackOptions(format="lmdb", store="raw"))
    assert summary.num_samples == 1 and summary.rejects == 1
    reject = json.loads((tmp_path / "out" / "rejects.jsonl").read_text())
    assert reject["path"] == "a/broken.jpg" and reject["reason"].startswith("cannot decode")


@pytest.mark.filterwarnings("error")
def test_raw_numpy_is_a_view_and_tensor_a_writable_copy() -> None:
    payload = memoryview(bytes(range(24)))
    meta = {"format": "raw", "shape": [2, 4, 3], "dtype": "uint8"}
    array = decode_numpy(payload, meta)
    assert np.shares_memory(array, np.frombuffer(payload, np.uint8)) and not array.flags.writeable
    tensor = decode_tensor(payload, meta)
    assert tensor.shape == (3, 2, 4) and tensor[1, 0, 1].item() == 4
    tensor[0, 0, 0] = 99  # writable, and no "non-writable array" warning
    gray = decode_tensor(payload, {"format": "raw", "shape": [2, 12, 1], "dtype": "uint8"})
    gray[0, 0, 0] = 99  # one channel: the transpose is contiguous already, but must still be a copy
    assert payload[0] == 0


@pytest.mark.parametrize(
    "size, request_hw, scale",
    [((500, 375), (224, 224), 2), ((224, 224), (224, 224), 1), ((300, 300), (224, 224), 1),
     ((4000, 3000), (224, 224), 8), ((4000, 3000), (1000, 1000), 4), ((100, 50), (224, 224), 1)],
)
def test_reduction_is_nearest_power_of_two(size: tuple[int, int], request_hw: tuple[int, int], scale: int) -> None:
    assert reduction(*size, request_hw) == scale


@pytest.mark.parametrize("fmt", sorted(WRITERS))
@pytest.mark.parametrize("store", ["original", "raw", "bmp", "jpeg"])
def test_decode_size_gives_about_that_size(fmt: str, store: str, tmp_path: Path) -> None:
    root = tmp_path / "src"
    (root / "c").mkdir(parents=True)
    (root / "c" / "big.jpg").write_bytes(saved(Image.fromarray(textured(200, 150)), "JPEG"))
    exif = Image.Exif()
    exif[0x0112] = 8
    (root / "c" / "turned.jpg").write_bytes(saved(Image.fromarray(textured(200, 100)), "JPEG", exif=exif))
    (root / "c" / "small.png").write_bytes(saved(Image.fromarray(textured(40, 30)), "PNG"))
    pack(root, tmp_path / "out", PackOptions(format=fmt, store=store))
    # Towards 50 high x 25 wide: 200x150 by 4 (50x38); turned is 100x200 upright, by 4 (25x50), which
    # needs the request turned too (stored 200x100 against 25x50 would give 2); 40x30 stays.
    expected = {"big.jpg": (50, 38), "turned.jpg": (25, 50), "small.png": (40, 30)}
    plain = readers.open_dataset(tmp_path / "out", fields=("image", "path"))
    for decode in ("pil", "numpy", "tensor"):
        ds = readers.open_dataset(tmp_path / "out", decode=decode, decode_size=(50, 25), fields=("image", "path"))
        for (image, path), (full, _) in zip(ds, plain):
            name = path.split("/")[-1]
            if decode == "pil":
                got = image.size
                # Same picture, smaller: compare with a plain decode shrunk to the same size.
                shrunk = np.asarray(full.resize(got, Image.Resampling.BOX), dtype=np.int16)
                assert np.abs(np.asarray(image, dtype=np.int16) - shrunk).mean() < 12, (store, name)
            elif decode == "numpy":
                got = (image.shape[1], image.shape[0])
            else:
                got = (image.shape[2], image.shape[1])
            assert got == expected[name], (decode, store, name)


def test_decode_size_arguments(tmp_path: Path, odd_folder: Path) -> None:
    out = tmp_path / "out"
    pack(odd_folder, out, PackOptions(format="lmdb"))
    with pytest.raises(ValueError, match="decode_size"):
        readers.open_dataset(out, decode="bytes", decode_size=(10, 10))
    for bad in [(0, 10), (10,), "224", (10.0, 10), (-1, 5)]:
        with pytest.raises(ValueError, match="decode_size"):
            readers.open_dataset(out, decode_size=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(resize=32), "--resize needs a store that decodes"),
        (dict(mode="L"), "--mode needs a store that decodes"),
        (dict(store="raw", quality=80), "--quality applies only to --store jpeg"),
        (dict(store="jpeg", quality=0), "--quality must be between 1 and 100"),
        (dict(store="raw", resize=0), "--resize must be at least 1"),
        (dict(store="raw", resize=64, max_side=32), "--max-side 32 is smaller than --resize 64"),
        (dict(store="png"), "--store must be one of"),
        (dict(store="raw", mode="CMYK"), "--mode must be one of"),
    ],
)
def test_pack_options_validation(options: dict[str, object], message: str) -> None:
    with pytest.raises(PackError, match=message):
        PackOptions(format="lmdb", **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--store", "png"], "Invalid value for '--store'"),
        (["--store", "raw", "--resize", "-5"], "Invalid value for '--resize'"),
        (["--store", "raw", "--max-side", "0"], "Invalid value for '--max-side'"),
        (["--store", "raw", "--center-crop", "-1"], "Invalid value for '--center-crop'"),
        (["--store", "jpeg", "--quality", "101"], "Invalid value for '--quality'"),
        (["--store", "raw", "--mode", "CMYK"], "Invalid value for '--mode'"),
        (["--center-crop", "16"], "--center-crop needs a store that decodes"),
        (["--store", "bmp", "--quality", "50"], "--quality applies only to --store jpeg"),
    ],
)
def test_cli_option_errors(args: list[str], message: str, odd_folder: Path, tmp_path: Path) -> None:
    code, output = run("lmdb", odd_folder, tmp_path / "out", "-q", *args)
    assert code == 2, output
    assert message in output and "Traceback" not in output
    assert not (tmp_path / "out").exists()


def test_cli_summary_shows_the_size_trade_off(odd_folder: Path, tmp_path: Path) -> None:
    code, output = run("lmdb", odd_folder, tmp_path / "out", "-q", "--store", "raw", "--mode", "l", "--resize", "16")
    assert code == 0, output
    assert "x the " in output and "of source files" in output
    manifest = readers.load_manifest(tmp_path / "out")
    assert manifest.options["mode"] == "L" and manifest.options["resize"] == 16
    assert manifest.source_bytes == sum(len(value[0]) for value in SOURCES.values())
    code, output = run("info", tmp_path / "out", "--json")
    assert code == 0 and json.loads(output)["source_bytes"] == manifest.source_bytes
    _, text = run("info", tmp_path / "out")
    assert "vs source    " in text and "x the " in text
    assert "resize=16" in text  # the stored geometry is visible too


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_full_verify_decodes_every_store(fmt: str, odd_folder: Path, tmp_path: Path) -> None:
    for store in ("raw", "bmp", "jpeg"):
        out = tmp_path / store
        pack(odd_folder, out, PackOptions(format=fmt, store=store, center_crop=8))
        code, output = run("verify", out, "--full", "-q")
        assert code == 0, output


def test_option_flags_round_trip_for_job_scripts() -> None:
    """Generated Slurm scripts re-run `pack` with option_args: the flags must parse back to the same options."""
    from packer.cli import main, option_args, pack_options_from

    for options in (PackOptions(format="lmdb"), PackOptions(format="lmdb", store="raw", mode="L", resize=64, center_crop=56),
                    PackOptions(format="lmdb", store="jpeg", max_side=300),
                    PackOptions(format="lmdb", sidecars=("txt", "json"), sidecars_optional=True),
                    PackOptions(format="lmdb", files_from="list.txt", null=True, metadata="val.csv",
                                label_column="class", classes="train/index.json"),
                    PackOptions(format="lmdb", no_classes=True)):
        command = main.get_command(click.Context(main), "lmdb")  # type: ignore[attr-defined]
        assert command is not None
        ctx = command.make_context("lmdb", ["src", "out", *option_args(options)])
        assert pack_options_from("lmdb", dict(ctx.params)) == options


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_decoding_store_is_deterministic_across_worker_processes(fmt: str, odd_folder: Path, tmp_path: Path) -> None:
    options = PackOptions(format=fmt, store="jpeg", resize=12, shard_size=3)
    pack(odd_folder, tmp_path / "one", options, workers=1)
    pack(odd_folder, tmp_path / "two", options, workers=2)
    shards = sorted(path.name for path in (tmp_path / "one").glob("shard-*"))
    assert len(shards) >= 3
    for name in shards:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name


def test_hdf5_fixed_shape_raw_layout(odd_folder: Path, tmp_path: Path) -> None:
    """Center-cropped raw pixels: one (N, H, W, C) array, one image per chunk; other stores stay flat."""
    import h5py

    ds = pack_to(odd_folder, tmp_path / "fixed", "hdf5", store="raw", center_crop=12, shard_size=4)
    with h5py.File(ds.shard_path(0), "r", locking=False) as file:
        assert file.attrs["layout"] == "fixed" and file.attrs["mode"] == "RGB"
        assert file["images"].shape == (4, 12, 12, 3) and file["images"].chunks == (1, 12, 12, 3)
        assert "offsets" not in file and "shapes" not in file
        first = file["images"][0]
    image, _ = ds[0]
    assert np.array_equal(image, first)
    assert [image.shape for image, _ in ds] == [(12, 12, 3)] * len(SOURCES)
    mixed = pack_to(odd_folder, tmp_path / "mixed", "hdf5", store="raw", resize=10)
    with h5py.File(mixed.shard_path(0), "r", locking=False) as file:
        assert file.attrs["layout"] == "flat" and file["shapes"].shape == (len(SOURCES), 3)
        shapes = file["shapes"][:]
    assert [list(image.shape) for image, _ in mixed] == shapes.tolist()
    gray = pack_to(odd_folder, tmp_path / "gray", "hdf5", store="bmp", mode="L", center_crop=8)
    with h5py.File(gray.shard_path(0), "r", locking=False) as file:
        assert file.attrs["layout"] == "flat" and file.attrs["mode"] == "L"  # fixed is for raw only
    assert {image.shape for image, _ in gray} == {(8, 8, 1)}
