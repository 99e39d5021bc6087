"""LMDB shards: records of a small header, JSON meta and the payload, under `manifest.sample_key` keys."""

from __future__ import annotations

import json
import struct
from typing import Any

RECORD_MAGIC = b"PKR1"
RECORD_HEADER = struct.Struct("<4sI")


def encode_record(meta: dict[str, Any], payload: bytes) -> bytes:
    """One stored sample: magic, uint32 LE meta length, UTF-8 JSON meta, then the image bytes."""
    meta_bytes = json.dumps(meta, separators=(",", ":")).encode("utf-8")
    return RECORD_HEADER.pack(RECORD_MAGIC, len(meta_bytes)) + meta_bytes + payload


def parse_record(record: bytes | memoryview) -> tuple[dict[str, Any], memoryview]:
    """Split a stored record into its meta dict and a zero-copy view of the payload."""
    view = memoryview(record)
    if len(view) < RECORD_HEADER.size:
        raise ValueError("record shorter than its header")
    magic, meta_len = RECORD_HEADER.unpack_from(view)
    if magic != RECORD_MAGIC:
        raise ValueError("bad record magic")
    start = RECORD_HEADER.size
    end = start + meta_len
    if end > len(view):
        raise ValueError("record meta runs past its end")
    meta = json.loads(bytes(view[start:end]).decode("utf-8"))
    return meta, view[end:]
