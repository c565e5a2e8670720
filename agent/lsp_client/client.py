"""One running language server for one workspace: start, initialize, documents, diagnostics, stop.

Documents are synchronised with full text (every server supports it): `sync` opens a document or
sends its new text with the next version, so the server sees the agent's overlay, not the disk.
Diagnostics are pulled (`textDocument/diagnostic`) from servers that offer it, statically or by
registering it: an answer to a request, computed at once (basedpyright otherwise waits 250 ms after
each change before it analyses, and in pull mode it no longer analyses in the background). Other
servers push `textDocument/publishDiagnostics`; `diagnostics` then waits until the server has
published for the version last sent (servers that send no version: the first publication after the
change, then a short quiet period in case a second one follows).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contain import contained_server_command, scrubbed_env
from ..errors import LanguageServerError, LanguageServerTimeout
from .jsonrpc import JsonRpcConnection
from .positions import language_id_for, path_to_uri
from .specs import ServerSpec, find_command

__all__ = ["LanguageServerClient", "PublishedDiagnostics", "CLIENT_CAPABILITIES"]

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 2.0
# Servers without versioned diagnostics: how long no further publication must arrive.
_QUIET_S = 0.05

CLIENT_CAPABILITIES: dict[str, Any] = {
    "general": {"positionEncodings": ["utf-16"]},
    "workspace": {
        "configuration": True,
        "workspaceFolders": True,
        "applyEdit": False,
        "workspaceEdit": {"documentChanges": True},
        "didChangeConfiguration": {"dynamicRegistration": True},
    },
    "window": {"workDoneProgress": True},
    "textDocument": {
        "synchronization": {"didSave": False, "dynamicRegistration": False},
        "publishDiagnostics": {"versionSupport": True, "relatedInformation": False},
        # basedpyright pulls only when the client can register it dynamically.
        "diagnostic": {"dynamicRegistration": True, "relatedDocumentSupport": False},
        "definition": {"linkSupport": False},
        "references": {},
        "hover": {"contentFormat": ["markdown", "plaintext"]},
        "documentSymbol": {"hierarchicalDocumentSymbolSupport": True},
        "rename": {"prepareSupport": False},
    },
}


@dataclass(frozen=True)
class PublishedDiagnostics:
    """The latest diagnostics a server published for one document."""

    version: int | None
    items: list[dict[str, Any]]
    sequence: int  # publication counter: later publications have larger numbers
    at: float


class LanguageServerClient:
    """A started server process speaking LSP to the agent."""

    def __init__(self, spec: ServerSpec, root: Path, timeout_s: float = 10.0, contain: str | None = None):
        self.spec = spec
        self.root = Path(root).resolve()
        self.timeout_s = timeout_s
        # An `agent.contain.Isolation` kind ("bwrap", "unshare") to start the server in; None: as is.
        self.contain = contain
        self._home: str | None = None  # the contained server's HOME, removed at close
        self.capabilities: dict[str, Any] = {}
        self.process: subprocess.Popen | None = None
        self.connection: JsonRpcConnection | None = None
        self._documents: dict[str, tuple[int, str]] = {}  # uri -> (version, text) the server has
        self._last_version = 0
        self._diagnostics: dict[str, PublishedDiagnostics] = {}
        self._changed_at_sequence: dict[str, int] = {}  # uri -> publications seen when last changed
        self._sequence = 0
        self._registered: set[str] = set()  # methods the server registered dynamically
        # uri -> (the open documents' versions when pulled, the items): an unchanged workspace is
        # not analysed twice (the edit gate's "before" is usually the last answer's "after").
        self._pulled: dict[str, tuple[tuple, list[dict[str, Any]]]] = {}
        self._published = threading.Condition()
        # One conversation at a time: a sync and the query after it must not interleave with another.
        self.lock = threading.RLock()

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return (
            self.process is not None
            and self.process.poll() is None
            and self.connection is not None
            and not self.connection.closed.is_set()
        )

    def start(self) -> LanguageServerClient:
        """Start the process and initialize it; LanguageServerError when it cannot start or answer."""
        program = find_command(self.spec.argv[0])
        if program is None:
            raise LanguageServerError(f"{self.spec.argv[0]} is not installed (not found on PATH)")
        argv, env = [program, *self.spec.argv[1:]], os.environ.copy()
        if self.contain is not None:
            # The workspace may be a repository cloned from anywhere, and a type checker runs its
            # interpreter: no network, no tokens in the environment, the home folder hidden.
            self._home = tempfile.mkdtemp(prefix="squidcode-lsp-home-")
            argv = contained_server_command(argv, [self.root], Path(self._home), self.contain)
            env = scrubbed_env(Path(self._home))
        env.update(self.spec.env)
        try:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self.root,
                env=env,
                start_new_session=True,  # an editor's Ctrl-C does not reach it; close() ends it
            )
        except OSError as exc:
            raise LanguageServerError(f"{self.spec.name} could not start: {exc.strerror or exc}") from exc
        self.connection = JsonRpcConnection(self.process, self.spec.name)
        self._install_handlers(self.connection)
        try:
            self._initialize()
        except LanguageServerError:
            self.close(grace_s=0.0)
            raise
        return self

    def _install_handlers(self, connection: JsonRpcConnection) -> None:
        connection.on_notification("textDocument/publishDiagnostics", self._on_diagnostics)
        connection.on_request("workspace/configuration", self._configuration)
        connection.on_request("client/registerCapability", self._register)
        connection.on_request("client/unregisterCapability", lambda _params: None)
        connection.on_request("window/workDoneProgress/create", lambda _params: None)
        connection.on_request("window/showMessageRequest", lambda _params: None)
        connection.on_request("workspace/workspaceFolders", lambda _params: [self._folder()])
        # The agent applies edits to its overlay itself; a server never writes the workspace.
        connection.on_request("workspace/applyEdit", lambda _params: {"applied": False})

    def _register(self, params: Any) -> None:
        for registration in (params or {}).get("registrations") or []:
            self._registered.add(registration.get("method", ""))

    def _folder(self) -> dict[str, str]:
        return {"uri": path_to_uri(self.root), "name": self.root.name}

    def _initialize(self) -> None:
        params = {
            # A server watches this process and exits once it is gone; in the sandbox's own process
            # namespace it cannot see it (basedpyright exited within seconds), so it is not given.
            "processId": None if self.contain else os.getpid(),
            "clientInfo": {"name": "squidcode-agent"},
            "rootUri": path_to_uri(self.root),
            "rootPath": str(self.root),
            "workspaceFolders": [self._folder()],
            "capabilities": CLIENT_CAPABILITIES,
            "initializationOptions": {"settings": dict(self.spec.settings)} if self.spec.settings else None,
        }
        answer = self.connection.request("initialize", params, self.timeout_s) or {}
        self.capabilities = answer.get("capabilities") or {}
        self.connection.notify("initialized", {})
        if self.spec.settings:
            self.connection.notify("workspace/didChangeConfiguration", {"settings": dict(self.spec.settings)})

    def _configuration(self, params: Any) -> list[Any]:
        items = (params or {}).get("items") or []
        return [self._setting(item.get("section") or "") for item in items]

    def _setting(self, section: str) -> Any:
        value: Any = self.spec.settings
        for key in section.split(".") if section else []:
            if not isinstance(value, dict) or key not in value:
                return None
            value = value[key]
        return value

    def close(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """shutdown + exit, then kill the process if it has not ended within `grace_s` in all."""
        process, connection = self.process, self.connection
        if process is None:
            return
        deadline = time.monotonic() + grace_s
        if connection is not None and self.alive and grace_s > 0:
            try:
                connection.request("shutdown", None, grace_s)
                connection.notify("exit")
            except LanguageServerError:
                pass  # it hangs or died: killed below
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.05))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        for pipe in (process.stdin, process.stdout, process.stderr):
            try:
                pipe.close()
            except OSError:
                pass  # already closed by the reader thread
        if self._home is not None:
            shutil.rmtree(self._home, ignore_errors=True)
            self._home = None
        self._documents.clear()

    # -- documents ------------------------------------------------------------------------------

    def sync(self, path: Path, text: str) -> bool:
        """Make the server's copy of `path` equal `text`; True when something was sent."""
        uri = path_to_uri(path)
        known = self._documents.get(uri)
        if known is not None and known[1] == text:
            return False
        with self._published:
            self._changed_at_sequence[uri] = self._sequence
        # One counter for all documents: a document closed and opened again never repeats a
        # version, so (uri, version) pairs name texts uniquely (the pulled-diagnostics cache key).
        self._last_version += 1
        version = self._last_version
        if known is None:
            self.connection.notify(
                "textDocument/didOpen",
                {
                    "textDocument": {
                        "uri": uri,
                        "languageId": language_id_for(path) or self.spec.language,
                        "version": version,
                        "text": text,
                    }
                },
            )
        else:
            self.connection.notify(
                "textDocument/didChange",
                {"textDocument": {"uri": uri, "version": version}, "contentChanges": [{"text": text}]},
            )
        self._documents[uri] = (version, text)
        return True

    def close_document(self, path: Path) -> None:
        uri = path_to_uri(path)
        if self._documents.pop(uri, None) is not None:
            self.connection.notify("textDocument/didClose", {"textDocument": {"uri": uri}})

    def open_documents(self) -> list[str]:
        return list(self._documents)

    def document_text(self, uri: str) -> str | None:
        known = self._documents.get(uri)
        return known[1] if known else None

    # -- diagnostics ----------------------------------------------------------------------------

    def _on_diagnostics(self, params: Any) -> None:
        if not isinstance(params, dict) or "uri" not in params:
            return
        with self._published:
            self._sequence += 1
            self._diagnostics[params["uri"]] = PublishedDiagnostics(
                params.get("version"), list(params.get("diagnostics") or []), self._sequence, time.monotonic()
            )
            self._published.notify_all()

    def _current(self, uri: str) -> PublishedDiagnostics | None:
        """The publication that answers for the version last sent, or None while waiting for one."""
        published = self._diagnostics.get(uri)
        if published is None:
            return None
        if published.version is not None and uri in self._documents:
            return published if published.version >= self._documents[uri][0] else None
        return published if published.sequence > self._changed_at_sequence.get(uri, -1) else None

    @property
    def pulls_diagnostics(self) -> bool:
        if self.spec.pull_diagnostics is not None:
            return self.spec.pull_diagnostics
        return self.supports("diagnosticProvider") or "textDocument/diagnostic" in self._registered

    def diagnostics(self, path: Path, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """The server's diagnostics of `path` as last synced; LanguageServerTimeout when none come."""
        if self.pulls_diagnostics:
            return self._pull_diagnostics(path, timeout_s)
        return self._published_diagnostics(path, timeout_s)

    def _pull_diagnostics(self, path: Path, timeout_s: float | None) -> list[dict[str, Any]]:
        uri = path_to_uri(path)
        state = tuple(sorted((u, version) for u, (version, _) in self._documents.items()))
        cached = self._pulled.get(uri)
        if cached is not None and cached[0] == state:
            return cached[1]
        report = self.request("textDocument/diagnostic", {"textDocument": {"uri": uri}}, timeout_s) or {}
        items = list(report.get("items") or [])
        self._pulled[uri] = (state, items)
        return items

    def _published_diagnostics(self, path: Path, timeout_s: float | None) -> list[dict[str, Any]]:
        uri = path_to_uri(path)
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        with self._published:
            while (current := self._current(uri)) is None:
                left = deadline - time.monotonic()
                if not self.alive:
                    raise LanguageServerError(f"{self.spec.name} stopped before publishing for {path.name}")
                if left <= 0:
                    waited = self.timeout_s if timeout_s is None else timeout_s
                    raise LanguageServerTimeout(
                        f"{self.spec.name} published no diagnostics of {path.name} within {waited:.1f} s"
                    )
                self._published.wait(min(left, 0.5))
            if current.version is None:
                # Unversioned: a second publication may follow the first one closely.
                while self._published.wait(_QUIET_S):
                    current = self._diagnostics[uri]
        return current.items

    # -- requests -------------------------------------------------------------------------------

    def supports(self, capability: str) -> bool:
        return bool(self.capabilities.get(capability))

    def request(self, method: str, params: Any, timeout_s: float | None = None) -> Any:
        if not self.alive:
            raise LanguageServerError(f"{self.spec.name} is not running")
        return self.connection.request(method, params, self.timeout_s if timeout_s is None else timeout_s)
