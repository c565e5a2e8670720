"""The collector over HTTPS (uvicorn's own TLS, `collector serve --ssl-certfile/--ssl-keyfile`) with a
self-signed certificate made by openssl for the test: members trust it through `feedback.ca_file`,
and without it their uploads wait (the certificate is not trusted) and lose nothing."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from context.config import FeedbackConfig
from context.errors import AdapterError, FeedbackUploadError
from feedback.recorder import FeedbackRecorder
from feedback.team_adapters import publish_adapter, pull_team_adapter
from feedback.train.adapters import AdapterRegistry
from feedback.upload import Uploader, collector_tls
from tests.unit.feedback.test_upload import TOKEN, Collector, free_port, outbox, show, wait

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "collector.pem", folder / "collector.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=collector",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.fixture(scope="module")
def collector(tmp_path_factory, tls):
    server = Collector(tmp_path_factory.mktemp("collector"), free_port(), tls=tls).start()
    yield server
    server.stop()


def recorder_for(tmp_path: Path, url: str, ca_file: Path | None) -> FeedbackRecorder:
    config = FeedbackConfig(share=True, endpoint=url, token=TOKEN, upload_interval_s=0.1,
                            ca_file=str(ca_file) if ca_file else None)
    return FeedbackRecorder(config, db_path=tmp_path / "member.db")


def test_uploads_wait_for_a_trusted_certificate_then_arrive_once(tmp_path, collector, tls):
    assert collector.url.startswith("https://")
    before = collector.stats()["by_table"].get("episodes", 0)
    recorder = recorder_for(tmp_path, collector.url, None)
    uploader = Uploader(recorder)
    uploader.start()
    try:
        show(recorder, 5)
        recorder.flush()
        # Not trusted (self-signed): retried with backoff, kept in the outbox, nothing dropped.
        wait(lambda: uploader.failures >= 1)
        assert uploader.dropped == 0 and outbox(recorder.db_path) == 10
        assert collector.stats()["by_table"].get("episodes", 0) == before
        # The member's settings name the collector's certificate: the next round goes through.
        recorder.reconfigure(FeedbackConfig(share=True, endpoint=collector.url, token=TOKEN,
                                              upload_interval_s=0.1, ca_file=str(tls[0])))
        uploader.wake()
        wait(lambda: outbox(recorder.db_path) == 0)
        assert collector.stats()["by_table"]["episodes"] == before + 5 and uploader.dropped == 0
    finally:
        uploader.stop()
        recorder.close()


def test_a_ca_file_that_is_not_a_certificate_pauses_sharing_with_the_reason(tmp_path, collector):
    bad = tmp_path / "not-a-cert.pem"
    bad.write_text("hello\n")
    with pytest.raises(FeedbackUploadError, match="not a readable PEM certificate"):
        collector_tls(str(bad))
    with pytest.raises(FeedbackUploadError, match="not a readable PEM certificate"):
        collector_tls(str(tmp_path / "missing.pem"))
    recorder = recorder_for(tmp_path, collector.url, bad)
    uploader = Uploader(recorder)
    uploader.start()
    try:
        show(recorder, 2)
        recorder.flush()
        wait(lambda: uploader.paused is not None)
        assert "feedback.ca_file" in uploader.paused and outbox(recorder.db_path) == 4
    finally:
        uploader.stop()
        recorder.close()


def test_team_adapters_are_published_and_pulled_over_https(tmp_path, collector, tls):
    trainer = AdapterRegistry(tmp_path / "trainer")

    def save(directory):
        (directory / "adapter_model.safetensors").write_bytes(b"\x01weights" * 50)
        (directory / "adapter_config.json").write_text('{"r": 8}')

    trainer.promote(trainer.add_version(save, {}).id)
    version = f"v0001-{int(time.time())}"
    with pytest.raises(AdapterError, match="certificate verify failed"):
        publish_adapter(collector.url, TOKEN, trainer.current().path, version, {})
    verify = collector_tls(str(tls[0]))
    assert publish_adapter(collector.url, TOKEN, trainer.current().path, version, {}, verify=verify) == \
        {"stored": version}
    member = AdapterRegistry(tmp_path / "member")
    with pytest.raises(AdapterError, match="certificate verify failed"):
        pull_team_adapter(collector.url, TOKEN, member)
    assert pull_team_adapter(collector.url, TOKEN, member, verify=verify) == "v0001"
    assert (member.current().path / "adapter_model.safetensors").read_bytes() == b"\x01weights" * 50
