"""Bad input gets a clear error and loses nothing; the server keeps serving.

These tests start `python -m lsp_server serve` as a subprocess and talk raw, Content-Length framed
JSON-RPC to it, so they can send what no well-behaved LSP client library would: bodies that are
not JSON or not UTF-8, unknown methods, params of the wrong shape, positions past the end, a 20 MB
document. After each bad input the same server must still answer a valid request, and one server
serves the whole module, so every test also proves the ones before it did not break anything.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.e2e.raw_lsp import RawLspClient, end_position, start_client, utf16_len

pytestmark = pytest.mark.e2e

# Keeps completions cheap (a short prompt window, a few tokens) while still producing text.
FAST_OPTIONS = {"completion": {"max_tokens": 6, "prefix_tokens": 128, "debounce_ms": 0}}

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602

SMALL_TEXT = (
    "def add(a, b):\n"
    '    """Return the sum of a and b."""\n'
    "    return a + b\n"
    "\n"
    "\n"
    "def multiply(a, b):\n"
    '    """Return the product of a and b."""\n'
    "    return "
)


def inline_items(response: dict) -> list[dict]:
    assert "error" not in response, response
    result = response["result"]
    if result is None:
        return []
    return result["items"] if isinstance(result, dict) else result


def insert_text(item: dict) -> str:
    text = item["insertText"]
    return text if isinstance(text, str) else text["value"]


# -- one server for the module ---------------------------------------------------------------


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad-input-ws")
    (root / "small.py").write_text(SMALL_TEXT, encoding="utf-8")
    (root / "on_disk.py").write_text(SMALL_TEXT, encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def server(model_cache_dir, workspace, tmp_path_factory):
    client = start_client(tmp_path_factory.mktemp("bad-input-server"))
    try:
        result = client.initialize(root=workspace, options=FAST_OPTIONS)
        client.capabilities = result["capabilities"]
        client.small_uri = (workspace / "small.py").as_uri()
        client.open(client.small_uri, SMALL_TEXT)
        # Wait for the model: the first completion includes the load.
        response = client.inline_completion(client.small_uri, end_position(SMALL_TEXT), timeout=180)
        items = inline_items(response)
        assert items, f"no completion from a fresh server: {response}"
        # Greedy decoding: the same document and cursor give the same suggestion every time.
        client.baseline = insert_text(items[0])
        yield client
    finally:
        client.close()


def assert_still_serving(client: RawLspClient, *, with_model: bool = False) -> None:
    """The server still answers requests; `with_model`: a real, non-empty completion.

    Without the model it is a request that goes through the same dispatch and handler (for a
    document never opened, so the answer is null at once); model completions take seconds each
    on two cores, so only some tests ask for one.
    """
    assert client.proc.poll() is None, client.tail()
    if with_model:
        response = client.inline_completion(client.small_uri, end_position(SMALL_TEXT))
        items = inline_items(response)
        assert items and insert_text(items[0]).strip(), f"no completion after bad input: {response}"
        # The small document was not changed by anything bad: same text, same suggestion.
        assert insert_text(items[0]) == client.baseline, response
        return
    response = client.inline_completion("file:///squidcode-test/ping.py", {"line": 0, "character": 0})
    assert "error" not in response and response["result"] is None, response


def valid_request_body(client: RawLspClient) -> tuple[int, bytes]:
    msg_id = client.new_id()
    body = {
        "jsonrpc": "2.0",
        "id": msg_id,
        "method": "textDocument/inlineCompletion",
        "params": {
            "textDocument": {"uri": "file:///squidcode-test/ping.py"},
            "position": {"line": 0, "character": 0},
            "context": {"triggerKind": 1},
        },
    }
    return msg_id, json.dumps(body).encode()


# -- undecodable frames ----------------------------------------------------------------------


def test_body_that_is_not_json_gets_parse_error(server):
    before = len(server.null_id_responses)
    server.send(b'{"jsonrpc": "2.0", "id": 9001, "method": ')
    error = server.wait_null_id_response(before)
    # JSON-RPC 2.0: a parse error is answered with an explicit `"id": null`.
    assert error == {"jsonrpc": "2.0", "id": None, "error": error["error"]}
    assert error["error"]["code"] == PARSE_ERROR
    assert "Parse error" in error["error"]["message"]
    assert 9001 not in server.responses
    assert_still_serving(server, with_model=True)


def test_message_right_after_a_bad_frame_is_not_lost(server):
    """A bad frame and a good request in the same write: the good one is still answered."""
    before = len(server.null_id_responses)
    msg_id, good = valid_request_body(server)
    server.send_frames(b"}{ definitely not json", good)
    assert server.wait_null_id_response(before)["error"]["code"] == PARSE_ERROR
    response = server.wait_response(msg_id, timeout=30)
    assert "error" not in response and response["result"] is None, response


def test_body_with_invalid_utf8_gets_parse_error(server):
    before = len(server.null_id_responses)
    body = b'{"jsonrpc": "2.0", "id": 9002, "method": "shutdown", "x": "\xff\xfe\xc3("}'
    server.send(body)
    error = server.wait_null_id_response(before)
    assert error["id"] is None
    assert error["error"]["code"] == PARSE_ERROR
    # It was not taken for a shutdown request.
    assert 9002 not in server.responses
    assert_still_serving(server)


def test_invalid_utf8_followed_by_a_request_in_the_same_write(server):
    before = len(server.null_id_responses)
    msg_id, good = valid_request_body(server)
    server.send_frames(b'{"jsonrpc": "2.0", "method": "initialized", "params": {"\xc0\xaf": 1}}', good)
    assert server.wait_null_id_response(before)["error"]["code"] == PARSE_ERROR
    response = server.wait_response(msg_id, timeout=30)
    assert "error" not in response and response["result"] is None, response


def test_several_bad_frames_in_a_row_each_get_an_answer(server):
    before = len(server.null_id_responses)
    for body in (b"   ", b"not json at all", b"\x00\x01\x02", b"{]"):
        server.send(body)
    first = server.wait_null_id_response(before)
    server.wait_null_id_response(before + 3)
    codes = {e["error"]["code"] for e in server.null_id_responses[before:]}
    assert codes == {PARSE_ERROR}, server.null_id_responses[before:]
    assert first["id"] is None
    assert_still_serving(server)


# -- well-formed JSON that is not a valid request ----------------------------------------------


def test_unknown_method_gets_method_not_found(server):
    response = server.request("squidcode/noSuchMethod", {"x": 1}, timeout=30)
    assert response["error"]["code"] == METHOD_NOT_FOUND, response
    assert "result" not in response
    assert_still_serving(server)


def test_unknown_notification_is_ignored(server):
    before = len(server.null_id_responses)
    server.notify("squidcode/noSuchNotification", {"x": 1})
    server.notify("$/someClientExtension", {"x": 1})
    assert_still_serving(server)
    assert len(server.null_id_responses) == before


@pytest.mark.parametrize(
    "params",
    [
        pytest.param("POSITION_AS_STRING", id="position-as-string"),
        pytest.param("MISSING_POSITION", id="missing-position"),
        pytest.param("CHARACTER_AS_STRING", id="character-as-string"),
        pytest.param("NEGATIVE_LINE", id="negative-line"),
        pytest.param(None, id="no-params"),
        pytest.param([1, 2, 3], id="params-as-list"),
    ],
)
def test_wrong_params_shape_gets_error_with_request_id(server, params):
    good = {
        "textDocument": {"uri": server.small_uri},
        "position": {"line": 0, "character": 0},
        "context": {"triggerKind": 1},
    }
    if params == "POSITION_AS_STRING":
        params = {**good, "position": "line 1, column 2"}
    elif params == "MISSING_POSITION":
        params = {k: v for k, v in good.items() if k != "position"}
    elif params == "CHARACTER_AS_STRING":
        params = {**good, "position": {"line": 0, "character": "x"}}
    elif params == "NEGATIVE_LINE":
        params = {**good, "position": {"line": -5, "character": 0}}
    msg_id = server.new_id()
    message = {"jsonrpc": "2.0", "id": msg_id, "method": "textDocument/inlineCompletion"}
    if params is not None:
        message["params"] = params
    server.send(message)
    response = server.wait_response(msg_id, timeout=30)
    assert "error" in response, response
    assert response["error"]["code"] in (INVALID_PARAMS, INVALID_REQUEST), response
    assert response["error"]["message"]
    assert_still_serving(server)


def test_string_request_id_is_echoed_in_the_error(server):
    msg_id = "req-☃-1"
    server.send(
        {
            "jsonrpc": "2.0",
            "id": msg_id,
            "method": "textDocument/inlineCompletion",
            "params": {"textDocument": {"uri": server.small_uri}, "position": "nowhere"},
        }
    )
    response = server.wait_response(msg_id, timeout=30)
    assert response["error"]["code"] == INVALID_PARAMS, response


def test_malformed_notifications_change_nothing(server):
    """Notifications get no answer, even bad ones; a bad one must not alter an open document."""
    before_null = len(server.null_id_responses)
    before_ids = set(server.responses)
    uri = server.small_uri
    # contentChanges of the wrong shape, for an open document
    server.notify(
        "textDocument/didChange",
        {"textDocument": {"uri": uri, "version": 50}, "contentChanges": "delete everything"},
    )
    server.notify(
        "textDocument/didChange",
        {"textDocument": {"uri": uri, "version": 51}, "contentChanges": [{"range": "all", "text": ""}]},
    )
    # a change to a document that was never opened
    server.notify(
        "textDocument/didChange",
        {
            "textDocument": {"uri": "file:///squidcode-test/never.py", "version": 2},
            "contentChanges": [{"text": "x = 1\n"}],
        },
    )
    # didOpen without a document, didClose of an unknown one
    server.notify("textDocument/didOpen", {"textDocument": None})
    server.notify("textDocument/didClose", {"textDocument": {"uri": "file:///squidcode-test/nope.py"}})
    assert_still_serving(server, with_model=True)
    assert len(server.null_id_responses) == before_null
    # Only the liveness request was answered.
    assert len(set(server.responses) - before_ids) == 1


# -- positions out of range --------------------------------------------------------------------


def test_position_past_the_end_of_the_document(server):
    response = server.inline_completion(server.small_uri, {"line": 10_000, "character": 10_000})
    assert "error" not in response, response
    # Past the end clamps to the end of the document, where the function body is unfinished.
    items = inline_items(response)
    assert items and insert_text(items[0]).strip(), response
    assert_still_serving(server)


def test_position_past_the_end_of_a_line(server):
    # Line 2 is `    return a + b`; a column far past its end (the largest LSP uinteger) clamps to it.
    response = server.inline_completion(server.small_uri, {"line": 2, "character": 2**31 - 1})
    assert "error" not in response, response
    assert response["result"] is None or isinstance(response["result"], dict | list), response
    assert_still_serving(server)


# -- a huge document ---------------------------------------------------------------------------


def test_20mb_document_completes_in_bounded_time(server, workspace):
    line = "value_{:07d} = compute(value_{:07d}, step=3)  # keep going\n"
    count = 20 * 1024 * 1024 // len(line.format(0, 0)) + 1
    text = "".join(line.format(i, max(i - 1, 0)) for i in range(count)) + "def finish(total):\n    return "
    assert len(text) >= 20 * 1024 * 1024
    uri = (workspace / "huge.py").as_uri()
    started = time.monotonic()
    server.open(uri, text)
    response = server.inline_completion(uri, end_position(text), timeout=120)
    elapsed = time.monotonic() - started
    assert "error" not in response, response
    assert elapsed < 60, f"a completion at the end of a 20 MB document took {elapsed:.1f}s"
    # The prompt is a bounded window before the cursor, so the suggestion is a normal one.
    items = inline_items(response)
    assert items and insert_text(items[0]).strip(), response
    server.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    assert_still_serving(server)


# -- non-ASCII text with incremental edits -------------------------------------------------------


def test_incremental_edits_with_utf16_columns(server, workspace):
    # pygls negotiates incremental sync; the edits below rely on it.
    sync = server.capabilities["textDocumentSync"]
    change_kind = sync["change"] if isinstance(sync, dict) else sync
    assert change_kind == 2, sync

    # A space and non-ASCII letters in the path: the URI arrives percent-encoded, as from VS Code.
    uri = (workspace / "ünï cödé 猫.py").as_uri()
    assert "%20" in uri and "%E7%8C%AB" in uri
    text = 'mood = "😀"\n'
    server.open(uri, text)

    def change(version: int, line: int, start: int, end: int, new_text: str) -> None:
        server.notify(
            "textDocument/didChange",
            {
                "textDocument": {"uri": uri, "version": version},
                "contentChanges": [
                    {
                        "range": {
                            "start": {"line": line, "character": start},
                            "end": {"line": line, "character": end},
                        },
                        "text": new_text,
                    }
                ],
            },
        )

    # Columns are UTF-16 code units: 😀 and 🐍 take two each, 猫 and 犬 one.
    after_grin = utf16_len('mood = "😀')  # 10
    change(2, 0, after_grin, after_grin, "猫🐍")  # mood = "😀猫🐍"
    change(3, 0, after_grin, after_grin + 1, "犬")  # mood = "😀犬🐍"
    change(4, 1, 0, 0, 'pets = ["🐍", "犬"]\nname_犬 = pets[1]\nprint("🐍", name_')
    # Complete the word `name_` to `name_犬`: an insertion at a UTF-16 column after an emoji.
    last_line = 'print("🐍", name_'
    change(5, 3, utf16_len(last_line), utf16_len(last_line), "犬")
    expected = 'mood = "😀犬🐍"\npets = ["🐍", "犬"]\nname_犬 = pets[1]\nprint("🐍", name_犬'

    # textDocument/completion replaces the word before the cursor, so its edit shows exactly the
    # word the server sees there and the UTF-16 column where the server thinks it starts.
    cursor = end_position(expected)
    assert cursor == {"line": 3, "character": utf16_len('print("🐍", name_犬')}
    response = server.request(
        "textDocument/completion",
        {"textDocument": {"uri": uri}, "position": cursor, "context": {"triggerKind": 1}},
        timeout=60,
    )
    assert "error" not in response, response
    result = response["result"]
    assert result is not None, "no completion for the edited unicode document"
    edit = result["items"][0]["textEdit"]
    assert edit["newText"].startswith("name_犬"), edit
    assert edit["range"]["start"] == {"line": 3, "character": utf16_len('print("🐍", ')}
    assert edit["range"]["end"] == cursor

    # A cursor right after an emoji on line 0: the word before it is `犬` only if the server
    # counted 😀 as two UTF-16 units and applied the edits where they were meant.
    after_dog = {"line": 0, "character": utf16_len('mood = "😀犬')}
    response = server.request(
        "textDocument/completion",
        {"textDocument": {"uri": uri}, "position": after_dog, "context": {"triggerKind": 1}},
        timeout=60,
    )
    assert "error" not in response, response
    assert response["result"] is not None, "no completion right after the emoji"
    edit = response["result"]["items"][0]["textEdit"]
    assert edit["newText"].startswith("犬"), edit
    assert edit["range"]["start"] == {"line": 0, "character": utf16_len('mood = "😀')}

    response = server.inline_completion(uri, cursor)
    items = inline_items(response)
    assert items and insert_text(items[0]).strip(), response
    assert items[0]["range"]["start"] == cursor
    assert_still_serving(server)


# -- documents the client never opened ---------------------------------------------------------


def test_never_opened_document_gets_null(server, workspace):
    uri = (workspace / "never-opened.py").as_uri()
    response = server.inline_completion(uri, {"line": 0, "character": 0}, timeout=30)
    assert response == {"jsonrpc": "2.0", "id": response["id"], "result": None}
    response = server.request(
        "textDocument/completion",
        {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 0}},
        timeout=30,
    )
    assert "error" not in response and response["result"] is None, response
    # A file that exists on disk but was never opened is not read from disk either.
    response = server.inline_completion(
        (workspace / "on_disk.py").as_uri(), end_position(SMALL_TEXT), timeout=30
    )
    assert response["result"] is None, response
    assert_still_serving(server)


def test_closed_document_gets_null(server, workspace):
    uri = (workspace / "closed.py").as_uri()
    server.open(uri, SMALL_TEXT)
    server.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    response = server.inline_completion(uri, end_position(SMALL_TEXT), timeout=30)
    assert "error" not in response and response["result"] is None, response
    assert_still_serving(server)


def test_server_wrote_only_valid_frames(server):
    """Nothing but framed JSON reached stdout (no stray prints, no progress bars), and after
    everything above the server still completes code."""
    assert server.unparsable == []
    assert_still_serving(server, with_model=True)
    # Bad input was never reported to the user as a server error.
    errors = [
        n for n in server.notifications if n["method"] == "window/showMessage" and n["params"]["type"] == 1
    ]
    assert errors == [], errors


def test_the_server_log_holds_no_protocol_traffic_or_document_text(server):
    # At the default log level the server's stderr (which editors show, often as errors) carries
    # its own messages only: pygls's per-message INFO lines would copy every document into it.
    assert_still_serving(server)
    log = server.stderr_path.read_text(encoding="utf-8", errors="replace")
    assert "Sending data" not in log and "Received" not in log
    assert SMALL_TEXT.splitlines()[0] not in log
