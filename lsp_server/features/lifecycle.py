"""initialize / initialized: read settings, then load the model in the background with progress."""

from __future__ import annotations

import asyncio
import logging

from lsprotocol import types
from pygls.exceptions import JsonRpcException

from ..indexing import start_index
from ..logging_bridge import LOGGED_PACKAGES, LspLogHandler
from ..server import CONFIG_SECTION, SquidServer
from .adapters import start_adapter_watch

__all__ = ["register"]

log = logging.getLogger(__name__)


def register(server: SquidServer) -> None:
    @server.feature(types.INITIALIZE)
    def on_initialize(ls: SquidServer, params: types.InitializeParams) -> None:
        ls.initialization_options = params.initialization_options
        ls.set_workspace_roots(params)
        ls.reload_config(report=False)

    @server.feature(types.INITIALIZED)
    async def on_initialized(ls: SquidServer, params: types.InitializedParams) -> None:
        attach_log_bridge(ls)
        ls.client_settings = await pull_client_settings(ls)
        ls.reload_config()
        ls.config_ready.set()
        log.info("squidcode %s ready; roots: %s", ls.version, [str(r) for r in ls.workspace_roots])
        ls.start_model_load()
        start_index(ls)
        start_adapter_watch(ls)

    @server.feature(types.SHUTDOWN)
    async def on_shutdown(ls: SquidServer, params: None) -> None:
        # Answered once background work has stopped and the stores are closed: a client that
        # kills the process right after the response loses nothing.
        log.info("shutdown requested: stopping background work")
        ls.shutdown_requested = True
        ls.stopping.set()
        await ls.served_completions.aclose()
        try:
            await asyncio.get_running_loop().run_in_executor(None, ls.stop_background_work)
        except asyncio.CancelledError:
            # `exit` came before this answer and the loop is closing: the stop goes on in its
            # thread, and the process waits for it before it ends (`lsp_server.cli`).
            return

    @server.feature(types.EXIT)
    def on_exit(ls: SquidServer, params: None) -> None:
        ls.exit_code = 0 if ls.shutdown_requested else 1


async def pull_client_settings(ls: SquidServer):
    """The client's `squidcode` settings via workspace/configuration, when it supports that."""
    workspace = ls.client_capabilities.workspace if ls.client_capabilities else None
    if not (workspace and workspace.configuration):
        return ls.client_settings
    request = types.ConfigurationParams(items=[types.ConfigurationItem(section=CONFIG_SECTION)])
    try:
        result = await asyncio.wait_for(ls.workspace_configuration_async(request), timeout=5)
    except (JsonRpcException, TimeoutError) as exc:
        log.info("workspace/configuration failed (%s); using other settings", exc)
        return ls.client_settings
    settings = result[0] if result else None
    return settings if isinstance(settings, dict) else ls.client_settings


def attach_log_bridge(ls: SquidServer) -> None:
    """Mirror squidcode's own log records into the editor's output panel."""
    loop = asyncio.get_running_loop()
    for name in LOGGED_PACKAGES:
        logger = logging.getLogger(name)
        if not any(isinstance(h, LspLogHandler) for h in logger.handlers):
            logger.addHandler(LspLogHandler(ls, loop))
