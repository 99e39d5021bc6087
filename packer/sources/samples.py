"""Samples made by code (`packer.pack_samples(fn, inputs, out)`): an input kind whose "location" is
an input itself, so shards, workers, tasks, resume and rejects are those of every other kind.

`fn` and `inputs` are pickled into OUT/.pack (the SRC of the plan: another `fn` or other inputs
is another SRC, so a rerun with them is the usual "unfinished run" error). Each worker process
loads them once and calls `fn(input)` for the entries of its shard, one call at a time (a torch
Dataset or a database cursor need not be thread-safe); encoding then runs in the reader threads.

A call returns a sample, or a list of samples, each a dict: `image` as encoded bytes (stored
as they are, like a file's), a PIL image or a uint8 HxW / HxWxC array (both stored as
lossless PNG); `label` an integer >= 0 (absent or None: unlabelled); every other key a field.
The fields and their types are those of the first input's first sample, which the scan makes
in the packing process: `str`, `bool`, `int`, `float`, numpy arrays (`array`, of the first
sample's dtype and shape) and lists or dicts (`json`). A sample without an image, with a field
of another type or missing one, or a call that raises, rejects that input, named.
"""

from __future__ import annotations

import hashlib
import io
import numbers
import os
import pickle
import threading
from array import array
from typing import TYPE_CHECKING, Any, Callable, Sequence

from readers.fields import FieldSpec, check_field_name, encode_value

from ..errors import PackError, RejectedFile
from .classes import read_classes
from .inputs import Record, ShardPlan, Source
from .listing import UNLABELLED, Listing, ScanError

if TYPE_CHECKING:
    from ..plan.options import PackOptions

SAMPLES_PREFIX = "samples-"
ARRAY_KINDS = {"i": "int64", "u": "int64", "f": "float64", "b": "bool"}


def save_samples(folder: str | os.PathLike[str], fn: Callable[[Any], Any], inputs: Sequence[Any]) -> str:
    """Pickle (fn, inputs) into `folder` under a name made of their hash; returns its path.

    A function the worker processes cannot import (a lambda, a local function, one typed into an
    interactive session) is a PackError saying so, here rather than in every worker."""
    if getattr(fn, "__module__", None) == "__main__":
        import __main__

        if not getattr(__main__, "__file__", None):
            raise PackError(f"pack_samples: {fn!r} is defined in an interactive session; the worker processes "
                            "are spawned and cannot import it: define it in a module (or a script) instead")
    try:
        data = pickle.dumps((fn, list(inputs)), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise PackError(f"pack_samples: fn and inputs must be picklable for the spawned worker processes "
                        f"(fn a module-level function or a picklable callable): {exc}") from None
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{SAMPLES_PREFIX}{hashlib.sha256(data).hexdigest()[:32]}.pickle")
    if not os.path.exists(path):
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    return path


def load_pickled(path: str) -> tuple[Callable[[Any], Any], list[Any]]:
    try:
        with open(path, "rb") as handle:
            fn, inputs = pickle.load(handle)
    except (OSError, pickle.UnpicklingError, AttributeError, ImportError, EOFError) as exc:
        raise PackError(f"{path}: cannot load pack_samples' function and inputs ({exc})") from None
    return fn, inputs


def describe_input(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def scan(source: Source, options: PackOptions) -> Listing:
    """One entry per input (location: input 0, the input's position); the fields from calling
    `fn` here on the first input it does not raise for (the workers reject those it raises for)."""
    fn, inputs = load_pickled(source.inputs[0])
    listing = Listing(root=source.root, classes=read_classes(options.classes) if options.classes else [],
                      locations=array("q"))
    assert listing.locations is not None
    for position in range(len(inputs)):
        listing.paths.append(str(position))
        listing.labels.append(UNLABELLED)  # read with the sample
        listing.sizes.append(0)
        listing.locations.extend((0, position, 0))
    if inputs:
        listing.fields = infer_fields(fn, inputs)
    return listing


def as_list(result: Any) -> list[Any]:
    return result if isinstance(result, list) else [result]


FIELD_PROBES = 100
"""Inputs `infer_fields` tries before it gives up: a fn that fails that often is broken, not unlucky."""


def infer_fields(fn: Callable[[Any], Any], inputs: Sequence[Any]) -> list[FieldSpec]:
    failure = None
    for first in inputs[:FIELD_PROBES]:
        try:
            samples = as_list(fn(first))
            break
        except Exception as exc:  # noqa: BLE001 - the user's code: its failure is the message
            failure = failure or f"fn({describe_input(first)}) raised {type(exc).__name__}: {exc}"
    else:
        raise ScanError(f"pack_samples: fn raised for the first {min(len(inputs), FIELD_PROBES)} inputs "
                        f"(the first: {failure}); nothing to take the fields from")
    if not samples or not isinstance(samples[0], dict):
        raise ScanError(f"pack_samples: fn({describe_input(first)}) must return a dict (or a list of dicts), "
                        f"not {type(samples[0] if samples else samples).__name__}")
    specs = []
    for name, value in samples[0].items():
        if name in ("image", "label"):
            continue
        problem = check_field_name(name)
        if problem:
            raise ScanError(f"pack_samples: key {name!r} cannot be a field: {problem}")
        spec = spec_of(name, value)
        if spec is None:
            raise ScanError(f"pack_samples: field {name!r} of the first sample is a {type(value).__name__}, "
                            "which no field type stores (str, bool, int, float, numpy array, list or dict)")
        specs.append(spec)
    return specs


def spec_of(name: str, value: Any) -> FieldSpec | None:
    if isinstance(value, str):
        return FieldSpec(name, "str")
    if isinstance(value, (bool, _numpy_bool())):
        return FieldSpec(name, "bool")
    if isinstance(value, numbers.Integral):
        return FieldSpec(name, "int")
    if isinstance(value, numbers.Real):
        return FieldSpec(name, "float")
    if type(value).__name__ == "ndarray" and value.dtype.kind in ARRAY_KINDS:
        dtype = "float32" if value.dtype.name == "float32" else ARRAY_KINDS[value.dtype.kind]
        return FieldSpec(name, "array", dtype=dtype, shape=tuple(value.shape))
    if isinstance(value, (list, dict)):
        return FieldSpec(name, "json")
    return None


def _numpy_bool() -> type:
    import numpy as np

    return np.bool_


def image_bytes(image: Any) -> bytes:
    """A sample's image as stored bytes: bytes as they are; a PIL image or uint8 array as PNG."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    from PIL import Image

    if type(image).__name__ == "ndarray":
        if image.dtype.name != "uint8" or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (1, 3, 4)):
            raise RejectedFile(f"image array must be uint8 HxW or HxWxC (C 1, 3 or 4), not {image.dtype} "
                               f"{tuple(image.shape)}")
        image = Image.fromarray(image[:, :, 0] if image.ndim == 3 and image.shape[2] == 1 else image)
    if not isinstance(image, Image.Image):
        raise RejectedFile(f"image must be bytes, a PIL image or a uint8 array, not {type(image).__name__}")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


class SamplesReader:
    """Calls fn(input) for a shard's entries, one call at a time, and checks what it returns."""

    def __init__(self, plan: ShardPlan) -> None:
        self.fn, self.inputs = load_pickled(plan.inputs[0])
        self.specs = {spec.name: spec for spec in plan.fields}
        self.lock = threading.Lock()

    def __call__(self, input: int, offset: int, length: int) -> list[Record]:
        value = self.inputs[offset]
        try:
            with self.lock:
                samples = as_list(self.fn(value))
        except Exception as exc:  # noqa: BLE001 - the user's code: any failure rejects this input
            raise RejectedFile(f"fn({describe_input(value)}) raised {type(exc).__name__}: {exc}") from None
        records = []
        for number, sample in enumerate(samples):
            where = f"fn({describe_input(value)})" + (f" sample {number}" if len(samples) > 1 else "")
            records.append(self.record(sample, where, f"{offset}/{number}" if len(samples) > 1 else str(offset)))
        return records

    def record(self, sample: Any, where: str, path: str) -> Record:
        if not isinstance(sample, dict):
            raise RejectedFile(f"{where}: a {type(sample).__name__}, not a dict")
        if sample.get("image") is None:
            raise RejectedFile(f"{where}: no image")
        try:
            image = image_bytes(sample["image"])
        except RejectedFile as exc:
            raise RejectedFile(f"{where}: {exc}") from None
        label = sample.get("label")
        if label is None:
            label = UNLABELLED
        elif isinstance(label, (bool, _numpy_bool())) or not isinstance(label, numbers.Integral) or label < 0:
            raise RejectedFile(f"{where}: label {label!r} is not a class index (an integer >= 0)")
        fields: dict[str, bytes] = {}
        for name, spec in self.specs.items():
            if name not in sample:
                raise RejectedFile(f"{where}: no field {name!r}, which the first sample has")
            fields[name] = self.stored(spec, sample[name], where)
        extra = sorted(set(sample) - set(self.specs) - {"image", "label"})
        if extra:
            raise RejectedFile(f"{where}: field {extra[0]!r}, which the first sample does not have")
        return Record(image=image, label=int(label), fields=fields, path=path)

    @staticmethod
    def stored(spec: FieldSpec, value: Any, where: str) -> bytes:
        found = spec_of(spec.name, value)
        fits = found is not None and (found.type == spec.type or (spec.type == "float" and found.type == "int"))
        if fits and spec.type == "array":
            fits = found.dtype == spec.dtype and found.shape == spec.shape  # type: ignore[union-attr]
        if not fits:
            what = type(value).__name__ if found is None or found.type != "array" else \
                f"{found.dtype} array of shape {found.shape}"
            expected = spec.type if spec.type != "array" else f"{spec.dtype} array of shape {spec.shape}"
            raise RejectedFile(f"{where}: field {spec.name!r} is a {what}, where the first sample has a {expected}")
        if spec.type == "array":
            value = value.tolist()
        elif spec.type in ("int", "float", "bool"):
            value = value.item() if hasattr(value, "item") else value
            value = float(value) if spec.type == "float" else value
        try:
            return encode_value(spec, value)
        except (ValueError, TypeError) as exc:
            raise RejectedFile(f"{where}: field {spec.name!r}: {exc}") from None

    def close(self) -> None:
        pass


def open_reader(plan: ShardPlan) -> SamplesReader:
    return SamplesReader(plan)
