"""What the model reads and runs on: configuration, the model runtime, and (later) the index and caches."""

from .config import (
    CompletionConfig,
    ConfigLayer,
    ModelConfig,
    SquidConfig,
    config_from_mapping,
    load_config_file,
    merge_layers,
)
from .errors import (
    ConfigError,
    GenerationCancelled,
    ModelLoadError,
    ModelNotFoundError,
    SquidcodeError,
)
from .runtime import GenerationResult, ModelRuntime, get_runtime, locate_embedded_gguf

__all__ = [
    "CompletionConfig",
    "ConfigLayer",
    "ModelConfig",
    "SquidConfig",
    "config_from_mapping",
    "load_config_file",
    "merge_layers",
    "ConfigError",
    "GenerationCancelled",
    "ModelLoadError",
    "ModelNotFoundError",
    "SquidcodeError",
    "GenerationResult",
    "ModelRuntime",
    "get_runtime",
    "locate_embedded_gguf",
]
