"""The learning loop end to end (`bench/learning_loop.py`, a short plan): a simulated user drives a
real server over LSP, the recorder stores what it did, `squidcode train --once` trains on those
episodes and gates the adapter, and the running server switches to a promoted one by itself.

Whether the loop *learns* is a measurement (docs/benchmarks.md), not a test: one GRPO step moves
nothing measurable. This checks that every step of the loop happens, on the product's paths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)  # the subprocess's own limit; the suite's 300 s killed it on a loaded machine
def test_the_loop_records_the_users_decisions_trains_on_them_and_swaps_the_adapter(model_cache_dir, tmp_path):
    out = tmp_path / "report.json"
    # The bundled task set's five oldest tasks: its newest one is the gate's regression set (the
    # bundled 32 make it seven, each answered with and without the adapter: most of the round's time).
    bundled = json.loads((REPO / "feedback" / "train" / "data" / "grpo_tasks.json").read_text())
    tasks = sorted(bundled["tasks"], key=lambda task: (task["created_at"], task["id"]))[:5]
    task_set = tmp_path / "tasks.json"
    task_set.write_text(json.dumps({**bundled, "tasks": tasks}))
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "learning_loop.py"), "--rounds", "1", "--steps", "1",
         "--train-spots", "9", "--eval-spots", "3", "--no-agent", "--max-new-tokens", "16",
         "--gate-spots", "4",
         "--train-threads", "1",  # the suite runs on two workers: a 2-thread pool on busy cores crawls
         "--task-set", str(task_set), "--judge-refused", "--out", str(out)],
        capture_output=True, text=True, timeout=900, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    # The base model was measured once the index was built (Squid composes only from a ready one).
    assert report["index_wait_s"] >= 0 and "index ready after" in proc.stderr + proc.stdout
    assert report["status"]["index"]["state"] == "ready"
    (entry,) = report["rounds"]
    actions = [e["action"] for e in entry["session"]]
    assert len(actions) == 9 and set(actions) <= {"keep", "modify", "revert", "none"}
    # What the user did reached the recorder through didChange alone, and it judged it the same way
    # at both checkpoints: each undo as reverted, each keep or rewrite as kept in some form.
    for checkpoint in ("1s", "3s"):
        stored = entry["recorded"][checkpoint]
        assert stored.get("reverted", 0) == actions.count("revert"), (stored, actions)
        kept = sum(stored.get(k, 0) for k in ("unchanged", "mostly_unchanged", "modified"))
        assert kept == actions.count("keep") + actions.count("modify"), (stored, actions)
        assert stored.get("unchanged", 0) >= actions.count("keep")
    # The round trained on those episodes and went through the gate.
    train = entry["train"]
    assert train["state"] in ("promoted", "rejected") and train["steps"] == 1, train
    gate = entry["gate"]
    recorded = actions.count("keep") + actions.count("modify") + actions.count("revert")
    if recorded >= 8:  # feedback.train.service.MIN_EPISODES: fewer, and the task set trains instead
        assert gate["data"]["source"] == "episodes"
        assert gate["data"]["train"] + gate["data"]["held_out"] == recorded
        # The learned preference was fitted on the training episodes (used or not, it says why).
        preference = gate["preference"]
        assert preference["kept"] + preference["not_kept"] >= gate["data"]["train"]
        assert preference["reason"]
        # With a preference that predicts the user, what they would keep decides (held-out episodes and
        # gate spots in files no episode is about); without one, the held-out reward does.
        if preference["enabled"]:
            keep = gate["keep"]
            assert keep["episodes"] == gate["data"]["held_out"] and 0 < keep["spots"] <= 4
            assert keep["compared"] == keep["episodes"] + keep["spots"]
        else:
            assert "keep" not in gate
    assert gate["held_out"]["n"] >= 1 and gate["regression"]["n"] == 1  # the task set's newest
    if train["state"] == "rejected":
        # The diagnostic measured the refused adapter on the held-out spots, then the pointer went
        # back: the server ends on the base model, the one in use.
        refused = entry["refused"]
        assert refused["adapter"] == "v0001" and 0.0 <= refused["keep_rate"] <= 1.0
        assert len(refused["log"]) == 3 and report["status"]["model"]["adapter"] is None
        assert f"the refused {refused['adapter']} would have had" in proc.stdout
    else:
        assert "refused" not in entry
    if train["state"] == "promoted":
        assert entry["swap_s"] >= 0
        assert report["held_out"][-1]["adapter"] == train["adapter"]
        assert report["status"]["model"]["adapter"] == train["adapter"]  # generating with it, no restart
