"""References by definition (issue 22, item 3): the definitions of the cross-file names around the
cursor, found through a real index's symbols, chosen as short documents; the set stays the same
while a line is typed unless a newly typed name needs a definition; nothing is composed when no name
resolves outside the current file; a keystroke with the same references reuses the runtime's window
after the composed cache (recognised by the composition's identity, not its values)."""

from __future__ import annotations

import pytest

from agent.completion import CompletionRequest, complete
from context.config import CompletionConfig, IndexConfig, SquidCacheConfig
from context.index.service import IndexService
from context.squid.references import (
    CompletionReferences,
    names_near_cursor,
    no_symbols,
    select_definitions,
)
from context.squid.service import SquidService

PRICING = '''"""Prices."""

TAX_RATE = 0.2


def price_with_tax(amount: float, rate: float = TAX_RATE) -> float:
    """The amount with tax added, rounded to cents."""
    return round(amount * (1 + rate), 2)


class Basket:
    """Items and their prices."""

    def __init__(self, owner: str):
        self.owner = owner
        self.items = []

    def add(self, name: str, price: float, quantity: int = 1) -> None:
        self.items.append((name, price, quantity))

    def total(self) -> float:
        return sum(p * q for _, p, q in self.items)
'''
MAIN = '''from shop.pricing import Basket, price_with_tax


def checkout(owner, items):
    basket = Basket(owner)
    for name, price in items:
        basket.add(name, price)
    total = price_with_tax(basket.total())
    return total


def shout(words):
    loud = [word.upper() for word in words]
    return " ".join(loud)


def quote(amount):
    return price_with_tax(amount)
'''
TYPED = "    total = price_with_tax(basket.total())"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("refs")
    root = tmp / "ws"
    (root / "shop").mkdir(parents=True)
    (root / "app").mkdir()
    (root / "shop" / "pricing.py").write_text(PRICING)
    (root / "app" / "main.py").write_text(MAIN)
    index = IndexService([root], IndexConfig(watch=False, debounce_ms=0, embeddings=False),
                         db_path=tmp / "index.sqlite3")
    index.start()
    assert index.wait_until_indexed(60)
    yield root, index
    index.stop()


def _select(root, index, prefix: str, text: str = MAIN, symbols=None, open_documents=None):
    current = str(root / "app" / "main.py")
    return select_definitions(current_path=current, prefix_text=prefix, current_text=text,
                              open_documents=open_documents or {current: text},
                              symbols=symbols or index.store.symbols_named, max_documents=4, roots=[root])


def _typed_line_prefixes() -> list[str]:
    """The text before the cursor at each keystroke while TYPED is typed on its line."""
    head = MAIN[: MAIN.index(TYPED)]
    indent = len(TYPED) - len(TYPED.lstrip())
    return [head + TYPED[:n] for n in range(indent + 1, len(TYPED) + 1)]


def test_definitions_of_cross_file_names_are_chosen(workspace):
    root, index = workspace
    prefix = MAIN[: MAIN.index("        basket.add(") + len("        basket.add(")]
    docs = _select(root, index, prefix)
    assert [d.source for d in docs] == [str(root / "shop" / "pricing.py")]
    (basket,) = docs
    # The class: its header, its docstring, its methods' headers; not their bodies.
    assert basket.text.startswith("# shop/pricing.py:11\nclass Basket:\n")
    assert '"""Items and their prices."""' in basket.text
    assert "def add(self, name: str, price: float, quantity: int = 1) -> None:" in basket.text
    assert "self.items.append" not in basket.text
    # `basket.add` is a method of the chosen class: no document of its own.
    assert basket.text.count("# shop/") == 1

    prefix = MAIN[: MAIN.index("    return total")]
    texts = [d.text for d in _select(root, index, prefix)]
    function = next(t for t in texts if "price_with_tax" in t)
    assert function == ("# shop/pricing.py:6\n"
                        "def price_with_tax(amount: float, rate: float = TAX_RATE) -> float:\n"
                        '    """The amount with tax added, rounded to cents."""\n')


def test_the_set_is_stable_while_a_line_is_typed(workspace):
    root, index = workspace
    rest = MAIN[MAIN.index(TYPED) + len(TYPED):]
    sets = [tuple(d.text for d in _select(root, index, prefix, text=prefix + rest))
            for prefix in _typed_line_prefixes()]
    changes = [i for i in range(1, len(sets)) if sets[i] != sets[i - 1]]
    # One change: when `price_with_tax(` is complete; never while a name is half typed.
    assert len(changes) == 1
    assert _typed_line_prefixes()[changes[0]].endswith("price_with_tax(")
    assert any("def price_with_tax" in t for t in sets[-1]) and any("class Basket" in t for t in sets[-1])
    # Ordered by file and line, whatever the order the names were met in.
    assert sets[-1] == tuple(sorted(sets[-1], key=lambda t: int(t.split("\n", 1)[0].rsplit(":", 1)[1])))


def test_a_name_imported_and_not_used_yet_is_what_the_next_lines_need(workspace):
    root, index = workspace
    text = ("from __future__ import annotations\n\nfrom shop.pricing import price_with_tax\n\n\n"
            "def total(items):\n    ")
    (doc,) = _select(root, index, text, text=text)
    assert "def price_with_tax(amount: float" in doc.text
    # The same document while its name is typed, and once it is used: the set does not flicker.
    for typed in ("price_with", "price_with_tax", "price_with_tax("):
        assert _select(root, index, text + typed, text=text + typed) == [doc]


def test_no_references_when_nothing_resolves_outside_the_file(workspace):
    root, index = workspace
    prefix = MAIN[: MAIN.index('    return " ".join(loud)')]
    assert _select(root, index, prefix) == []
    # Names the current file defines or binds are its own, even where another file has them too.
    assert _select(root, index, "def price_with_tax(x):\n    return x\n\nprice_with_tax(",
                   text="def price_with_tax(x):\n    return x\n") == []
    # The word being typed is no name yet; a name reached through a module is the module's.
    assert names_near_cursor("x = sys.stdin.rea") == [("stdin", "sys"), ("sys", None)]


def test_open_files_resolve_what_the_index_does_not_know(workspace):
    root, index = workspace
    current = str(root / "app" / "main.py")
    unsaved = str(root / "shop" / "draft.py")
    opened = {current: MAIN, unsaved: "def discount(amount, percent):\n    return amount * (1 - percent)\n"}
    docs = _select(root, index, "x = discount(", text="x = discount(\n", symbols=no_symbols,
                   open_documents=opened)
    assert [d.source for d in docs] == [unsaved] and "def discount(amount, percent):" in docs[0].text


def test_a_keystroke_with_the_same_references_reuses_the_window(runtime, workspace, monkeypatch):
    root, index = workspace
    current = str(root / "app" / "main.py")
    service = SquidService(runtime, SquidCacheConfig(), None, start_thread=False)
    references = CompletionReferences(service, current_path=current, open_documents={current: MAIN},
                                      search=None, roots=[root], symbols=index.store.symbols_named)
    prefixes = _typed_line_prefixes()[-3:]  # `...basket.tota`, `...basket.total`, `...basket.total(`
    service.context_for(references.documents(prefixes[0]), wait=True)  # encoded, as in the background
    results = []
    generate = runtime.generate

    def recorded(*args, **kwargs):
        results.append(generate(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(runtime, "generate", recorded)
    config = CompletionConfig(max_tokens=4, finish_tokens=0, debounce_ms=0)
    runtime.forget_prefix()
    rest = MAIN[MAIN.index(TYPED) + len(TYPED):]  # the line typed so far, nothing after the cursor
    served = []
    for prefix in prefixes:
        results.clear()
        complete(runtime, CompletionRequest(prefix + rest, len(prefix), "python", current), config,
                 references=references)
        served.append(results[0])
    composed = references.compose(prefixes[0])
    assert composed is not None and {s for s in composed.sources} == {str(root / "shop" / "pricing.py")}
    first, second, third = served
    assert first.prompt_tokens > 50  # the window was prefilled once (after the composed references) ...
    for result in (second, third):
        # ... then only the newly typed tokens (and the last one, whose logits choose the next token).
        assert result.prompt_tokens - result.reused_tokens <= 3, result
    assert service.context_for(references.documents(prefixes[-1])) is service.context_for(
        references.documents(prefixes[0]))


def test_the_runtime_recognises_a_composition_by_identity(runtime, workspace):
    import torch

    root, index = workspace
    current = str(root / "app" / "main.py")
    service = SquidService(runtime, SquidCacheConfig(), None, start_thread=False)
    references = CompletionReferences(service, current_path=current, open_documents={current: MAIN},
                                      search=None, roots=[root], symbols=index.store.symbols_named)
    prefix = _typed_line_prefixes()[-1]
    composed = service.context_for(references.documents(prefix), wait=True)
    engine = runtime.prepare()._current_engine()
    if engine is None:
        pytest.skip("the lean engine does not run this model")
    cache = engine.new_cache()
    cache.load_past(composed.new_cache())
    assert cache.holds_past(composed.new_cache())  # another copy of the same composition
    # Recognised without reading the values: a copy whose values differ but carries the identity.
    tampered = composed.new_cache()
    with torch.no_grad():
        tampered.layers[0].keys.add_(1.0)
    assert cache.holds_past(tampered)
    # Another composition is compared by value; one that is not held is not held.
    other = service.context_for(references.documents(MAIN[: MAIN.index("    total =")]), wait=True)
    assert other.identity != composed.identity
    assert not cache.holds_past(other.new_cache())
    cache.crop(0)
    assert not cache.holds_past(composed.new_cache())
