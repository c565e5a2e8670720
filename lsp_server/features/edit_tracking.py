"""Feedback edit tracking: the recorder's life in the server, fed by the editor's document events.

The recorder is created once the configuration is known and follows later changes of it (and of
the model: a model change right after an output is a switch away from it). didChange / didClose
reach it through the server's document listeners (the index owns those notifications); didOpen and
workspace/didRenameFiles are handled here. A timer judges due checkpoints about once a second.
"""

from __future__ import annotations

import asyncio
import logging

from lsprotocol import types

from context.config import SquidConfig
from context.errors import FeedbackStoreError
from feedback.recorder import FeedbackRecorder
from feedback.tracking import TextChange
from feedback.upload import Uploader

from ..server import SquidServer
from .feedback_commands import completion_model_id

__all__ = ["register", "to_text_changes"]

log = logging.getLogger(__name__)


def to_text_changes(params: types.DidChangeTextDocumentParams) -> list[TextChange]:
    changes = []
    for change in params.content_changes:
        rng = getattr(change, "range", None)
        if rng is None:
            changes.append(TextChange(None, None, change.text))
        else:
            changes.append(
                TextChange(
                    (rng.start.line, rng.start.character), (rng.end.line, rng.end.character), change.text
                )
            )
    return changes


def _tick_interval(config: SquidConfig) -> float:
    shortest = min((*config.feedback.checkpoints_s, config.feedback.dismiss_after_s))
    return max(0.02, min(1.0, shortest / 4))


def _start(ls: SquidServer, config: SquidConfig) -> None:
    recorder = FeedbackRecorder(config.feedback)
    encoding = ls.workspace.position_encoding if ls.workspace else None
    recorder.tracker.utf16 = encoding in (None, types.PositionEncodingKind.Utf16, "utf-16")
    ls.feedback = recorder
    ls.feedback_uploader = Uploader(recorder)
    ls.feedback_uploader.start()
    ls.status_sections["feedback"] = lambda: _status_section(recorder)
    ls.stop_hooks.append(("feedback", lambda: _stop(ls)))
    try:
        # Kept on the server: the loop holds tasks only weakly.
        ls.feedback_tick_task = asyncio.get_running_loop().create_task(_tick_forever(ls))
    except RuntimeError:
        log.info("no event loop: feedback checkpoints are judged only when tick() is called")
    log.info(
        "feedback: recording %s, sharing %s, store %s",
        "on" if recorder.config.record else "off",
        "on" if recorder.sharing else "off",
        recorder.db_path,
    )


def _status_section(recorder: FeedbackRecorder) -> dict:
    """The `feedback` part of `squidcode.status` (docs/protocol.md)."""
    status = recorder.status()
    return {"record": status["record"], "share": status["share"]}


def _stop(ls: SquidServer) -> None:
    if getattr(ls, "feedback_uploader", None) is not None:
        ls.feedback_uploader.stop()
    if ls.feedback is not None:
        ls.feedback.close()


async def _tick_forever(ls: SquidServer) -> None:
    while True:
        await asyncio.sleep(_tick_interval(ls.config))
        if ls.feedback is not None:
            try:
                ls.feedback.tick()
            except FeedbackStoreError as exc:  # the store is the writer's business; keep ticking
                log.warning("feedback: %s", exc)


def on_config(ls: SquidServer, previous: SquidConfig, config: SquidConfig) -> None:
    if ls.feedback is None:
        _start(ls, config)
    elif previous.feedback != config.feedback:
        ls.feedback.reconfigure(config.feedback)
        ls.feedback_uploader.wake()
    ls.feedback.note_model(completion_model_id(ls, config))


def on_document(ls: SquidServer, method: str, params) -> None:
    recorder = ls.feedback
    if recorder is None:
        return
    uri = params.text_document.uri
    if method == types.TEXT_DOCUMENT_DID_CHANGE:
        if not recorder.follows(uri):
            return
        opened = ls.open_document_text(uri)
        if opened is not None:
            recorder.on_did_change(uri, to_text_changes(params), opened[0])
    elif method == types.TEXT_DOCUMENT_DID_CLOSE:
        recorder.on_close(uri)


def register(server: SquidServer) -> None:
    server.feedback_uploader = None
    server.feedback_tick_task = None
    server.config_listeners.append(lambda previous, config: on_config(server, previous, config))
    server.document_listeners.append(lambda method, params: on_document(server, method, params))

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: SquidServer, params: types.DidOpenTextDocumentParams) -> None:
        ls.notify_document_listeners(types.TEXT_DOCUMENT_DID_OPEN, params)
        if ls.feedback is not None:
            ls.feedback.on_open(params.text_document.uri, params.text_document.text)

    renames = types.FileOperationRegistrationOptions(
        filters=[types.FileOperationFilter(pattern=types.FileOperationPattern(glob="**/*"))]
    )

    @server.feature(types.WORKSPACE_DID_RENAME_FILES, renames)
    def did_rename(ls: SquidServer, params: types.RenameFilesParams) -> None:
        if ls.feedback is not None:
            for rename in params.files:
                ls.feedback.on_rename(rename.old_uri, rename.new_uri)
                # Clients close the old name and open the new one around the rename, in either order.
                opened = ls.open_document_text(rename.new_uri)
                if opened is not None:
                    ls.feedback.on_open(rename.new_uri, opened[0])
