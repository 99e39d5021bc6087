"""A threaded HTTP server for one directory on 127.0.0.1, for the remote tests and bench_remote.py.

It counts GETs per path, can add a first-byte delay and a bandwidth cap per response, and plays
scripted faults per path: an HTTP status, a corrupted body, a body cut short, or a body that
stalls half way (until the server closes). `PeakSampler` watches a size (a cache's) meanwhile.
"""

from __future__ import annotations

import collections
import functools
import http.server
import re
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable, TypeVar

CHUNK = 64 * 1024


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def __init__(self, *args: Any, owner: LoopbackHTTP, **kwargs: Any) -> None:
        self.owner = owner
        super().__init__(*args, **kwargs)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        action = self.owner.next_action(path)
        if self.owner.delay_s:
            time.sleep(self.owner.delay_s)
        if isinstance(action, int):
            self.send_error(action)
            return
        file = self.owner.directory / path.lstrip("/")
        if ".." in Path(path).parts or not file.is_file():
            self.send_error(404)
            return
        data = file.read_bytes()
        if action == "corrupt":
            data = data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1:]
        wanted = _byte_range(self.headers.get("Range"), len(data)) if action != "whole" else None
        if wanted is not None:
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {wanted.start}-{wanted.stop - 1}/{len(data)}")
            data = data[wanted]
        else:
            self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        body = memoryview(data)[: len(data) // 2] if action in ("truncate", "stall") else memoryview(data)
        self._send(body)
        if action == "stall":
            self.wfile.flush()
            self.owner.closing.wait()
        if action in ("truncate", "stall"):
            self.close_connection = True

    def _send(self, body: memoryview) -> None:
        bandwidth = self.owner.bandwidth
        for start in range(0, len(body), CHUNK):
            chunk = body[start:start + CHUNK]
            self.wfile.write(chunk)
            if bandwidth:
                time.sleep(len(chunk) / bandwidth)


def _byte_range(header: str | None, size: int) -> slice | None:
    """The bytes a `Range: bytes=first-last` header asks for (one range, as fsspec sends), or None."""
    match = re.fullmatch(r"bytes=(\d+)-(\d*)", header or "")
    if match is None or int(match.group(1)) >= size:
        return None
    last = min(size - 1, int(match.group(2))) if match.group(2) else size - 1
    return slice(int(match.group(1)), last + 1)


class _Server(http.server.ThreadingHTTPServer):
    request_queue_size = 128  # the default backlog of 5 drops bursts of connections (SYN retried a second later)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-answer (fsspec reads a file's size from the start of a GET)
        is not the server's error: no traceback on the test's stderr."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


_S = TypeVar("_S", bound="_LoopbackServer")


class _LoopbackServer:
    """A server on 127.0.0.1 serving from a daemon thread, shut down on leaving a `with` block."""

    _server: Any

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LoopbackHTTP(_LoopbackServer):
    """Serve `directory` at `self.url` until `close()`.

    `delay_s`: sleep before answering each request (an object store's first-byte latency).
    `bandwidth`: bytes per second per response (None: as fast as loopback goes).
    `faults[path]`: actions for the next GETs of that path, in turn: an HTTP status code, or one
    of "corrupt" (one byte flipped), "truncate" (half the body, then the connection closes),
    "stall" (half the body, then nothing until the server closes), "whole" (the whole file, its
    Range header ignored, as some servers do). A GET with a Range header gets those bytes (206).
    """

    def __init__(self, directory: str | Path, *, delay_s: float = 0.0, bandwidth: float | None = None) -> None:
        self.directory = Path(directory)
        self.delay_s = delay_s
        self.bandwidth = bandwidth
        self.gets: collections.Counter[str] = collections.Counter()
        self.faults: dict[str, list[int | str]] = {}
        self.closing = threading.Event()
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), functools.partial(_Handler, owner=self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        threading.Thread(target=self._server.serve_forever, name="loopback-http", daemon=True).start()

    def next_action(self, path: str) -> int | str | None:
        with self._lock:
            self.gets[path] += 1
            queue = self.faults.get(path)
            return queue.pop(0) if queue else None

    def close(self) -> None:
        self.closing.set()
        super().close()


class PeakSampler:
    """The largest value `measure()` returned, polled every `interval_s` in a thread during a `with` block."""

    def __init__(self, measure: Callable[[], int], interval_s: float = 0.002) -> None:
        self.measure = measure
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.measure())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class LoopbackS3(_LoopbackServer):
    """moto's S3 (the real protocol, objects in memory) on 127.0.0.1, answering every request after
    `delay_s` (an object store's first-byte latency) and taking request bodies at most at
    `bandwidth` bytes per second each (None: as fast as loopback goes). Run it in a process of
    its own in benchmarks: it must not compete with the packer for one GIL. `paths` lists the
    path of every request, in order (path-style: `/bucket/key`)."""

    def __init__(self, *, delay_s: float = 0.0, bandwidth: float | None = None) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        app = DomainDispatcherApplication(create_backend_app)
        self.paths: list[str] = []

        def slowed(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            self.paths.append(urllib.parse.unquote(environ.get("PATH_INFO", "")))
            wait = delay_s + (int(environ.get("CONTENT_LENGTH") or 0) / bandwidth if bandwidth else 0.0)
            if wait:
                time.sleep(wait)
            return app(environ, start_response)

        self._server = make_server("127.0.0.1", 0, slowed, threaded=True, request_handler=MotoRequestHandler)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        threading.Thread(target=self._server.serve_forever, name="loopback-s3", daemon=True).start()

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"key": "testing", "secret": "testing",
                "client_kwargs": {"endpoint_url": self.url, "region_name": "us-east-1"}}

