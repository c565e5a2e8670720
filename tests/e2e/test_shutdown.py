"""The server stops cleanly however a connection ends: `shutdown` + `exit` in the middle of the model
load, the first index pass, a completion or the pre-encoding of references; `exit` alone; a client
that vanishes without a word. Every connection must end with the exit code LSP asks for (0 after
`shutdown`, 1 for `exit` without it, 0 when the client just went away), never by a signal (the
SIGABRT of a thread left inside torch), and with nothing in stderr that reads as a failure (a request
touching a closed store, a traceback, an error sent to a closed pipe).

Each case starts its own server on a fresh copy of the standard library's `email` package with
Squid and the index on (tests/e2e/connection_ends.py); `bench/bench_shutdown.py` runs 200 of them.
"""

from __future__ import annotations

import pytest

from tests.e2e.connection_ends import ConnectionEnd, random_ends, run_connection
from tests.e2e.raw_lsp import start_client

pytestmark = pytest.mark.e2e

# Every moment once, each ending at least once; then one ended at a random moment (the benchmark
# draws 200 of them).
CHOSEN = [
    ConnectionEnd("model-load", "shutdown", 0.0),
    ConnectionEnd("index", "exit-only", 0.5),
    ConnectionEnd("completion", "shutdown", 0.2),
    ConnectionEnd("preencode", "vanish", 0.1),
    ConnectionEnd("idle", "shutdown", 0.0),
]
RANDOM = random_ends(1, seed=7)


def _check(outcome) -> None:
    assert outcome.exit_code is not None, f"{outcome.end}: the server did not exit"
    assert outcome.exit_code >= 0, f"{outcome.end}: killed by signal {-outcome.exit_code}"
    assert outcome.exit_code == outcome.expected_code, outcome
    assert outcome.failures == [], outcome
    # Stopping never waits on more than a model load's grace period plus the index's next batch.
    assert outcome.exit_s < 30, outcome


@pytest.mark.parametrize("end", CHOSEN + RANDOM, ids=lambda e: f"{e.moment}-{e.ending}-{e.delay_s}")
def test_connection_ends_cleanly(end: ConnectionEnd, model_cache_dir, tmp_path):
    _check(run_connection(end, tmp_path))


@pytest.mark.parametrize("ending", ["shutdown", "vanish"])
def test_a_connection_ended_while_the_squid_reader_is_built_ends_cleanly(ending, runtime, model_cache_dir,
                                                                         tmp_path):
    """The reader's copy of the model is built on a thread (about 2 s) from the first completion on:
    ended as that completion answers, the server waits for the build and exits as LSP asks."""
    from tests.unit.squid.test_reader import reader_with_weights

    reader = reader_with_weights(runtime, tmp_path / "reader", scale=0.01)
    end = ConnectionEnd("preencode", ending, 0.0)  # as the first completion answers
    _check(run_connection(end, tmp_path / "connection", squid={"reader": str(reader)}))


def test_requests_after_shutdown_get_an_error_and_exit_is_zero(model_cache_dir, tmp_path):
    client = start_client(tmp_path)
    try:
        client.initialize(root=tmp_path, options={"index": {"enabled": False}})
        assert "result" in client.request("shutdown", timeout=60)
        late = client.request("workspace/symbol", {"query": "x"}, timeout=30)
        assert late.get("error", {}).get("code") == -32600, late  # InvalidRequest
        client.notify("exit")
        assert client.proc.wait(timeout=30) == 0
    finally:
        client.close()
    log = client.stderr_path.read_text(errors="replace")
    assert "background work stopped" in log
    assert "Traceback" not in log
