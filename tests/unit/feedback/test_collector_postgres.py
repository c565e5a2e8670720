"""The collector storing into PostgreSQL: a real server (Debian's postgresql, started for the test
on loopback), a real collector process and a real uploader."""

from __future__ import annotations

import glob
import shutil
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest

from feedback.upload import Uploader
from tests.unit.feedback.test_upload import TOKEN, Collector, free_port, outbox, sharing_recorder, show, wait

INITDB = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
psycopg = pytest.importorskip("psycopg", reason="needs psycopg (pip install psycopg[binary])")
pytestmark = pytest.mark.skipif(
    not INITDB or not shutil.which("runuser"),
    reason="needs a PostgreSQL server (apt-get install -y postgresql)",
)


@pytest.fixture(scope="module")
def postgres_url():
    bin_dir = Path(INITDB[-1]).parent
    # The server refuses to run as root and needs a folder its own user can reach.
    base = Path(tempfile.mkdtemp(prefix="squidcode-pg-"))
    base.chmod(0o755)
    shutil.chown(base, "postgres", "postgres")
    port = free_port()

    def as_postgres(*command: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *command], check=True, capture_output=True, timeout=120
        )

    as_postgres(str(bin_dir / "initdb"), "-D", str(base / "data"), "-A", "trust", "-U", "postgres")
    as_postgres(
        str(bin_dir / "pg_ctl"),
        "-D",
        str(base / "data"),
        "-l",
        str(base / "log"),
        "-w",
        "-o",
        f"-p {port} -k {base} -c listen_addresses=127.0.0.1",
        "start",
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        as_postgres(str(bin_dir / "pg_ctl"), "-D", str(base / "data"), "-m", "immediate", "stop")
        shutil.rmtree(base, ignore_errors=True)


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
        episode = recorder.record_completion_episode(
            uri="file:///w/a.py", position=(1, 4), output="return a + b", prompt_text="def add(a, b):\n    ",
            model_id="m")
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
    assert examples_from_source(CollectorSource(postgres_url, "other-team")) == []
