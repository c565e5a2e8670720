"""The server side of feedback without a client: LSP change conversion, listener isolation, and
the episode-reading API the trainer calls."""

from __future__ import annotations

import logging

from lsprotocol import types

import feedback
from context.config import FeedbackConfig
from feedback.recorder import FeedbackRecorder
from lsp_server.features.edit_tracking import to_text_changes
from lsp_server.features.feedback_commands import accept_command
from lsp_server.server import SquidServer


def test_lsp_changes_become_tracker_changes():
    params = types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri="file:///a.py", version=2),
        content_changes=[
            types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(1, 2), end=types.Position(3, 4)), text="x"
            ),
            types.TextDocumentContentChangeWholeDocument(text="all"),
        ],
    )
    first, second = to_text_changes(params)
    assert (first.start, first.end, first.text) == ((1, 2), (3, 4), "x")
    assert (second.start, second.end, second.text) == (None, None, "all")


def test_accept_command_shape():
    command = accept_command("abc", "text")
    assert command.command == "squidcode.completion.accept"
    assert command.arguments == [{"episodeId": "abc"}]
    assert accept_command(None, "text").arguments == [{"episodeId": ""}]


def test_a_failing_document_listener_is_logged_and_the_others_still_run(caplog):
    server = SquidServer("test")
    seen = []

    def broken(method, params):
        raise RuntimeError("plugin bug")

    server.document_listeners[:] = [broken, lambda method, params: seen.append(method)]
    with caplog.at_level(logging.ERROR):
        server.notify_document_listeners(types.TEXT_DOCUMENT_DID_CHANGE, None)
    assert seen == [types.TEXT_DOCUMENT_DID_CHANGE]
    assert "plugin bug" in caplog.text


def test_episodes_with_outcomes_reads_what_the_recorder_wrote(tmp_path):
    recorder = FeedbackRecorder(FeedbackConfig(), db_path=tmp_path / "f.db")
    episode_id = recorder.record_agent_episode(
        "add a docstring",
        "m",
        None,
        [],
        [{"diff": "+'''Doc.'''", "verified": True, "checks": {}, "logprob": -1.0}],
        0,
        "prompt",
    )
    recorder.close()
    (item,) = feedback.episodes_with_outcomes(tmp_path / "f.db")
    assert item.episode["id"] == episode_id and item.episode["candidates"][0]["verified"] is True
    assert item.episode["instruction"] == "add a docstring" and item.outcomes == []
