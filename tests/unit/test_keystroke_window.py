"""A keystroke prefills at most `prefill_limit` prompt tokens; `warm()` brings the whole window back.

The planning is checked on token lists; the rest on the real embedded model, where a shortened or
anchored window must generate exactly what a fresh run on the same tokens generates.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from agent.completion import CompletionRequest, complete, warm_window
from context.boundary import leaves_open
from context.config import CompletionConfig
from context.foreground import foreground
from context.runtime import WARM_CHUNK, _plan_prefill

REPO = Path(__file__).resolve().parents[2]
CODE = (REPO / "context" / "index" / "store.py").read_text()[:6000]


def plan(cached, prompt, limit, partial=False):
    return _plan_prefill(cached, prompt, reuse=True, slack=1024, limit=limit, partial=partial)


# -- planning --------------------------------------------------------------------------------------

PROMPT = list(range(1000, 1600))  # 600 distinct tokens


def test_without_a_limit_the_whole_prompt_is_kept():
    assert plan([], PROMPT, 0) == ([], PROMPT, 0)


def test_a_cold_prompt_over_the_limit_keeps_its_last_tokens():
    head, kept, common = plan([], PROMPT, 256)
    assert (head, kept, common) == ([], PROMPT[-256:], 0)


def test_a_prompt_that_mostly_reuses_the_cache_is_kept_whole():
    head, kept, common = plan(PROMPT[:500], PROMPT, 256)  # 100 to prefill
    assert (head, kept, common) == ([], PROMPT, 500)


def test_typing_on_after_a_short_window_stays_anchored_where_the_cache_begins():
    cached = PROMPT[344:590]  # the window a limit of 246 gave, ten tokens ago
    head, kept, common = plan(cached, PROMPT, 256)
    assert kept == PROMPT[344:] and head == [] and common == len(cached)


def test_an_anchor_that_would_still_prefill_too_much_is_not_used():
    cached = PROMPT[100:150]  # begins inside the prompt, but 450 tokens would follow it
    head, kept, common = plan(cached, PROMPT, 256)
    assert kept == PROMPT[-256:] and common == 0


def test_a_partly_warmed_window_is_resumed_on_little_overlap():
    cached = PROMPT[:64]  # an interrupted warm of this window, before the cursor moved 5 tokens on
    slid = PROMPT[5:] + [7, 8, 9, 10, 11]
    assert plan(cached, slid, 0) == ([], slid, 0)  # a completion does not keep so little
    head, kept, common = plan(cached, slid, 0, partial=True)
    assert head == PROMPT[:5] and kept == slid and common == 64


# -- the real model --------------------------------------------------------------------------------


@pytest.fixture
def ids(runtime):
    ids = runtime.encode(CODE)
    assert len(ids) > 1200
    runtime.forget_prefix()
    yield ids[:1200]
    runtime.forget_prefix()


def fresh(runtime, prompt, new_tokens):
    runtime.forget_prefix()
    return runtime.generate(prompt, max_new_tokens=new_tokens)


def test_a_limited_prefill_generates_what_its_shorter_window_generates(runtime, ids):
    prompt = ids[:900]
    short = runtime.generate(prompt, max_new_tokens=12, prefill_limit=300)
    assert short.dropped_tokens == 600 and short.prompt_tokens == 300 and short.reused_tokens == 0
    # Typing on: the window stays where the cache begins and only the new tokens are prefilled.
    typed = runtime.generate(ids[:910], max_new_tokens=12, prefill_limit=300)
    assert typed.dropped_tokens == 600 and typed.prompt_tokens == 310
    assert typed.reused_tokens >= 299
    assert short.text == fresh(runtime, prompt[-300:], 12).text
    assert typed.text == fresh(runtime, ids[600:910], 12).text


def test_warm_brings_the_whole_window_back(runtime, ids):
    runtime.generate(ids[:900], max_new_tokens=4, prefill_limit=300)
    assert runtime.warm(ids[:900]) is True
    after = runtime.generate(ids[:905], max_new_tokens=12, prefill_limit=300)
    assert after.dropped_tokens == 0 and after.prompt_tokens == 905
    assert after.reused_tokens >= 899
    assert after.text == fresh(runtime, ids[:905], 12).text
    # A window already held is not prefilled again.
    assert runtime.warm(ids[:905]) is True


def test_an_interrupted_warm_keeps_the_current_window_and_resumes_later(runtime, ids):
    runtime.generate(ids[:900], max_new_tokens=4, prefill_limit=300)
    polls = iter(range(1000))
    stopped = runtime.warm(ids[:900], should_stop=lambda: next(polls) >= 3)  # two chunks, then stop
    assert stopped is False
    assert runtime._spare.length == 2 * WARM_CHUNK
    # The keystroke after it still finds its short window.
    typed = runtime.generate(ids[:903], max_new_tokens=4, prefill_limit=300)
    assert typed.reused_tokens >= 299 and typed.dropped_tokens == 600
    # The next warm (the cursor moved on) starts from what the interrupted one prefilled.
    assert runtime.warm(ids[2:903]) is True
    after = runtime.generate(ids[2:906], max_new_tokens=12, prefill_limit=300)
    assert after.dropped_tokens == 0 and after.head_tokens == 2 and after.reused_tokens >= 900
    assert after.text == fresh(runtime, ids[:906], 12).text


def test_warm_gives_way_to_foreground_work(runtime, ids):
    runtime.generate(ids[:900], max_new_tokens=4, prefill_limit=300)
    with foreground():
        assert runtime.warm(ids[:900]) is False
    # Foreground work that starts while a warm runs stops it at the next chunk.
    polled, entered = threading.Event(), threading.Event()
    result = {}

    def should_stop():
        polled.set()
        entered.wait(60)
        return False

    def warm():
        result["warm"] = runtime.warm(ids[:1200], should_stop=should_stop)

    worker = threading.Thread(target=warm)
    worker.start()
    assert polled.wait(60)
    with foreground():
        entered.set()
        worker.join(60)
    assert result["warm"] is False
    assert runtime.generate(ids[:900], max_new_tokens=2, prefill_limit=300).reused_tokens >= 299


def test_a_completion_far_from_the_cached_window_answers_from_a_shorter_one(runtime):
    text = CODE
    config = CompletionConfig(max_tokens=8, keystroke_prefill_tokens=256, prefix_tokens=1024)
    request = CompletionRequest(text, len(text), "python")
    runtime.forget_prefix()
    first = complete(runtime, request, config)
    assert first is not None and first.dropped_tokens > 0 and first.prompt_tokens == 256
    assert warm_window(runtime, request, config) is True
    again = complete(runtime, request, config)
    assert again is not None and again.dropped_tokens == 0 and again.prompt_tokens > 900
    unlimited = complete(runtime, request, CompletionConfig(max_tokens=8, keystroke_prefill_tokens=0))
    assert unlimited is not None and again.text == unlimited.text


def test_the_window_is_warmed_after_references_not_encoded_yet(runtime, tmp_path):
    """A keystroke composes the references that are ready; the window warmed while idle follows all
    of them, the missing ones encoded first, so the next keystroke reads the whole window after its
    references (warmed after the ready ones only, it no longer matched once the rest were ready)."""
    from context.config import SquidCacheConfig
    from context.squid.references import CompletionReferences
    from context.squid.service import SquidService

    units = "def to_metres(feet):\n    return feet * 0.3048\n"
    text = CODE + "\n\ndef stride(feet):\n    return to_metres("
    # No background encoder: a reference is encoded only when someone waits for it.
    service = SquidService(runtime, SquidCacheConfig(document_tokens=64), None, start_thread=False)
    open_documents = {"/w/units.py": units, "/w/cur.py": text}
    references = CompletionReferences(service, current_path="/w/cur.py", open_documents=open_documents,
                                      search=None, symbols=lambda names, limit: [])
    config = CompletionConfig(max_tokens=8, keystroke_prefill_tokens=256, prefix_tokens=1024)
    request = CompletionRequest(text, len(text), "python", "/w/cur.py")
    runtime.forget_prefix()
    first = complete(runtime, request, config, references=references)
    assert first is not None and first.reference_tokens == 0  # not encoded: not read
    assert first.dropped_tokens > 0 and first.prompt_tokens == 256
    held = []
    warm = runtime.warm

    def watched_warm(*args, **kwargs):
        held.append(service._paused())  # the background encoder waits while the window warms
        return warm(*args, **kwargs)

    runtime.warm = watched_warm
    try:
        assert warm_window(runtime, request, config, references=references) is True
    finally:
        del runtime.warm
    assert held == [True] and not service._paused()
    again = complete(runtime, request, config, references=references)
    assert again is not None and again.reference_tokens > 0  # encoded by the warm
    assert again.dropped_tokens == 0 and again.prompt_tokens > 900
    service.stop()


def test_the_warms_reference_encodes_give_way_and_keep_their_work(runtime, monkeypatch):
    """A warm encodes the references not encoded yet before the window; those encodes stop for the
    next keystroke as the prefill does, and the next warm goes on from where they stopped."""
    from context.config import SquidCacheConfig
    from context.squid.encode import DocumentEncoding
    from context.squid.references import CompletionReferences
    from context.squid.service import SquidService

    units = "def to_metres(feet):\n" + "".join(f"    step_{i} = feet * {i}\n" for i in range(60))
    text = CODE + "\n\ndef stride(feet):\n    return to_metres("
    service = SquidService(runtime, SquidCacheConfig(document_tokens=512), None, start_thread=False)
    # Open files composed whole (no symbols): one long reference.
    references = CompletionReferences(service, current_path="/w/cur.py",
                                      open_documents={"/w/units.py": units, "/w/cur.py": text},
                                      search=None)
    config = CompletionConfig(max_tokens=8, keystroke_prefill_tokens=256, prefix_tokens=1024)
    request = CompletionRequest(text, len(text), "python", "/w/cur.py")
    runtime.forget_prefix()

    def a_keystroke_comes() -> bool:  # the next keystroke, once the encode is under way
        return any(encoding.done for encoding in encodings)

    encodings = []
    real = DocumentEncoding.run

    def watched(self, *args, **kwargs):
        encodings.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DocumentEncoding, "run", watched)
    stopped = warm_window(runtime, request, config, references=references, should_stop=a_keystroke_comes)
    assert stopped is False
    assert service.stats()["paused"] == 1 and service.encoded == 0
    done = next(iter(service._partial.values())).done
    assert done > 0
    assert warm_window(runtime, request, config, references=references) is True
    assert service.encoded == 1 and service.stats()["resumed_tokens"] == done
    answer = complete(runtime, request, config, references=references)
    assert answer.reference_tokens > 200 and answer.dropped_tokens == 0
    service.stop()


# A method whose neighbours open with docstrings: the model opens one too.
DOCSTRING_STYLE = '''class Inventory:
    """Items on hand, by name."""

    def add(self, name, count=1):
        """Add `count` of `name` to the inventory.

        A name not seen before starts at zero.
        """
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count=1):
        '''


def test_a_completion_cut_inside_its_docstring_closes_it_or_is_not_offered(runtime):
    request = CompletionRequest(DOCSTRING_STYLE, len(DOCSTRING_STYLE), "python")
    raw = runtime.generate(runtime.encode(DOCSTRING_STYLE), max_new_tokens=8)
    assert raw.text.lstrip().startswith('"""') and leaves_open(raw.text)  # 8 tokens end inside it
    finished = complete(runtime, request, CompletionConfig(max_tokens=8, finish_tokens=32))
    assert finished is not None and finished.new_tokens > 8
    assert finished.text.startswith('"""Remove') and not leaves_open(finished.text)
    assert finished.text.index('"""', 3) > 0  # the docstring is closed in the suggestion itself
    # Without more tokens the open docstring is cut back, here to nothing: no suggestion.
    assert complete(runtime, request, CompletionConfig(max_tokens=8, finish_tokens=0)) is None
