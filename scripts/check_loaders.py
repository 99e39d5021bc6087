"""timm and NVIDIA DALI (on the CPU) read a `pack wds` output with no code of ours: every sample,
labels exact, pixels compared with Pillow's decode of the same bytes. With --throughput, DALI's CPU
pipeline and our `make_loader` read the same shards side by side, decoding to 224x224. Run by
scripts/check_loaders.sh in its own venv (timm needs torchvision, DALI its own wheel); not part of
the test suite."""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

import readers
from readers.cpus import available_cpus

sys.path.insert(0, str(Path(__file__).parent))
from bench_read import SIDE, to_tensor_224  # noqa: E402 - the transform scripts/bench_read.py measures with


def expected_samples(out: Path) -> list[tuple[np.ndarray, int]]:
    dataset = readers.open_dataset(out, decode="bytes", fields=("image", "label"))
    return [(np.asarray(Image.open(io.BytesIO(image)).convert("RGB")), label)
            for image, label in (dataset[index] for index in range(len(dataset)))]


def check_timm(out: Path, expected: list[tuple[np.ndarray, int]]) -> str:
    import timm.data

    dataset = timm.data.create_dataset("wds/pack", root=str(out), split="train")
    seen = [(np.asarray(image), int(label)) for image, label in dataset]
    assert len(seen) == len(expected), f"timm read {len(seen)} samples of {len(expected)}"
    for index, ((pixels, label), (want, want_label)) in enumerate(zip(seen, expected)):
        assert label == want_label and np.array_equal(pixels, want), f"timm: sample {index} differs"
    return f"timm {timm.__version__}: {len(seen)} samples, labels and pixels exact"


def dali_pipeline(out: Path, batch_size: int, threads: int, size: int | None):
    from nvidia.dali import fn, pipeline_def, types

    tars = sorted(str(path) for path in out.glob("shard-*.tar"))

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=None, exec_dynamic=True)
    def pipeline():
        image, label = fn.readers.webdataset(paths=tars, index_paths=[tar[:-4] + ".idx" for tar in tars],
                                             ext=["jpg;png", "cls"], missing_component_behavior="error",
                                             random_shuffle=False, name="reader")
        image = fn.decoders.image(image, device="cpu", output_type=types.RGB)
        if size is not None:  # as to_tensor_224: shorter side to `size`, then the center square
            image = fn.crop(fn.resize(image, resize_shorter=size), crop=(size, size))
        return image, label

    built = pipeline()
    built.build()
    return built


def check_dali(out: Path, expected: list[tuple[np.ndarray, int]]) -> str:
    import nvidia.dali

    pipe = dali_pipeline(out, batch_size=1, threads=1, size=None)
    for index, (want, want_label) in enumerate(expected):
        images, labels = pipe.run()
        pixels, label = np.asarray(images.at(0)), int(bytes(np.asarray(labels.at(0))).decode())
        assert label == want_label, f"DALI: sample {index} label {label}, expected {want_label}"
        assert pixels.shape == want.shape, f"DALI: sample {index} shape {pixels.shape}, expected {want.shape}"
        differ = int(np.abs(pixels.astype(int) - want).max())
        assert differ <= 1, f"DALI: sample {index} pixels differ by up to {differ} from Pillow's"
    return f"DALI {nvidia.dali.__version__} (CPU): {len(expected)} samples, labels exact, pixels within 1 of Pillow's"


def images_per_second(batches, seconds: float) -> float:
    """Images per second after the first batch, over at least `seconds`."""
    count, started = 0, None
    for batch in batches:
        if started is None:
            started = time.perf_counter()
            continue
        count += batch
        if time.perf_counter() - started >= seconds:
            break
    return count / (time.perf_counter() - started)


def dali_batches(out: Path, batch_size: int, threads: int):
    pipe = dali_pipeline(out, batch_size=batch_size, threads=threads, size=SIDE)
    while True:
        images, _ = pipe.run()
        assert images.as_array().shape[1:] == (SIDE, SIDE, 3)
        yield len(images)


def loader_batches(out: Path, batch_size: int, workers: int):
    dataset = readers.open_dataset(out, decode="pil", transform=to_tensor_224)
    loader = readers.make_loader(dataset, batch_size, num_workers=workers, seed=0)
    while True:
        for images, _ in loader:
            assert tuple(images.shape[1:]) == (3, SIDE, SIDE)
            yield len(images)


def throughput(out: Path, seconds: float) -> str:
    cpus = available_cpus()
    dali = images_per_second(dali_batches(out, 32, cpus), seconds)
    ours = images_per_second(loader_batches(out, 32, cpus), seconds)
    return (f"decode to {SIDE}x{SIDE}, batch 32, {cpus} CPUs: DALI CPU pipeline {dali:.0f} img/s, "
            f"make_loader ({cpus} workers) {ours:.0f} img/s, DALI / make_loader = {dali / ours:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a pack wds output")
    parser.add_argument("--skip-dali", action="store_true", help="when DALI's wheel could not be installed")
    parser.add_argument("--throughput", type=float, default=0.0, metavar="SECONDS",
                        help="also time DALI against make_loader for this long each")
    args = parser.parse_args()
    expected = expected_samples(args.out)
    print(check_timm(args.out, expected), flush=True)
    if not args.skip_dali:
        started = time.monotonic()
        print(check_dali(args.out, expected), f"({time.monotonic() - started:.1f} s)", flush=True)
        if args.throughput:
            print(throughput(args.out, args.throughput), flush=True)


if __name__ == "__main__":
    main()
