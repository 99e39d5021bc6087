"""LMDB shards: records of a small header, JSON meta and the payload, under `manifest.sample_key` keys.

A sample's fields (version 2) sit under their own keys beside its record, `<key>.<field name>`,
holding `readers.fields.encode_value` bytes; an absent optional field has no key. Record keys
have no dot, so they are told apart from field keys, and `<key>` < `<key>.<name>` < the next
sample's key: writes in sample order, fields by name, can still append.
"""

from __future__ import annotations

import json
import struct
from typing import Any

RECORD_MAGIC = b"PKR1"
RECORD_HEADER = struct.Struct("<4sI")


def field_key(key: str, name: str) -> bytes:
    """Where a field of the sample whose record is under `key` (`manifest.sample_key`) is stored."""
    return f"{key}.{name}".encode("ascii")


def is_record_key(key: bytes) -> bool:
    return b"." not in key


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
