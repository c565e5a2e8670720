"""Team collection: a real uploader against a real collector process over loopback, and the
uploader's rules for each kind of answer."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from context.config import FeedbackConfig
from feedback.collector import MAX_BODY_BYTES
from feedback.recorder import FeedbackRecorder
from feedback.redact import RULES_VERSION
from feedback.store import FeedbackStore
from feedback.upload import Uploader

TOKEN = "team-token-0123456789"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Collector:
    """`squidcode collector serve` as a subprocess."""

    def __init__(self, tmp_path: Path, port: int, db: str | None = None,
                 tls: tuple[Path, Path] | None = None):
        self.db = db or tmp_path / "collector.db"
        self.tokens = tmp_path / "tokens.txt"
        self.tokens.write_text(f"# team tokens\nacme={TOKEN}\n")
        self.port = port
        # tls: (certificate, key) for HTTPS; the certificate is then what this client trusts.
        self.tls = tls
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        self.verify = ssl.create_default_context(cafile=str(tls[0])) if tls else True
        self.process: subprocess.Popen | None = None

    def start(self) -> Collector:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lsp_server",
                "collector",
                "serve",
                "--db",
                str(self.db),
                "--port",
                str(self.port),
                "--tokens",
                str(self.tokens),
                *(["--ssl-certfile", str(self.tls[0]), "--ssl-keyfile", str(self.tls[1])]
                  if self.tls else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/v1/health", timeout=1, verify=self.verify).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError(f"collector did not start: {self.process.stderr.read1().decode()}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None

    def stats(self) -> dict:
        return httpx.get(self.url + "/v1/stats", headers={"Authorization": f"Bearer {TOKEN}"},
                         verify=self.verify).json()


@pytest.fixture(scope="module")
def collector(tmp_path_factory):
    server = Collector(tmp_path_factory.mktemp("collector"), free_port()).start()
    yield server
    server.stop()


def sharing_recorder(tmp_path: Path, url: str, name: str = "f.db") -> FeedbackRecorder:
    config = FeedbackConfig(share=True, endpoint=url, token=TOKEN, upload_interval_s=0.1)
    return FeedbackRecorder(config, db_path=tmp_path / name)


def show(recorder: FeedbackRecorder, n: int) -> None:
    for i in range(n):
        recorder.record_completion_episode(
            uri=f"file:///a{i}.py", position=(0, i), output=f"x{i}", prompt_text="p", model_id="m"
        )


def wait(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def outbox(path: Path) -> int:
    store = FeedbackStore(path)
    try:
        return store.outbox_size()
    finally:
        store.close()


def test_uploads_reach_the_collector_and_resending_stores_nothing_twice(tmp_path, collector):
    before = collector.stats()["by_table"]
    recorder = sharing_recorder(tmp_path, collector.url)
    uploader = Uploader(recorder)
    uploader.start()
    show(recorder, 30)  # 30 episodes + 30 "shown" events
    recorder.flush()
    wait(lambda: outbox(recorder.db_path) == 0)
    after = collector.stats()["by_table"]
    assert after["episodes"] - before.get("episodes", 0) == 30
    assert after["events"] - before.get("events", 0) == 30
    # A batch sent again (its answer was lost, say) is stored once.
    store = FeedbackStore(recorder.db_path)
    batch = [{"id": r["id"], "table": "episodes", "row": r} for r in store.rows("episodes")][:5]
    answer = httpx.post(
        collector.url + "/v1/events", json={"events": batch}, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert answer.json() == {"accepted": 0, "duplicates": 5}
    assert collector.stats()["by_table"] == after
    uploader.stop()
    recorder.close()


def test_reference_documents_reach_the_collector_once_with_the_completions_naming_them(tmp_path, collector):
    from context.prompt_record import ReferenceIdentity, ServedPrompt

    before = collector.stats()["by_table"]
    recorder = sharing_recorder(tmp_path, collector.url)
    uploader = Uploader(recorder)
    uploader.start()
    documents = tuple(ReferenceIdentity(f"{tmp_path.name[-8:]}{i}", f"/w/m{i}.py", 4, f"M{i} = {i}\n")
                      for i in range(2))
    served = ServedPrompt(ids=(1, 2), text="x = ", references=documents, reference_tokens=8)
    for round_ in range(2):  # the same two documents named by three completions each time
        for i in range(3):
            recorder.record_completion_episode(uri=f"file:///w/r{round_}{i}.py", position=(0, 4), output="1",
                                               served=served, model_id="m")
        recorder.flush()
        wait(lambda: outbox(recorder.db_path) == 0)
        after = collector.stats()["by_table"]
        assert after["episodes"] - before.get("episodes", 0) == 3 * (round_ + 1)
        assert after["reference_documents"] - before.get("reference_documents", 0) == 2
        # Sent once, not sent again and ignored: 3 episodes and their "shown" events a round, 2 documents.
        assert uploader.sent == 6 * (round_ + 1) + 2
    uploader.stop()
    recorder.close()


def test_rows_recorded_before_sharing_was_on_stay_local(tmp_path, collector):
    recorder = FeedbackRecorder(
        FeedbackConfig(endpoint=collector.url, token=TOKEN), db_path=tmp_path / "f.db"
    )
    show(recorder, 3)
    recorder.flush()
    assert outbox(recorder.db_path) == 0  # sharing off: nothing queued
    recorder.close()


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (b"{not json", {}, 400),
        (json.dumps({"events": []}).encode(), {}, 422),
        (
            json.dumps({"events": [{"id": "a b", "table": "episodes", "row": {"id": "a b"}}]}).encode(),
            {},
            422,
        ),
        (json.dumps({"events": [{"id": "x1", "table": "secrets", "row": {"id": "x1"}}]}).encode(), {}, 422),
        (json.dumps({"events": [{"id": "x1", "table": "events", "row": {"id": "other"}}]}).encode(), {}, 422),
        (
            json.dumps({"events": [{"id": "x1", "table": "events", "row": {"id": "x1"}}]}).encode(),
            {"Authorization": "Bearer wrong-token-123"},
            401,
        ),
        (b"[" + b" " * (MAX_BODY_BYTES + 10) + b"]", {}, 413),
    ],
    ids=["bad-json", "empty", "bad-id", "bad-table", "id-mismatch", "bad-token", "too-large"],
)
def test_malformed_uploads_are_refused_and_store_nothing(collector, body, headers, status):
    before = collector.stats()["events"]
    sent = {"Authorization": f"Bearer {TOKEN}", "content-type": "application/json", **headers}
    answer = httpx.post(collector.url + "/v1/events", content=body, headers=sent, timeout=30)
    assert answer.status_code == status
    assert "error" in answer.json()
    assert collector.stats()["events"] == before
    # The collector still serves after refusing.
    good_id = f"ok{status}{len(body)}"
    good = {"events": [{"id": good_id, "table": "events", "row": {"id": good_id, "kind": "shown"}}]}
    assert (
        httpx.post(
            collector.url + "/v1/events", json=good, headers={"Authorization": f"Bearer {TOKEN}"}
        ).json()["accepted"]
        == 1
    )


def test_the_offline_queue_survives_a_restart_and_drains_when_the_collector_returns(tmp_path):
    port = free_port()
    collector = Collector(tmp_path, port)
    recorder = sharing_recorder(tmp_path, collector.url)
    uploader = Uploader(recorder)
    uploader.start()
    show(recorder, 10)
    recorder.flush()
    wait(lambda: uploader.failures >= 2)  # nobody listening: retried with backoff, queue kept
    assert outbox(recorder.db_path) == 20
    uploader.stop()
    recorder.close()
    # The editor restarts; the collector comes up.
    collector.start()
    try:
        again = sharing_recorder(tmp_path, collector.url)
        second = Uploader(again)
        second.start()
        wait(lambda: outbox(again.db_path) == 0)
        assert collector.stats()["events"] == 20
        second.stop()
        again.close()
    finally:
        collector.stop()


class ScriptedCollector(httpx.BaseTransport):
    """A test double for a collector that answers with the status codes it is given, in order."""

    def __init__(self, *statuses: int):
        self.statuses = list(statuses)
        self.batches: list[int] = []
        self.rules: list[int | None] = []  # the redaction rules each batch says it was redacted under

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        payload = json.loads(request.content)
        self.batches.append(len(payload["events"]))
        self.rules.append(payload.get("redaction_rules"))
        return httpx.Response(self.statuses.pop(0), json={})


def round_with(tmp_path, *statuses: int, rows: int = 4):
    recorder = sharing_recorder(tmp_path, "http://collector.invalid")
    show(recorder, rows // 2)
    recorder.flush()
    transport = ScriptedCollector(*statuses)
    uploader = Uploader(recorder, transport=transport)
    store = FeedbackStore(recorder.db_path)
    results = []
    with httpx.Client(transport=transport) as client:
        for _ in statuses:
            results.append(uploader.send_once(client, store))
    recorder.close()
    return results, uploader, transport, store.outbox_size()


def test_server_errors_are_retried_with_growing_backoff(tmp_path):
    results, uploader, transport, left = round_with(tmp_path, 500, 503, 200)
    assert results == ["retry", "retry", "sent 4"] and left == 0 and uploader.failures == 0
    # Each batch names the rules its rows were redacted under: the collector redacts again only
    # what older rules redacted.
    assert transport.rules == [RULES_VERSION] * 3


def test_backoff_doubles_and_is_capped(tmp_path):
    recorder = sharing_recorder(tmp_path, "http://collector.invalid")
    uploader = Uploader(recorder)
    delays = []
    for failures in (1, 2, 3, 20):
        uploader.failures = failures
        delays.append(uploader._delay())
    assert 0.08 <= delays[0] <= 0.12 and 0.16 <= delays[1] <= 0.24 and 0.32 <= delays[2] <= 0.48
    assert delays[3] <= 300 * 1.2
    recorder.close()


def test_a_refused_token_pauses_uploads_and_keeps_the_queue(tmp_path):
    results, uploader, _, left = round_with(tmp_path, 401)
    assert results == ["unauthorized"] and uploader.paused and left == 4
    uploader.wake()  # settings changed
    assert uploader.paused is None


def test_too_large_batches_are_halved_and_unusable_ones_dropped(tmp_path):
    results, uploader, transport, left = round_with(tmp_path, 413, 422, 200)
    assert results == ["smaller", "dropped", "sent 2"]
    assert transport.batches == [4, 2, 2] and uploader.dropped == 2 and left == 0
