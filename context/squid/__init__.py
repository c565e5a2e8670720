"""Squid attention: per-document KV caches, encoded once and composed per request without
re-encoding, with measured quality recovery and a device -> CPU -> disk store."""

from .compose import ComposedContext, Recovery, compose, prefill
from .encode import (
    DEFAULT_PREFIX,
    DocumentKV,
    PrefixKV,
    build_cache,
    document_key,
    encode_document,
    encode_prefix,
)
from .keys import FORMAT_VERSION, CacheKey, content_hash, model_identity
from .references import CompletionReferences, select_references
from .service import ReferenceDocument, SquidService, recovery_from_config
from .store import KVCacheStore, TierStats

__all__ = [
    "DEFAULT_PREFIX",
    "FORMAT_VERSION",
    "CacheKey",
    "ComposedContext",
    "CompletionReferences",
    "KVCacheStore",
    "ReferenceDocument",
    "SquidService",
    "TierStats",
    "recovery_from_config",
    "select_references",
    "DocumentKV",
    "PrefixKV",
    "Recovery",
    "build_cache",
    "compose",
    "content_hash",
    "document_key",
    "encode_document",
    "encode_prefix",
    "model_identity",
    "prefill",
]
