from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from imagefolders import add_non_utf8_file, image_bytes, make_image_folder
from loopback import LoopbackHTTP

from packer.run.pipeline import pack
from packer.plan.options import PackOptions
from packer.write.writers import WRITERS

pytest_plugins = ["timeouts"]

PackedAs = Callable[[str], tuple[Path, dict[str, bytes]]]
S3_BUCKET = "pack-test"


def make_test_folder(root: Path) -> dict[str, bytes]:
    """19 seeded images with nested folders, odd names and a non-UTF-8 file name; returns
    {relative path: bytes}."""
    files = make_image_folder(root)
    odd = image_bytes(random.Random(99))
    files[add_non_utf8_file(root, odd)] = odd
    return files


@pytest.fixture
def image_folder(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """The test's own copy of the seeded image folder, to pack or to change."""
    root = tmp_path / "src"
    return root, make_test_folder(root)


@pytest.fixture(scope="session")
def packed_as(tmp_path_factory: pytest.TempPathFactory) -> PackedAs:
    """format -> (dataset, files): the seeded image folder packed in shards of 4 (5 shards, the
    last one short), on first use per format and session; the dataset must only be read. In
    sorted order, so that sample i is the i-th sorted path (tests/test_order.py covers shuffles)."""
    root = tmp_path_factory.mktemp("packed-source") / "src"
    files = make_test_folder(root)
    outs: dict[str, Path] = {}

    def packed_as(fmt: str) -> tuple[Path, dict[str, bytes]]:
        if fmt not in outs:
            outs[fmt] = tmp_path_factory.mktemp(f"packed-{fmt}") / "out"
            pack(root, outs[fmt], PackOptions(format=fmt, shard_size=4, order="sorted"))
        return outs[fmt], dict(files)

    return packed_as


@pytest.fixture(scope="session", params=sorted(WRITERS))
def packed(request: pytest.FixtureRequest, packed_as: PackedAs) -> tuple[Path, dict[str, bytes]]:
    """The seeded image folder packed once per registered format, shared by the whole session:
    tests only read it (use `packed_copy` to change it)."""
    return packed_as(request.param)


@pytest.fixture(params=sorted(WRITERS))
def packed_copy(request: pytest.FixtureRequest, packed_as: PackedAs, tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """The test's own copy of `packed`, for one registered format, to damage."""
    out, files = packed_as(request.param)
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    return copy, files


# Datasets behind URLs: a loopback HTTP server and a loopback S3 (moto), started once per session.


@pytest.fixture(scope="session")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackHTTP]:
    with LoopbackHTTP(tmp_path_factory.mktemp("served")) as server:
        yield server


@pytest.fixture
def serve(http_server: LoopbackHTTP, packed_as: PackedAs, request: pytest.FixtureRequest) -> Callable[[str], str]:
    """format -> URL of this test's own copy of the shared packed dataset on the HTTP server
    (its own paths, so GET counts and faults are the test's alone)."""
    made: list[str] = []

    def serve(fmt: str) -> str:
        name = f"{request.node.name}-{fmt}-{len(made)}".replace("[", "-").replace("]", "")
        shutil.copytree(packed_as(fmt)[0], http_server.directory / name)
        made.append(name)
        return f"{http_server.url}/{name}"

    return serve


@pytest.fixture(scope="session")
def s3_options() -> Iterator[dict[str, Any]]:
    """storage_options for a moto S3 server on loopback holding an empty bucket `pack-test`."""
    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    options = {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"}}
    s3fs.S3FileSystem(**options).call_s3("create_bucket", Bucket=S3_BUCKET)
    yield options
    server.stop()


@pytest.fixture(scope="session")
def s3_packed(s3_options: dict[str, Any], packed_as: PackedAs) -> Callable[[str], str]:
    """format -> s3:// URL of the shared packed dataset, uploaded on first use."""
    import s3fs

    fs = s3fs.S3FileSystem(**s3_options)
    urls: dict[str, str] = {}

    def s3_packed(fmt: str) -> str:
        if fmt not in urls:
            for file in sorted(packed_as(fmt)[0].iterdir()):
                fs.put_file(str(file), f"{S3_BUCKET}/{fmt}/{file.name}")
            urls[fmt] = f"s3://{S3_BUCKET}/{fmt}"
        return urls[fmt]

    return s3_packed
