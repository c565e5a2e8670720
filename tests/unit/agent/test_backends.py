"""The OpenAI-compatible backend against a loopback server double (FakeOpenAIServer), and the local
backend's prompt, sampling and log-probability with the real model."""

from __future__ import annotations

import time

import pytest

from agent.backends import (
    Conversation,
    Document,
    LocalBackend,
    OpenAIBackend,
    Sample,
    build_local_prompt,
    split_local_prompt,
)
from agent.errors import BackendAuthError, BackendConnectionError, BackendError, BackendTimeoutError
from tests.unit.agent.doubles import FakeOpenAIServer, chat_completion

CONV = Conversation(
    "system text",
    "calc.py:\n  def add(a, b)",
    [Document("calc.py", "def add(a, b):\n    return a - b")],
    [{"role": "user", "content": "fix add"}],
)


def backend(server, **kw):
    return OpenAIBackend(server.base_url, "test-model", "sk-test", backoff_s=0.01, **kw)


def test_non_streamed_choices_tool_calls_and_logprobs():
    tool_calls = [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "calc.py"}'},
        }
    ]
    with FakeOpenAIServer(
        [chat_completion("", "second", tool_calls=tool_calls, logprobs=[-0.5, -1.5])]
    ) as server:
        samples = backend(server, stream=False).sample(CONV, 2, temperature=0.7, max_tokens=64)
        request, headers = server.requests[0], server.headers[0]
    assert [s.text for s in samples] == ["", "second"]
    assert samples[0].tool_calls[0].name == "read_file" and samples[0].tool_calls[0].args == {
        "path": "calc.py"
    }
    assert [s.logprob for s in samples] == [-0.5, -1.5]
    assert request["n"] == 2 and request["temperature"] == 0.7 and request["model"] == "test-model"
    assert request["messages"][0]["role"] == "system" and "calc.py" in request["messages"][0]["content"]
    assert headers["Authorization"] == "Bearer sk-test"


def test_streamed_chunks_are_assembled_per_choice_with_tool_call_deltas():
    chunks = [
        {
            "choices": [
                {"index": 0, "delta": {"content": "Hel"}},
                {
                    "index": 1,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "c9", "function": {"name": "grep", "arguments": '{"pat'}}
                        ]
                    },
                },
            ]
        },
        {
            "choices": [
                {"index": 0, "delta": {"content": "lo"}, "logprobs": {"content": [{"logprob": -0.25}]}},
                {
                    "index": 1,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'tern": "x"}'}}]},
                },
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    with FakeOpenAIServer([{"stream": chunks}]) as server:
        samples = backend(server).sample(CONV, 2, temperature=0.0, max_tokens=64)
    assert samples[0].text == "Hello" and samples[0].logprob == -0.25 and samples[0].finish_reason == "stop"
    assert samples[1].tool_calls[0].name == "grep" and samples[1].tool_calls[0].args == {"pattern": "x"}


def test_auth_errors_are_clear_and_not_retried():
    with FakeOpenAIServer([{"status": 401, "error": "bad key"}, chat_completion("never")]) as server:
        with pytest.raises(BackendAuthError, match="refused the API key"):
            backend(server).sample(CONV, 1, temperature=0, max_tokens=8)
        assert len(server.requests) == 1


def test_server_errors_are_retried_with_backoff_then_succeed():
    with FakeOpenAIServer([{"status": 503}, {"status": 429}, chat_completion("ok")]) as server:
        samples = backend(server, stream=False).sample(CONV, 1, temperature=0, max_tokens=8)
        assert samples[0].text == "ok" and len(server.requests) == 3


def test_retries_are_bounded():
    with FakeOpenAIServer([{"status": 500}] * 5) as server:
        with pytest.raises(BackendError, match="HTTP 500"):
            OpenAIBackend(server.base_url, "m", retries=1, backoff_s=0.01).sample(
                CONV, 1, temperature=0, max_tokens=8
            )
        assert len(server.requests) == 2


def test_garbage_answers_are_a_backend_error():
    for garbage in ("garbage", {"choices": "nope"}, {"stream": ["{not json"]}, {"stream": []}):
        with FakeOpenAIServer([garbage]) as server:
            with pytest.raises(BackendError):
                OpenAIBackend(server.base_url, "m", retries=0).sample(CONV, 1, temperature=0, max_tokens=8)


def test_a_server_that_hangs_times_out():
    with FakeOpenAIServer([("sleep", 3, chat_completion("late"))]) as server:
        started = time.monotonic()
        with pytest.raises(BackendTimeoutError, match="did not answer in time"):
            OpenAIBackend(server.base_url, "m", timeout_s=0.5, retries=0).sample(
                CONV, 1, temperature=0, max_tokens=8
            )
        assert time.monotonic() - started < 3


def test_nothing_listening_is_a_connection_error():
    with pytest.raises(BackendConnectionError, match="cannot connect"):
        OpenAIBackend("http://127.0.0.1:9/v1", "m", retries=0, timeout_s=2).sample(
            CONV, 1, temperature=0, max_tokens=8
        )


def test_local_prompt_holds_documents_and_ends_with_the_started_block(runtime):
    prompt = build_local_prompt(
        runtime.tokenizer,
        "SYS",
        "MAP",
        [Document("calc.py", "def add(): ...")],
        [{"role": "user", "content": "fix add"}],
    )
    assert prompt.index("SYS") < prompt.index("MAP") < prompt.index("File calc.py") < prompt.index("fix add")
    assert prompt.endswith("<|im_start|>assistant\n```")


def test_local_sampling_is_batched_seeded_and_ranked(runtime, monkeypatch):
    local = LocalBackend(runtime)
    small = Conversation("Answer with code.", "", [], [{"role": "user", "content": "def add(a, b):"}])
    batches = []
    real_batch = runtime.generate_batch

    def counted(*args, **kwargs):
        batches.append(args[1])
        return real_batch(*args, **kwargs)

    monkeypatch.setattr(runtime, "generate_batch", counted)
    one = local.sample(small, 3, temperature=0.9, max_tokens=6, seed=5)
    again = local.sample(small, 3, temperature=0.9, max_tokens=6, seed=5)
    assert batches == [3, 3]  # K candidates in one batched decode
    assert len(one) == 3 and all(s.text.startswith("```") for s in one)
    assert [s.text for s in one] == [s.text for s in again]  # seeded
    # Greedy candidates of the batch decode exactly like a single generation.
    greedy = local.sample(small, 1, temperature=0.0, max_tokens=6)[0]
    assert [s.text for s in local.sample(small, 2, temperature=0.0, max_tokens=6)] == [greedy.text] * 2
    lp = local.logprob(small, greedy)
    worse = local.logprob(small, Sample("```zebra quantum banana", [], 3))
    assert lp is not None and worse is not None and lp > worse


def test_the_split_prompt_is_the_plain_prompt_with_the_documents_between(runtime):
    docs = [Document("calc.py", "def add(a, b):\n    return a - b\n"), Document("t.py", "import calc\n")]
    turns = [{"role": "user", "content": "fix add"}, {"role": "assistant", "content": "```tool"}]
    head, tail = split_local_prompt(runtime.tokenizer, "SYS", "", turns)
    blocks = "".join(f"File {d.rel} (from line 1):\n```\n{d.text.rstrip()}\n```\n\n" for d in docs)
    assert head + blocks + tail == build_local_prompt(runtime.tokenizer, "SYS", "", docs, turns)
    assert head.endswith("<|im_start|>user\n") and "SYS" in head
    # The repo map changes per request: it moves after the documents, into the tail.
    _, with_map = split_local_prompt(runtime.tokenizer, "SYS", "MAP", turns)
    assert with_map.startswith("Repository map:\nMAP\n\n") and with_map.endswith(tail)


def test_local_documents_through_squid_are_not_in_the_prompt_text(runtime, tmp_path, monkeypatch):
    from context.config import SquidCacheConfig
    from context.squid.service import SquidService

    encodes = []
    real_encode = SquidService._encode

    def counted(self, *args, **kwargs):
        encodes.append(1)
        return real_encode(self, *args, **kwargs)

    monkeypatch.setattr(SquidService, "_encode", counted)
    local = LocalBackend(runtime, squid=SquidCacheConfig(), squid_disk=tmp_path / "kv")
    doc = Document("calc.py", "def add(a, b):\n    return a - b\n")
    conversation = Conversation("Answer with code.", "", [doc], [{"role": "user", "content": "fix add"}])
    prompt_ids, composed = local._prepared(conversation)
    assert composed is not None and len(composed.spans) == 1 and len(encodes) == 1
    assert "calc.py" not in runtime.decode(prompt_ids)  # composed in front, not prefilled again
    assert "calc.py" in runtime.decode(list(composed.token_ids))
    assert "calc.py" in LocalBackend(runtime).prompt(conversation)
    greedy = local.sample(conversation, 1, temperature=0.0, max_tokens=6)[0]
    twice = local.sample(conversation, 2, temperature=0.0, max_tokens=6)
    assert [s.text for s in twice] == [greedy.text] * 2
    assert len(encodes) == 1  # the document was encoded once, then reused by every call
    assert local.logprob(conversation, greedy) is not None
    # A later episode (a new backend, the same disk tier) reads the document from disk.
    again = LocalBackend(runtime, squid=SquidCacheConfig(), squid_disk=tmp_path / "kv")
    assert again.sample(conversation, 1, temperature=0.0, max_tokens=6)[0].text == greedy.text
    assert len(encodes) == 1


def test_an_unnamed_model_is_the_one_the_server_lists():
    from agent.session import make_backend
    from context.config import AgentConfig
    from tests.e2e.editor_support import FakeOpenAIServer as ListingServer

    with ListingServer("ok") as server:
        config = AgentConfig(backend="openai", base_url=server.base_url, model="")
        backend = make_backend(config, lambda: None)
        assert backend.model == "fake"
        backend.close()


def test_an_unnamed_model_without_a_reachable_server_is_a_clear_error():
    from agent.errors import AgentError
    from agent.session import make_backend
    from context.config import AgentConfig

    config = AgentConfig(backend="openai", base_url="http://127.0.0.1:9/v1", model="", request_timeout_s=2)
    with pytest.raises(AgentError, match="set agent.model"):
        make_backend(config, lambda: None)


def test_a_server_that_ignores_n_is_asked_once_per_missing_candidate_with_its_own_seed():
    # llama.cpp's and Ollama's servers answer one choice whatever `n` asks for.
    with FakeOpenAIServer([chat_completion("a"), chat_completion("b"), chat_completion("c")]) as server:
        samples = backend(server, stream=False).sample(CONV, 3, temperature=0.7, max_tokens=8, seed=40)
        requests = server.requests
    assert [s.text for s in samples] == ["a", "b", "c"]
    assert [r["n"] for r in requests] == [3, 2, 1]
    assert [r["seed"] for r in requests] == [40, 41, 42]


def test_extra_choices_beyond_k_are_dropped():
    with FakeOpenAIServer([chat_completion("a", "b", "c")]) as server:
        samples = backend(server, stream=False).sample(CONV, 2, temperature=0.7, max_tokens=8)
        assert len(server.requests) == 1
    assert [s.text for s in samples] == ["a", "b"]
