"""kill -9 in the middle of writes: every row the writer reported committed is there, and the
database opens and passes SQLite's integrity check."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from feedback.store import FeedbackStore

WRITER = textwrap.dedent(
    """
    import json, sys
    from context.config import FeedbackConfig
    from feedback.recorder import FeedbackRecorder

    recorder = FeedbackRecorder(FeedbackConfig(), db_path=sys.argv[1])
    batch = 0
    while True:
        ids = [recorder.record_completion_episode(uri=f"file:///f{batch}_{i}.py", position=(i, 0),
                                                  output="x" * 500, prompt_text="p" * 2000, model_id="m")
               for i in range(40)]
        if recorder.flush(30):
            print(json.dumps(ids), flush=True)  # committed: flush returned after the transaction
        batch += 1
    """
)


def test_kill_9_during_writes_loses_no_committed_row(tmp_path):
    db = tmp_path / "f.db"
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, env=env, text=True
    )
    committed: list[str] = []
    deadline = time.monotonic() + 60
    try:
        while len(committed) < 200 and time.monotonic() < deadline:
            line = child.stdout.readline()
            assert line, "the writer died on its own"
            committed += json.loads(line)
        time.sleep(0.05)  # into the next batch's writes
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert child.returncode == -signal.SIGKILL
    store = FeedbackStore(db)
    assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    stored = {row["id"] for row in store.rows("episodes")}
    assert len(committed) >= 200
    assert set(committed) <= stored
