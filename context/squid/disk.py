"""The disk format of one cached document: a safetensors file whose header carries the metadata.

    keys       [layers, kv_heads, seq, head_dim]   (the model's dtype)
    values     [layers, kv_heads, seq, head_dim]
    token_ids  [seq] int64
    metadata   format version, the key's fields, start position, source path, shapes, checksum

Writes are atomic: the bytes go to a temporary file in the same folder (unique per process and
thread), are flushed to disk, and replace the entry with `os.replace`, so a reader sees the old
entry or the new one, never a partial file, and two processes writing the same entry both leave a
whole file. Reads check everything before an entry is used: a truncated or unparsable file, another
format version, another key, shapes that disagree, or a CRC-32 mismatch is `CacheEntryCorrupt`.
"""

from __future__ import annotations

import json
import os
import secrets
import struct
import threading
import zlib
from pathlib import Path

import torch

from ..errors import CacheEntryCorrupt
from .encode import DocumentKV
from .keys import FORMAT_VERSION, CacheKey

__all__ = ["SUFFIX", "checksum", "read_entry", "read_metadata", "write_entry"]

SUFFIX = ".safetensors"
_TENSORS = ("keys", "values", "token_ids")


def checksum(tensors: dict[str, torch.Tensor]) -> str:
    """CRC-32 over the tensors' bytes in name order (corruption, not tampering, is the concern)."""
    crc = 0
    for name in _TENSORS:
        data = tensors[name].contiguous().view(torch.uint8).numpy()
        crc = zlib.crc32(memoryview(data), crc)
    return f"{crc:08x}"


def _metadata(entry: DocumentKV, tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    return {
        **entry.key.as_metadata(),
        "start": str(entry.start),
        "source": entry.source or "",
        "shape": json.dumps(list(entry.keys.shape)),
        "dtype": str(entry.keys.dtype),
        "checksum": checksum(tensors),
    }


def write_entry(path: Path, entry: DocumentKV) -> int:
    """Write `entry` to `path` atomically; returns the bytes written. OSError (full disk) propagates
    after the temporary file is removed."""
    import safetensors.torch

    tensors = {
        "keys": entry.keys.detach().cpu().contiguous(),
        "values": entry.values.detach().cpu().contiguous(),
        "token_ids": torch.tensor(entry.token_ids, dtype=torch.int64),
    }
    data = safetensors.torch.save(tensors, metadata=_metadata(entry, tensors))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return len(data)


def _split_header(data: bytes, path: Path) -> tuple[dict, int]:
    if len(data) < 8:
        raise CacheEntryCorrupt(f"{path}: truncated ({len(data)} bytes)")
    (size,) = struct.unpack("<Q", data[:8])
    if size > len(data) - 8:
        raise CacheEntryCorrupt(f"{path}: truncated header ({size} bytes announced, {len(data) - 8} present)")
    try:
        header = json.loads(data[8 : 8 + size])
    except (UnicodeDecodeError, ValueError) as exc:
        raise CacheEntryCorrupt(f"{path}: unreadable header ({exc})") from exc
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__"), dict):
        raise CacheEntryCorrupt(f"{path}: no metadata in the header")
    return header["__metadata__"], size


def read_metadata(path: Path) -> dict[str, str]:
    """The metadata alone (reads the header only)."""
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise CacheEntryCorrupt(f"{path}: truncated ({len(head)} bytes)")
        (size,) = struct.unpack("<Q", head)
        return _split_header(head + handle.read(min(size, 1 << 20)), path)[0]


def _check_metadata(meta: dict, expected: CacheKey | None, path: Path) -> CacheKey:
    if meta.get("format") != str(FORMAT_VERSION):
        raise CacheEntryCorrupt(f"{path}: format version {meta.get('format')!r}, expected {FORMAT_VERSION}")
    try:
        key = CacheKey.from_metadata(meta)
        int(meta["start"])
    except (KeyError, ValueError) as exc:
        raise CacheEntryCorrupt(f"{path}: incomplete metadata ({exc})") from exc
    if expected is not None and key != expected:
        raise CacheEntryCorrupt(f"{path}: holds another entry than the one asked for")
    return key


def read_entry(path: Path, expected: CacheKey | None = None, device: str = "cpu") -> DocumentKV:
    """Read and verify one entry. FileNotFoundError when absent, CacheEntryCorrupt when unusable."""
    import safetensors.torch
    from safetensors import SafetensorError

    data = path.read_bytes()
    meta, _ = _split_header(data, path)
    key = _check_metadata(meta, expected, path)
    try:
        tensors = safetensors.torch.load(data)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise CacheEntryCorrupt(f"{path}: unreadable tensors ({exc})") from exc
    if set(tensors) != set(_TENSORS):
        raise CacheEntryCorrupt(f"{path}: tensors {sorted(tensors)}, expected {list(_TENSORS)}")
    keys, values, ids = tensors["keys"], tensors["values"], tensors["token_ids"]
    shape = list(keys.shape)
    if (shape != json.loads(meta.get("shape", "null")) or list(values.shape) != shape or keys.dim() != 4
            or ids.dim() != 1 or ids.shape[0] != shape[2] or str(keys.dtype) != meta.get("dtype")):
        raise CacheEntryCorrupt(f"{path}: tensor shapes or dtype disagree with the metadata")
    if checksum(tensors) != meta.get("checksum"):
        raise CacheEntryCorrupt(f"{path}: checksum mismatch")
    return DocumentKV(
        key=key, token_ids=tuple(ids.tolist()), start=int(meta["start"]),
        keys=keys.to(device), values=values.to(device), source=meta.get("source") or None,
    )
