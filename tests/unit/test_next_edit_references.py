"""The next-edit model path's related code in the server (`lsp_server.squid_context`): the
definitions a completion at the cursor would read, encoded in the background behind the model
path's prompt head, then composed; the real model, a real Squid service, the open files as the
editor has them (no index: names found in the open files)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from context.config import SquidCacheConfig, SquidConfig
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
