"""workspace/didChangeConfiguration: re-validate settings; reload the model if its settings changed."""

from __future__ import annotations

from lsprotocol import types

from ..indexing import start_index
from ..server import CONFIG_SECTION, SquidServer
from .lifecycle import pull_client_settings

__all__ = ["register"]


def register(server: SquidServer) -> None:
    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def on_change(ls: SquidServer, params: types.DidChangeConfigurationParams) -> None:
        settings = params.settings
        if isinstance(settings, dict) and CONFIG_SECTION in settings:
            ls.client_settings = settings[CONFIG_SECTION]
        elif isinstance(settings, dict) and settings:
            ls.client_settings = settings
        else:
            # Pull-model clients send null settings and expect the server to ask.
            ls.client_settings = await pull_client_settings(ls)
        index_before = ls.config.index
        if ls.reload_config():
            ls.start_model_load()
        if ls.config.index != index_before:
            start_index(ls)
