"""Which thread the server's model work runs on (`context.threads`)."""

from __future__ import annotations

import asyncio
import threading

from lsprotocol import types

import lsp_server.server as server_module
from lsp_server.server import SquidServer


def test_a_completion_makes_its_references_on_the_model_thread_not_the_event_loop(monkeypatch):
    """Squid's references encode their shared prefix the first time: that torch work must run on the
    model's thread, never on the event loop, whose thread lives as long as the server
    (`context.threads`: an idle thread that ran torch slows the model thread's decoding)."""
    threads = {}

    def references_stand_in(ls, uri, runtime):  # stands in for Squid (no model here)
        threads["references"] = threading.current_thread().name
        return "references"

    def complete_stand_in(runtime, request, config, cancelled, references):
        threads["complete"] = threading.current_thread().name
        assert references == "references"
        return None

    monkeypatch.setattr(server_module, "completion_references", references_stand_in)
    monkeypatch.setattr(server_module, "complete", complete_stand_in)
    server = SquidServer("test")
    server.open_document_text = lambda uri: ("import os\n", "python")

    async def model_ready():
        return "model stand-in"

    server.model_ready = model_ready

    async def ask():
        server.config_ready.set()
        return await server.complete_at("file:///w/a.py", types.Position(line=1, character=0))

    try:
        assert asyncio.run(ask()) is None
    finally:
        server.model_executor.shutdown(wait=True)
    assert threads["references"].startswith("squid-model"), threads
    assert threads["complete"] == threads["references"]
