"""What identifies a cached document: the model, the adapter, the shared prefix, the text, the format.

A cache entry is only ever reused under the exact key it was encoded with: a changed model (another
path, dtype or weights), a new LoRA adapter, another system prefix or an edited document gives
another key, so an old entry can never be used wrongly; it just ages out of the store.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

__all__ = ["FORMAT_VERSION", "CacheKey", "content_hash", "model_identity", "token_hash"]

# Bump when the layout of a cached entry (tensor names, shapes, metadata) changes.
FORMAT_VERSION = 1

_IDENTITIES: dict[int, str] = {}


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def token_hash(ids) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:32]


def model_identity(runtime) -> str:
    """The loaded model's source and dtype plus a fingerprint of a few of its weights.

    The fingerprint catches new weights behind an unchanged path. It reads ~16k values, so it is
    computed once per loaded model object.
    """
    model = runtime.model
    cached = _IDENTITIES.get(id(model))
    if cached is not None:
        return cached
    digest = hashlib.sha256(f"{runtime.source}|{model.dtype}|{model.config.model_type}".encode())
    params = list(model.parameters())
    for tensor in (params[0], params[len(params) // 2], params[-1]):
        sample = tensor.detach().flatten()[:4096].float().cpu().numpy().tobytes()
        digest.update(sample)
    identity = f"{runtime.source}#{digest.hexdigest()[:16]}"
    _IDENTITIES[id(model)] = identity
    return identity


@dataclass(frozen=True)
class CacheKey:
    """(model id, adapter id, prefix hash, document content hash, format version)."""

    model: str
    adapter: str | None
    prefix: str
    content: str
    format: int = FORMAT_VERSION

    @property
    def digest(self) -> str:
        """A file-name-safe name for the key (the disk tier's file name)."""
        text = f"{self.model}\0{self.adapter or ''}\0{self.prefix}\0{self.content}\0{self.format}"
        return hashlib.sha256(text.encode()).hexdigest()[:40]

    def as_metadata(self) -> dict[str, str]:
        return {k: "" if v is None else str(v) for k, v in asdict(self).items()}

    @classmethod
    def from_metadata(cls, meta: dict[str, str]) -> CacheKey:
        return cls(
            model=meta["model"], adapter=meta["adapter"] or None, prefix=meta["prefix"],
            content=meta["content"], format=int(meta["format"]),
        )
