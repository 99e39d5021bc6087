"""SRC becomes a Source once, at the entry, and that value travels (#37 item 2).

Each run here is traced (sys.setprofile, in every thread) and every call of a packer function
whose arguments carry SRC (the str or Path given, its absolute or URL spelling, or a Source) is a
stop in that function's module; as #37 counts them, a module's stops after its first enter it
again. Entries (stops from another module, or from outside packer) are reported too. Asking the
Source itself (its properties) or making a dataclass that names SRC is not a stop: that is the
value answering; nor are the resolver's own steps (`_url_source`, `kind_of`, ...), which are one
resolution. A shard task (`run_shard`) is its own entry, made from the plan, and counted apart
(per shard). Calls of `readers.remote.is_url` and `location` on SRC from packer, outside the
resolver and the Source, are counted as re-asks.

The goal: the resolver (`packer.sources.inputs.resolve_source`) runs once per run and never in a
shard task; no module is entered with SRC from another more than three times, nor stops it more
than three times (entered once, then again at most twice; the readers of SRC's files, `READERS`,
only the former); nothing re-asks whether SRC is a URL.
"""

from __future__ import annotations

import io
import os
import random
import sys
import tarfile
import threading
from collections import Counter
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, Callable

import pytest
from conftest import S3_BUCKET
from imagefolders import image_bytes

import packer
from packer.sources.inputs import Source

GENERATOR_FLAGS = 0x20 | 0x80 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ASYNC_GENERATOR
VARARGS, VARKEYWORDS = 0x04, 0x08
MOST_STOPS = 3
"""A module entered once with SRC, then again at most twice."""
READERS = ("packer.sources.walk", "packer.sources.remote", "packer.sources.filelist", "packer.sources.tars")
"""The readers of SRC's own files: handed the folder (or the inputs) to read, their helpers pass it
on among themselves; that is the reading, not SRC travelling. Held to entries from other modules."""
RESOLVER = {"resolve_source", "_resolved", "_url_source", "_directory", "_files"}
"""Where `packer.sources.inputs` makes a Source of SRC: the one place that may ask what SRC is.
Beside it and the Source, `RangeFile` asks it of each file it opens (an input, an index beside
it): a tar SRC's one input is named as SRC is, but it is a file opened, not SRC asked again."""
MAY_ASK = ("Source.", "RangeFile.")
ASKS = {"is_url", "location"}


class Context:
    """What one run, or one shard task of it, did with SRC."""

    def __init__(self) -> None:
        self.entries: Counter[str] = Counter()  # stops from another module
        self.stops: Counter[str] = Counter()  # every call carrying SRC
        self.asks: Counter[str] = Counter()
        self.resolved = 0
        self.calls: list[str] = []

    def report(self, title: str) -> str:
        shown = ", ".join(f"{module.removeprefix('packer.')} {count}" for module, count in sorted(self.entries.items()))
        again = sum(count - 1 for count in self.entries.values())
        stops = ", ".join(f"{module.removeprefix('packer.')} {count}" for module, count in sorted(self.stops.items()))
        asks = ", ".join(f"{where} {count}" for where, count in sorted(self.asks.items())) or "none"
        return (f"{title}: {sum(self.stops.values())} stops in {len(self.stops)} modules, "
                f"{sum(self.entries.values())} entries, {again} again; resolved {self.resolved}x; "
                f"is_url/location re-asked: {asks}; entries: {shown}; stops: {stops}")


class SrcTrace:
    """Calls into packer modules carrying SRC, in the run (`run`) and in each shard task (`shards`)."""

    def __init__(self, src: str | os.PathLike[str]) -> None:
        text = os.fspath(src)
        self.spellings = {text, text.rstrip("/"), text if "://" in text else os.path.abspath(text)}
        self.run_context = Context()
        self.shards: list[Context] = []
        self._shard_frame: FrameType | None = None
        self._started: list[FrameType] = []  # generator frames seen: a later 'call' resumes one

    def carries(self, value: Any) -> bool:
        if isinstance(value, Source):
            return True
        if isinstance(value, (str, os.PathLike)):
            try:
                return os.fspath(value) in self.spellings
            except TypeError:
                return False
        return False

    def _arguments(self, frame: FrameType) -> list[Any]:
        code = frame.f_code
        named = code.co_argcount + code.co_kwonlyargcount
        values = [frame.f_locals.get(name) for name in code.co_varnames[:named]]
        if code.co_flags & VARARGS:
            values += list(frame.f_locals.get(code.co_varnames[named]) or ())
        if code.co_flags & VARKEYWORDS:
            values += list((frame.f_locals.get(code.co_varnames[named + bool(code.co_flags & VARARGS)]) or {}).values())
        return values

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "return" and frame is self._shard_frame:
            self._shard_frame = None
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        code: CodeType = frame.f_code
        caller_frame = frame.f_back
        caller = caller_frame.f_globals.get("__name__", "") if caller_frame is not None else ""
        if module == "readers.remote" and code.co_name in ASKS:
            if caller.startswith("packer") and self.carries(frame.f_locals.get("path")):
                where = caller_frame.f_code.co_qualname  # type: ignore[union-attr]
                if not (caller == "packer.sources.inputs" and where in RESOLVER or
                        caller in ("packer.sources.inputs", "packer.sources.ranges") and where.startswith(MAY_ASK)):
                    self.context.asks[f"{caller.removeprefix('packer.')}.{where}"] += 1
            return
        if not (module == "packer" or module.startswith("packer.")):
            return
        if code.co_flags & GENERATOR_FLAGS:
            if any(seen is frame for seen in self._started):
                return  # a generator resumed, not called
            self._started.append(frame)
        if module == "packer.write.shard" and code.co_name == "run_shard" and self._shard_frame is None:
            self._shard_frame = frame
            self.shards.append(Context())
        if code.co_qualname.startswith("Source.") or "__create_fn__" in code.co_qualname:
            return  # the value answering, or a dataclass made (a Source, a Plan naming SRC)
        if caller == module == "packer.sources.inputs" and caller_frame.f_code.co_name in RESOLVER:  # type: ignore
            return  # a step of the one resolution
        context = self.context
        if code.co_name == "resolve_source":
            context.resolved += 1
        if not any(self.carries(value) for value in self._arguments(frame)):
            return
        context.stops[module] += 1
        if caller != module:
            context.entries[module] += 1
        context.calls.append(f"{caller.removeprefix('packer.')} -> {module.removeprefix('packer.')}."
                             f"{code.co_qualname}")

    @property
    def context(self) -> Context:
        return self.shards[-1] if self._shard_frame is not None else self.run_context

    def run(self, call: Callable[[], Any]) -> Any:
        sys.setprofile(self._profile)
        threading.setprofile(self._profile)
        try:
            return call()
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]


def traced(src: str | os.PathLike[str], call: Callable[[], Any]) -> SrcTrace:
    trace = SrcTrace(src)
    summary = trace.run(call)
    assert summary.num_samples or summary.up_to_date
    way = "up to date" if summary.up_to_date else "published" if summary.published else "a task's shards"
    print(trace.run_context.report(f"{src} ({way})"))
    print("  " + "\n  ".join(trace.run_context.calls))
    for number, shard in enumerate(trace.shards):
        print(shard.report(f"  shard task {number}"))
    return trace


def small_folder(root: Path, names: list[str]) -> None:
    rng = random.Random(7)
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(image_bytes(rng))


def assert_once(trace: SrcTrace) -> None:
    run = trace.run_context
    assert run.entries, "the trace saw SRC travel"
    assert run.resolved == 1, run.report("resolved other than once")
    over = {module: count for module, count in run.entries.items() if count > MOST_STOPS}
    over.update({module: count for module, count in run.stops.items()
                 if count > MOST_STOPS and not module.startswith(READERS)})
    assert not over, run.report(f"entered again more than twice: {over}")
    assert not run.asks, run.report("SRC's kind asked again")
    for shard in trace.shards:
        assert shard.resolved == 0 and not shard.asks, shard.report("a shard task")


def runs(src: str | os.PathLike[str], pack: Callable[..., Any]) -> list[SrcTrace]:
    """A pack's (or an append's) ways: one task of two (plans, packs its shards, publishes
    nothing), the whole run after it (reuses the plan, checks SRC against it, resumes), a rerun
    (up to date)."""
    return [traced(src, lambda: pack(task_index=0, task_count=2)), traced(src, pack), traced(src, pack)]


def test_a_pack_resolves_src_once(tmp_path: Path) -> None:
    src = tmp_path / "src"
    small_folder(src, ["a/1.jpg", "a/2.jpg", "b/3.jpg", "b/4.jpg"])
    out = tmp_path / "out"
    for trace in runs(src, lambda **task: packer.pack(str(src), out, "wds", shard_size=2, workers=1, **task)):
        assert_once(trace)


def test_an_append_resolves_src_once(tmp_path: Path) -> None:
    src, more = tmp_path / "src", tmp_path / "more"
    small_folder(src, ["a/1.jpg", "b/2.jpg"])
    small_folder(more, ["a/4.jpg", "c/5.jpg", "c/6.jpg", "d/7.jpg"])  # c, d: new to OUT
    out = tmp_path / "out"
    packer.pack(str(src), out, "wds", shard_size=2, workers=1)
    for trace in runs(more, lambda **task: packer.pack(str(more), out, "wds", append=True, workers=1, **task)):
        assert_once(trace)


def test_a_tar_src_is_resolved_once(tmp_path: Path) -> None:
    """A container input: its kind's scan, its inputs' times (`input_mtimes`) on the rerun."""
    tar_path = tmp_path / "data.tar"
    rng = random.Random(3)
    with tarfile.open(tar_path, "w") as tar:
        for number in range(4):
            for extension, data in (("jpg", image_bytes(rng)), ("cls", str(number % 2).encode())):
                info = tarfile.TarInfo(f"{number:04d}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "out"
    for trace in runs(tar_path, lambda **task: packer.pack(str(tar_path), out, "wds", shard_size=2, workers=1, **task)):
        assert_once(trace)


def test_a_url_src_is_resolved_once(tmp_path: Path, s3_options: dict[str, Any],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import fsspec.config
    import s3fs

    monkeypatch.setitem(fsspec.config.conf, "s3", s3_options)
    src = tmp_path / "src"
    small_folder(src, ["a/1.jpg", "a/2.jpg", "b/3.jpg", "b/4.jpg"])
    s3fs.S3FileSystem(**s3_options).put(str(src), f"{S3_BUCKET}/once", recursive=True)
    url = f"s3://{S3_BUCKET}/once"
    out = tmp_path / "out"
    for trace in runs(url, lambda **task: packer.pack(url, out, "wds", shard_size=2, workers=1, **task)):
        assert_once(trace)
