"""The collector storing into PostgreSQL: a real server (Debian's postgresql, started for the test
on loopback), a real collector process and a real uploader."""

from __future__ import annotations

import httpx
import pytest

from feedback.upload import Uploader
from tests.postgres import NO_POSTGRES, have_postgres, postgres_server
from tests.unit.feedback.test_upload import TOKEN, Collector, free_port, outbox, sharing_recorder, show, wait

psycopg = pytest.importorskip("psycopg", reason="needs psycopg (pip install psycopg[binary])")
pytestmark = pytest.mark.skipif(not have_postgres(), reason=NO_POSTGRES)


@pytest.fixture(scope="module")
def postgres_url():
    with postgres_server() as url:
        yield url


def test_uploads_land_in_postgres_once(tmp_path, postgres_url):
    collector = Collector(tmp_path, free_port(), db=postgres_url).start()
    try:
        recorder = sharing_recorder(tmp_path, collector.url)
        uploader = Uploader(recorder)
        uploader.start()
        show(recorder, 12)
        recorder.flush()
        wait(lambda: outbox(recorder.db_path) == 0)
        assert collector.stats()["by_table"] == {"episodes": 12, "events": 12}
        # The same event twice is stored once; a malformed batch is refused and stores nothing.
        event = {"id": "dup1", "table": "events", "row": {"id": "dup1", "kind": "shown"}}
        headers = {"Authorization": f"Bearer {TOKEN}"}
        for expected in ({"accepted": 1, "duplicates": 0}, {"accepted": 0, "duplicates": 1}):
            assert (
                httpx.post(collector.url + "/v1/events", json={"events": [event]}, headers=headers).json()
                == expected
            )
        bad = httpx.post(collector.url + "/v1/events", json={"events": [{"id": "x"}]}, headers=headers)
        assert bad.status_code == 422
        with psycopg.connect(postgres_url) as conn:
            assert conn.execute("SELECT COUNT(*) FROM received").fetchone()[0] == 25
        uploader.stop()
        recorder.close()
    finally:
        collector.stop()


def test_a_teams_uploaded_episodes_are_read_back_for_training(tmp_path, postgres_url):
    """Through the real uploader and collector process into PostgreSQL, then the trainer's source
    for that team (`squidcode train --source postgresql://... --team acme`)."""
    import time

    from context.config import FeedbackConfig
    from context.prompt_record import ReferenceIdentity, ServedPrompt
    from feedback.recorder import FeedbackRecorder
    from feedback.tracking import TextChange
    from feedback.train.dataset import examples_from_source
    from feedback.train.team_source import CollectorSource

    collector = Collector(tmp_path, free_port(), db=postgres_url).start()
    try:
        config = FeedbackConfig(share=True, endpoint=collector.url, token=TOKEN, upload_interval_s=0.1,
                                checkpoints_s=(0.05,))
        recorder = FeedbackRecorder(config, db_path=tmp_path / "member.db")
        uploader = Uploader(recorder)
        uploader.start()
        after = "def add(a, b):\n    return a + b\n"
        served = ServedPrompt(ids=(1, 2), text="def add(a, b):\n    ", reference_tokens=4,
                              references=(ReferenceIdentity("pg1", "/w/ops.py", 4, "PLUS = '+'\n"),))
        episode = recorder.record_completion_episode(
            uri="file:///w/a.py", position=(1, 4), output="return a + b", served=served, model_id="m")
        recorder.on_did_change("file:///w/a.py", [TextChange((1, 4), (1, 4), "return a + b")], after)
        recorder.accept_completion(episode, None, after)
        time.sleep(0.1)
        recorder.tick()  # the checkpoint: kept unchanged
        recorder.flush()
        wait(lambda: outbox(recorder.db_path) == 0)
        uploader.stop()
        recorder.close()
    finally:
        collector.stop()
    (example,) = examples_from_source(CollectorSource(postgres_url, "acme"))
    assert example.id == episode and example.kept_text == "    return a + b" and not example.reverted
    # The reference document it was served with came along, and is composed for training as served.
    assert [(ref.hash, ref.text) for ref in example.served.references] == [("pg1", "PLUS = '+'\n")]
    assert examples_from_source(CollectorSource(postgres_url, "other-team")) == []


def test_an_unversioned_store_is_migrated_with_its_rows_and_a_newer_one_refused(postgres_url):
    """A database the collector filled before its schema had versions: tables made by the earlier
    CREATE TABLE statements, one upload in them."""
    from context.errors import FeedbackStoreError
    from feedback.collector import SCHEMA_VERSION, PostgresCollectorStore

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE before_versions")
    url = postgres_url.rsplit("/", 1)[0] + "/before_versions"
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE received (id TEXT PRIMARY KEY, team TEXT NOT NULL, tbl TEXT NOT NULL, "
                     "row TEXT NOT NULL, received_at DOUBLE PRECISION NOT NULL)")
        conn.execute("INSERT INTO received VALUES ('a1', 'acme', 'episodes', '{}', 1.0)")
    for _ in range(2):  # the second open finds nothing to do
        store = PostgresCollectorStore(url)
        try:
            assert store.stats("acme") == {"events": 1, "by_table": {"episodes": 1}}
            assert store.latest_adapter("acme") is None  # the adapters table came with version 1
        finally:
            store.close()
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT version FROM collector_schema").fetchall() == [(SCHEMA_VERSION,)]
            query = "SELECT indexname FROM pg_indexes WHERE tablename = 'received'"
            indexes = {r[0] for r in conn.execute(query)}
            assert "received_team_tbl" in indexes
    with psycopg.connect(url) as conn:
        conn.execute("UPDATE collector_schema SET version = 9")
    with pytest.raises(FeedbackStoreError, match="schema version 9, newer than this squidcode knows"):
        PostgresCollectorStore(url)


def test_a_store_redacted_under_older_rules_is_redacted_again_when_the_collector_opens(postgres_url):
    """As `test_collector_redaction` does it for SQLite: the same statements, on PostgreSQL."""
    import json

    from feedback.collector import PostgresCollectorStore
    from feedback.redact import RULES_VERSION
    from tests.unit.feedback.test_collector_redaction import assert_redacted, old_rows

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE older_rules")
    url = postgres_url.rsplit("/", 1)[0] + "/older_rules"
    PostgresCollectorStore(url).close()
    with psycopg.connect(url) as conn:  # rows a collector of older rules stored
        conn.execute("DELETE FROM collector_meta")
        for event in old_rows():
            if event["table"] == "reference_documents":
                conn.execute("INSERT INTO reference_documents VALUES ('acme', %s, %s, 1.0)",
                             [event["id"], json.dumps(event["row"])])
            else:
                conn.execute("INSERT INTO received VALUES (%s, 'acme', %s, %s, 1.0)",
                             [event["id"], event["table"], json.dumps(event["row"])])
    PostgresCollectorStore(url).close()
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, row FROM received UNION ALL "
                            "SELECT hash, row FROM reference_documents")
        assert_redacted({row_id: json.loads(text) for row_id, text in rows})
        assert conn.execute("SELECT value FROM collector_meta").fetchall() == [(str(RULES_VERSION),)]
