"""Byte identity of everything `pack` writes, for structural changes that must not change output.

Packs a fixed set of small generated inputs (a class folder, WebDataset tars, a RecordIO .rec, a
TFRecord, an already packed dataset, and the class folder on a loopback S3 bucket) into every
format x store (a local folder; the loopback S3 bucket of scripts/loopback.py), with the default
options (small shards, so every case has several), plus a few others: a two-task run and
`pack merge`, `--order sorted`, a decoding store (`--store raw --center-crop`). Prints one
`sha256  case/file` line per output file, the work folder `.pack/` included (plan, listing,
markers), and with `--save FILE` writes them there; `--compare FILE` exits 1 naming every line
that differs.

Nothing is normalised: index.json holds no time, host or duration, and the cases are packed
under one fixed root (`--root`, emptied first), so the absolute paths a plan records are the same
in every run. Only the lock file's presence is left out of the listing (`.pack/plan.lock`, empty,
a local OUT's alone), as it says nothing about the output.

    python scripts/check_identical.py --save /tmp/identity-main.txt      # on main, before a change
    python scripts/check_identical.py --compare /tmp/identity-main.txt   # after each step

Only the public API (`packer.pack`, `packer.merge`) and the tests' input writers are used, so the
script runs unchanged on either side of a refactor.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import os
import random
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

BUCKET = "identity"
FORMATS = ("lmdb", "hdf5", "wds")
LEFT_OUT = {".pack/plan.lock"}
TASK_CASES = {("folder-wds", "local"), ("folder-wds", "s3"), ("tars-lmdb", "local"), ("s3src-hdf5", "local"),
              ("s3src-hdf5", "s3")}
"""Cases packed again as two tasks and `pack merge`. Not a container input into a bucket, so that
the hashes taken before #29 compare: there the second task stopped (the plan's listing hash
covered the inputs, its check in `RemoteOut.mirror_plan` the listing file alone; fixed since,
tested in test_remote_pack)."""


def write_tars(folder: Path, rng: random.Random, image_bytes: Callable[..., bytes]) -> None:
    """Two WebDataset shards (jpg, cls, txt, json per sample), with fixed member times."""
    folder.mkdir(parents=True)
    number = 0
    for shard in range(2):
        with tarfile.open(folder / f"data-{shard:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for _ in range(5):
                members = {"jpg": image_bytes(rng), "cls": str(number % 3).encode(),
                           "txt": f"caption {number}".encode(), "json": json.dumps({"n": number}).encode()}
                for extension, data in members.items():
                    info = tarfile.TarInfo(f"{number:06d}.{extension}")
                    info.size, info.mtime = len(data), 1_700_000_000
                    tar.addfile(info, io.BytesIO(data))
                number += 1


def make_inputs(root: Path, s3: Any) -> dict[str, str]:
    """input name -> SRC, all generated from fixed seeds."""
    from imagefolders import image_bytes, make_image_folder
    from recordfiles import example, recordio_payload, write_recordio, write_tfrecord

    import packer

    inputs = root / "inputs"
    folder = inputs / "folder"
    make_image_folder(folder, classes=3, per_class=4, seed=1)
    write_tars(inputs / "tars", random.Random(2), image_bytes)
    rng = random.Random(3)
    images = [image_bytes(rng) for _ in range(9)]
    (inputs / "rec").mkdir()
    (inputs / "tfrecord").mkdir()
    write_recordio(inputs / "rec" / "train.rec", [recordio_payload(image, float(k % 3), id=k)
                                                  for k, image in enumerate(images)])
    write_tfrecord(inputs / "tfrecord" / "train-00000-of-00001",
                   [example({"image/encoded": image, "image/class/label": k % 3 + 1}) for k, image in enumerate(images)])
    packer.pack(folder, inputs / "packed", "wds", shard_size=5, workers=1)
    fs = s3fs_of(s3)
    fs.put(str(folder), f"{BUCKET}/raw", recursive=True)
    return {
        "folder": str(folder),
        "tars": str(inputs / "tars"),
        "rec": str(inputs / "rec" / "train.rec"),
        "tfrecord": str(inputs / "tfrecord" / "train-00000-of-00001"),
        "packed": str(inputs / "packed"),
        "s3src": f"s3://{BUCKET}/raw",
    }


def s3fs_of(options: dict[str, Any]) -> Any:
    import s3fs

    return s3fs.S3FileSystem(**options, skip_instance_cache=True)


def cases(inputs: dict[str, str]) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(case name, SRC, format, options): every input x format with the defaults, then the others."""
    listed = []
    for name, src in inputs.items():
        for fmt in FORMATS:
            options: dict[str, Any] = {"shard_size": 4, "workers": 2 if name in ("folder", "tars") else 1}
            if name == "tfrecord":
                options["input_format"] = "tfrecord"
                options["label_offset"] = -1
            listed.append((f"{name}-{fmt}", src, fmt, options))
    listed += [
        ("sorted-lmdb", inputs["folder"], "lmdb", {"shard_size": 4, "order": "sorted", "workers": 1}),
        ("tars-sorted-wds", inputs["tars"], "wds", {"shard_size": 3, "order": "sorted", "workers": 1}),
        ("raw-hdf5", inputs["folder"], "hdf5", {"shard_size": 4, "store": "raw", "center_crop": 16, "workers": 1}),
        ("jpeg-wds", inputs["rec"], "wds", {"shard_size": 4, "store": "jpeg", "resize": 12, "workers": 1}),
    ]
    return listed


def run_case(src: str, out: str, fmt: str, options: dict[str, Any], tasks: bool) -> None:
    import packer

    if not tasks:
        packer.pack(src, out, fmt, **options)
        return
    for task in range(2):
        packer.pack(src, out, fmt, task_index=task, task_count=2, **options)
    packer.merge(out)


def local_hashes(out: Path) -> dict[str, str]:
    return {path.relative_to(out).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(out.rglob("*")) if path.is_file()}


def bucket_hashes(s3: dict[str, Any], prefix: str) -> dict[str, str]:
    fs = s3fs_of(s3)
    return {key.split(f"{prefix}/", 1)[1]: hashlib.sha256(fs.cat_file(key)).hexdigest()
            for key in sorted(fs.find(f"{BUCKET}/{prefix}"))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("/tmp/pack-identity"),
                        help="where inputs and local outputs go (emptied first; fixed, as plans record paths)")
    parser.add_argument("--save", type=Path, help="write the hash lines to this file")
    parser.add_argument("--compare", type=Path, help="compare with a file written by --save; exit 1 on a difference")
    parser.add_argument("--only", default="", help="run only cases whose name contains this")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    from loopback import LoopbackS3

    shutil.rmtree(args.root, ignore_errors=True)
    args.root.mkdir(parents=True)
    lines: list[str] = []
    with LoopbackS3() as server:
        s3 = server.storage_options
        os.environ["FSSPEC_S3"] = json.dumps(s3)  # spawned workers read the bucket's address from here
        import fsspec.config

        fsspec.config.conf["s3"] = s3
        s3fs_of(s3).call_s3("create_bucket", Bucket=BUCKET)
        inputs = make_inputs(args.root, s3)
        for name, src, fmt, options in cases(inputs):
            for store in ("local", "s3"):
                for tasks in (False, True) if (name, store) in TASK_CASES else (False,):
                    case = f"{name}-{store}" + ("-tasks" if tasks else "")
                    if args.only not in case:
                        continue
                    if store == "local":
                        out = args.root / "out" / case
                        run_case(src, str(out), fmt, options, tasks)
                        hashes = local_hashes(out)
                    else:
                        run_case(src, f"s3://{BUCKET}/out/{case}", fmt, options, tasks)
                        hashes = bucket_hashes(s3, f"out/{case}")
                    lines += [f"{digest}  {case}/{file}" for file, digest in hashes.items() if file not in LEFT_OUT]
                    print(f"{case}: {len(hashes)} files", file=sys.stderr, flush=True)
    text = "".join(line + "\n" for line in lines)
    if args.save:
        args.save.write_text(text)
    if not args.compare:
        sys.stdout.write(text)
        return 0
    before = set(args.compare.read_text().splitlines())
    now = set(lines)
    differing = sorted(before ^ now, key=lambda line: line.split("  ", 1)[1])
    for line in differing:
        print(("-" if line in before else "+") + line)
    print(f"{len(now)} files hashed, {len(differing)} lines differ from {args.compare}", file=sys.stderr)
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
