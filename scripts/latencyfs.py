#!/usr/bin/env python3
"""A read-only passthrough FUSE filesystem that makes a local folder behave like network storage.

Every metadata call (getattr/lookup, readdir, open, release, statfs, readlink) and every read
sleeps `--latency-ms` before answering, as a round trip to an NFS/Lustre/SMB server would; a read
larger than `--read-cap` KB is split into pieces that each pay the latency (one after another,
as rsize-limited RPCs); `--bandwidth` MB/s caps the bytes of all reads together (one shared
link). libfuse runs the calls on many threads and the sleeps release the GIL, so concurrent
calls overlap as they would on a real network store: latency, not the filesystem, is the cost.

Caching is the kernel's, as on a network mount: attributes and names for `--attr-timeout`
seconds (libfuse's default 1 s; NFS keeps them 3-60 s), file pages until the file is opened again
(no `kernel_cache`, so each open starts cold, as close-to-open consistency does). A fresh mount
holds nothing: unmount and mount again for a cold run, no page-cache dropping needed.

Setup: `apt-get install fuse3` (fusermount3 and libfuse3.so.3) and `pip install mfusepy`.

    python scripts/latencyfs.py SRC MOUNTPOINT --latency-ms 1 [--read-cap 128] [--bandwidth 100]
    fusermount3 -u MOUNTPOINT              # unmount (Ctrl-C also does in the foreground)

From Python (benchmarks, tests): `with mounted(src, latency_ms=1) as root: ...` mounts in a child
process, waits until the mount answers, and unmounts on the way out, errors included.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

STAT_FIELDS = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks")
TIME_FIELDS = ("st_atime", "st_mtime", "st_ctime")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
MOUNT_WAIT_S = 15.0


def missing_requirements() -> str | None:
    """Why this machine cannot mount a latencyfs (for tests to skip with), or None when it can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is absent (no FUSE in this kernel or container)"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is absent (apt-get install fuse3)"
    try:
        import mfusepy  # noqa: F401  (loads libfuse3.so.3)
    except (ImportError, OSError) as exc:
        return f"mfusepy cannot load libfuse3 ({exc}); pip install mfusepy, apt-get install fuse3"
    return None


class Link:
    """The network between client and server: a delay per call and, optionally, a shared bandwidth."""

    def __init__(self, latency_s: float, bandwidth_bps: float | None) -> None:
        self.latency_s = latency_s
        self.bandwidth_bps = bandwidth_bps
        self._lock = threading.Lock()
        self._free_at = 0.0  # when the shared link has sent every byte booked so far
        self.calls: dict[str, int] = {}  # per kind of call: how many were served,
        self.in_flight: dict[str, int] = {}  # how many are being served now,
        self.most_in_flight: dict[str, int] = {"all": 0}  # and the most at once ("all": of every kind together)

    @contextlib.contextmanager
    def serving(self, call: str) -> Iterator[None]:
        """Count one `call` (getattr, open, read, ...) in flight while the block runs."""
        with self._lock:
            self.calls[call] = self.calls.get(call, 0) + 1
            self.in_flight[call] = self.in_flight.get(call, 0) + 1
            self.most_in_flight[call] = max(self.most_in_flight.get(call, 0), self.in_flight[call])
            self.most_in_flight["all"] = max(self.most_in_flight["all"], sum(self.in_flight.values()))
        try:
            yield
        finally:
            with self._lock:
                self.in_flight[call] -= 1

    def report(self) -> dict[str, dict[str, int]]:
        """What was served: calls and the most in flight, per kind of call."""
        with self._lock:
            return {"calls": dict(self.calls), "most_in_flight": dict(self.most_in_flight)}

    def round_trip(self, nbytes: int = 0) -> None:
        """Sleep one round trip, then until `nbytes` have gone through the link behind earlier bookings."""
        if self.latency_s:
            time.sleep(self.latency_s)
        if self.bandwidth_bps and nbytes:
            with self._lock:
                start = max(time.monotonic(), self._free_at)
                self._free_at = start + nbytes / self.bandwidth_bps
                done = self._free_at
            time.sleep(max(0.0, done - time.monotonic()))


def operations(root: Path, link: Link, read_cap: int | None) -> Any:
    """The mfusepy Operations for a read-only view of `root` where every call pays `link`."""
    import mfusepy

    class LatencyOperations(mfusepy.Operations):
        use_ns = True

        def _real(self, path: str) -> str:
            return os.path.join(root, path.lstrip("/"))

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            with link.serving("getattr"):
                link.round_trip()
                stat = os.lstat(self._real(path))
            attrs = {name: getattr(stat, name) for name in STAT_FIELDS}
            attrs.update({name: getattr(stat, name + "_ns") for name in TIME_FIELDS})
            return attrs

        def readdir(self, path: str, fh: int) -> list[str | tuple[str, dict[str, int], int]]:
            """Names with their types (the kernel's d_type, so `find -type f` needs no stat), as NFS's
            READDIR; sizes and times cost a getattr per entry (no READDIRPLUS: mfusepy cannot fill one)."""
            with link.serving("readdir"):
                link.round_trip()
                with os.scandir(self._real(path)) as entries:
                    return [".", "..", *((entry.name, {"st_mode": entry.stat(follow_symlinks=False).st_mode}, 0)
                                         for entry in entries)]

        def readlink(self, path: str) -> str:
            with link.serving("readlink"):
                link.round_trip()
                return os.readlink(self._real(path))

        def statfs(self, path: str) -> dict[str, int]:
            with link.serving("statfs"):
                link.round_trip()
                stat = os.statvfs(self._real(path))
            return {name: getattr(stat, name) for name in (
                "f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_namemax")}

        def open(self, path: str, flags: int) -> int:
            if flags & WRITE_FLAGS:
                raise mfusepy.FuseOSError(errno.EROFS)
            with link.serving("open"):
                link.round_trip()
                return os.open(self._real(path), os.O_RDONLY)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            piece = read_cap or size
            parts = []
            for start in range(offset, offset + size, piece):
                wanted = min(piece, offset + size - start)
                data = os.pread(fh, wanted, start)
                with link.serving("read"):
                    link.round_trip(len(data))
                parts.append(data)
                if len(data) < wanted:  # the end of the file: no call past it
                    break
            return b"".join(parts)

        def release(self, path: str, fh: int) -> int:
            with link.serving("release"):
                link.round_trip()
            os.close(fh)
            return 0

    return LatencyOperations()


def serve(src: Path, mountpoint: Path, *, latency_ms: float, read_cap_kb: int | None = None,
          bandwidth_mbps: float | None = None, attr_timeout: float = 1.0, threads: int = 64,
          foreground: bool = True, report: Path | None = None) -> None:
    """Mount `src` read-only at `mountpoint` and serve it until unmounted; then, with `report`,
    write there (JSON) how many calls of each kind were served and the most at once (`Link.report`)."""
    import mfusepy

    link = Link(latency_ms / 1000, bandwidth_mbps * 1e6 if bandwidth_mbps else None)
    ops = operations(src.resolve(), link, read_cap_kb * 1024 if read_cap_kb else None)
    mfusepy.FUSE(ops, os.fspath(mountpoint), foreground=foreground, ro=True, fsname=f"latencyfs:{src}",
                 attr_timeout=attr_timeout, entry_timeout=attr_timeout, negative_timeout=attr_timeout,
                 max_threads=threads, max_idle_threads=threads)
    if report is not None:
        report.write_text(json.dumps(link.report()))


def unmount(mountpoint: Path) -> bool:
    """fusermount3 -u, retried for a while if a file is still open there; False if it then had to be
    lazy (detached from the tree, but served until the last open file closes)."""
    for _ in range(20):
        if not os.path.ismount(mountpoint):
            return True
        if subprocess.run(["fusermount3", "-u", os.fspath(mountpoint)], capture_output=True).returncode == 0:
            return True
        time.sleep(0.1)
    subprocess.run(["fusermount3", "-u", "-z", os.fspath(mountpoint)], check=True, capture_output=True)
    return False


@contextlib.contextmanager
def mounted(src: Path | str, latency_ms: float, *, mountpoint: Path | str | None = None,
            read_cap_kb: int | None = None, bandwidth_mbps: float | None = None,
            attr_timeout: float = 1.0, report: Path | None = None) -> Iterator[Path]:
    """A fresh (cold) latencyfs of `src`, served by a child process, unmounted when the block ends;
    `report`: a file where the server leaves its counts of calls once unmounted (`serve`)."""
    made = mountpoint is None
    where = Path(tempfile.mkdtemp(prefix="latencyfs-") if mountpoint is None else mountpoint)
    where.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, os.path.abspath(__file__), os.fspath(src), os.fspath(where),
           "--latency-ms", str(latency_ms), "--attr-timeout", str(attr_timeout)]
    if read_cap_kb:
        cmd += ["--read-cap", str(read_cap_kb)]
    if bandwidth_mbps:
        cmd += ["--bandwidth", str(bandwidth_mbps)]
    if report is not None:
        cmd += ["--report", os.fspath(report)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + MOUNT_WAIT_S
        while not os.path.ismount(where):
            if server.poll() is not None:
                raise RuntimeError(f"latencyfs of {src} at {where} exited with {server.returncode}: "
                                   f"{server.stderr.read().decode(errors='replace').strip() if server.stderr else ''}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"latencyfs of {src} at {where} not mounted after {MOUNT_WAIT_S:.0f} s")
            time.sleep(0.02)
        yield where
    finally:
        try:
            if not unmount(where):  # files left open would keep it serving: stop it, they fail from now on
                server.terminate()
        finally:
            try:
                server.wait(timeout=MOUNT_WAIT_S)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            if made:
                where.rmdir()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path, help="folder to serve")
    parser.add_argument("mountpoint", type=Path, help="empty folder to mount it on")
    parser.add_argument("--latency-ms", type=float, default=1.0, help="delay of every metadata call and read")
    parser.add_argument("--read-cap", type=int, default=None, metavar="KB",
                        help="largest read one call serves; bigger reads pay the latency per piece")
    parser.add_argument("--bandwidth", type=float, default=None, metavar="MBps",
                        help="bytes per second of all reads together, in MB/s (default: unlimited)")
    parser.add_argument("--attr-timeout", type=float, default=1.0,
                        help="seconds the kernel may keep attributes and names (default 1, libfuse's)")
    parser.add_argument("--threads", type=int, default=64, help="most calls served at once")
    parser.add_argument("--background", action="store_true", help="detach once mounted")
    parser.add_argument("--report", type=Path, default=None, metavar="FILE",
                        help="once unmounted, write the calls served and the most in flight, per kind (JSON)")
    args = parser.parse_args()
    why = missing_requirements()
    if why:
        sys.exit(f"latencyfs: {why}")
    if not args.src.is_dir():
        sys.exit(f"latencyfs: {args.src}: not a folder")
    serve(args.src, args.mountpoint, latency_ms=args.latency_ms, read_cap_kb=args.read_cap,
          bandwidth_mbps=args.bandwidth, attr_timeout=args.attr_timeout, threads=args.threads,
          foreground=not args.background, report=args.report.resolve() if args.report else None)


if __name__ == "__main__":
    main()
