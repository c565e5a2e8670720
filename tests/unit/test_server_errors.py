"""Errors the server reports about itself: a client stream that is gone must not make it recurse.

After `exit` (or a crashed editor) the output stream is closed. pygls reports a failed send as a
server error, which LanguageServer reports by sending a message to the client, which fails again:
without a guard that recursed until Python's stack ran out, logging a traceback at every level
(seconds of CPU on every exit).
"""

from __future__ import annotations

import io
import time

from lsprotocol import types

from lsp_server import create_server


def test_sending_on_a_closed_stream_is_reported_once_not_recursively(caplog):
    server = create_server()
    stream = io.BytesIO()
    server.protocol.set_writer(stream)
    stream.close()
    started = time.perf_counter()
    server.protocol.notify(types.WINDOW_LOG_MESSAGE,
                           types.LogMessageParams(type=types.MessageType.Info, message="bye"))
    assert time.perf_counter() - started < 1.0
    failures = [r for r in caplog.records if "Error sending data" in r.getMessage()]
    # One failure for the notification, and one when LanguageServer tries to show that failure
    # to the client; the guard stops there (without it, hundreds, one per stack level).
    assert 1 <= len(failures) <= 2, len(failures)
    assert not any("maximum recursion" in r.getMessage() for r in caplog.records)


def test_a_server_error_is_still_shown_to_a_connected_client():
    server = create_server()
    stream = io.BytesIO()
    server.protocol.set_writer(stream)
    server.report_server_error(RuntimeError("index thread died"), types.WINDOW_SHOW_MESSAGE)
    assert b"index thread died" in stream.getvalue()
    assert not server._reporting_error
