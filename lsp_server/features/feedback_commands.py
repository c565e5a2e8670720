"""Feedback commands (docs/protocol.md): accepting a completion, and the consent switches.

`squidcode.completion.accept` rides as the `command` of every inline completion item, so the
client runs it when the user accepts (LSP has no accept notification). `squidcode.feedback.status`,
`setRecord` and `setShare` show and change what is recorded and whether it is shared.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

from agent.completion import Completion

from ..server import SquidServer

__all__ = [
    "register",
    "accept_command",
    "record_completion",
    "ACCEPT_COMMAND",
    "STATUS_COMMAND",
    "SET_RECORD_COMMAND",
    "SET_SHARE_COMMAND",
]

log = logging.getLogger(__name__)

ACCEPT_COMMAND = "squidcode.completion.accept"
STATUS_COMMAND = "squidcode.feedback.status"
SET_RECORD_COMMAND = "squidcode.feedback.setRecord"
SET_SHARE_COMMAND = "squidcode.feedback.setShare"


def accept_command(episode_id: str | None, text: str) -> types.Command:
    """The command attached to an inline completion item; `episodeId` is "" when nothing is recorded."""
    return types.Command(
        title="squidcode: accept", command=ACCEPT_COMMAND, arguments=[{"episodeId": episode_id or ""}]
    )


def record_completion(
    ls: SquidServer, uri: str, position: types.Position, completion: Completion
) -> str | None:
    """Record a completion the server is about to show; its episode id, or None.

    A failure here is logged and the completion is shown all the same.
    """
    try:
        return _record_completion(ls, uri, position, completion)
    except Exception:  # noqa: BLE001 - feedback must never cost the user a completion
        log.exception("feedback: could not record a completion")
        return None


def _record_completion(
    ls: SquidServer, uri: str, position: types.Position, completion: Completion
) -> str | None:
    recorder = ls.feedback
    opened = ls.open_document_text(uri)
    if recorder is None or opened is None or not completion.text:
        return None
    _, language = opened
    runtime = ls.runtime
    return recorder.record_completion_episode(
        uri=uri,
        position=(position.line, position.character),
        output=completion.text,
        # The prompt as the completion was served with it (its window, ids and settings), not
        # rebuilt from the document, which may have changed since.
        served=completion.prompt,
        # A completion server's answer is its model's: switching between it and the local model
        # (a fallback, or the user's choice) reads as a model switch.
        model_id=model_id_of(ls) if completion.served_by == "local" else completion.served_by,
        adapter_id=getattr(runtime, "adapter_id", None) if completion.served_by == "local" else None,
        language=language,
        latency_s=round(completion.latency_s, 4),
        extra={
            "prompt_builder": "completion.fim" if completion.prompt.fim else "completion.prefix",
            "prompt_tokens": completion.prompt_tokens,  # prefilled for this answer (not held in cache)
            "new_tokens": completion.new_tokens,
            "backend": ls.config.completion.backend,
            "served_by": completion.served_by,
            "cached_tokens": completion.cached_tokens,
        },
    )


def model_id_of(ls: SquidServer, config=None) -> str:
    """The configured model's id: its path, or the embedded model's name."""
    from context.runtime import EMBEDDED_MODEL_NAME

    path = (config or ls.config).model.path
    return str(Path(path).expanduser()) if path else EMBEDDED_MODEL_NAME


def completion_model_id(ls: SquidServer, config=None) -> str:
    """The id of the model that answers completions: a completion server's
    (`agent.completion_server.server_model_id`), or the local model's (`model_id_of`)."""
    from agent.completion_server import server_model_id

    config = config or ls.config
    if config.completion.backend != "local":
        return server_model_id(config.completion)
    return model_id_of(ls, config)


def _argument(args: tuple[Any, ...], command: str) -> dict[str, Any]:
    if args and args[0] == []:
        # Lua clients (Neovim) encode an empty table as [] rather than {}.
        args = ({},) + tuple(args[1:])
    if len(args) > 1 or (args and not isinstance(args[0], dict)):
        raise JsonRpcInvalidParams(f"{command} takes one JSON object as its argument")
    return args[0] if args else {}


def _switch(args: tuple[Any, ...], command: str) -> bool:
    value = _argument(args, command).get("on")
    if not isinstance(value, bool):
        raise JsonRpcInvalidParams(f'{command} needs {{"on": true|false}}')
    return value


def _recorder(ls: SquidServer):
    if ls.feedback is None:
        raise JsonRpcInvalidParams("squidcode feedback is not available (the server is not initialized yet)")
    return ls.feedback


def register(server: SquidServer) -> None:
    @server.command(ACCEPT_COMMAND)
    def accept(ls: SquidServer, *args: Any) -> dict:
        arg = _argument(args, ACCEPT_COMMAND)
        episode_id, text = arg.get("episodeId"), arg.get("text")
        if not isinstance(episode_id, str) or (text is not None and not isinstance(text, str)):
            raise JsonRpcInvalidParams(f'{ACCEPT_COMMAND} needs {{"episodeId": str, "text"?: str}}')
        if ls.feedback is not None and episode_id:
            uri = ls.feedback.episode_uri(episode_id)
            opened = ls.open_document_text(uri) if uri else None
            ls.feedback.accept_completion(episode_id, text, opened[0] if opened else None)
        return {}

    @server.command(STATUS_COMMAND)
    def status(ls: SquidServer, *args: Any) -> dict:
        _argument(args, STATUS_COMMAND)
        return _recorder(ls).status()

    @server.command(SET_RECORD_COMMAND)
    def set_record(ls: SquidServer, *args: Any) -> dict:
        on = _switch(args, SET_RECORD_COMMAND)
        recorder = _recorder(ls)
        recorder.set_record(on)
        ls.state_changed()
        log.info("feedback recording turned %s", "on" if on else "off")
        return recorder.status()

    @server.command(SET_SHARE_COMMAND)
    def set_share(ls: SquidServer, *args: Any) -> dict:
        on = _switch(args, SET_SHARE_COMMAND)
        recorder = _recorder(ls)
        if on and not (recorder.config.endpoint and recorder.config.token):
            raise JsonRpcInvalidParams(
                "sharing needs feedback.endpoint and feedback.token in the settings first; nothing is shared"
            )
        recorder.set_share(on)
        ls.state_changed()
        log.info("feedback sharing turned %s", "on" if on else "off")
        return recorder.status()
