"""The service a server runs: ready documents composed, missing ones encoded in the background,
paused while a request runs, keyed by model and adapter, dropped when their file changes; and the
completion path reading its references through it."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import replace

import pytest
import torch

from agent.completion import CompletionRequest, complete
from context.config import CompletionConfig, SquidCacheConfig
from context.squid import Recovery
from context.squid.encode import encode_document
from context.squid.references import CompletionReferences, retrieval_query, select_references
from context.squid.service import BACKGROUND_CHUNK, ReferenceDocument, SquidService, recovery_from_config

DOC_A = ReferenceDocument("# util.py\ndef clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n",
                          source="/w/util.py")
DOC_B = ReferenceDocument("# names.py\nGREETING = 'hello'\n", source="/w/names.py")
CONFIG = SquidCacheConfig(recompute_first=4, document_tokens=64)


@pytest.fixture
def service(runtime, tmp_path):
    svc = SquidService(runtime, CONFIG, tmp_path)
    yield svc
    svc.stop()


def test_missing_documents_are_encoded_in_the_background_then_composed(service):
    with service.foreground():  # as a request does: the encoder waits
        assert service.context_for([DOC_A, DOC_B]) is None
        assert service.stats()["queued"] == 2
    assert service.wait_idle(120)
    assert service.encoded == 2
    ctx = service.context_for([DOC_A, DOC_B])
    assert ctx is not None and len(ctx.spans) == 2
    assert ctx.recomputed_fraction > 0  # the configured first-4 recovery ran
    # Both were persisted by the background encoder.
    assert service.stats()["tiers"]["disk"]["entries"] == 2


def test_the_configured_recovery_is_the_one_composed(runtime, tmp_path):
    config = replace(CONFIG, recompute_first=0, recompute_last=5, recompute_following=-1)
    assert recovery_from_config(config) == Recovery(last_k=5, following=None)
    windowed = replace(config, recompute_window=512, recompute_sinks=8)
    assert recovery_from_config(windowed) == Recovery(last_k=5, following=None, window=512, sinks=8)
    svc = SquidService(runtime, config, tmp_path)
    try:
        ctx = svc.context_for([DOC_A, DOC_B], wait=True)
        # Only the last 5 tokens were recomputed: the second document's, nearest the query.
        assert ctx.recovery.last_k == 5
        lengths = [end - start for start, end in ctx.spans]
        assert ctx.recomputed_fraction == pytest.approx(5 / sum(lengths))
    finally:
        svc.stop()


def test_wait_encodes_in_the_request(service):
    ctx = service.context_for([DOC_B], wait=True)
    assert ctx is not None and ctx.spans == ((service.prefix().length, ctx.offset),)


def test_the_same_references_reuse_the_last_composition(service):
    first = service.context_for([DOC_A, DOC_B], wait=True)
    assert service.context_for([DOC_A, DOC_B]) is first
    swapped = service.context_for([DOC_B, DOC_A])
    assert swapped is not first and swapped.token_ids != first.token_ids
    # Each request's cache is its own: extending one leaves the composition intact.
    cache = first.new_cache()
    cache.update(first.keys[0:1, :, :1].clone(), first.values[0:1, :, :1].clone(), 0)
    assert cache.get_seq_length() == first.offset + 1
    assert first.new_cache().get_seq_length() == first.offset


def test_background_encoding_pauses_while_a_request_runs(service):
    with service.foreground():
        service.schedule([DOC_A])
        time.sleep(0.5)
        assert service.encoded == 0, "the encoder must wait for the request"
    assert service.wait_idle(120) and service.encoded == 1


@contextlib.contextmanager
def _request_mid_encode(svc: SquidService, doc: ReferenceDocument):
    """`doc` scheduled; once its encode is a few chunks in, a request holds the service (inside the
    block) and the encoder has given way."""
    svc.schedule([doc])
    deadline = time.monotonic() + 60
    while not svc._inflight.is_set() and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.3)  # a few chunks in
    with svc.foreground():
        while svc._inflight.is_set() and time.monotonic() < deadline + 30:
            time.sleep(0.005)
        yield


def test_a_request_starting_mid_encode_pauses_it_within_a_chunk(runtime, tmp_path):
    long_doc = ReferenceDocument("x = 1\n" * 200, source="/w/long.py")
    svc = SquidService(runtime, replace(CONFIG, document_tokens=400), tmp_path)
    try:
        with _request_mid_encode(svc, long_doc):
            # The encoder gave up its place between two chunks and put the document back, with
            # what it had encoded.
            assert not svc._inflight.is_set() and svc.encoded == 0
            assert svc.stats()["queued"] == 1 and svc.stats()["paused"] == 1
            done = next(iter(svc._partial.values())).done
            assert 0 < done < 400
            # ... and its thread ended: no live thread but the request's holds an OpenMP team.
            assert _encoder_thread_ends(svc)
        assert svc.wait_idle(180) and svc.encoded == 1
        assert _encoder_thread_ends(svc), "out of work, the encoder thread ends"
        # It went on from where it paused, and what it stored is what an encode never paused gives.
        stats = svc.stats()
        assert stats["paused"] == 0 and stats["resumed_tokens"] >= done
        ids, key = svc._tokens_and_key(svc.prefix(), long_doc)
        stored = svc.store.get(key)
        whole = encode_document(runtime, svc.prefix(), ids, key, chunk_tokens=BACKGROUND_CHUNK)
        assert torch.equal(stored.keys, whole.keys) and torch.equal(stored.values, whole.values)
    finally:
        svc.stop()


def test_a_paused_encode_of_a_changed_file_is_dropped(runtime, tmp_path):
    long_doc = ReferenceDocument("y = 2\n" * 200, source="/w/changing.py")
    svc = SquidService(runtime, replace(CONFIG, document_tokens=400), tmp_path)
    try:
        with _request_mid_encode(svc, long_doc):
            assert svc.stats()["paused"] == 1
            svc.invalidate_paths(["/w/changing.py"])
            stats = svc.stats()
            assert (stats["queued"], stats["paused"], stats["encoded"]) == (0, 0, 0)
    finally:
        svc.stop()


def test_an_encode_paused_after_its_file_changed_is_not_kept(runtime, tmp_path):
    from context.errors import GenerationCancelled

    svc = SquidService(runtime, replace(CONFIG, document_tokens=400), tmp_path, start_thread=False)
    try:
        doc = ReferenceDocument("z = 3\n" * 100, source="/w/moving.py")
        epoch = svc.epoch()
        ids, key = svc._tokens_and_key(svc.prefix(), doc)
        polls = []

        def the_file_changes_then_a_request_comes() -> bool:
            polls.append(1)
            if len(polls) == 2:
                svc.invalidate_paths(["/w/moving.py"])
            return len(polls) == 3

        with pytest.raises(GenerationCancelled):
            svc._encode(svc.prefix(), ids, key, doc.source, the_file_changes_then_a_request_comes,
                        BACKGROUND_CHUNK, epoch=epoch)
        assert svc.stats()["paused"] == 0
        # Paused before any change, it is kept.
        with pytest.raises(GenerationCancelled):
            svc._encode(svc.prefix(), ids, key, doc.source, lambda: len(polls) > 3 or polls.append(1),
                        BACKGROUND_CHUNK, epoch=svc.epoch())
        assert svc.stats()["paused"] == 1
    finally:
        svc.stop()


def _encoder_thread_ends(service: SquidService, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(t.name == "squid-preencode" for t in threading.enumerate()):
            return True
        time.sleep(0.01)
    return False


def test_the_encoder_thread_lives_only_while_it_has_work(runtime, service):
    assert not any(t.name == "squid-preencode" for t in threading.enumerate()), "no work, no thread"
    service.schedule([DOC_A])
    assert service.wait_idle(120) and service.encoded == 1
    assert _encoder_thread_ends(service)
    # Work queued later starts a new one.
    service.schedule([DOC_B])
    assert service.wait_idle(120) and service.encoded == 2
    assert _encoder_thread_ends(service)
    # A service that does not pre-encode never starts one.
    quiet = SquidService(runtime, replace(CONFIG, preencode=False), None)
    assert quiet.schedule([DOC_A, DOC_B]) == 0 and quiet._thread is None


def test_another_adapter_never_reuses_caches(runtime, service):
    assert service.context_for([DOC_A], wait=True) is not None
    before = service.encoded
    runtime.adapter_id = "adapter-under-test"
    try:
        assert service.context_for([DOC_A]) is None, "a base-model cache must not serve an adapter"
        assert service.prefix().adapter == "adapter-under-test"
    finally:
        runtime.adapter_id = None
    assert service.context_for([DOC_A]) is not None and service.encoded == before


def test_changed_files_are_invalidated(service):
    service.context_for([DOC_A, DOC_B], wait=True)
    assert service.invalidate_paths(["/w/util.py"]) == 1
    ctx = service.context_for([DOC_A, DOC_B])
    assert ctx is not None and len(ctx.spans) == 1  # only names.py is still cached


def test_text_read_before_its_file_changed_is_never_stored(service, tmp_path):
    # Read before the change, queued after it (the repo map's pre-encode reads files, then queues).
    epoch = service.epoch()
    service.invalidate_paths(["/w/util.py"])
    with service.foreground():
        assert service.schedule([DOC_A, DOC_B], epoch=epoch) == 2
    assert service.wait_idle(120) and service.encoded == 2
    ctx = service.context_for([DOC_A, DOC_B])
    assert ctx is not None and len(ctx.spans) == 1, "only names.py, read after nothing changed, is kept"
    sources = {p.name for p in tmp_path.rglob("*.safetensors")}
    assert len(sources) == 1


def test_an_encode_running_when_its_file_changes_is_dropped(service, tmp_path, monkeypatch):
    import context.squid.service as service_module

    real_encode = service_module.DocumentEncoding.run

    def encode_while_the_file_changes(*args, **kwargs):
        entry = real_encode(*args, **kwargs)
        service.invalidate_paths(["/w/util.py"])  # the watcher's event lands before the encode ends
        return entry

    monkeypatch.setattr(service_module.DocumentEncoding, "run", encode_while_the_file_changes)
    # A request that waits still gets its context from the text it read ...
    ctx = service.context_for([DOC_A], wait=True, persist=True)
    assert ctx is not None and len(ctx.spans) == 1
    # ... but the old text's cache is kept in no tier.
    monkeypatch.setattr(service_module.DocumentEncoding, "run", real_encode)
    assert not service.store.contains(service._tokens_and_key(service.prefix(), DOC_A)[1])
    assert not list(tmp_path.rglob("*.safetensors"))


def test_retrieval_query_takes_identifiers_nearest_the_cursor():
    text = "import os\nfrom shop import Basket\n\ndef total(basket):\n    return basket_total("
    assert retrieval_query(text).split()[:2] == ["basket_total", "basket"]
    assert "def" not in retrieval_query(text).split()


class _Hit:
    def __init__(self, path, text):
        self.path, self.rel, self.start_line, self.text = path, path.rsplit("/", 1)[-1], 3, text


def test_select_references_prefers_open_files_and_skips_the_current_one():
    calls = []

    def search(query, k):
        calls.append((query, k))
        return [_Hit("/w/cur.py", "def own(): pass"), _Hit("/w/other.py", "def helper(): pass"),
                _Hit("/w/open.py", "dup")]

    docs = select_references(
        current_path="/w/cur.py", prefix_text="helper(",
        open_documents={"/w/cur.py": "me", "/w/open.py": "x = 1"}, search=search, max_documents=3,
        max_tokens=64,
    )
    assert [d.source for d in docs] == ["/w/open.py", "/w/other.py"]
    assert docs[1].text.startswith("# other.py:3\n") and calls == [("helper", 6)]


def test_completion_reads_references_through_squid(runtime, service):
    config = CompletionConfig(max_tokens=8, debounce_ms=0)
    text = "def shout(name):\n    return "
    request = CompletionRequest(text, len(text), "python", "/w/cur.py")
    refs = CompletionReferences(service, current_path="/w/cur.py",
                                open_documents={"/w/names.py": DOC_B.text}, search=None)
    first = complete(runtime, request, config, references=refs)
    assert first is not None and first.reference_tokens == 0  # not encoded yet: no waiting
    assert service.wait_idle(120)
    second = complete(runtime, request, config, references=refs)
    assert second is not None and second.reference_tokens > first.prompt_tokens // 4
    # The served prompt names the documents it followed: content hash, file, tokens (no text).
    (reference,) = second.prompt.references
    assert reference.path == "/w/names.py" and reference.hash
    assert 0 < reference.tokens < second.reference_tokens  # the shared prefix comes first
    assert first.prompt.references == ()
    off = complete(runtime, request, config)
    assert off is not None and off.reference_tokens == 0 and off.text == first.text


def test_a_failing_reference_source_never_breaks_a_completion(runtime):
    class Broken:
        def foreground(self):
            return threading.Lock()

        def compose(self, prefix, wait=False):
            raise RuntimeError("simulated failure")

    text = "def add(a, b):\n    return "
    result = complete(runtime, CompletionRequest(text, len(text)), CompletionConfig(max_tokens=6),
                      references=Broken())
    assert result is not None and result.reference_tokens == 0
