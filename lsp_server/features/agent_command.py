"""`squidcode.agent.run`: the agent's episode as a command, with `$/progress` per step and cancellation.

Arguments (one object): {instruction, uri, range?, k?, apply?, workDoneToken?}. The answer is
{episodeId, diff, edit (WorkspaceEdit or null), steps, candidates, chosen}; with `apply: true` the
server also sends `workspace/applyEdit` itself. The episode runs on its own worker thread, so
completions keep being served between its model calls. `$/cancelRequest` and
`window/workDoneProgress/cancel` both stop it before its next step or token.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from lsprotocol import types
from lsprotocol.converters import get_converter
from pygls.exceptions import (
    JsonRpcInternalError,
    JsonRpcInvalidParams,
    JsonRpcInvalidRequest,
    JsonRpcRequestCancelled,
)
from pygls.uris import to_fs_path

from agent.episode import AgentResult, StepRecord
from agent.errors import AgentCancelled
from agent.loop import AgentLoop, AgentRequest
from agent.overlay import FileChange
from agent.sandbox import Workspace
from agent.session import make_backend, open_memory, squid_settings, with_overrides
from context.errors import SquidcodeError

from ..agent_feedback import (
    agent_edit_applied,
    record_agent_result,
    remember_returned_edit,
    track_applied_agent_edit,
)
from ..connection import post_to_loop
from ..server import SquidServer

__all__ = [
    "AGENT_APPLIED", "AGENT_RUN", "register", "parse_arguments", "to_lsp_workspace_edit", "to_lsp_result",
]

log = logging.getLogger(__name__)

AGENT_RUN = "squidcode.agent.run"
AGENT_APPLIED = "squidcode.agent.applied"


def parse_arguments(args: tuple) -> dict[str, Any]:
    """The command's argument object, validated; JsonRpcInvalidParams says what is wrong."""
    if len(args) != 1 or not isinstance(args[0], dict):
        raise JsonRpcInvalidParams(f"{AGENT_RUN} takes one object {{instruction, uri, range?, k?, apply?}}")
    raw = args[0]
    instruction, uri = raw.get("instruction"), raw.get("uri")
    if not isinstance(instruction, str) or not instruction.strip():
        raise JsonRpcInvalidParams(f"{AGENT_RUN}: 'instruction' must be a non-empty string")
    if not isinstance(uri, str) or not uri.startswith("file:"):
        raise JsonRpcInvalidParams(f"{AGENT_RUN}: 'uri' must be a file: URI")
    k = raw.get("k")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 16):
        raise JsonRpcInvalidParams(f"{AGENT_RUN}: 'k' must be an integer from 1 to 16")
    if not isinstance(raw.get("apply", False), bool):
        raise JsonRpcInvalidParams(f"{AGENT_RUN}: 'apply' must be true or false")
    token = raw.get("workDoneToken")
    if token is not None and not isinstance(token, str | int):
        raise JsonRpcInvalidParams(f"{AGENT_RUN}: 'workDoneToken' must be a string or an integer")
    return {
        "instruction": instruction,
        "uri": uri,
        "range": _line_range(raw.get("range")),
        "k": k,
        "apply": raw.get("apply", False),
        "token": token,
    }


def _line_range(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        start, end = int(value["start"]["line"]), int(value["end"]["line"])
    except (KeyError, TypeError, ValueError):
        raise JsonRpcInvalidParams(f"{AGENT_RUN}: 'range' must be an LSP Range") from None
    if start < 0 or end < start:
        raise JsonRpcInvalidParams(f"{AGENT_RUN}: 'range' must start at a line >= 0 and not end before it")
    return start + 1, end + 1  # LSP lines are 0-based; the agent's are 1-based


def _line_edit(before: str, after: str) -> types.TextEdit:
    """One TextEdit replacing the lines between the common head and tail of the two texts."""
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    return types.TextEdit(
        range=types.Range(
            start=types.Position(line=head, character=0),
            end=types.Position(line=len(old) - tail, character=0),
        ),
        new_text="".join(new[head : len(new) - tail]),
    )


def to_lsp_workspace_edit(changes: list[FileChange], uri_of: dict[Path, str]) -> types.WorkspaceEdit | None:
    if not changes:
        return None
    return types.WorkspaceEdit(
        changes={
            uri_of.get(change.path, change.path.as_uri()): [_line_edit(change.before, change.after)]
            for change in changes
        }
    )


def to_lsp_result(result: AgentResult, edit: types.WorkspaceEdit | None, converter) -> dict[str, Any]:
    return {
        "episodeId": result.episode_id,
        **result.to_json(),
        "edit": converter.unstructure(edit) if edit is not None else None,
    }


class _Progress:
    """`$/progress` for one episode: the client's token, or one the server creates."""

    def __init__(self, ls: SquidServer, token):
        self.ls, self.token, self.loop = ls, token, asyncio.get_running_loop()

    @classmethod
    async def start(cls, ls: SquidServer, token, instruction: str) -> _Progress:
        if token is None:
            token = await ls.begin_progress("Agent", instruction[:80])
        elif token is not None:
            ls.work_done_progress.begin(
                token,
                types.WorkDoneProgressBegin(
                    title="squidcode: Agent", message=instruction[:80], cancellable=True
                ),
            )
        return cls(ls, token)

    def cancelled(self) -> bool:
        future = self.ls.work_done_progress.tokens.get(self.token) if self.token is not None else None
        return bool(future is not None and future.cancelled())

    def step(self, step: StepRecord, number: int) -> None:
        if self.token is None:
            return
        message = f"{number}. {step.tool}: {'ok' if step.ok else 'failed'}"
        post_to_loop(
            self.loop,
            self.ls.work_done_progress.report,
            self.token,
            types.WorkDoneProgressReport(message=message, cancellable=True),
        )

    def end(self, message: str) -> None:
        if self.token is not None:
            self.ls.end_progress(self.token, message)


def _workspace_for(ls: SquidServer, path: Path) -> Workspace:
    roots = [r for r in ls.workspace_roots if path.resolve().is_relative_to(Path(r).resolve())]
    return Workspace(roots or [path.parent])


def _open_buffers(ls: SquidServer) -> tuple[dict[Path, str], dict[Path, str]]:
    buffers, uris = {}, {}
    for uri, document in ls.workspace.text_documents.items():
        fs = to_fs_path(uri)
        if fs:
            path = Path(fs).resolve()
            buffers[path], uris[path] = document.source, uri
    return buffers, uris


async def _backend(ls: SquidServer, agent_config):
    if agent_config.backend == "local":
        runtime = await ls.model_ready()
        if runtime is None:
            raise JsonRpcInternalError(
                f"squidcode: the model is not loaded ({ls.model_error}); run `squidcode doctor`"
            )
        return make_backend(agent_config, lambda: runtime, *squid_settings(ls.config))
    return make_backend(agent_config, lambda: None)


async def run_agent_command(ls: SquidServer, args: tuple) -> dict[str, Any]:
    request = parse_arguments(args)
    if ls.stopping.is_set():
        raise JsonRpcInvalidRequest("squidcode: the server is shutting down")
    if not ls.config.agent.enabled:
        raise JsonRpcInternalError("squidcode: the agent is turned off (agent.enabled = false)")
    fs = to_fs_path(unquote(request["uri"]))
    path = Path(fs).resolve() if fs else None
    if path is None or not path.is_file() and ls.open_document_text(request["uri"]) is None:
        raise JsonRpcInvalidParams(f"{AGENT_RUN}: {request['uri']} is neither open nor a file")
    try:
        agent_config = with_overrides(ls.config.agent, k=request["k"])
        backend = await _backend(ls, agent_config)
        workspace = _workspace_for(ls, path)
    except SquidcodeError as exc:
        raise JsonRpcInternalError(f"squidcode: {exc}") from exc
    buffers, uris = _open_buffers(ls)
    stop = threading.Event()
    progress = await _Progress.start(ls, request["token"], request["instruction"])
    store = ls.index_service.store if ls.index_service is not None else None
    loop = AgentLoop(
        backend,
        workspace,
        agent_config,
        store=store,
        searcher=ls.index_service.search if ls.index_service is not None else None,
        memory=open_memory(ls.config, workspace.root),
        buffers=buffers,
        on_step=progress.step,
        should_stop=lambda: stop.is_set() or progress.cancelled() or ls.stopping.is_set(),
    )
    agent_request = AgentRequest(request["instruction"], path, request["range"], request["k"])
    try:
        result = await asyncio.get_running_loop().run_in_executor(ls.agent_executor, loop.run, agent_request)
    except asyncio.CancelledError:
        stop.set()
        progress.end("cancelled")
        raise
    except AgentCancelled as exc:
        progress.end("cancelled")
        raise JsonRpcRequestCancelled(f"squidcode: {exc}") from exc
    except SquidcodeError as exc:
        progress.end("failed")
        raise JsonRpcInternalError(f"squidcode: {exc}") from exc
    outcome = f"candidate {result.chosen} chosen" if result.chosen is not None else "none verified"
    progress.end(f"{len(result.candidates)} candidates, {outcome}")
    uri_of = uris | {path: request["uri"]}
    edit = to_lsp_workspace_edit(result.changes, uri_of)
    feedback_id = record_agent_result(ls, result, request["uri"], path)
    if feedback_id is not None:
        result.episode_id = feedback_id  # the id the feedback store knows this episode by
    if feedback_id is not None and edit is not None:
        befores = {uri_of.get(c.path, c.path.as_uri()): c.before for c in result.changes}
        rels = {uri_of.get(c.path, c.path.as_uri()): workspace.rel(c.path) for c in result.changes}
        if request["apply"]:
            applied = await ls.workspace_apply_edit_async(
                types.ApplyWorkspaceEditParams(edit=edit, label="squidcode agent")
            )
            if applied.applied:
                track_applied_agent_edit(ls, feedback_id, edit, befores, root=workspace.root, rels=rels)
        else:
            # The client applies it itself and then runs `squidcode.agent.applied`.
            remember_returned_edit(ls, feedback_id, edit, befores, workspace.root, rels)
    elif request["apply"] and edit is not None:
        await ls.workspace_apply_edit_async(
            types.ApplyWorkspaceEditParams(edit=edit, label="squidcode agent")
        )
    return to_lsp_result(result, edit, get_converter())


def agent_applied(ls: SquidServer, args: tuple) -> dict[str, Any]:
    """`squidcode.agent.applied {episodeId}`: the client applied the edit of that episode."""
    if len(args) != 1 or not isinstance(args[0], dict) or not isinstance(args[0].get("episodeId"), str):
        raise JsonRpcInvalidParams(f"{AGENT_APPLIED} takes one object {{episodeId}}")
    return {"tracked": agent_edit_applied(ls, args[0]["episodeId"])}


def register(server: SquidServer) -> None:
    @server.command(AGENT_RUN)
    async def agent_run(ls: SquidServer, *args) -> dict[str, Any]:
        return await run_agent_command(ls, args)

    @server.command(AGENT_APPLIED)
    def agent_applied_command(ls: SquidServer, *args) -> dict[str, Any]:
        return agent_applied(ls, args)
