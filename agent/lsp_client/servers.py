"""The language servers of one workspace: started lazily, restarted after a crash, degraded at last.

`LanguageServers` starts a server the first time a file it handles is queried. A server that dies
is started again on the next query, at most `max_restarts` times; one that cannot start, does not
answer `initialize`, or keeps timing out is marked degraded and left alone. Every query returns
notes beside its answer, one line each ("basedpyright is not installed: ..."), which the tools show
the model: a missing or hung server degrades to the checks the agent had without it, never an error.

Before each query the overlay is synchronised: every document the server has open, the edited files
and the queried one get the overlay's text, so answers reflect the agent's proposed edits.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..contain import isolation
from ..errors import LanguageServerError, LanguageServerTimeout, ToolError
from .client import SHUTDOWN_GRACE_S, LanguageServerClient
from .positions import uri_to_path
from .specs import ServerSpec, server_specs

__all__ = ["LanguageServers", "ServerState", "shared_language_servers", "close_shared_language_servers"]

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_TIMEOUTS = 3  # consecutive timeouts before a server counts as hung


@dataclass
class ServerState:
    """What the pool knows about one server of the workspace."""

    spec: ServerSpec
    client: LanguageServerClient | None = None
    starts: int = 0
    timeouts: int = 0
    degraded: str | None = None  # why it is no longer used
    notes: list[str] = field(default_factory=list)


class LanguageServers:
    """Lazily started language servers for one workspace root."""

    def __init__(
        self,
        root: Path,
        commands: Mapping[str, str | Sequence[str]] | None = None,
        *,
        specs: Iterable[ServerSpec] | None = None,
        timeout_s: float = 10.0,
        max_restarts: int = 2,
        allow_unisolated: bool = False,
        type_checker: str = "auto",
    ):
        self.root = Path(root).resolve()
        self.timeout_s = timeout_s
        self.max_restarts = max_restarts
        # Servers run contained as the workspace's tests do (`agent.contain`); where this machine
        # cannot contain them, only with `agent.allow_unisolated`.
        self.allow_unisolated = allow_unisolated
        chosen = list(specs) if specs is not None else server_specs(commands, type_checker=type_checker)
        self._states = [ServerState(spec) for spec in chosen]
        self._lock = threading.Lock()

    # -- which servers ---------------------------------------------------------------------------

    def states(self) -> list[ServerState]:
        return list(self._states)

    def clients_for(self, path: Path, notes: list[str]) -> list[LanguageServerClient]:
        """The running servers for `path`, starting or restarting them as needed; why any is
        unavailable is appended to `notes`."""
        clients = []
        for state in self._states:
            if not state.spec.handles(path):
                continue
            client = self._ensure(state, notes)
            if client is not None:
                clients.append(client)
        return clients

    def _ensure(self, state: ServerState, notes: list[str]) -> LanguageServerClient | None:
        with self._lock:
            if state.degraded is not None:
                notes.append(state.degraded)
                return None
            if state.client is not None and state.client.alive:
                return state.client
            if state.client is not None:  # it was running and is gone: a crash
                code = state.client.process.poll() if state.client.process else None
                state.client.close(grace_s=0.0)
                state.client = None
                if state.starts > self.max_restarts:
                    state.degraded = (
                        f"{state.spec.name} crashed {state.starts} times (last exit code {code}); "
                        "it is no longer used in this session"
                    )
                    notes.append(state.degraded)
                    return None
                notes.append(f"{state.spec.name} stopped (exit code {code}) and was restarted")
            return self._start(state, notes)

    def _start(self, state: ServerState, notes: list[str]) -> LanguageServerClient | None:
        found = isolation()
        if not found.isolated and not self.allow_unisolated:
            state.degraded = (f"{state.spec.name} was not started: this machine cannot contain it "
                              f"({found.detail}); agent.allow_unisolated = true starts it uncontained")
            notes.append(state.degraded)
            return None
        state.starts += 1
        try:
            contain = found.kind if found.isolated else None
            state.client = LanguageServerClient(state.spec, self.root, self.timeout_s, contain).start()
        except LanguageServerError as exc:
            state.degraded = f"{state.spec.name} is unavailable ({exc})"
            log.info("language server %s: %s", state.spec.name, exc)
            notes.append(state.degraded)
            return None
        state.timeouts = 0
        return state.client

    # -- queries ---------------------------------------------------------------------------------

    def run(
        self,
        client: LanguageServerClient,
        overlay: Any,
        paths: Iterable[Path],
        query: Callable[[LanguageServerClient], T],
        notes: list[str],
    ) -> T | None:
        """`query(client)` after syncing `overlay` (and `paths`) into it; None, with a note, when
        the server times out or stops."""
        state = next((s for s in self._states if s.client is client), None)
        try:
            with client.lock:
                sync_overlay(client, overlay, paths)
                answer = query(client)
        except LanguageServerTimeout as exc:
            notes.append(f"{exc}; answering without it")
            if state is not None:
                self._count_timeout(state)
            return None
        except LanguageServerError as exc:
            notes.append(f"{exc}; answering without it")
            return None
        if state is not None:
            state.timeouts = 0
        return answer

    def _count_timeout(self, state: ServerState) -> None:
        state.timeouts += 1
        if state.timeouts >= MAX_TIMEOUTS:
            with self._lock:
                state.degraded = (
                    f"{state.spec.name} timed out {state.timeouts} times in a row; "
                    "it is no longer used in this session"
                )
                if state.client is not None:
                    state.client.close(grace_s=0.0)

    def query_first(
        self,
        overlay: Any,
        path: Path,
        capability: str,
        query: Callable[[LanguageServerClient], T],
        notes: list[str],
    ) -> T | None:
        """The answer of the first server for `path` that has `capability` and answers."""
        clients = [c for c in self.clients_for(path, notes) if c.supports(capability)]
        if not clients and not notes:
            notes.append(f"no language server for {path.suffix or path.name} files offers {capability}")
        for client in clients:
            answer = self.run(client, overlay, [path], query, notes)
            if answer is not None:
                return answer
        return None

    def close(self) -> None:
        with self._lock:
            for state in self._states:
                if state.client is not None:
                    # One that has just timed out is not waited for: it would only time out again.
                    state.client.close(grace_s=0.0 if state.timeouts else SHUTDOWN_GRACE_S)
                    state.client = None


def _overlay_text(overlay: Any, path: Path) -> str | None:
    try:
        return overlay.read(path)
    except ToolError:
        return None  # deleted or unreadable: nothing to show the server


def sync_overlay(client: LanguageServerClient, overlay: Any, paths: Iterable[Path]) -> None:
    """Send the overlay's text of every open document, every edited file and `paths` that
    `client` handles; a document that no longer exists is closed."""
    wanted = {uri_to_path(uri) for uri in client.open_documents()}
    wanted.update(overlay.edited())
    wanted.update(paths)
    for path in sorted(wanted):
        if not client.spec.handles(path):
            continue
        text = _overlay_text(overlay, path)
        if text is None:
            client.close_document(path)
        else:
            client.sync(path, text)


_SHARED: dict[tuple, LanguageServers] = {}
_SHARED_LOCK = threading.Lock()


def shared_language_servers(
    root: Path, commands: Mapping[str, Any] | None, timeout_s: float, allow_unisolated: bool = False,
    type_checker: str = "auto",
) -> LanguageServers:
    """One pool per workspace root and configuration for the whole process, so servers stay warm
    across episodes; all are shut down at exit."""
    key = (Path(root).resolve(), tuple(sorted((k, str(v)) for k, v in (commands or {}).items())), timeout_s,
           allow_unisolated, type_checker)
    with _SHARED_LOCK:
        pool = _SHARED.get(key)
        if pool is None:
            pool = _SHARED[key] = LanguageServers(
                key[0], commands, timeout_s=timeout_s, allow_unisolated=allow_unisolated,
                type_checker=type_checker,
            )
        return pool


@atexit.register
def close_shared_language_servers() -> None:
    with _SHARED_LOCK:
        pools = list(_SHARED.values())
        _SHARED.clear()
    for pool in pools:
        pool.close()
