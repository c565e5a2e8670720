"""`squidcode demo`: squidcode's main job end to end, as an editor would see it.

Starts `squidcode serve` as a subprocess, connects a real LSP client (pygls), opens the bundled
example workspace, requests inline completions at the end of an unfinished function, and prints
each with its latency: the first includes the model load, the second is warm. Then, in a second
session on the bundled agent example (`demo_agent/`: `full_name` repeats the first name, and
`test_names.py` fails), it asks the agent (`squidcode.agent.run`) for a fix and prints the edit it
chose, verified by that test and not applied to the files.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from pathlib import Path

from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.lsp.client import LanguageClient

__all__ = [
    "run_demo", "server_command", "start_server", "agent_outcome", "describe_agent", "DEMO_WORKSPACE",
    "DEMO_FILE",
]

DEMO_WORKSPACE = Path(__file__).parent / "demo_workspace"
DEMO_FILE = DEMO_WORKSPACE / "inventory.py"
AGENT_WORKSPACE = Path(__file__).parent / "demo_agent"
AGENT_FILE = AGENT_WORKSPACE / "names.py"
AGENT_INSTRUCTION = "full_name repeats the first name: test_full_name fails. Fix it."
AGENT_K = 2


# Why an episode ended (`agent.episode.AgentResult.stop_reason`), in words.
STOP_REASONS = {
    "verified": "a candidate passed its checks",
    "unverified": "the step budget (agent.max_steps) ran out",
    "done": "the model said it was done",
    "step_budget": "the step budget (agent.max_steps) ran out",
    "token_budget": "the token budget (agent.token_budget) ran out",
    "unparsable": "the model's answers could not be parsed, too many times in a row (agent.reprompts)",
    "backend_error": "the model backend failed",
}


def agent_outcome(answer: dict | None, seconds: float, error: str | None = None) -> dict:
    """What one `squidcode.agent.run` answer says happened. `outcome`: "verified" (a chosen edit,
    in `diff`), "unverified" (edits, none passed its checks: `failed_checks`), "no edit", or
    "error" (the request failed: `why`); `why` is the episode's `stop_reason` in words; `unparsed`
    holds the model's raw answers that could not be parsed."""
    answer = answer if isinstance(answer, dict) else {}
    candidates = answer.get("candidates") or []
    steps = answer.get("steps") or []
    stop = answer.get("stop_reason") or ""
    diff = (answer.get("diff") or "") if answer.get("chosen") is not None else ""
    if error is not None:
        outcome, why = "error", error
    else:
        outcome = "verified" if diff else "unverified" if candidates else "no edit"
        why = STOP_REASONS.get(stop, stop or "the server gave no reason")
        if answer.get("error"):
            why += f": {answer['error']}"
    return {
        "outcome": outcome, "stop_reason": stop, "why": why, "seconds": round(seconds, 1),
        "steps": [f"{s.get('tool')}{'' if s.get('ok') else ' (failed)'}" for s in steps],
        "candidates": len(candidates), "verified": sum(1 for c in candidates if c.get("verified")),
        "failed_checks": sorted({name for c in candidates for name, ok in (c.get("checks") or {}).items()
                                 if ok is False}),
        "chosen": answer.get("chosen"), "diff": diff,
        "unparsed": [s["answer"] for s in steps if s.get("answer")],
    }


def describe_agent(outcome: dict, applied: str) -> str:
    """One line for `outcome` (`agent_outcome`), then the diff when there is one; `applied` says
    what became of the edit ("applied and recorded", "not applied", ...), said only of a verified one."""
    took = f"in {outcome['seconds']} s"
    stopped = f"stopped: {outcome['stop_reason'] or '?'}, {outcome['why']}"
    if outcome["outcome"] == "verified":
        return f"verified edit {took}, {applied}\n{outcome['diff'].rstrip()}"
    if outcome["outcome"] == "unverified":
        failed = ", ".join(outcome["failed_checks"]) or "none recorded"
        return (f"unverified edit {took}, not applied: none of {outcome['candidates']} candidates passed "
                f"its checks (failed: {failed}); {stopped}")
    if outcome["outcome"] == "error":
        return f"no edit {took}: the request failed: {outcome['why']}"
    return f"no edit {took}; {stopped}"


def server_command() -> list[str]:
    """`squidcode serve` from the running environment, falling back to `python -m lsp_server`."""
    script = shutil.which("squidcode", path=str(Path(sys.executable).parent))
    if script:
        return [script, "serve"]
    return [sys.executable, "-m", "lsp_server", "serve"]


async def start_server(client: LanguageClient, log_path: Path | None = None) -> None:
    """`squidcode serve` under `client`, its stderr drained (into `log_path`, or dropped).

    pygls pipes the server's stderr and never reads it: a server that logs 64 KiB there would
    block on its next log line, in the middle of a request.
    """
    await client.start_io(*server_command())
    stream = client._server.stderr

    async def drain() -> None:
        sink = open(log_path, "ab") if log_path is not None else None  # noqa: SIM115 - closed below
        try:
            while chunk := await stream.read(65536):
                if sink is not None:
                    sink.write(chunk)
        finally:
            if sink is not None:
                sink.close()

    client._stderr_drain = asyncio.ensure_future(drain())


def _demo_client(progress: list[str]) -> LanguageClient:
    client = LanguageClient("squidcode-demo", "1")

    @client.feature(types.WINDOW_WORK_DONE_PROGRESS_CREATE)
    def on_progress_create(params: types.WorkDoneProgressCreateParams) -> None:
        return None

    @client.feature(types.PROGRESS)
    def on_progress(params: types.ProgressParams) -> None:
        value = params.value
        kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", "")
        title = value.get("title") or value.get("message") if isinstance(value, dict) else ""
        progress.append(f"{kind}: {title}")

    @client.feature("squidcode/indexStatus")
    def on_index_status(params) -> None:
        state = getattr(params, "state", "?")
        progress.append(f"index {state}: {getattr(params, 'files', 0)} files, "
                        f"{getattr(params, 'symbols', 0)} symbols")

    @client.feature("squidcode/status")
    def on_status(params) -> None:
        return None  # the demo prints the index and progress lines above instead

    @client.feature(types.WINDOW_LOG_MESSAGE)
    def on_log(params: types.LogMessageParams) -> None:
        return None

    @client.feature(types.WINDOW_SHOW_MESSAGE)
    def on_show(params: types.ShowMessageParams) -> None:
        print(f"[server] {params.message}", file=sys.stderr)

    return client


async def _run() -> dict:
    text = DEMO_FILE.read_text(encoding="utf-8")
    lines = text.split("\n")
    # The cursor goes at the end of the unfinished function's (indented, empty) last line.
    cursor = types.Position(line=len(lines) - 2, character=len(lines[-2]))
    uri = DEMO_FILE.as_uri()
    progress: list[str] = []
    client = _demo_client(progress)
    started = time.perf_counter()
    await start_server(client)
    try:
        await client.initialize_async(
            types.InitializeParams(
                process_id=None,
                root_uri=DEMO_WORKSPACE.as_uri(),
                workspace_folders=[types.WorkspaceFolder(uri=DEMO_WORKSPACE.as_uri(), name="demo")],
                capabilities=types.ClientCapabilities(
                    window=types.WindowClientCapabilities(work_done_progress=True)
                ),
            )
        )
        client.initialized(types.InitializedParams())
        initialized_s = time.perf_counter() - started
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
            )
        )
        runs = []
        for label in ("first (includes model load)", "warm"):
            t0 = time.perf_counter()
            result = await client.text_document_inline_completion_async(
                types.InlineCompletionParams(
                    text_document=types.TextDocumentIdentifier(uri=uri),
                    position=cursor,
                    context=types.InlineCompletionContext(
                        trigger_kind=types.InlineCompletionTriggerKind.Invoked
                    ),
                )
            )
            items = result.items if isinstance(result, types.InlineCompletionList) else (result or [])
            insert = items[0].insert_text if items else None
            runs.append({"label": label, "latency_s": round(time.perf_counter() - t0, 3),
                         "text": insert if isinstance(insert, str) else getattr(insert, "value", None)})
        await client.shutdown_async(None)
        client.exit(None)
    finally:
        await client.stop()
    agent = await _agent_session()
    return {
        "file": str(DEMO_FILE),
        "cursor": {"line": cursor.line, "character": cursor.character},
        "initialized_s": round(initialized_s, 3),
        "progress": progress,
        "completions": runs,
        "agent": agent,
    }


async def _agent_session() -> dict:
    """A second session, on the agent example: one episode; the edit is returned, not applied."""
    client = _demo_client([])
    await start_server(client)
    try:
        await client.initialize_async(types.InitializeParams(
            process_id=None,
            root_uri=AGENT_WORKSPACE.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=AGENT_WORKSPACE.as_uri(), name="demo-agent")],
            capabilities=types.ClientCapabilities(),
        ))
        client.initialized(types.InitializedParams())
        report = await _agent_edit(client)
        await client.shutdown_async(None)
        client.exit(None)
    finally:
        await client.stop()
    return report


async def _agent_edit(client: LanguageClient) -> dict:
    t0 = time.perf_counter()
    try:
        result = await client.workspace_execute_command_async(types.ExecuteCommandParams(
            command="squidcode.agent.run",
            arguments=[{"instruction": AGENT_INSTRUCTION, "uri": AGENT_FILE.as_uri(), "k": AGENT_K}],
        ))
    except JsonRpcException as exc:
        outcome = agent_outcome(None, time.perf_counter() - t0, str(exc))
        return {"instruction": AGENT_INSTRUCTION, **outcome, "error": str(exc)}
    return {"instruction": AGENT_INSTRUCTION, **agent_outcome(result, time.perf_counter() - t0)}


def run_demo(as_json: bool = False) -> int:
    report = asyncio.run(_run())
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print(f"squidcode demo: {report['file']} at line {report['cursor']['line'] + 1}")
        print(f"server initialized in {report['initialized_s']:.2f}s; progress: {report['progress']}")
        for run in report["completions"]:
            print(f"\n--- inline completion, {run['label']}: {run['latency_s'] * 1000:.0f} ms ---")
            print(run["text"] if run["text"] else "(no completion)")
        agent = report["agent"]
        print(f"\n--- agent: \"{agent['instruction']}\" ---")
        if agent["steps"]:
            print(f"steps: {', '.join(agent['steps'])}")
        print(describe_agent(agent, "not applied (the demo leaves the files as they are)"))
    completed = all(run["text"] for run in report["completions"])
    return 0 if completed and report["agent"].get("diff") else 1
