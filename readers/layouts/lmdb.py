"""LMDB shards: zero-padded ASCII keys, and records of a small header, JSON meta and the payload.

A sample's fields (version 2) sit under their own keys beside its record, `<key>.<field name>`,
holding `readers.fields.encode_value` bytes; an absent optional field has no key. Record keys
have no dot, so they are told apart from field keys, and `<key>` < `<key>.<name>` < the next
sample's key: writes in sample order, fields by name, can still append.
"""

from __future__ import annotations

import json
import struct
from typing import Any

KEY_WIDTH = 10
RECORD_MAGIC = b"PKR1"
RECORD_HEADER = struct.Struct("<4sI")


def sample_key(local_index: int) -> bytes:
    """Key order is sample order, so writes can append."""
    return b"%0*d" % (KEY_WIDTH, local_index)


def field_key(local_index: int, name: str) -> bytes:
    return sample_key(local_index) + b"." + name.encode("ascii")


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
