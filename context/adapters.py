"""Apply a LoRA adapter (peft) to a loaded ModelRuntime, or take it off, without reloading the model.

peft injects the LoRA layers into the runtime's own model object, so `runtime.model` keeps its
identity and its generation code works unchanged; `runtime.adapter_id` names what is applied, and
anything derived from activations (Squid KV caches) is keyed by it, so caches made under another
adapter are never reused. An adapter trained on fill-in-the-middle prompts (its version's meta.json
names the format) sets `runtime.adapter_fim`, the format completions are then served in. Swaps hold
the runtime's generation lock: a generation in progress finishes with the weights it started with.
"""

from __future__ import annotations

import json
import logging
import weakref
from pathlib import Path

from .errors import AdapterError
from .fim import FimFormat, resolve
from .loading import model_loading

__all__ = ["adapter_fim", "apply_adapter", "current_adapter", "remove_adapter"]

log = logging.getLogger(__name__)

# runtime -> the peft wrapper whose LoRA layers are inside runtime.model.
_WRAPPERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def current_adapter(runtime) -> str | None:
    return runtime.adapter_id


def apply_adapter(runtime, path: Path, adapter_id: str) -> None:
    """Apply the peft adapter saved at `path` as `adapter_id`, replacing any adapter applied before.

    Raises AdapterError when the files cannot be read or do not fit the model; the runtime is then
    left on the base weights (adapter_id None), never half-applied.
    """
    with model_loading():  # peft imports transformers lazily, which is not thread-safe
        from peft import PeftModel

    path = Path(path)
    if not (path / "adapter_config.json").is_file():
        raise AdapterError(f"{path} holds no LoRA adapter (adapter_config.json is missing)")
    with runtime._lock:
        if runtime.adapter_id == adapter_id:
            return
        previous = runtime.adapter_id
        _unload_locked(runtime)
        try:
            with model_loading():
                wrapper = PeftModel.from_pretrained(runtime.model, str(path), is_trainable=False)
        except (*_unreadable_errors(), ValueError, RuntimeError, KeyError) as exc:
            _strip_partial_lora(runtime)
            log.warning("adapter %s at %s does not load (%s); keeping the base model", adapter_id, path, exc)
            raise AdapterError(f"cannot apply adapter {adapter_id} from {path}: {exc}") from exc
        wrapper.eval()
        _WRAPPERS[runtime] = wrapper
        runtime.adapter_id = adapter_id
        runtime.adapter_fim = adapter_fim(path)
    log.info("adapter %s applied (was %s)", adapter_id, previous or "base model")


def remove_adapter(runtime) -> None:
    """Go back to the base weights."""
    with runtime._lock:
        _unload_locked(runtime)


def _unload_locked(runtime) -> None:
    wrapper = _WRAPPERS.pop(runtime, None)
    if wrapper is not None:
        # unload() takes the LoRA layers out of the model in place and returns the base model.
        runtime.model = wrapper.unload()
    runtime.adapter_id = None
    runtime.adapter_fim = None


def adapter_fim(path: Path) -> FimFormat | None:
    """The fill-in-the-middle format the adapter at `path` was trained to answer in: its version's
    `meta.json` "fim" (a family's name or a template, `feedback.train`); None: none recorded, or
    one this version cannot read (served with the model's own prompt)."""
    try:
        setting = json.loads((Path(path) / "meta.json").read_text()).get("fim")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(setting, str) or not setting:
        return None
    try:
        return resolve(setting, ())
    except ValueError:
        log.warning("adapter at %s names a FIM format this version does not know (%r); ignored",
                    path, setting)
        return None


def _unreadable_errors() -> tuple[type[Exception], ...]:
    from safetensors import SafetensorError

    return (OSError, SafetensorError)


def _strip_partial_lora(runtime) -> None:
    """Take out LoRA layers a failed load may have injected before it raised."""
    from peft.tuners.lora import LoraLayer

    if not any(isinstance(m, LoraLayer) for m in runtime.model.modules()):
        return
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, module in list(runtime.model.named_modules()):
        if isinstance(module, BaseTunerLayer) and hasattr(module, "get_base_layer"):
            parent_name, _, child = name.rpartition(".")
            parent = runtime.model.get_submodule(parent_name) if parent_name else runtime.model
            setattr(parent, child, module.get_base_layer())
