"""The next-edit model path in the server. Its related code (`lsp_server.squid_context`): the
definitions a completion at the cursor would read, encoded in the background behind the model
path's prompt head, then composed; the real model, a real Squid service, the open files as the
editor has them (no index: names found in the open files). Its debounce and cancellation
(`features.next_edit._model_path`), with the model path itself stood in for."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from types import SimpleNamespace

from context.config import CompletionConfig, SquidCacheConfig, SquidConfig
from context.next_edit import EditHistory
from context.next_edit_model import prompt_parts
from context.squid.references import CompletionReferences, no_symbols
from context.squid.service import SquidService
from lsp_server.squid_context import NextEditReferences, stop_squid

CALC = "def price_of(item):\n    return item.price * item.quantity\n"
MAIN = "from shop.calc import price_of\n\n\ndef total(items):\n    return sum(price_of(i) for i in items)\n"


def test_related_code_is_encoded_in_the_background_then_composed(runtime, tmp_path):
    (tmp_path / "shop").mkdir()
    calc, main = tmp_path / "shop" / "calc.py", tmp_path / "main.py"
    calc.write_text(CALC)
    main.write_text(MAIN)
    config = SquidConfig(squid=SquidCacheConfig(cache_dir=str(tmp_path / "squid")))
    ls = SimpleNamespace(config=config, workspace_roots=[tmp_path], next_edit_squid=None, squid_service=None)
    completion = CompletionReferences(
        SquidService(runtime, config.squid, None, start_thread=False), current_path=str(main),
        open_documents={str(main): MAIN, str(calc): CALC}, search=None, roots=[tmp_path], symbols=no_symbols)
    history = EditHistory()
    history.open(str(main), MAIN)
    at = MAIN.index("items)\n")
    history.change(str(main), at, at + len("items"), "basket")
    text = history.text(str(main))
    cursor = text.index("price_of(i)") + len("price_of(")
    head, *_ = prompt_parts(runtime.tokenizer, history.edits(str(main)), text, cursor)
    references = NextEditReferences(ls, runtime, completion)
    try:
        first = references(head, text[:cursor])  # nothing encoded yet: queued for the background
        deadline = time.monotonic() + 120
        composed = first
        while composed is None and time.monotonic() < deadline:
            time.sleep(0.2)
            composed = references(head, text[:cursor])
        assert first is None and composed is not None
        context, documents = composed
        assert documents.startswith("Related code:\n```\n# shop/calc.py:1\ndef price_of(item):"), documents
        assert ls.next_edit_squid.prefix_text == head and len(context.spans) == 1
        with references.foreground():  # holds both services' encoders off, and lets go
            pass
        assert references(head, text[:cursor])[1] == documents  # cached: composed again at once
    finally:
        stop_squid(ls)
    assert ls.next_edit_squid is None


class ModelPathStandIn:
    """Stands in for `predict_with_model` (the model itself is not what is tested): it runs until
    its `should_stop` turns true or 20 s pass, and notes which."""

    def __init__(self):
        self.calls, self.started = [], threading.Event()

    def __call__(self, runtime, edits, text, cursor, should_stop, references):
        self.started.set()
        began = time.monotonic()
        while not should_stop() and time.monotonic() - began < 20:
            time.sleep(0.01)
        self.calls.append(("stopped" if should_stop() else "ran out", time.monotonic() - began))
        return None


def _server_for_model_path(monkeypatch, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from lsp_server.features import next_edit as feature
    from lsp_server.server import SupersedeRegistry

    stand_in = ModelPathStandIn()
    monkeypatch.setattr(feature, "predict_with_model", stand_in)
    monkeypatch.setattr(feature, "next_edit_references", lambda ls, uri, runtime: None)
    history = EditHistory()
    history.open("file:///x.py", MAIN)
    history.change("file:///x.py", 0, 0, "# cart\n")
    executor = ThreadPoolExecutor(1)

    async def model_ready():
        return "the model"

    ls = SimpleNamespace(
        supersede=SupersedeRegistry(), config=SquidConfig(), stopping=threading.Event(), edit_history=history,
        model_ready=model_ready,
        run_model_work=lambda fn, *args: asyncio.get_running_loop().run_in_executor(executor, fn, *args))
    return ls, stand_in, feature, executor


async def test_a_newer_request_or_a_cancel_stops_the_model_path_of_the_one_before(monkeypatch, tmp_path):
    ls, stand_in, feature, executor = _server_for_model_path(monkeypatch, tmp_path)
    text = ls.edit_history.text("file:///x.py")
    try:
        first = asyncio.create_task(feature._model_path(ls, "file:///x.py", text, 10))
        await asyncio.to_thread(stand_in.started.wait, 10)
        second = asyncio.create_task(feature._model_path(ls, "file:///x.py", text, 12))
        assert await asyncio.wait_for(first, 5) is None  # superseded: stopped between tokens
        assert stand_in.calls and stand_in.calls[0][0] == "stopped" and stand_in.calls[0][1] < 5
        stand_in.started.clear()
        await asyncio.to_thread(stand_in.started.wait, 10)
        second.cancel()  # $/cancelRequest cancels the handler's task
        with contextlib.suppress(asyncio.CancelledError):
            await second
        deadline = time.monotonic() + 5
        while len(stand_in.calls) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert [c[0] for c in stand_in.calls] == ["stopped", "stopped"]
        # Within the debounce wait, a newer request ends the older before the model is asked.
        calls = len(stand_in.calls)
        ls.config = SquidConfig(completion=CompletionConfig(debounce_ms=300))
        older = asyncio.create_task(feature._model_path(ls, "file:///x.py", text, 10))
        await asyncio.sleep(0.05)
        newer = asyncio.create_task(feature._model_path(ls, "file:///x.py", text, 10))
        assert await asyncio.wait_for(older, 5) is None and len(stand_in.calls) == calls
        ls.stopping.set()  # the server stopping ends the newer one too
        assert await asyncio.wait_for(newer, 25) is None
    finally:
        executor.shutdown(wait=True)
