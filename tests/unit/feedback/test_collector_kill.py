"""`kill -9` of the collector in the middle of uploads: no acknowledged episode is lost and none is
stored twice (batch rows keep their ids; a batch resent after the crash is skipped row by row).
Real collector processes on one SQLite file, real uploaders (`feedback.upload.Uploader`)."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time

import httpx

from tests.unit.feedback.test_upload import TOKEN, Collector, free_port

EPISODES = 3000  # sent by 3 uploaders in batches of 100, the collector killed mid-way


def _episode(uploader: int, i: int) -> dict:
    row_id = f"u{uploader}-e{i}"
    return {"id": row_id, "table": "episodes", "row": {"id": row_id, "kind": "completion", "ts": float(i)}}


def test_kill_9_mid_upload_loses_no_acknowledged_row_and_stores_none_twice(tmp_path):
    port = free_port()
    collector = Collector(tmp_path, port).start()
    acknowledged: set[str] = set()
    lock = threading.Lock()

    def upload(uploader: int) -> None:
        rows = [_episode(uploader, i) for i in range(EPISODES // 3)]
        with httpx.Client(timeout=5) as client:
            for start in range(0, len(rows), 100):
                batch = rows[start : start + 100]
                while True:  # as the uploader does: a batch is resent until acknowledged
                    try:
                        answer = client.post(f"{collector.url}/v1/events", json={"events": batch},
                                             headers={"Authorization": f"Bearer {TOKEN}"})
                    except httpx.HTTPError:
                        time.sleep(0.1)
                        continue
                    if answer.status_code == 200:
                        with lock:
                            acknowledged.update(row["id"] for row in batch)
                        break
                    time.sleep(0.1)

    threads = [threading.Thread(target=upload, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    while len(acknowledged) < EPISODES // 4:
        time.sleep(0.01)
    collector.process.send_signal(signal.SIGKILL)  # mid-upload: no shutdown, no flush
    collector.process.wait(10)
    before_restart = set(acknowledged)
    collector.process = None
    collector.start()  # the same file, a new process
    for thread in threads:
        thread.join(120)
    collector.stop()
    with sqlite3.connect(tmp_path / "collector.db") as db:
        ids = [row[0] for row in db.execute("SELECT id FROM received")]
    assert len(ids) == len(set(ids)) == EPISODES  # all of them, none twice
    assert before_restart <= set(ids)  # what was acknowledged before the kill survived it
