"""`squidcode.status` (workspace/executeCommand) and the `squidcode/status` notification: one object
saying what the server is doing (model, index, feedback, training), for status bars and health checks.

The object's shape is docs/protocol.md's. Other features contribute a section by putting a function
in `server.status_sections` (e.g. `"feedback"`, `"training"`) and call `server.state_changed()` when
it changes; the notification goes out only when the object differs from the last one sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from context.config import ModelConfig
from context.runtime import EMBEDDED_MODEL_NAME

from ..server import SquidServer

__all__ = [
    "register",
    "STATUS_COMMAND",
    "STATUS_NOTIFICATION",
    "model_section",
    "build_status",
    "StatusNotifier",
]

log = logging.getLogger(__name__)

STATUS_COMMAND = "squidcode.status"
STATUS_NOTIFICATION = "squidcode/status"

# What a section reports while no feature provides it (feedback and training are off until then).
DEFAULT_SECTIONS: dict[str, dict] = {
    "feedback": {"record": False, "share": False},
    "training": {"state": "off", "adapter": None, "step": None},
}


def model_section(config: ModelConfig, runtime, error: str | None) -> dict:
    """The `model` part: the configured model, and what was actually loaded once it is (not loaded
    and no error: still loading)."""
    if runtime is not None and getattr(runtime, "model", None) is not None:
        dtype = str(getattr(runtime.model, "dtype", "")).removeprefix("torch.") or config.dtype
        return {
            "name": runtime.source or EMBEDDED_MODEL_NAME,
            "loaded": True,
            "device": runtime.device,
            "dtype": dtype,
            "adapter": runtime.adapter_id,
            "error": None,
        }
    return {
        "name": config.path or EMBEDDED_MODEL_NAME,
        "loaded": False,
        "device": config.device,
        "dtype": config.dtype,
        "adapter": None,
        "error": error,
    }


def build_status(
    version: str, model: dict, index: dict | None, sections: dict[str, Callable[[], dict]]
) -> dict:
    """The whole status object; a failing section provider is logged and reported, never fatal."""
    status: dict[str, Any] = {"version": version, "model": model, "index": index or {"state": "off"}}
    for name, default in DEFAULT_SECTIONS.items():
        status[name] = dict(default)
    for name, provider in sections.items():
        try:
            status[name] = provider()
        except Exception as exc:  # noqa: BLE001 - a plugin's failure must not break the status
            log.warning("status section %r failed: %s", name, exc)
            status[name] = {"error": str(exc)}
    return status


def server_status(ls: SquidServer) -> dict:
    model = model_section(ls.config.model, ls.runtime, ls.model_error)
    index = ls.index_service.status() if ls.index_service is not None else None
    if index is None and not ls.config.index.enabled:
        index = {"state": "off"}
    return build_status(ls.version, model, index, ls.status_sections)


class StatusNotifier:
    """Sends `squidcode/status` when the status object changed since the last one sent."""

    def __init__(self, ls: SquidServer):
        self._ls = ls
        self._last: dict | None = None

    def __call__(self) -> None:
        status = server_status(self._ls)
        if status == self._last:
            return
        self._last = status
        self._ls.protocol.notify(STATUS_NOTIFICATION, status)


def register(server: SquidServer) -> None:
    server.state_listeners.append(StatusNotifier(server))
    server.status_sections.setdefault(
        "completion", lambda: server.served_completions.status(server.config.completion))

    @server.command(STATUS_COMMAND)
    def status_command(ls: SquidServer, *args) -> dict:
        # Arguments are `{}` by the contract; anything else is ignored rather than refused.
        return server_status(ls)
