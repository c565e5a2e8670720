"""The squidcode language server: state shared by the feature modules, and protocol hardening.

Features live in `lsp_server/features/`, one module each; this module owns what they share: the
validated configuration, the model (loaded off the event loop, with `$/progress`), the worker that
runs model work, and the per-document supersede registry used for debounce and cancellation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidRequest, JsonRpcParseError
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.json_rpc import RPCRequest
from pygls.uris import to_fs_path

from agent.completion import Completion, CompletionRequest, complete, warm_window
from context.config import ConfigLayer, SquidConfig, file_layers, merge_layers
from context.errors import SquidcodeError
from context.foreground import foreground
from context.next_edit import EditHistory
from context.runtime import ModelRuntime, get_runtime
from context.threads import SerialThreadExecutor

from .connection import post_to_loop
from .indexing import stop_index
from .positions import offset_at
from .served_completion import ServedCompletions, show_warning
from .squid_context import completion_references, stop_squid

__all__ = ["SquidServer", "SquidProtocol", "SupersedeRegistry", "SERVER_NAME", "CONFIG_SECTION"]

log = logging.getLogger(__name__)

SERVER_NAME = "squidcode"
CONFIG_SECTION = "squidcode"
# How long stopping waits for a model load in flight before the process exits around it.
MODEL_LOAD_WAIT_S = 2.0


class SquidProtocol(LanguageServerProtocol):
    """Answers a request whose params do not match the LSP schema with an error, not silence; and
    a request after `shutdown` with InvalidRequest, as LSP asks (pygls drops it, and the client waits)."""

    def handle_message(self, message) -> None:
        if self._shutdown and isinstance(message, RPCRequest) and message.method != types.EXIT:
            log.info("%s after shutdown: answered InvalidRequest", message.method)
            self._send_response(message.id, error=JsonRpcInvalidRequest(
                "the server is shutting down (shutdown was requested)").to_response_error())
            return
        super().handle_message(message)

    def structure_message(self, data: dict[str, Any]):
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if "id" in data and "method" in data:
                self._send_response(data["id"], error=exc.to_response_error())
            raise


class _UndecodableFrameFilter(logging.Filter):
    """Drops pygls' ERROR-with-traceback for a frame that is not UTF-8 JSON: bad input from the
    client, answered with a parse error and logged as one warning by `report_server_error`."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, json.JSONDecodeError | UnicodeDecodeError)


logging.getLogger("pygls.server").addFilter(_UndecodableFrameFilter())


@dataclass
class _Pending:
    generation: int
    cancelled: threading.Event = field(default_factory=threading.Event)


class SupersedeRegistry:
    """One live request per document: starting a new one cancels the one before it."""

    def __init__(self) -> None:
        self._pending: dict[str, _Pending] = {}
        self._counter = 0
        self._lock = threading.Lock()

    def begin(self, key: str) -> _Pending:
        with self._lock:
            self._counter += 1
            previous = self._pending.get(key)
            if previous is not None:
                previous.cancelled.set()
            current = _Pending(self._counter)
            self._pending[key] = current
            return current

    def is_current(self, key: str, pending: _Pending) -> bool:
        with self._lock:
            return self._pending.get(key) is pending and not pending.cancelled.is_set()

    def finish(self, key: str, pending: _Pending) -> None:
        with self._lock:
            if self._pending.get(key) is pending:
                del self._pending[key]

    def cancel_all(self) -> None:
        """Cancel every live request (the server is stopping): generation stops between tokens."""
        with self._lock:
            for pending in self._pending.values():
                pending.cancelled.set()


def _in_daemon_thread(fn, *args) -> tuple[asyncio.Future, threading.Thread]:
    """Run `fn` on a daemon thread: a slow model load (a first GGUF conversion takes ~20 s) must not
    hold up the process's exit when the editor shuts the server down."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(outcome: str, value) -> None:
        if not future.done():
            getattr(future, outcome)(value)

    def target() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine, not swallowed
            post_to_loop(loop, settle, "set_exception", exc)
        else:
            post_to_loop(loop, settle, "set_result", result)

    thread = threading.Thread(target=target, name="squid-model-load", daemon=True)
    thread.start()
    return future, thread


class SquidServer(LanguageServer):
    """pygls server plus squidcode's shared state."""

    def __init__(self, version: str):
        super().__init__(SERVER_NAME, version, protocol_cls=SquidProtocol, max_workers=4)
        self.config = SquidConfig()
        self.config_problems: list[str] = []
        self._reporting_error = False
        self._file_problems: list[str] = []
        self.initialization_options: Any = None
        self.client_settings: Any = None
        self.workspace_roots: list[Path] = []
        self.supersede = SupersedeRegistry()
        # Model work is serialised on one thread; the event loop never runs it.
        self.model_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="squid-model")
        # Agent episodes, one at a time: each one is long, and the model is one per process.
        self.agent_executor = SerialThreadExecutor("squid-agent")  # its thread ends with the episode
        self.runtime: ModelRuntime | None = None
        self.model_error: str | None = None
        self._model_task: asyncio.Task | None = None
        self._model_thread: threading.Thread | None = None
        # Set when the client asked for `shutdown` (or went away): requests get nothing, background
        # work stops, and `stop_background_work` closes the stores once nothing can touch them.
        self.stopping = threading.Event()
        self.shutdown_requested = False
        self.exit_code = 0  # `exit` before `shutdown` makes it 1 (LSP); a client that vanishes, 0
        self._stopped = False
        self._stop_lock = threading.Lock()
        # (name, hook) called by `stop_background_work` after model work and the index have stopped,
        # in order: features that own something to flush or close (feedback) add theirs.
        self.stop_hooks: list[tuple[str, Callable[[], None]]] = []
        # Threads started for background work (the repo map's pre-encode), joined on stop.
        self.background_threads: list[threading.Thread] = []
        # Set once `initialized` has merged the client's settings; requests wait for it so that
        # none is answered under defaults the user has overridden.
        self.config_ready = asyncio.Event()
        self.index_service = None  # context.index.service.IndexService once indexing starts
        self.feedback = None  # feedback.recorder.FeedbackRecorder once configured (features/edit_tracking)
        # Called as listener(method, params) for didChange / didClose: features that follow
        # documents (feedback edit tracking) without owning those notifications. Must be fast.
        self.document_listeners: list = []
        # Each open document's recent edits, in memory only (features/next_edit feeds and reads it).
        self.edit_history = EditHistory()
        # Called as listener(old_config, new_config) after every configuration reload.
        self.config_listeners: list = []
        # Called on the event loop whenever the model, index, feedback or training state changes;
        # the status feature sends `squidcode/status` from here.
        self.state_listeners: list[Callable[[], None]] = []
        # Sections of `squidcode.status` contributed by features (name -> provider), e.g. "feedback".
        self.status_sections: dict[str, Callable[[], dict]] = {}
        self.squid_service = None  # context.squid.service.SquidService once a completion needs it
        self.next_edit_squid = None  # ... and the next-edit model path's (`squid_context`)
        # The completion server (`completion.backend` other than "local") and whether it answers.
        self.served_completions = ServedCompletions(show_warning(self), self.state_changed)
        # Agent edits returned to the client, until it reports them applied (`squidcode.agent.applied`),
        # and the tracked ones whose outcomes teach the agent's memory (lsp_server/agent_feedback.py).
        self.agent_returned_edits: dict = {}
        self.agent_memory_regions: dict = {}

    # -- configuration -------------------------------------------------------------------------

    def config_layers(self) -> list[ConfigLayer]:
        layers, self._file_problems = file_layers(self.workspace_roots)
        if self.initialization_options is not None:
            layers.append(ConfigLayer("initializationOptions", self.initialization_options))
        if self.client_settings is not None:
            layers.append(ConfigLayer("workspace settings", self.client_settings))
        return layers

    def reload_config(self, report: bool = True) -> bool:
        """Rebuild the configuration from every layer; True when the model settings changed.

        `report=False` validates silently: used at `initialize`, whose problems are reported once
        the client's own settings have been pulled at `initialized`.
        """
        layers = self.config_layers()
        config, problems = merge_layers(layers)
        problems = self._file_problems + problems
        model_changed = config.model != self.config.model
        previous, self.config = self.config, config
        self.config_problems = problems
        logging.getLogger("lsp_server").setLevel(config.log_level.upper())
        for problem in problems if report else ():
            log.warning("configuration: %s", problem)
            self.window_show_message(
                types.ShowMessageParams(
                    type=types.MessageType.Warning, message=f"squidcode configuration: {problem}"
                )
            )
        for listener in self.config_listeners:
            try:
                listener(previous, config)
            except Exception:  # noqa: BLE001 - a failing listener is logged and skipped
                log.exception("configuration listener %r failed", listener)
        return model_changed

    def state_changed(self) -> None:
        """Tell the state listeners (the `squidcode/status` notification) that something changed."""
        for listener in list(self.state_listeners):
            listener()

    # -- the model -----------------------------------------------------------------------------

    def start_model_load(self) -> None:
        self.runtime = None
        self.model_error = None
        self._model_task = asyncio.ensure_future(self._load_model())

    async def model_ready(self) -> ModelRuntime | None:
        """The loaded model, waiting for a load in progress; None when it failed to load."""
        if self._model_task is None:
            self.start_model_load()
        # shield: a cancelled completion request must not cancel the load others wait for.
        await asyncio.shield(self._model_task)
        return self.runtime

    async def _load_model(self) -> None:
        model_config = self.config.model
        cache_dir = self.config.resolved_cache_dir()
        self.state_changed()
        token = await self.begin_progress("Loading model", model_config.path or "embedded model")
        try:
            # The engine too, so that the first keystroke does not wait for it.
            future, self._model_thread = _in_daemon_thread(
                lambda: get_runtime(model_config, cache_dir).prepare())
            self.runtime = await future
        except SquidcodeError as exc:
            self.model_error = str(exc)
            log.error("model unavailable: %s", exc)
            self.window_show_message(
                types.ShowMessageParams(
                    type=types.MessageType.Error,
                    message=f"squidcode: {exc} Run `squidcode doctor` for details.",
                )
            )
        finally:
            self.end_progress(token, "model ready" if self.runtime else "model unavailable")
            self.state_changed()

    async def begin_progress(self, title: str, message: str) -> str | None:
        window = self.client_capabilities.window if self.client_capabilities else None
        if not (window and window.work_done_progress):
            return None
        token = f"squidcode-{uuid.uuid4()}"
        try:
            await asyncio.wait_for(self.work_done_progress.create_async(token), timeout=5)
        except (TimeoutError, JsonRpcException) as exc:
            log.info("client did not accept a progress token (%s); loading silently", exc)
            return None
        self.work_done_progress.begin(
            token, types.WorkDoneProgressBegin(title=f"squidcode: {title}", message=message)
        )
        return token

    def end_progress(self, token: str | None, message: str) -> None:
        if token is not None:
            self.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))

    # -- completion ----------------------------------------------------------------------------

    async def complete_at(self, uri: str, position: types.Position) -> Completion | None:
        """A completion at `position`, or None: unopened document, superseded, cancelled, no model.

        A newer request for the same document supersedes this one, during the debounce wait or
        during generation; `$/cancelRequest` cancels the task and stops generation between tokens.
        """
        try:
            await asyncio.wait_for(self.config_ready.wait(), timeout=10)
        except TimeoutError:
            log.warning("no `initialized` from the client yet; completing with the settings known so far")
        if not self.config.completion.enabled or self.stopping.is_set():
            return None
        opened = self.open_document_text(uri)
        if opened is None:
            log.info("completion asked for %s, which the client never opened", uri)
            return None
        text, language = opened
        request = CompletionRequest(text, offset_at(text, position), language, to_fs_path(uri))
        pending = self.supersede.begin(uri)
        try:
            await asyncio.sleep(self.config.completion.debounce_ms / 1000)
            if not self.supersede.is_current(uri, pending) or self.stopping.is_set():
                return None
            if self.config.completion.backend != "local":
                answered, served = await self.served_completions.complete(
                    self, uri, request, pending.cancelled.is_set)
                if answered or not self.supersede.is_current(uri, pending):
                    return served
            runtime = await self.model_ready()
            if runtime is None or not self.supersede.is_current(uri, pending) or self.stopping.is_set():
                return None
            # Background work (indexing, the repo map, embeddings) pauses until this returns.
            with foreground():
                work = self.run_model_work(self._complete_locally, runtime, request, uri,
                                           pending.cancelled.is_set)
                if work is None:
                    return None
                result, references = await work
            if ((result is None or result.dropped_tokens) and self.supersede.is_current(uri, pending)
                    and not self.stopping.is_set()):
                # A shorter window answered this keystroke: the whole one is prefilled while the
                # editor is idle, and gives way as soon as the next completion waits.
                self.run_model_work(self._warm_window, runtime, request, references)
            return result
        except asyncio.CancelledError:
            pending.cancelled.set()
            raise
        finally:
            self.supersede.finish(uri, pending)

    def run_model_work(self, fn, *args) -> asyncio.Future | None:
        """`fn(*args)` on the model's thread; None once the server is stopping (its executor is shut)."""
        if self.stopping.is_set():
            return None
        try:
            return asyncio.get_running_loop().run_in_executor(self.model_executor, fn, *args)
        except RuntimeError:  # shut down between the check and the call
            return None

    def _complete_locally(self, runtime: ModelRuntime, request: CompletionRequest, uri: str, cancelled):
        """On the model's thread: the request's Squid references (their shared prefix is encoded at the
        first; torch runs on no thread of the server's that lives on, `context.threads`) and the
        completion. Returns both: the references are the idle-time window warm's too."""
        references = completion_references(self, uri, runtime)
        return complete(runtime, request, self.config.completion, cancelled, references), references

    def _warm_window(self, runtime: ModelRuntime, request: CompletionRequest, references) -> None:
        try:
            warm_window(runtime, request, self.config.completion, references,
                        should_stop=self.stopping.is_set)
        except Exception:  # noqa: BLE001 - background work: the next completion prefills what it needs
            log.exception("warming the completion window failed")

    # -- stopping ------------------------------------------------------------------------------

    def stop_background_work(self, timeout: float = 30.0) -> None:
        """Stop everything that runs beside the client's requests, then close what it writes to.

        Called at `shutdown`, and again (a no-op then) when the connection ends, however it ends.
        The order is what keeps stores safe: requests are cancelled and the model's threads drained
        before the index and the feedback store close, so no request ever touches a closed store;
        and no thread is left inside torch when the interpreter exits (that aborted the process).
        """
        with self._stop_lock:  # a second caller (exit arriving mid-shutdown) waits for the first
            if self._stopped:
                return
            self.stopping.set()
            self.supersede.cancel_all()
            steps: list[tuple[str, Callable[[], None]]] = [
                ("repo map", lambda: [thread.join(timeout) for thread in self.background_threads]),
                # Generation polls its cancel flag between tokens, warming between chunks: both end soon.
                ("model work", lambda: self.model_executor.shutdown(wait=True, cancel_futures=True)),
                ("agent", lambda: self.agent_executor.shutdown(wait=True, cancel_futures=True)),
                # After the model's thread, which makes the services: the pre-encoders stop between
                # chunks, joined.
                ("squid", lambda: stop_squid(self)),
                # A model load cannot be interrupted (it converts, or compiles the fused step); the
                # process exits around it (`lsp_server.cli`), and its files are written atomically.
                ("model load", lambda: self._model_thread and self._model_thread.join(MODEL_LOAD_WAIT_S)),
                ("index", lambda: stop_index(self)),
                *self.stop_hooks,
            ]
            spent = []
            for name, step in steps:
                began = time.monotonic()
                try:
                    step()
                except Exception:  # noqa: BLE001 - one part failing to stop must not keep others open
                    log.exception("stopping %s failed", name)
                spent.append((name, time.monotonic() - began))
            self._stopped = True
            log.info("background work stopped in %.2fs (%s)", sum(s for _, s in spent),
                     ", ".join(f"{name} {s:.2f}s" for name, s in spent if s >= 0.01))

    # -- documents -----------------------------------------------------------------------------

    def notify_document_listeners(self, method: str, params: Any) -> None:
        """Hand a document notification to each listener; a failing one is logged and skipped."""
        if self._stopped:
            return  # the listeners' stores are closed; the client is leaving
        for listener in self.document_listeners:
            try:
                listener(method, params)
            except Exception:  # noqa: BLE001 - the editor's notification must not be lost to a plugin
                log.exception("document listener %r failed on %s", listener, method)

    def open_document_text(self, uri: str) -> tuple[str, str | None] | None:
        """Text and language of a document the client opened; None for one it never opened."""
        # pygls keys open documents by the percent-decoded URI (`%20`, `%E7%8C%AB`, `c%3A`...).
        document = self.workspace.text_documents.get(unquote(uri))
        if document is None:
            return None
        return document.source, document.language_id

    def set_workspace_roots(self, params: types.InitializeParams) -> None:
        uris = [f.uri for f in params.workspace_folders or []]
        if not uris and params.root_uri:
            uris = [params.root_uri]
        roots = [to_fs_path(uri) for uri in uris]
        self.workspace_roots = [Path(root) for root in roots if root]

    # -- protocol errors -----------------------------------------------------------------------

    def report_server_error(self, error: Exception, source) -> None:
        """Answer undecodable frames with a JSON-RPC parse error and keep serving."""
        if isinstance(error, json.JSONDecodeError | UnicodeDecodeError):
            log.warning("dropped a frame that is not valid UTF-8 JSON: %s", error)
            parse_error = JsonRpcParseError(f"Parse error: {error}").to_response_error()
            # JSON-RPC 2.0 requires `"id": null` here; lsprotocol's converter would omit a None id.
            self.protocol._send_data({"jsonrpc": "2.0", "id": None, "error": parse_error})
            return
        if isinstance(error, JsonRpcException):
            # Already answered to the request (SquidProtocol) or logged by pygls.
            log.warning("protocol error: %s", error)
            return
        if self._reporting_error:
            # Telling the client failed too (its stream is gone, as after `exit`): pygls would report
            # that failure by sending again, recursing until Python's stack ran out.
            return
        self._reporting_error = True
        try:
            super().report_server_error(error, source)
        finally:
            self._reporting_error = False
