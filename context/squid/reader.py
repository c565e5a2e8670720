"""A reader adapter: LoRA weights for the tokens after a Squid composition, and for those only.

Squid encodes each document alone after the shared prefix and composes the caches by re-rotating
their keys, so the documents never attended to each other; the tokens that follow a composition (a
question, a completion's window) read caches full prefill would have computed differently. A reader
is a LoRA adapter applied to those tokens and not to the documents: the documents' caches stay the
base model's, shared with every request and never encoded again, and the adapter learns to read
them as full prefill would have (`feedback.train.squid_reader` distils it from full prefill).

`load_reader` injects it into a runtime's model switched off; `Reader.reading()` switches it on for
the forward passes inside. The runtime's `adapter_id` is not changed: with the reader off the model
computes exactly the base model's values, so caches keyed by the base model stay valid.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from ..errors import AdapterError
from ..loading import model_loading
from .keys import model_identity

__all__ = ["READER_FILE", "Reader", "load_reader", "reader_info"]

# Beside the adapter's own files: what the reader is and which model it was distilled for.
READER_FILE = "squid_reader.json"


def reader_info(path: Path) -> dict:
    """The reader's description (`READER_FILE`); AdapterError when `path` holds no reader."""
    path = Path(path)
    try:
        info = json.loads((path / READER_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise AdapterError(f"{path} holds no Squid reader ({READER_FILE} is missing)") from exc
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{path / READER_FILE} cannot be read: {exc}") from exc
    if not isinstance(info, dict) or info.get("kind") != "squid-reader":
        raise AdapterError(f"{path / READER_FILE} does not describe a Squid reader")
    return info


class Reader:
    """A reader injected into `runtime.model`, off except inside `reading()`."""

    def __init__(self, runtime, wrapper, path: Path, info: dict):
        self.runtime, self.path, self.info = runtime, path, info
        self._wrapper = wrapper
        self._wrapper.base_model.disable_adapter_layers()

    @contextmanager
    def reading(self):
        """The reader on for the forward passes inside (the tokens after a composition)."""
        self._wrapper.base_model.enable_adapter_layers()
        try:
            yield
        finally:
            self._wrapper.base_model.disable_adapter_layers()

    def close(self) -> None:
        """Take the reader's layers out of the model: the runtime is the base model again."""
        if self._wrapper is not None:
            self.runtime.model = self._wrapper.unload()
            self._wrapper = None


def load_reader(runtime, path: Path) -> Reader:
    """Inject the reader saved at `path` into `runtime.model`, switched off.

    Raises AdapterError when `path` holds no reader, when it was distilled for another model, or when
    a LoRA adapter is already applied (a reader reads the base model's document caches)."""
    path = Path(path)
    info = reader_info(path)
    if info.get("model") != model_identity(runtime):
        raise AdapterError(f"the reader at {path} was distilled for {info.get('model')!r}, "
                           f"not {model_identity(runtime)!r}")
    if runtime.adapter_id is not None:
        raise AdapterError(f"adapter {runtime.adapter_id} is applied; a reader needs the base model")
    with model_loading():
        from peft import PeftModel

        try:
            wrapper = PeftModel.from_pretrained(runtime.model, str(path), is_trainable=False)
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            raise AdapterError(f"cannot load the reader at {path}: {exc}") from exc
    wrapper.eval()
    return Reader(runtime, wrapper, path, info)
