"""The one exception hierarchy of squidcode.

Errors from torch, transformers, sqlite3, httpx or git are translated into these at the boundary,
with a message a user can act on.
"""

__all__ = [
    "SquidcodeError",
    "ConfigError",
    "ModelNotFoundError",
    "ModelLoadError",
    "GenerationCancelled",
    "IndexStoreError",
    "IndexCorruptError",
    "FeedbackStoreError",
    "FeedbackUploadError",
    "AdapterError",
    "TrainingError",
    "CacheEntryCorrupt",
]


class SquidcodeError(Exception):
    """Base class of every error squidcode raises on purpose."""


class ConfigError(SquidcodeError):
    """A configuration value or file is invalid."""


class ModelNotFoundError(SquidcodeError):
    """The configured model (or the embedded default) cannot be found on disk."""


class ModelLoadError(SquidcodeError):
    """A model was found but could not be loaded."""


class GenerationCancelled(SquidcodeError):
    """Generation stopped because its request was cancelled or superseded."""


class IndexStoreError(SquidcodeError):
    """The repository index database could not be read or written."""


class IndexCorruptError(IndexStoreError):
    """The repository index database is damaged; delete it (or reopen the store) to rebuild it."""


class FeedbackStoreError(SquidcodeError):
    """The feedback database could not be opened, read or written."""


class FeedbackUploadError(SquidcodeError):
    """A batch of feedback could not be delivered to the team collector."""


class AdapterError(SquidcodeError):
    """A LoRA adapter cannot be stored, found, promoted or applied."""


class TrainingError(SquidcodeError):
    """The background trainer cannot run (no data, no model, a bad checkpoint)."""


class CacheEntryCorrupt(SquidcodeError):
    """A stored Squid KV cache entry is damaged or stale; it is discarded and encoded again."""
