"""The agent over LSP: `squidcode.agent.run`, its code actions, `$/progress`, `workspace/applyEdit`,
cancellation and bad input, against the server as a subprocess.

Two backends: a loopback OpenAI-compatible server double whose answers are scripted (so the edit,
the progress and the applied WorkspaceEdit are known exactly), and the real embedded model (so the
whole path runs with it; what a 135M model proposes is not asserted, only that it is reported)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Union

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from tests.conftest import SERVER_CMD
from tests.unit.agent.conftest import CALC, TEST_CALC
from tests.unit.agent.doubles import FakeOpenAIServer, chat_completion

pytestmark = pytest.mark.e2e

AGENT_RUN = "squidcode.agent.run"
EDIT = [
    {
        "id": "c1",
        "type": "function",
        "function": {
            "name": "edit",
            "arguments": json.dumps(
                {"path": "calc.py", "blocks": [{"search": "    return a - b", "replace": "    return a + b"}]}
            ),
        },
    }
]
READ = [
    {"id": "c0", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "calc.py"}'}}
]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "calc.py").write_text(CALC)
    (root / "test_calc.py").write_text(TEST_CALC)
    return root


@pytest.fixture
def fake_openai():
    with FakeOpenAIServer(
        [chat_completion("", tool_calls=READ), chat_completion("", tool_calls=EDIT)]
    ) as server:
        yield server


def _code_action_or_command(converter):
    """lsprotocol structures any object with a "command" key as a Command, so a CodeAction that carries
    one loses its kind and title on the client side; editors read the JSON correctly. Tell them apart
    by the type of "command" (a string in a Command, an object in a CodeAction)."""

    def hook(obj, _type):
        kind = types.Command if isinstance(obj.get("command"), str) else types.CodeAction
        return converter.structure(obj, kind)

    converter.register_structure_hook(Union[types.Command, types.CodeAction], hook)  # noqa: UP007


async def start(client: LanguageClient, project: Path, agent: dict, model: dict | None = None,
                feedback: dict | None = None) -> None:
    client.applied_edits = []
    _code_action_or_command(client.protocol._converter)

    @client.feature(types.WORKSPACE_APPLY_EDIT)
    def apply_edit(params: types.ApplyWorkspaceEditParams):
        client.applied_edits.append(params)
        return types.ApplyWorkspaceEditResult(applied=True)

    client.initialize_result = await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities("visual-studio-code"),
            root_uri=project.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=project.as_uri(), name="proj")],
            initialization_options={"agent": agent, "index": {"enabled": False}, "model": model or {},
                                    "feedback": feedback or {}},
        )
    )


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER_CMD))
async def scripted(lsp_client: LanguageClient, project: Path, fake_openai, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    await start(
        lsp_client,
        project,
        {
            "backend": "openai",
            "model": "m",
            "base_url": fake_openai.base_url,
            "api_key_env": "",
            "retries": 0,
        },
    )
    lsp_client.fake = fake_openai
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER_CMD))
async def tracked(lsp_client: LanguageClient, project: Path, fake_openai, tmp_path):
    """The scripted agent, with feedback checkpoints a fraction of a second apart."""
    await start(
        lsp_client,
        project,
        {"backend": "openai", "model": "m", "base_url": fake_openai.base_url, "api_key_env": "",
         "retries": 0},
        feedback={"db_path": str(tmp_path / "feedback.db"), "checkpoints_s": [0.3, 0.6]},
    )
    lsp_client.db_path = tmp_path / "feedback.db"
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER_CMD))
async def local(lsp_client: LanguageClient, project: Path, model_cache_dir):
    # Small budgets: one step of 16 tokens keeps this test short on a loaded two-core machine.
    await start(
        lsp_client,
        project,
        {"max_steps": 1, "max_step_tokens": 16, "pretest": False, "k": 1, "context_tokens": 100},
        # One torch thread: on a busy two-core machine two threads spin against each other (8x slower).
        model={"threads": 1},
    )
    yield
    await lsp_client.shutdown_session()


def open_calc(client: LanguageClient, project: Path) -> str:
    uri = (project / "calc.py").as_uri()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=CALC)
        )
    )
    return uri


def run_params(arguments: dict) -> types.ExecuteCommandParams:
    return types.ExecuteCommandParams(command=AGENT_RUN, arguments=[arguments])


async def test_capabilities_and_code_actions(scripted: LanguageClient, project: Path):
    caps = scripted.initialize_result.capabilities
    assert AGENT_RUN in caps.execute_command_provider.commands
    assert caps.code_action_provider is not None
    uri = open_calc(scripted, project)
    diagnostic = types.Diagnostic(
        range=types.Range(
            start=types.Position(line=4, character=4), end=types.Position(line=4, character=16)
        ),
        message="add() subtracts",
        source="pytest",
    )
    selection = types.Range(
        start=types.Position(line=3, character=0), end=types.Position(line=5, character=0)
    )
    actions = await scripted.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=selection,
            context=types.CodeActionContext(diagnostics=[diagnostic]),
        )
    )
    assert [a.title for a in actions] == ["squidcode: fix this", "squidcode: ask…"]
    fix, ask = actions
    assert fix.kind == types.CodeActionKind.QuickFix and fix.command.command == AGENT_RUN
    [arguments] = fix.command.arguments
    assert arguments["uri"] == uri and "add() subtracts" in arguments["instruction"]
    assert arguments["range"]["start"] == {"line": 4, "character": 4}
    assert ask.command.arguments[0]["range"]["end"] == {"line": 5, "character": 0}
    empty = await scripted.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(start=selection.start, end=selection.start),
            context=types.CodeActionContext(diagnostics=[]),
        )
    )
    assert not empty


async def _stored_episode(db: str, episode_id: str, timeout_s: float = 20.0):
    """The episode as the feedback store holds it, once the recorder's writer has committed it."""
    from feedback.store import FeedbackStore

    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        if Path(db).exists():
            store = FeedbackStore(db, readonly=True)
            try:
                found = [e for e in store.episodes_with_outcomes() if e.episode["id"] == episode_id]
            finally:
                store.close()
            if found and found[0].events:
                return found[0]
        assert asyncio.get_running_loop().time() < deadline, f"episode {episode_id} never reached {db}"
        await asyncio.sleep(0.2)


async def test_run_with_progress_and_apply(scripted: LanguageClient, project: Path):
    uri = open_calc(scripted, project)
    token = "agent-progress-1"
    scripted.progress_reports[token] = []  # a client-initiated token: the client knows it already
    result = await scripted.workspace_execute_command_async(
        run_params(
            {"instruction": "add() subtracts; fix it", "uri": uri, "apply": True, "workDoneToken": token}
        )
    )
    assert set(result) == {
        "episodeId", "diff", "edit", "steps", "candidates", "chosen", "stop_reason", "error"
    }
    assert [s["tool"] for s in result["steps"]] == ["run_tests", "read_file", "edit"]
    assert result["chosen"] == 0 and result["candidates"][0]["verified"] is True
    assert result["candidates"][0]["checks"]["tests"] is True
    [text_edit] = result["edit"]["changes"][uri]
    assert text_edit == {
        "range": {"start": {"line": 4, "character": 0}, "end": {"line": 5, "character": 0}},
        "newText": "    return a + b\n",
    }
    [applied] = scripted.applied_edits
    assert applied.edit.changes[uri][0].new_text == "    return a + b\n"
    reports = [r for r in scripted.progress_reports[token]]
    assert reports[0].kind == "begin" and reports[-1].kind == "end"
    assert [r.message for r in reports if r.kind == "report"] == [
        "1. run_tests: ok",
        "2. read_file: ok",
        "3. edit: ok",
    ]
    assert "return a - b" in (project / "calc.py").read_text()  # the server never writes files itself
    # The episode, its candidates with their checks, and the applied edit reach the feedback store.
    status = await scripted.workspace_execute_command_async(
        types.ExecuteCommandParams(command="squidcode.feedback.status", arguments=[{}])
    )
    episode = await _stored_episode(status["db"], result["episodeId"])
    assert episode.episode["kind"] == "agent" and episode.episode["chosen"] == 0
    assert episode.episode["candidates"][0]["checks"]["tests"] is True
    assert episode.episode["extra"]["original"] == CALC
    assert [e["kind"] for e in episode.events if e["kind"] == "applied"] == ["applied"]
    # The model was shown the open buffer and the tool list as native tools.
    first = scripted.fake.requests[0]
    assert first["tools"] and "return a - b" in first["messages"][0]["content"]


async def test_bad_arguments_get_errors_and_the_server_keeps_serving(scripted: LanguageClient, project: Path):
    uri = open_calc(scripted, project)
    bad = [
        {"uri": uri},
        {"instruction": "x", "uri": "http://example.com/a.py"},
        {"instruction": "x", "uri": uri, "k": 99},
        {"instruction": "x", "uri": uri, "range": {"start": 1}},
        {"instruction": "x", "uri": (project / "missing.py").as_uri()},
    ]
    for arguments in bad:
        with pytest.raises(Exception) as raised:
            await scripted.workspace_execute_command_async(run_params(arguments))
        assert "squidcode" in str(raised.value) or AGENT_RUN in str(raised.value)
    with pytest.raises(Exception, match="takes one object"):
        await scripted.workspace_execute_command_async(
            types.ExecuteCommandParams(command=AGENT_RUN, arguments=[1, 2])
        )
    result = await scripted.workspace_execute_command_async(
        run_params({"instruction": "fix add", "uri": uri})
    )
    assert result["chosen"] == 0


async def test_the_real_model_runs_the_whole_path(local: LanguageClient, project: Path):
    uri = open_calc(local, project)
    result = await asyncio.wait_for(
        local.workspace_execute_command_async(
            run_params(
                {
                    "instruction": "add() subtracts instead of adding; fix it",
                    "uri": uri,
                    "range": {"start": {"line": 3, "character": 0}, "end": {"line": 5, "character": 0}},
                }
            )
        ),
        timeout=250,
    )
    assert set(result) == {
        "episodeId", "diff", "edit", "steps", "candidates", "chosen", "stop_reason", "error"
    }
    # The id the feedback store records the episode under (recording is on in test servers).
    assert len(result["episodeId"]) == 32 and result["steps"]
    for candidate in result["candidates"]:
        checks = candidate["checks"]
        assert candidate["verified"] == bool(checks["lint"] and checks["tests"] is not False)
    if result["chosen"] is None:
        assert result["edit"] is None and result["diff"] == ""
    else:
        assert result["edit"]["changes"][uri] and result["diff"].startswith("--- a/calc.py")


async def test_cancel_stops_an_episode_and_the_server_answers_after(local: LanguageClient, project: Path):
    uri = open_calc(local, project)
    local.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(
            settings={"squidcode": {"agent": {"max_steps": 20, "max_step_tokens": 400, "pretest": False}}}
        )
    )
    msg_id = str(uuid.uuid4())
    future = local.protocol.send_request(
        types.WORKSPACE_EXECUTE_COMMAND,
        run_params({"instruction": "rewrite everything", "uri": uri}),
        msg_id=msg_id,
    )
    await asyncio.sleep(3.0)
    local.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))
    with pytest.raises(Exception) as raised:
        await asyncio.wait_for(asyncio.wrap_future(future), timeout=60)
    assert "cancel" in str(raised.value).lower()
    actions = await local.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(
                start=types.Position(line=0, character=0), end=types.Position(line=1, character=0)
            ),
            context=types.CodeActionContext(diagnostics=[]),
        )
    )
    assert [a.title for a in actions] == ["squidcode: ask…"]


async def test_an_edit_the_client_applies_is_tracked_and_its_revert_is_remembered(
    tracked: LanguageClient, project: Path
):
    """The client applies the returned edit itself and says so (`squidcode.agent.applied`); the user
    then undoes it: the outcome is "reverted", and the agent's memory gains a note not to do it again."""
    from agent.memory import MemoryStore, default_memory_path
    from context.config import default_cache_dir
    from feedback.store import FeedbackStore

    uri = open_calc(tracked, project)
    result = await tracked.workspace_execute_command_async(
        run_params({"instruction": "add() subtracts; fix it", "uri": uri})
    )
    assert tracked.applied_edits == []  # apply was not asked for: the client applies it
    [text_edit] = result["edit"]["changes"][uri]
    unknown = await tracked.workspace_execute_command_async(
        types.ExecuteCommandParams(command="squidcode.agent.applied", arguments=[{"episodeId": "nope"}])
    )
    assert unknown == {"tracked": False}

    def change(version: int, start: int, end: int, text: str) -> None:
        rng = types.Range(start=types.Position(start, 0), end=types.Position(end, 0))
        tracked.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangePartial(range=rng, text=text)],
        ))

    change(2, 4, 5, text_edit["newText"])  # the client applies the edit...
    answer = await tracked.workspace_execute_command_async(
        types.ExecuteCommandParams(command="squidcode.agent.applied",
                                   arguments=[{"episodeId": result["episodeId"]}])
    )
    assert answer == {"tracked": True}
    change(3, 4, 5, "    return a - b\n")  # ...and the user undoes it
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        statuses = []
        if tracked.db_path.exists():
            store = FeedbackStore(tracked.db_path, readonly=True)
            try:
                for item in store.episodes_with_outcomes():
                    if item.episode["id"] == result["episodeId"]:
                        statuses = [o["status"] for o in item.outcomes]
            finally:
                store.close()
        if len(statuses) >= 2:
            break
        assert asyncio.get_running_loop().time() < deadline, f"outcomes so far: {statuses}"
        await asyncio.sleep(0.2)
    assert statuses == ["reverted", "reverted"]
    memory = MemoryStore(default_memory_path(default_cache_dir()), str(project.resolve()))
    try:
        notes = [n for n in memory.notes() if n.kind == "revert"]
    finally:
        memory.close()
    assert len(notes) == 1 and "calc.py" in notes[0].body and "return a + b" in notes[0].body, notes
