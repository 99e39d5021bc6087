"""Packing straight into an object store (moto's S3 on loopback through s3fs): the bucket ends up
holding exactly what a local pack of the same folder holds, and resume, the cluster flow, verify,
info and a remote SRC work there."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from conftest import S3_BUCKET

import readers
from clirun import run
from loopback import LoopbackHTTP
from imagefolders import image_bytes, make_image_folder
from recordfiles import recordio_payload, write_recordio
from packer.plan.partition import Partition
from packer.run.pipeline import merge, pack
from packer.stores.remote_out import RemoteOut
from packer.plan.options import PackOptions
from packer.write.writers import WRITERS

FIELDS = ("image", "label", "path", "index")


def s3fs_of(options: dict[str, Any]) -> Any:
    import s3fs

    return s3fs.S3FileSystem(**options, skip_instance_cache=True)


def bucket_files(options: dict[str, Any], prefix: str) -> dict[str, bytes]:
    """Every object under `prefix` (relative name -> bytes), the work folder left out."""
    fs = s3fs_of(options)
    keys = [key for key in fs.find(f"{S3_BUCKET}/{prefix}") if "/.pack/" not in key]
    return {key.split(f"{prefix}/", 1)[1]: fs.cat_file(key) for key in keys}


def local_files(out: Path) -> dict[str, bytes]:
    return {path.relative_to(out).as_posix(): path.read_bytes() for path in sorted(out.rglob("*"))
            if path.is_file() and ".pack" not in path.relative_to(out).parts}


def cli_env(options: dict[str, Any]) -> dict[str, str]:
    """The environment a `pack` subprocess finds the loopback S3 in (fsspec's own configuration)."""
    return {**os.environ, "FSSPEC_S3": json.dumps(options)}


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_remote_pack_equals_local_pack(fmt: str, image_folder: tuple[Path, dict[str, bytes]], s3_options: dict,
                                       tmp_path: Path) -> None:
    src, _ = image_folder
    pack(src, tmp_path / "local", PackOptions(format=fmt, shard_size=4), workers=1)
    url = f"s3://{S3_BUCKET}/equal-{fmt}"
    staging = tmp_path / "staging"
    summary = pack(src, url, PackOptions(format=fmt, shard_size=4), workers=2, staging=staging,
                   storage_options=s3_options)
    assert summary.published and summary.num_shards == 5
    assert bucket_files(s3_options, f"equal-{fmt}") == local_files(tmp_path / "local")
    assert not [path for path in staging.rglob("*") if path.is_file() and path.name.startswith("shard-")]
    remote = readers.open_dataset(url, decode="bytes", fields=FIELDS, cache_dir=tmp_path / "cache",
                                  storage_options=s3_options)
    local = readers.open_dataset(tmp_path / "local", decode="bytes", fields=FIELDS)
    assert list(remote) == list(local)


@pytest.fixture
def s3_conf(s3_options: dict, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The loopback S3 as fsspec's configuration, as a user's ~/.config/fsspec would give it: for
    in-process CLI runs, which take no storage options."""
    import fsspec.config

    monkeypatch.setitem(fsspec.config.conf, "s3", s3_options)
    return s3_options


def test_large_shards_go_up_in_parts(image_folder: tuple[Path, dict[str, bytes]], s3_options: dict,
                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over two parts of `default_block_size`, s3fs uploads a shard in parts; the result is the same."""
    import moto.s3.models
    import s3fs

    monkeypatch.setattr(moto.s3.models, "S3_UPLOAD_PART_MIN_SIZE", 256)  # S3 wants 5 MiB parts; these are tiny
    calls: list[str] = []
    call_s3 = s3fs.S3FileSystem._call_s3

    async def counting(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(method)
        return await call_s3(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counting)
    src, _ = image_folder
    pack(src, tmp_path / "local", PackOptions(format="wds", shard_size=10), workers=1)
    url = f"s3://{S3_BUCKET}/multipart"
    pack(src, url, PackOptions(format="wds", shard_size=10), workers=1,
         storage_options={**s3_options, "default_block_size": 4096})
    assert calls.count("complete_multipart_upload") >= 2 and calls.count("upload_part") > 4
    assert bucket_files(s3_options, "multipart") == local_files(tmp_path / "local")


def test_tasks_then_merge_on_the_bucket_equal_one_run(image_folder: tuple[Path, dict[str, bytes]], s3_conf: dict,
                                                      tmp_path: Path) -> None:
    src, _ = image_folder
    pack(src, tmp_path / "local", PackOptions(format="lmdb", shard_size=3), workers=1)
    url = f"s3://{S3_BUCKET}/tasks"
    assert run("plan", src, url, "--format", "lmdb", "--shard-size", "3")[0] == 0
    for task in (2, 0, 1):
        code, output = run("lmdb", src, url, "--shard-size", "3", "--task-index", task, "--task-count", 3,
                           "--workers", 1, "--staging", tmp_path / f"staging-{task}", "-q")
        assert code == 0, output
        assert "this task's" in output and f"pack merge {url}" in output
    assert "index.json" not in bucket_files(s3_conf, "tasks")
    code, output = run("merge", url)
    assert code == 0 and output.startswith("merged 7 shards") and f"{url}/index.json" in output, output
    assert bucket_files(s3_conf, "tasks") == local_files(tmp_path / "local")
    assert not s3fs_of(s3_conf).find(f"{S3_BUCKET}/tasks/.pack/tmp")
    count = readers.load_manifest(tmp_path / "local").num_samples
    code, output = run("verify", url, "-q")
    assert code == 0 and output.strip() == f"{url}: OK, {count} samples", output
    code, output = run("info", url, "--json")
    info = json.loads(output)
    assert code == 0 and info["num_samples"] == count and info["image_sizes"]["sampled"] == count


def test_tasks_of_a_container_input_on_the_bucket_equal_one_run(s3_options: dict, tmp_path: Path) -> None:
    """A second task mirrors a plan whose listing hash covers the container inputs' names too."""
    rng = random.Random(0)
    src = tmp_path / "train.rec"
    write_recordio(src, [recordio_payload(image_bytes(rng), float(k % 3)) for k in range(7)])
    pack(src, tmp_path / "local", PackOptions(format="wds", shard_size=3), workers=1)
    url = f"s3://{S3_BUCKET}/rec-tasks"
    for task in range(2):
        summary = pack(src, url, PackOptions(format="wds", shard_size=3), workers=1, partition=Partition(task, 2),
                       staging=tmp_path / f"staging-{task}", storage_options=s3_options)
        assert not summary.published
    merge(RemoteOut(url, staging=tmp_path / "merge", storage_options=s3_options))
    assert bucket_files(s3_options, "rec-tasks") == local_files(tmp_path / "local")


def test_a_different_plan_in_the_bucket_is_refused(image_folder: tuple[Path, dict[str, bytes]], s3_conf: dict) -> None:
    src, _ = image_folder
    url = f"s3://{S3_BUCKET}/other-plan"
    assert run("plan", src, url, "--format", "wds", "--shard-size", "3")[0] == 0
    code, output = run("wds", src, url, "--shard-size", "4", "-q")
    assert code == 1 and f"{url}: holds an unfinished run of" in output and len(output.strip().splitlines()) == 1


def test_verify_names_a_damaged_remote_shard(image_folder: tuple[Path, dict[str, bytes]], s3_conf: dict,
                                            tmp_path: Path) -> None:
    src, _ = image_folder
    url = f"s3://{S3_BUCKET}/damaged"
    pack(src, url, PackOptions(format="hdf5", shard_size=4), workers=1)
    fs = s3fs_of(s3_conf)
    key = f"{S3_BUCKET}/damaged/shard-000002.h5"
    data = bytearray(fs.cat_file(key))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(key, bytes(data))
    fs.rm_file(f"{S3_BUCKET}/damaged/shard-000004.h5")
    code, output = run("verify", url, "-q")
    assert code == 1 and f"{url}: 2 problems found" in output
    assert f"{url}/shard-000004.h5: missing" in output
    assert f"{url}/shard-000002.h5: sha256" in output


def test_no_bucket_is_one_line(image_folder: tuple[Path, dict[str, bytes]], s3_conf: dict) -> None:
    code, output = run("wds", image_folder[0], "s3://no-such-bucket/x.wds", "-q")
    assert code == 1 and len(output.strip().splitlines()) == 1, output
    assert output.startswith("Error: s3://no-such-bucket/x.wds") and "bucket does not exist" in output


def test_no_credentials_is_one_line(image_folder: tuple[Path, dict[str, bytes]], s3_options: dict,
                                    tmp_path: Path) -> None:
    options = {"client_kwargs": s3_options["client_kwargs"]}  # no key, no secret
    env = {key: value for key, value in cli_env(options).items() if not key.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true")
    result = subprocess.run([sys.executable, "-m", "packer.cli", "wds", str(image_folder[0]),
                             f"s3://{S3_BUCKET}/nocreds", "-q"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"Error: s3://{S3_BUCKET}/nocreds") and "no credentials" in result.stderr


def test_kill_9_mid_upload_then_rerun_gives_the_same_bytes(image_folder: tuple[Path, dict[str, bytes]],
                                                           s3_options: dict, tmp_path: Path) -> None:
    src, _ = image_folder
    pack(src, tmp_path / "local", PackOptions(format="wds", shard_size=2), workers=1)
    url = f"s3://{S3_BUCKET}/killed"
    fs = s3fs_of(s3_options)
    args = [sys.executable, "-m", "packer.cli", "wds", str(src), url, "--shard-size", "2", "--workers", "1", "-q",
            "--staging", str(tmp_path / "staging")]
    process = subprocess.Popen(args, env=cli_env(s3_options), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while process.poll() is None and time.monotonic() < deadline:
        if fs.find(f"{S3_BUCKET}/killed/.pack/done"):  # a shard is up: the next one is being packed or sent
            break
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, process.stderr.read()  # killed before the end
    assert not fs.exists(f"{S3_BUCKET}/killed/index.json")
    # What a kill during a copy or a temporary upload can leave: neither is taken for a finished shard.
    fs.pipe_file(f"{S3_BUCKET}/killed/.pack/tmp/shard-000008.tar.tmp-host-1", b"half a shard")
    fs.pipe_file(f"{S3_BUCKET}/killed/shard-000009.tar", b"a shard with no marker")
    result = subprocess.run(args[:-2], env=cli_env(s3_options), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "resumed" in result.stdout, result.stderr
    assert bucket_files(s3_options, "killed") == local_files(tmp_path / "local")
    assert not fs.find(f"{S3_BUCKET}/killed/.pack/tmp")


def test_remote_src_equals_local_src(tmp_path: Path, s3_conf: dict) -> None:
    src = tmp_path / "src"
    make_image_folder(src)  # hidden and non-image entries too (S3 keys must be UTF-8: no undecodable name)
    fs = s3fs_of(s3_conf)
    fs.put(str(src), f"{S3_BUCKET}/raw", recursive=True)
    assert fs.exists(f"{S3_BUCKET}/raw/class_02/.hidden.jpg") and fs.exists(f"{S3_BUCKET}/raw/class_00/notes.txt")
    pack(src, tmp_path / "local", PackOptions(format="wds", shard_size=4), workers=1)
    pack(f"s3://{S3_BUCKET}/raw/", tmp_path / "from-bucket", PackOptions(format="wds", shard_size=4), workers=1)
    assert local_files(tmp_path / "from-bucket") == local_files(tmp_path / "local")
    code, output = run("wds", f"s3://{S3_BUCKET}/raw", f"s3://{S3_BUCKET}/raw-packed", "--shard-size", 4,
                       "--workers", 1, "-q")
    assert code == 0, output
    assert bucket_files(s3_conf, "raw-packed") == local_files(tmp_path / "local")
    code, output = run("wds", f"s3://{S3_BUCKET}/raw", tmp_path / "x", "--sidecars", "txt", "-q")
    assert code == 1 and "--sidecars need a local SRC" in output


def test_a_filesystem_without_atomic_puts_gets_files_moved_into_place(
        image_folder: tuple[Path, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any writable fsspec URL works; where a write is not all-or-nothing (here fsspec's memory
    filesystem), each file is uploaded to a temporary key and moved to its name once checked."""
    import fsspec

    memory = fsspec.filesystem("memory")
    moves: list[tuple[str, str]] = []
    mv = type(memory).mv
    monkeypatch.setattr(type(memory), "mv", lambda self, a, b, **kw: (moves.append((a, b)), mv(self, a, b, **kw))[1])
    src, _ = image_folder
    pack(src, tmp_path / "local", PackOptions(format="hdf5", shard_size=4), workers=1)
    pack(src, "memory://packed/hdf5", PackOptions(format="hdf5", shard_size=4), workers=1)
    stored = {key.split("/packed/hdf5/", 1)[1]: memory.cat_file(key) for key in memory.find("/packed/hdf5")
              if "/.pack/" not in key}
    assert stored == local_files(tmp_path / "local")
    assert ("/packed/hdf5/shard-000000.h5" in {b for _, b in moves}
            and all("/.pack/tmp/" in a and ".tmp-" in a for a, _ in moves))
    assert not memory.find("/packed/hdf5/.pack/tmp")


def test_a_store_gone_mid_run_is_one_line_and_the_rerun_resumes(image_folder: tuple[Path, dict[str, bytes]],
                                                                 s3_options: dict, tmp_path: Path) -> None:
    """The bucket's endpoint stops answering after the first shard: one line naming the URL and the
    cause, the finished shard stays, and a rerun (another endpoint to the same store) finishes the
    same bytes. moto keeps its buckets per process, so a second server serves the same ones."""
    from loopback import LoopbackS3

    from packer.errors import PackError

    src, _ = image_folder
    pack(src, tmp_path / "local", PackOptions(format="lmdb", shard_size=5), workers=1)
    url = f"s3://{S3_BUCKET}/gone"
    no_retries = {"config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2}}
    first = LoopbackS3()
    store = s3fs_of(s3_options)
    marker = f"{S3_BUCKET}/gone/.pack/done/shard-000000.lmdb.json"
    packed = 0

    def progress(count: int) -> None:
        nonlocal packed
        packed += count
        if packed == 6:  # the second shard is being packed: close once the first one's upload is done
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                store.invalidate_cache()
                if store.exists(marker):
                    break
                time.sleep(0.05)
            first.close()

    with pytest.raises(PackError) as error:
        pack(src, url, PackOptions(format="lmdb", shard_size=5), workers=1, progress=progress,
             storage_options={**first.storage_options, **no_retries})
    message = str(error.value)
    assert message.startswith(f"{url}/") and "cannot reach the store" in message and "\n" not in message
    store.invalidate_cache()
    assert store.exists(marker)
    with LoopbackS3() as second:
        summary = pack(src, url, PackOptions(format="lmdb", shard_size=5), workers=1,
                       storage_options=second.storage_options)
    assert summary.resumed_shards == 1
    assert bucket_files(s3_options, "gone") == local_files(tmp_path / "local")


def test_dask_workers_upload_their_shards(image_folder: tuple[Path, dict[str, bytes]], s3_options: dict,
                                             tmp_path: Path) -> None:
    """Dask workers get OUT (with its storage options) pickled and upload the shards they pack.
    (On another machine a worker would also mirror the plan into its staging first: not tested here.)"""
    pytest.importorskip("dask.distributed")
    src, _ = image_folder
    pack(src, tmp_path / "local", PackOptions(format="wds", shard_size=5), workers=1)
    url = f"s3://{S3_BUCKET}/dask"
    summary = pack(src, url, PackOptions(format="wds", shard_size=5), engine="dask", scheduler="local", workers=2,
                   storage_options=s3_options)
    assert summary.published and summary.num_shards == 4
    assert bucket_files(s3_options, "dask") == local_files(tmp_path / "local")


def test_a_task_on_another_machine_mirrors_the_plan_first(image_folder: tuple[Path, dict[str, bytes]],
                                                          s3_options: dict, tmp_path: Path) -> None:
    """A shard task whose staging folder is empty (a Dask worker elsewhere) downloads the plan's
    listing from the bucket, checks it against the plan's hash, and packs its shard."""
    from packer.run.pipeline import ensure_plan
    from packer.stores.remote_out import RemoteOut
    from packer.write.shard import finished_shards, run_shard

    src, _ = image_folder
    url = f"s3://{S3_BUCKET}/elsewhere"
    planner = RemoteOut(url, staging=tmp_path / "planner", storage_options=s3_options)
    plan = ensure_plan(src, planner, PackOptions(format="lmdb", shard_size=5))
    worker = RemoteOut(url, staging=tmp_path / "worker", storage_options=s3_options)
    assert not worker.staging.exists()
    result = run_shard(worker, plan, 2)
    listing = Path(".pack", "listing.jsonl")
    assert (worker.staging / listing).read_bytes() == (planner.staging / listing).read_bytes()
    assert finished_shards(worker, plan, [1, 2]) == {1: None, 2: result}
    assert not list(worker.staging.glob("shard-*"))  # uploaded, then freed


def test_a_listing_that_does_not_match_its_plan_is_refused(image_folder: tuple[Path, dict[str, bytes]],
                                                           s3_options: dict, tmp_path: Path) -> None:
    """Two tasks writing different plans at once can leave one's listing beside the other's plan:
    the listing's sha256 in plan.json catches it."""
    from packer.errors import PackError
    from packer.run.pipeline import ensure_plan
    from packer.stores.remote_out import RemoteOut

    url = f"s3://{S3_BUCKET}/mixed-plan"
    ensure_plan(image_folder[0], RemoteOut(url, staging=tmp_path / "a", storage_options=s3_options),
                PackOptions(format="wds", shard_size=5))
    fs = s3fs_of(s3_options)
    key = f"{S3_BUCKET}/mixed-plan/.pack/listing.jsonl"
    fs.pipe_file(key, fs.cat_file(key).replace(b", 0, ", b", 1, ", 1))
    with pytest.raises(PackError, match=r"listing.jsonl: does not match plan.json \(another task"):
        RemoteOut(url, staging=tmp_path / "b", storage_options=s3_options).mirror_plan()


def test_background_uploads_hold_back_shards_past_their_budget(s3_options: dict, tmp_path: Path) -> None:
    """Staged shards go up from threads; `full()` says when the budget (bytes, with a least and a
    most count of shards) is spent; each upload leaves its files and marker in the bucket and
    frees its staging space."""
    from packer.stores.remote_out import RemoteOut
    from packer.write.shard import BackgroundUploads, ShardResult

    out = RemoteOut(f"s3://{S3_BUCKET}/background", staging=tmp_path / "staging", storage_options=s3_options)
    out.staging.mkdir(parents=True)

    def staged(number: int, size: int) -> ShardResult:
        name = f"shard-{number:06d}.tar"
        (out.staging / name).write_bytes(bytes([number]) * size)
        return ShardResult(name=name, num_samples=1, bytes=size, sha256="-", fingerprint="-", rejects=[],
                           label_counts={}, source_bytes=size)

    uploads = BackgroundUploads(out, limit_bytes=1000, limit_shards=(2, 3))
    try:  # `running` changes only at reap(), so `full()` is the same at every run
        uploads.submit(staged(0, 5000))
        assert not uploads.full()  # over the bytes, but fewer shards than the least
        uploads.submit(staged(1, 10))
        assert uploads.full()  # two shards, over the bytes
        uploads.finish()
        assert not uploads.running and not uploads.full()
        fulls = []
        for number in range(2, 5):
            uploads.submit(staged(number, 10))
            fulls.append(uploads.full())
        assert fulls == [False, False, True]  # under the bytes: full at the most shards
        uploads.finish()
    finally:
        uploads.close()
    fs = s3fs_of(s3_options)
    for number, size in enumerate([5000, 10, 10, 10, 10]):
        assert fs.cat_file(f"{S3_BUCKET}/background/shard-{number:06d}.tar") == bytes([number]) * size
        assert json.loads(fs.cat_file(f"{S3_BUCKET}/background/.pack/done/shard-{number:06d}.tar.json"))["bytes"] == size
    assert not list(out.staging.glob("*.tar"))


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_verify_reads_every_format_remotely(fmt: str, image_folder: tuple[Path, dict[str, bytes]], s3_conf: dict,
                                            packed_as: Callable, serve: Callable[[str], str],
                                            http_server: LoopbackHTTP) -> None:
    url = f"s3://{S3_BUCKET}/verify-{fmt}"
    pack(image_folder[0], url, PackOptions(format=fmt, shard_size=4), workers=1)
    served = serve(fmt)  # a web server whose listing gives no sizes
    for where, count in ((url, len(image_folder[1])), (served, readers.load_manifest(packed_as(fmt)[0]).num_samples)):
        for full, said in (((), ""), (("--full",), ", all decoded")):
            code, output = run("verify", where, *full, "-q")
            assert code == 0 and output.strip() == f"{where}: OK, {count} samples{said}", output
    last = readers.load_manifest(packed_as(fmt)[0]).shards[-1].name
    (http_server.directory / served.rsplit("/", 1)[1] / last).unlink()
    code, output = run("verify", served, "-q")
    assert code == 1 and f"{served}/{last}: missing" in output, output


def test_reading_without_credentials_is_one_error_without_retries(s3_options: dict, tmp_path: Path) -> None:
    options = {"client_kwargs": s3_options["client_kwargs"]}  # no key, no secret
    env = {key: value for key, value in cli_env(options).items() if not key.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true")
    code = ("import readers\ntry:\n    readers.open_dataset('s3://pack-test/nocreds', cache_dir='cache')\n"
            "except readers.DatasetError as exc:\n    print(exc)")
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "retry" not in result.stderr, result.stderr
    assert result.stdout.startswith("s3://pack-test/nocreds/index.json: no credentials"), result.stdout


def read_back(out: Path) -> list[tuple[bytes, int, str]]:
    dataset = readers.open_dataset(out, decode="bytes", fields=("image", "label", "path"))
    try:
        return [(bytes(image), int(label), path) for image, label, path in dataset]
    finally:
        dataset.close()


def test_a_url_that_is_one_tar_rec_or_tfrecord_is_read_as_that_kind(tmp_path: Path, http_server: LoopbackHTTP) -> None:
    """A URL naming one input file packs what the same file packs locally (over fsspec ranged
    reads), with the .idx or .tfindex beside it; a URL that is none of the things a URL SRC may be
    says what those are."""
    from recordfiles import example, write_tfrecord

    rng = random.Random(36)
    served = http_server.directory / "one-file"
    served.mkdir()
    make_image_folder(tmp_path / "src", classes=2, per_class=6)
    assert run("wds", tmp_path / "src", tmp_path / "s.wds", "--shard-size", 8, "-q")[0] == 0
    (served / "shard-000000.tar").write_bytes((tmp_path / "s.wds" / "shard-000000.tar").read_bytes())
    offsets = write_recordio(served / "train.rec", [recordio_payload(image_bytes(rng), float(k % 3)) for k in range(9)])
    (served / "train.idx").write_text("".join(f"{100 + key}\t{offset}\n" for key, offset in enumerate(offsets)))
    write_tfrecord(served / "train.tfrecord", [example({"image/encoded": image_bytes(rng), "image/class/label": k % 2})
                                               for k in range(7)], index=True)
    for name, count in (("shard-000000.tar", 8), ("train.rec", 9), ("train.tfrecord", 7)):
        local, remote = tmp_path / f"local-{name}", tmp_path / f"remote-{name}"
        assert run("lmdb", served / name, local, "--order", "sorted", "-q")[0] == 0
        code, output = run("lmdb", f"{http_server.url}/one-file/{name}", remote, "--order", "sorted", "-q")
        assert code == 0 and output.startswith(f"packed {count} samples"), output
        assert read_back(remote) == read_back(local) and len(read_back(local)) == count
    assert read_back(tmp_path / "remote-train.rec")[0][2] == "train.rec/100"  # the keys of the .idx beside it
    code, output = run("hdf5", f"{http_server.url}/one-file/train.zip", tmp_path / "x.h5", "-q")
    assert code == 1 and output == (f"Error: {http_server.url}/one-file/train.zip: not a packed dataset (no index.json), "
                                    "a folder of images or a tar, .rec or .tfrecord file: a URL SRC is one of those\n")


def test_a_bucket_tar_is_read_in_ranged_blocks_as_the_local_tar(tmp_path: Path, s3_conf: dict,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 4 KiB: the scan's headers and the shard's samples come from many ranged GETs."""
    import packer.sources.ranges

    monkeypatch.setattr(packer.sources.ranges, "BLOCK_BYTES", 4096)
    make_image_folder(tmp_path / "src", classes=2, per_class=6)
    assert run("wds", tmp_path / "src", tmp_path / "s.wds", "--shard-size", 8, "-q")[0] == 0
    tar = tmp_path / "s.wds" / "shard-000000.tar"
    assert tar.stat().st_size > 6 * 4096
    s3fs_of(s3_conf).put(str(tar), f"{S3_BUCKET}/one-tar/shard-000000.tar")
    assert run("hdf5", tar, tmp_path / "local", "-q")[0] == 0
    code, output = run("hdf5", f"s3://{S3_BUCKET}/one-tar/shard-000000.tar", tmp_path / "remote", "-q")
    assert code == 0 and output.startswith("packed 8 samples"), output
    assert read_back(tmp_path / "remote") == read_back(tmp_path / "local")


def test_a_shuffled_pack_of_a_bucket_tar_fetches_it_once_per_pass(tmp_path: Path, s3_conf: dict,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A shuffled pack (the default) reads a container's runs in turn; fsspec's readahead cache
    kept one block from the last read, so each jump fetched the rest of the tar again: 1.1 MB for
    this 0.23 MB tar, 1058 MB for a 13 MB one. Now the scan and the pack read it once each."""
    from packer.sources.ranges import RangeFile

    fetched = tmp_path / "fetched"
    fetch = RangeFile.fetch

    def counted(self: RangeFile, number: int) -> bytes:
        data = fetch(self, number)
        with open(fetched, "a") as handle:  # a file: shard workers may be other processes
            handle.write(f"{len(data)}\n")
        return data

    monkeypatch.setattr(RangeFile, "fetch", counted)
    make_image_folder(tmp_path / "src", classes=3, per_class=20)
    assert run("wds", tmp_path / "src", tmp_path / "s.wds", "--shard-size", 100, "-q")[0] == 0
    tar = tmp_path / "s.wds" / "shard-000000.tar"
    s3fs_of(s3_conf).put(str(tar), f"{S3_BUCKET}/shuffled/shard-000000.tar")
    assert run("hdf5", tar, tmp_path / "local", "-q")[0] == 0
    code, output = run("hdf5", f"s3://{S3_BUCKET}/shuffled/shard-000000.tar", tmp_path / "remote", "-q")
    assert code == 0 and output.startswith("packed 63 samples"), output
    assert read_back(tmp_path / "remote") == read_back(tmp_path / "local")
    assert sum(int(line) for line in fetched.read_text().split()) == 2 * tar.stat().st_size
