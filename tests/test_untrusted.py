"""A stranger's dataset stays inside its folder: hostile index.json files and sidecars.

Each variant is made by the test from a sound packed dataset (one field, one type confusion or
one path trick at a time) and opened as a user would: `open_dataset` on a folder, over loopback
HTTP and on a loopback S3 server, and `pack verify`, `pack info` and re-packing. Every one must be
one DatasetError naming index.json and the field, before any shard is fetched or opened; the
files outside the dataset and the cache must stay as they were, and the servers must see no
request outside the dataset's prefix.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import logging
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import h5py
import numpy as np
import pytest
from clirun import run
from loopback import LoopbackHTTP, LoopbackS3

import readers
from readers.layouts.wds import INDEX_HEADER
from readers.tar import BLOCK
from readers.manifest import MANIFEST_NAME

Mutate = Callable[[dict[str, Any]], None]
BUCKET = "hostile"


def setter(*path: Any, value: Any) -> Mutate:
    """A mutation that sets manifest[path...] = value."""

    def mutate(manifest: dict[str, Any]) -> None:
        target = manifest
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def both(*mutations: Mutate) -> Mutate:
    def mutate(manifest: dict[str, Any]) -> None:
        for mutation in mutations:
            mutation(manifest)

    return mutate


def drop(*path: Any) -> Mutate:
    def mutate(manifest: dict[str, Any]) -> None:
        target = manifest
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


PATH_TRICKS = ["../other/shard-000000.tar", "/etc/hostname", "..", ".", "", "sub/shard-000000.tar",
               "shard-000000.tar/../../x", "..\\shard-000000.tar", "%2e%2e/shard-000000.tar",
               "shard-000000.tar?x=1", "shard-000000.tar#x", "shard-000000.tar\x00", " shard-000000.tar",
               ".hidden.tar", "~/shard-000000.tar", "file:///etc/hostname", "http://evil/x.tar"]
HASH_TRICKS = ["../../../../outside-x", "A" * 64, "0" * 63, "0" * 65, "g" * 64, "", "0" * 62 + "/x",
               "../" + "0" * 61]

# (id, mutation of a sound wds manifest, the field the error must name)
VARIANTS: list[tuple[str, Mutate, str]] = [
    *[(f"shard-name-{i}", setter("shards", 0, "name", value=trick), r"shards\[0\]\.name")
      for i, trick in enumerate(PATH_TRICKS)],
    *[(f"sidecar-name-{i}", setter("shards", 1, "sidecars", 0, "name", value=trick), r"shards\[1\]\.sidecars\[0\]\.name")
      for i, trick in enumerate(PATH_TRICKS)],
    *[(f"descriptor-name-{i}", setter("descriptors", 0, "name", value=trick), r"descriptors\[0\]\.name")
      for i, trick in enumerate(PATH_TRICKS)],
    *[(f"shard-sha-{i}", setter("shards", 0, "sha256", value=trick), r"shards\[0\]\.sha256")
      for i, trick in enumerate(HASH_TRICKS)],
    *[(f"sidecar-sha-{i}", setter("shards", 0, "sidecars", 0, "sha256", value=trick), r"shards\[0\]\.sidecars\[0\]\.sha256")
      for i, trick in enumerate(HASH_TRICKS)],
    ("descriptor-sha", setter("descriptors", 0, "sha256", value="../x"), r"descriptors\[0\]\.sha256"),
    ("shard-of-another-format", setter("shards", 0, "name", value="shard-000000.h5"), r"shards\[0\]\.name"),
    ("shard-not-numbered", setter("shards", 0, "name", value="shard-x.tar"), r"shards\[0\]\.name"),
    ("index-as-shard", setter("shards", 0, "name", value="index.json"), r"shards\[0\]\.name"),
    ("sidecar-of-another-shard", setter("shards", 1, "sidecars", 0, "name", value="shard-000000.packidx"),
     r"shards\[1\]\.sidecars\[0\]\.name"),
    ("sidecar-is-the-shard", setter("shards", 1, "sidecars", 0, "name", value="shard-000001.tar"),
     r"shards\[1\]\.sidecars\[0\]\.name"),
    ("shard-twice", lambda m: m["shards"].__setitem__(1, copy.deepcopy(m["shards"][0])), r"shards\[1\]\.name"),
    ("descriptor-not-a-descriptor", setter("descriptors", 0, "name", value="shard-000000.tar"), r"descriptors\[0\]\.name"),
    ("index-as-descriptor", setter("descriptors", 0, "name", value="index.json"), r"descriptors\[0\]\.name"),
    # sizes and counts
    ("num-samples-raised", lambda m: m.__setitem__("num_samples", m["num_samples"] + 10**12), r"num_samples"),
    ("num-samples-negative", setter("num_samples", value=-1), r"num_samples"),
    ("num-samples-text", setter("num_samples", value="19"), r"num_samples"),
    ("num-samples-float", setter("num_samples", value=19.0), r"num_samples"),
    ("num-samples-bool", setter("num_samples", value=True), r"num_samples"),
    ("num-samples-null", setter("num_samples", value=None), r"num_samples"),
    ("num-samples-missing", drop("num_samples"), r"num_samples"),
    ("shard-count-raised", both(lambda m: m["shards"][0].__setitem__("num_samples", 4 + 10**12),
                                lambda m: m.__setitem__("num_samples", m["num_samples"] + 10**12)), r"shards\[0\]"),
    ("shard-count-negative", both(setter("shards", 0, "num_samples", value=-4),
                                  lambda m: m.__setitem__("num_samples", m["num_samples"] - 8)), r"shards\[0\]\.num_samples"),
    ("shard-count-list", setter("shards", 0, "num_samples", value=[4]), r"shards\[0\]\.num_samples"),
    ("shard-size-negative", setter("shards", 0, "bytes", value=-5), r"shards\[0\]\.bytes"),
    ("shard-size-beyond-any-file", setter("shards", 0, "bytes", value=1 << 60), r"shards\[0\]\.bytes"),
    ("shard-count-beyond-int64", both(setter("shards", 0, "num_samples", value=10**19),
                                      setter("shards", 0, "bytes", value=1 << 49)), r"shards\[0\]\.num_samples"),
    ("shard-size-text", setter("shards", 0, "bytes", value="5"), r"shards\[0\]\.bytes"),
    ("shard-size-float", setter("shards", 0, "bytes", value=1.5), r"shards\[0\]\.bytes"),
    ("shard-too-small-for-its-count", setter("shards", 0, "bytes", value=100), r"shards\[0\]"),
    ("shard-classes-above-count", setter("shards", 0, "num_classes", value=5), r"shards\[0\]\.num_classes"),
    ("shard-classes-negative", setter("shards", 0, "num_classes", value=-1), r"shards\[0\]\.num_classes"),
    ("sidecar-size-negative", setter("shards", 0, "sidecars", 0, "bytes", value=-1), r"shards\[0\]\.sidecars\[0\]\.bytes"),
    ("source-bytes-negative", setter("source_bytes", value=-1), r"source_bytes"),
    ("class-counts-too-many", lambda m: m["class_counts"].__setitem__(0, 10**6), r"class_counts"),
    ("class-counts-negative", lambda m: m["class_counts"].__setitem__(0, -1), r"class_counts\[0\]"),
    ("class-counts-length", lambda m: m["class_counts"].append(0), r"class_counts"),
    ("class-counts-text", setter("class_counts", value="4"), r"class_counts"),
    # types and shapes
    ("not-an-object", lambda m: (m.clear(), m.__setitem__("x", 1)), r"version"),
    ("shards-not-a-list", setter("shards", value={"name": "shard-000000.tar"}), r"shards"),
    ("shard-not-an-object", setter("shards", 0, value="shard-000000.tar"), r"shards\[0\]"),
    ("sidecars-not-a-list", setter("shards", 0, "sidecars", value="shard-000000.packidx"), r"shards\[0\]\.sidecars"),
    ("classes-not-a-list", setter("classes", value="abc"), r"classes"),
    ("class-not-a-name", setter("classes", 0, value=7), r"classes\[0\]"),
    ("class-named-twice", lambda m: m["classes"].__setitem__(1, m["classes"][0]), r"classes\[1\]"),
    ("version-newer", setter("version", value=99), r"version"),
    ("version-text", setter("version", value="2"), r"version"),
    ("version-zero", setter("version", value=0), r"version"),
    ("format-unknown", setter("format", value="zip"), r"format"),
    ("format-list", setter("format", value=["wds"]), r"format"),
    ("store-unknown", setter("store", value="../evil"), r"store"),
    ("options-list", setter("options", value=[1]), r"options"),
    ("tool-version-number", setter("tool_version", value=1), r"tool_version"),
    ("field-path-name", setter("fields", value=[{"name": "../x", "type": "str"}]), r"fields\[0\]\.name"),
    ("field-reserved-name", setter("fields", value=[{"name": "cls", "type": "str"}]), r"fields\[0\]\.name"),
    ("field-unknown-type", setter("fields", value=[{"name": "x", "type": "exe"}]), r"fields\[0\]\.type"),
    ("field-dtype-unknown", setter("fields", value=[{"name": "x", "type": "array", "dtype": "object"}]),
     r"fields\[0\]\.dtype"),
    ("field-dtype-on-str", setter("fields", value=[{"name": "x", "type": "str", "dtype": "int64"}]), r"fields\[0\]\.dtype"),
    ("field-shape-negative", setter("fields", value=[{"name": "x", "type": "array", "dtype": "int64", "shape": [-1]}]),
     r"fields\[0\]\.shape\[0\]"),
    ("field-shape-text", setter("fields", value=[{"name": "x", "type": "array", "dtype": "int64", "shape": "4"}]),
     r"fields\[0\]\.shape"),
    ("field-shape-deep", setter("fields", value=[{"name": "x", "type": "array", "dtype": "int64", "shape": [1] * 40}]),
     r"fields\[0\]\.shape"),
    ("field-optional-text", setter("fields", value=[{"name": "x", "type": "str", "optional": "yes"}]),
     r"fields\[0\]\.optional"),
    ("field-twice", setter("fields", value=[{"name": "x", "type": "str"}, {"name": "x", "type": "int"}]),
     r"fields\[1\]\.name"),
    ("field-not-an-object", setter("fields", value=["x"]), r"fields\[0\]"),
]
PATH_VARIANTS = [variant for variant in VARIANTS if "name" in variant[0] or "sha" in variant[0]]


def sound_manifest(out: Path) -> dict[str, Any]:
    return json.loads((out / MANIFEST_NAME).read_text())


def snapshot(root: Path, skip: tuple[Path, ...]) -> dict[str, tuple[int, str]]:
    """Every file and folder under `root` but those in `skip`: its size and content hash."""
    seen: dict[str, tuple[int, str]] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if Path(folder, d) not in skip]
        for name in dirs:
            seen[os.path.relpath(Path(folder, name), root)] = (-1, "")
        for name in files:
            path = Path(folder, name)
            seen[os.path.relpath(path, root)] = (path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
    return seen


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory, packed_as: Callable) -> Iterator[dict[str, Any]]:
    """A folder of everything an escape could touch: a sound wds dataset, 'other' datasets beside
    it whose files the tricks name, and the files 'outside-x' and 'outside-x.use' they aim at;
    served over HTTP (the whole sandbox, so a request outside the prefix could be answered) and
    put in an S3 bucket in the same shape."""
    root = tmp_path_factory.mktemp("sandbox")
    shutil.copytree(packed_as("wds")[0], root / "data" / "sound")
    shutil.copytree(packed_as("wds")[0], root / "data" / "other")
    for depth in range(1, 6):
        (root / ("d/" * depth) / "outside-x").parent.mkdir(parents=True, exist_ok=True)
        (root / ("d/" * depth) / "outside-x").write_text("keep\n")
        (root / ("d/" * depth) / "outside-x.use").write_text("keep\n")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with LoopbackHTTP(root) as http, LoopbackS3() as s3:
        import s3fs

        fs = s3fs.S3FileSystem(**s3.storage_options)
        fs.call_s3("create_bucket", Bucket=BUCKET)
        for file in (root / "data" / "other").iterdir():
            fs.put_file(str(file), f"{BUCKET}/data/other/{file.name}")
        yield {"root": root, "http": http, "s3": s3, "fs": fs}


def variant_dataset(sandbox: dict[str, Any], name: str, mutate: Mutate) -> Path:
    """A copy of the sound dataset under data/NAME, with its index.json mutated."""
    out = sandbox["root"] / "data" / name
    if not out.exists():
        shutil.copytree(sandbox["root"] / "data" / "sound", out)
        manifest = sound_manifest(out)
        mutate(manifest)
        (out / MANIFEST_NAME).write_text(json.dumps(manifest))
    return out


def assert_one_error(exc: BaseException, where: str, field: str) -> None:
    message = str(exc)
    assert "\n" not in message
    assert re.match(rf"{re.escape(where)}: {field}: ", message), message


@pytest.mark.parametrize("name,mutate,field", VARIANTS, ids=[variant[0] for variant in VARIANTS])
def test_a_hostile_manifest_is_one_error_naming_file_and_field(name: str, mutate: Mutate, field: str,
                                                               sandbox: dict[str, Any]) -> None:
    out = variant_dataset(sandbox, name, mutate)
    cache = sandbox["root"] / "cache" / name
    before = snapshot(sandbox["root"], (cache,))
    with pytest.raises(readers.DatasetError) as local:
        readers.open_dataset(out)
    assert_one_error(local.value, str(out / MANIFEST_NAME), field)
    http: LoopbackHTTP = sandbox["http"]
    http.gets.clear()
    url = f"{http.url}/data/{name}"
    with pytest.raises(readers.DatasetError) as remote:
        readers.open_dataset(url, cache_dir=cache)
    assert_one_error(remote.value, f"{url}/{MANIFEST_NAME}", field)
    assert set(http.gets) == {f"/data/{name}/{MANIFEST_NAME}"}  # nothing fetched but the manifest
    assert snapshot(sandbox["root"], (cache,)) == before
    assert not [path for path in cache.rglob("*") if path.is_file()]  # the cache holds nothing either


@pytest.mark.parametrize("name,mutate,field", PATH_VARIANTS, ids=[variant[0] for variant in PATH_VARIANTS])
def test_a_hostile_manifest_on_s3_asks_for_nothing_outside_its_prefix(name: str, mutate: Mutate, field: str,
                                                                      sandbox: dict[str, Any]) -> None:
    out = variant_dataset(sandbox, name, mutate)
    s3: LoopbackS3 = sandbox["s3"]
    sandbox["fs"].put_file(str(out / MANIFEST_NAME), f"{BUCKET}/data/{name}/{MANIFEST_NAME}")
    cache = sandbox["root"] / "cache" / f"s3-{name}"
    before = snapshot(sandbox["root"], (cache,))
    s3.paths.clear()
    url = f"s3://{BUCKET}/data/{name}"
    with pytest.raises(readers.DatasetError) as remote:
        readers.open_dataset(url, cache_dir=cache, storage_options=s3.storage_options)
    assert_one_error(remote.value, f"{url}/{MANIFEST_NAME}", field)
    assert s3.paths and set(s3.paths) <= {f"/{BUCKET}/data/{name}/{MANIFEST_NAME}"}, s3.paths
    assert snapshot(sandbox["root"], (cache,)) == before


@pytest.mark.parametrize("name,mutate,field", PATH_VARIANTS[::3], ids=[variant[0] for variant in PATH_VARIANTS[::3]])
def test_verify_info_and_repacking_refuse_a_hostile_manifest(name: str, mutate: Mutate, field: str,
                                                             sandbox: dict[str, Any], tmp_path: Path) -> None:
    out = variant_dataset(sandbox, name, mutate)
    before = snapshot(sandbox["root"], ())
    http: LoopbackHTTP = sandbox["http"]
    http.gets.clear()
    url = f"{http.url}/data/{name}"
    for args, where in [(("verify", out), out), (("info", out), out), (("verify", url), url), (("info", url), url),
                        (("wds", out, tmp_path / "repacked"), out)]:
        code, output = run(*args)
        assert code == 1, output
        error = output.strip().splitlines()[-1]  # after pack's progress bar
        assert "Traceback" not in output and error.startswith(f"Error: {where}/{MANIFEST_NAME}: "), (args, output)
        assert re.search(rf"{MANIFEST_NAME}: {field}: ", error), error
    assert set(http.gets) == {f"/data/{name}/{MANIFEST_NAME}"}
    assert snapshot(sandbox["root"], ()) == before


def test_repacking_a_hostile_manifest_from_s3_asks_for_nothing_outside_its_prefix(sandbox: dict[str, Any],
                                                                                 tmp_path: Path) -> None:
    name, mutate, field = VARIANTS[0]  # a shard named ../other/shard-000000.tar
    out = variant_dataset(sandbox, name, mutate)
    sandbox["fs"].put_file(str(out / MANIFEST_NAME), f"{BUCKET}/data/{name}/{MANIFEST_NAME}")
    s3: LoopbackS3 = sandbox["s3"]
    s3.paths.clear()
    url = f"s3://{BUCKET}/data/{name}"
    env = {**os.environ, "FSSPEC_S3": json.dumps(s3.storage_options), "PACK_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "packer.cli", "lmdb", url, str(tmp_path / "repacked"), "-q"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert re.fullmatch(rf"Error: {re.escape(url)}/{MANIFEST_NAME}: {field}: .*\n", done.stderr), done.stderr
    assert s3.paths and all(path.startswith(f"/{BUCKET}/data/{name}") for path in s3.paths), s3.paths


# Sidecars and offset tables: bounds-checked against the shard before any read.

HUGE = 1 << 34  # 16 GiB: a read of this size would be an allocation the machine may even grant


def republish(out: Path, name: str, data: bytes) -> None:
    """Replace file `name` of the dataset and make index.json agree with it (size and sha256), as
    an attacker who controls the whole folder would: then only the bounds checks stand between."""
    (out / name).write_bytes(data)
    manifest = sound_manifest(out)
    for info in [*manifest["shards"], *(s for shard in manifest["shards"] for s in shard["sidecars"])]:
        if info["name"] == name:
            info["bytes"], info["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))


def lying_packidx(out: Path, row: int, column: int, value: int) -> bytes:
    data = bytearray((out / "shard-000000.packidx").read_bytes())
    columns = struct.unpack_from("<I", data, 4)[0]
    struct.pack_into("<q", data, INDEX_HEADER.size + 8 * (row * columns + column), value)
    return bytes(data)


def read_peak(read: Callable[[], Any]) -> tuple[BaseException | None, int]:
    """What `read()` raised, and the most memory Python allocated meanwhile."""
    import tracemalloc

    tracemalloc.start()
    try:
        read()
        raised = None
    except Exception as exc:  # noqa: BLE001 - the caller asserts what it is
        raised = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return raised, peak


PACKIDX_LIES = [  # (id, row, column, value): column 0 image offset, 1 image size, 2 meta offset, 3 meta size
    ("image-size-huge", 1, 1, HUGE), ("image-size-negative", 1, 1, -5), ("image-offset-huge", 1, 0, HUGE),
    ("image-offset-negative", 1, 0, -512), ("meta-size-huge", 1, 3, HUGE), ("meta-offset-huge", 1, 2, HUGE),
    ("meta-size-negative", 1, 3, -1), ("meta-before-image", 1, 2, 0),
]


@pytest.mark.parametrize("where", ["local", "http"])
@pytest.mark.parametrize("name,row,column,value", PACKIDX_LIES, ids=[lie[0] for lie in PACKIDX_LIES])
def test_a_lying_packidx_is_an_error_never_a_read_past_the_tar(name: str, row: int, column: int, value: int,
                                                               where: str, sandbox: dict[str, Any],
                                                               tmp_path: Path) -> None:
    out = sandbox["root"] / "data" / f"packidx-{name}"
    if not out.exists():
        shutil.copytree(sandbox["root"] / "data" / "sound", out)
        republish(out, "shard-000000.packidx", lying_packidx(out, row, column, value))
    path = out if where == "local" else f"{sandbox['http'].url}/data/{out.name}"
    ds = readers.open_dataset(path, decode="bytes", cache_dir=tmp_path / "cache")
    raised, peak = read_peak(lambda: ds[row])
    assert isinstance(raised, readers.DatasetError), raised
    message = str(raised)  # names the shard's file: in the dataset folder, or the cache's copy of a URL's
    assert f".tar: sample {row}: " in message and ("damaged tar index" in message or "truncated" in message), message
    assert peak < 8 << 20, peak
    assert ds[row + 1] is not None and len(list(ds.iter_shard(0))) == 4  # the rest reads; streaming needs no index
    ds.close()


@pytest.mark.parametrize("name,row,column,value", PACKIDX_LIES, ids=[lie[0] for lie in PACKIDX_LIES])
def test_a_lying_packidx_streams_what_the_tar_holds(name: str, row: int, column: int, value: int,
                                                    sandbox: dict[str, Any]) -> None:
    """Streaming reads a local tar through its index; a row that does not match the tar is checked
    before it becomes a read or an allocation, and the sample comes from a walk of the tar: the
    same samples as a front-to-back read, none from where the index points."""
    out = sandbox["root"] / "data" / f"packidx-stream-{name}"
    shutil.copytree(sandbox["root"] / "data" / "sound", out)
    republish(out, "shard-000000.packidx", lying_packidx(out, row, column, value))
    ds = readers.open_dataset(out, decode="bytes")
    count = ds.manifest.shards[0].num_samples
    whole = [(meta, bytes(payload), fields) for _, (meta, payload, fields) in ds.read_records(0, 0, count)]
    streamed: list[tuple[Any, ...]] = []
    raised, peak = read_peak(lambda: streamed.extend((meta, bytes(payload), fields) for meta, payload, fields in
                                                     (record.load() for _, record in ds.stream_records(0, 0, count))))
    assert raised is None and streamed == whole and len(whole) == 4
    assert peak < 8 << 20, peak
    ds.close()


def test_a_packidx_claiming_more_samples_is_refused(sandbox: dict[str, Any]) -> None:
    out = sandbox["root"] / "data" / "packidx-count"
    shutil.copytree(sandbox["root"] / "data" / "sound", out)
    data = bytearray((out / "shard-000000.packidx").read_bytes())
    struct.pack_into("<q", data, 8, 1 << 40)
    republish(out, "shard-000000.packidx", bytes(data))
    raised, peak = read_peak(lambda: readers.open_dataset(out)[0])
    assert isinstance(raised, readers.DatasetError) and "shard-000000.packidx: indexes" in str(raised), raised
    assert peak < 8 << 20


def test_a_tar_member_claiming_more_bytes_than_the_tar_is_an_error(sandbox: dict[str, Any]) -> None:
    out = sandbox["root"] / "data" / "member-size"
    shutil.copytree(sandbox["root"] / "data" / "sound", out)
    data = bytearray((out / "shard-000000.tar").read_bytes())
    data[124:136] = b"%011o\0" % (8**11 - 1)  # the first member: 8 GiB
    data[148:156] = b" " * 8
    data[148:156] = b"%06o\0 " % sum(data[:BLOCK])
    republish(out, "shard-000000.tar", bytes(data))
    ds = readers.open_dataset(out, decode="bytes")
    raised, peak = read_peak(lambda: list(ds.iter_shard(0)))
    assert isinstance(raised, readers.DatasetError), raised
    assert re.search(r"shard-000000\.tar: tar shard is truncated in '000000_0000000000\.\w+' \(8589934591 bytes",
                     str(raised)), raised
    assert peak < 8 << 20


HDF5_LIES = [("end-huge", 1, HUGE), ("end-negative", 1, -5), ("start-after-end", 2, 0), ("start-negative", 0, -10)]


@pytest.mark.parametrize("name,row,value", HDF5_LIES, ids=[lie[0] for lie in HDF5_LIES])
def test_lying_hdf5_offsets_are_an_error_never_a_huge_read(name: str, row: int, value: int, packed_as: Callable,
                                                           tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(packed_as("hdf5")[0], out)
    with h5py.File(out / "shard-000000.h5", "r+") as file:
        file["offsets"][row] = value
    ds = readers.open_dataset(out, decode="bytes")
    damaged = [i for i in range(4) if i in (row - 1, row)]
    for i in damaged:
        raised, peak = read_peak(lambda: ds[i])
        assert isinstance(raised, readers.DatasetError) and f"shard-000000.h5: sample {i}: " in str(raised), raised
        assert peak < 8 << 20
    raised, _ = read_peak(lambda: ds.__getitems__([0, 1, 2, 3]))  # the batch path, read ahead
    assert isinstance(raised, readers.DatasetError)
    assert [ds[i] for i in range(4) if i not in damaged]


def test_hdf5_columns_of_the_wrong_length_are_refused_before_they_are_read(packed_as: Callable, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(packed_as("hdf5")[0], out)
    with h5py.File(out / "shard-000000.h5", "r+") as file:
        del file["labels"]
        file.create_dataset("labels", shape=(HUGE,), dtype=np.int64, chunks=(1 << 16,), compression="gzip")
    raised, peak = read_peak(lambda: readers.open_dataset(out)[0])
    assert isinstance(raised, readers.DatasetError), raised
    assert f"shard-000000.h5: labels holds {HUGE} samples, index.json says 4" in str(raised)
    assert peak < 8 << 20


def test_paths_are_built_only_from_checked_names_and_hashes(tmp_path: Path) -> None:
    """A manifest made in Python (not parsed) meets the same checks where paths are built."""
    from readers.cache import ShardCache
    from readers.manifest import FileInfo
    from readers.remote import LocalFiles, RemoteStore

    cache = ShardCache(tmp_path / "cache")
    sound = FileInfo("shard-000000.tar", 10, "0" * 64)
    assert cache.object_path(sound) == tmp_path / "cache" / "objects" / ("0" * 64 + ".tar")
    for hostile in [FileInfo("../x.tar", 10, "0" * 64), FileInfo("shard-000000.tar", 10, "../../../../outside-x")]:
        with pytest.raises(readers.DatasetError, match="is not a"):
            cache.object_path(hostile)
        with pytest.raises(readers.DatasetError, match="is not a"):
            cache.lease(hostile, RemoteStore("http://127.0.0.1:9"))
    with pytest.raises(readers.DatasetError, match="'/etc/hostname' is not a plain file name"):
        LocalFiles(tmp_path).path(FileInfo("/etc/hostname", 10, "0" * 64))
    with pytest.raises(readers.DatasetError, match="is not a plain file name"):
        RemoteStore("http://127.0.0.1:9/data").url_of("../other/shard-000000.tar")
    assert not (tmp_path / "outside-x.use").exists()


def test_the_formats_table_names_the_files_each_layout_writes() -> None:
    from readers.formats import FORMATS
    from readers.layouts.wds import DALI_INDEX_EXTENSION, INDEX_EXTENSION

    assert FORMATS["wds"].sidecars == (INDEX_EXTENSION, DALI_INDEX_EXTENSION)


def test_a_url_whose_index_json_is_not_sound_is_not_taken_for_a_folder_of_images(sandbox: dict[str, Any]) -> None:
    from packer.sources.inputs import resolve_source
    from packer.sources.listing import ScanError

    out = variant_dataset(sandbox, "version-newer", setter("version", value=99))
    with pytest.raises(ScanError, match=r"index\.json: version: format version 99 is newer"):
        resolve_source(f"{sandbox['http'].url}/data/{out.name}")
    assert resolve_source(f"{sandbox['http'].url}/data/nothing-here").kind == "folder"


def test_pack_info_escapes_control_characters_a_manifest_holds(sandbox: dict[str, Any]) -> None:
    out = variant_dataset(sandbox, "terminal-escapes", both(setter("classes", 0, value="a\x1b[2Jb"),
                                                            setter("tool_version", value="pack \x07")))
    code, output = run("info", out)
    assert code == 0, output
    assert "\x1b" not in output and "\x07" not in output
    assert "a\\x1b[2Jb" in output and "pack \\x07" in output


def hdf5_copy(packed_as: Callable, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(packed_as("hdf5")[0], out)
    return out


SECRET = b"TOPSECRET-ssh-key-0123456789abcd"


def external_storage(file: h5py.File, secret: Path) -> None:
    del file["labels"]
    file.create_dataset("labels", shape=(4,), dtype=np.int64, external=[(str(secret), 0, 32)])


def external_link(file: h5py.File, secret: Path) -> None:
    with h5py.File(secret.with_suffix(".h5"), "w") as other:
        other.create_dataset("labels", data=np.frombuffer(SECRET, dtype=np.int64))
    del file["labels"]
    file["labels"] = h5py.ExternalLink(str(secret.with_suffix(".h5")), "/labels")


def virtual_dataset(file: h5py.File, secret: Path) -> None:
    with h5py.File(secret.with_suffix(".h5"), "w") as other:
        other.create_dataset("labels", data=np.frombuffer(SECRET, dtype=np.int64))
    layout = h5py.VirtualLayout(shape=(4,), dtype=np.int64)
    layout[:] = h5py.VirtualSource(str(secret.with_suffix(".h5")), "labels", shape=(4,))
    del file["labels"]
    file.create_virtual_dataset("labels", layout)


def soft_link_to_a_field(file: h5py.File, secret: Path) -> None:
    file["crc32_copy"] = file["crc32"]
    del file["crc32"]
    file["crc32"] = h5py.SoftLink("/crc32_copy")


@pytest.mark.parametrize("make", [external_storage, external_link, virtual_dataset, soft_link_to_a_field],
                         ids=lambda make: make.__name__)
def test_an_hdf5_shard_cannot_make_the_reader_read_another_file(make: Callable, packed_as: Callable,
                                                                tmp_path: Path) -> None:
    out = hdf5_copy(packed_as, tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    with h5py.File(out / "shard-000000.h5", "r+") as file:
        make(file, secret)
    ds = readers.open_dataset(out, fields=("label",))
    with pytest.raises(readers.DatasetError, match=r"shard-000000\.h5: '(labels|crc32)' (links outside the shard|keeps its "
                                                   r"data outside the shard)"):
        ds[0]
    code, output = run("verify", out)
    assert code == 1 and "TOPSECRET" not in output and "Traceback" not in output


@pytest.mark.parametrize("name,shape,chunks", [("labels", (4, 16000, 16000), (1, 1000, 1000)),
                                               ("crc32", (4, 3), None), ("images", (200_000_000,), (1,))])
def test_hdf5_columns_of_another_shape_are_refused_before_they_are_read(name: str, shape: tuple, chunks: Any,
                                                                        packed_as: Callable, tmp_path: Path) -> None:
    out = hdf5_copy(packed_as, tmp_path)
    with h5py.File(out / "shard-000000.h5", "r+") as file:
        dtype = file[name].dtype
        del file[name]
        file.create_dataset(name, shape=shape, dtype=dtype, chunks=chunks)  # never written: costs no disk
    raised, peak = read_peak(lambda: readers.open_dataset(out)[0])
    assert isinstance(raised, readers.DatasetError) and f"shard-000000.h5: {name} " in str(raised), raised
    assert peak < 8 << 20


def test_counts_raised_with_sizes_to_match_are_refused_by_the_files_real_sizes(sandbox: dict[str, Any]) -> None:
    """A liar who raises a shard's count and its size in index.json together (10^9 samples in a
    'terabyte' that is a 15 kB file) would have a loader plan an epoch of 8 GB of indices: the real
    sizes (the folder's, the bucket's listing) refuse it first."""
    raise_count = both(setter("shards", 0, "num_samples", value=10**9), setter("shards", 0, "bytes", value=10**13),
                       lambda m: m.__setitem__("num_samples", m["num_samples"] + 10**9 - 4))
    out = variant_dataset(sandbox, "count-and-size-raised", raise_count)
    with pytest.raises(readers.DatasetError, match=r"shard-000000\.tar: \d+ bytes cannot hold the 1000000000 samples "
                                                   r"index\.json counts in it"):
        readers.open_dataset(out)
    for file in out.iterdir():
        sandbox["fs"].put_file(str(file), f"{BUCKET}/data/{out.name}/{file.name}")
    url = f"s3://{BUCKET}/data/{out.name}"
    raised, peak = read_peak(lambda: readers.open_dataset(url, cache_dir=out.parent.parent / "cache" / out.name,
                                                          storage_options=sandbox["s3"].storage_options))
    assert isinstance(raised, readers.DatasetError) and str(raised).startswith(f"{url}/shard-000000.tar: "), raised
    assert peak < 32 << 20


def test_a_fifo_named_like_a_shard_is_an_error_not_a_hang(tmp_path: Path, packed_as: Callable) -> None:
    out = tmp_path / "out"
    shutil.copytree(packed_as("wds")[0], out)
    (out / "shard-000000.tar").unlink()
    os.mkfifo(out / "shard-000000.tar")
    with pytest.raises(readers.DatasetError, match=r"shard-000000\.tar: not a regular file"):
        readers.open_dataset(out)


def test_a_store_that_sends_more_than_index_json_says_is_cut_off(sandbox: dict[str, Any], tmp_path: Path) -> None:
    """index.json says 2 kB; the server sends the whole (larger) tar: the download stops at once
    instead of filling the cache's disk (a server that never stops would fill it)."""
    out = variant_dataset(sandbox, "shard-smaller-than-sent", setter("shards", 0, "bytes", value=6144))
    url = f"{sandbox['http'].url}/data/{out.name}"
    ds = readers.open_dataset(url, decode="bytes", cache_dir=tmp_path / "cache")
    with pytest.raises(readers.DatasetError, match=rf"^{re.escape(url)}/shard-000000\.tar: the store sends \d+ bytes, "
                                                   r"index\.json says 6144$"):
        ds[0]
    assert sum(path.stat().st_size for path in (tmp_path / "cache").rglob("*") if path.is_file()) == 0
    assert sandbox["http"].gets[f"/data/{out.name}/shard-000000.tar"] == 1  # not retried


@pytest.mark.parametrize("text,problem", [('{"classes": ["cat", "cat", "dog"]}', "classes name 'cat' twice"),
                                          ('{"classes": "dog"}', "classes must be a list of names"),
                                          ('{"classes": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                           "not the index.json of a packed dataset (no classes list)")])
def test_a_classes_json_is_checked_as_index_json_would_be(text: str, problem: str, image_folder: tuple[Path, Any],
                                                          tmp_path: Path) -> None:
    (tmp_path / "other.json").write_text(text)
    code, output = run("lmdb", image_folder[0], tmp_path / "out", "--classes", tmp_path / "other.json", "-q")
    assert code == 1 and output.strip().splitlines()[-1] == f"Error: {tmp_path / 'other.json'}: {problem}", output
