"""Reports: the statistics JSON, the JSON-lines export, and the HTML page drawn by headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time

import pytest

from feedback.report import compute_stats, export_jsonl, render_html
from feedback.store import SERVED_PROMPT_KEY, FeedbackStore

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DAY = 86400.0


# A served prompt composed with one reference document (Squid), as a completion's `extra` holds it.
WITH_REFERENCES = {SERVED_PROMPT_KEY: {"references": [{"hash": "doc-1", "path": "/w/a.py", "tokens": 40}]}}


def fill(store: FeedbackStore, now: float) -> None:
    """Two models over two days: m1 shown 4 times, 3 accepted; m2 shown twice, none accepted. The
    first and third (both accepted) were composed with a reference document."""
    rows = []
    for i, (model, accepted, statuses) in enumerate(
        [
            ("m1", True, ["unchanged", "unchanged"]),
            ("m1", True, ["unchanged", "reverted"]),
            ("m1", True, ["mostly_unchanged", "modified"]),
            ("m1", False, []),
            ("m2", False, []),
            ("m2", False, []),
        ]
    ):
        ts = now - DAY * (i % 2)
        rows.append(
            (
                "episodes",
                {
                    "id": f"e{i}",
                    "kind": "completion",
                    "ts": ts,
                    "model_id": model,
                    "language": "python" if i < 5 else "go",
                    "extra": WITH_REFERENCES if i in (0, 2) else {"position": [i, 0]},
                },
            )
        )
        rows.append(("events", {"id": f"s{i}", "episode_id": f"e{i}", "kind": "shown", "ts": ts}))
        if accepted:
            rows.append(("events", {"id": f"a{i}", "episode_id": f"e{i}", "kind": "accepted", "ts": ts + 1}))
        for checkpoint, status in zip((30.0, 120.0), statuses, strict=False):
            rows.append(
                (
                    "outcomes",
                    {
                        "id": f"o{i}{checkpoint}",
                        "episode_id": f"e{i}",
                        "region_id": f"r{i}",
                        "checkpoint_s": checkpoint,
                        "ts": ts + checkpoint,
                        "status": status,
                    },
                )
            )
    rows.append(("sessions", {"id": "s1", "started_at": now - DAY, "last_seen": now - DAY + 60, "day": "d1"}))
    rows.append(("sessions", {"id": "s2", "started_at": now - 3600, "last_seen": now - 1800, "day": "d2"}))
    rows.append(
        (
            "model_switches",
            {"id": "w1", "ts": now, "from_model": "m2", "to_model": "m1", "seconds_after_output": 5.0},
        )
    )
    store.write(rows)


@pytest.fixture
def store(tmp_path):
    store = FeedbackStore(tmp_path / "f.db")
    fill(store, time.time())
    yield store
    store.close()


def test_stats_figures(store):
    stats = compute_stats(store)
    assert stats["acceptance_rate"] == 0.5  # 3 of 6 shown
    assert (
        stats["by_model"]["m1"]["acceptance_rate"] == 0.75 and stats["by_model"]["m2"]["acceptance_rate"] == 0
    )
    at_30, at_2m = stats["persistence"]["30s"], stats["persistence"]["2m"]
    assert at_30["n"] == 3 and at_30["kept_rate"] == 1.0
    assert at_2m["kept_rate"] == round(1 / 3, 4) and at_2m["reverted"] == round(1 / 3, 4)
    assert stats["revert_rate"] == round(1 / 3, 4)
    assert set(stats["by_language"]) == {"python", "go"}
    assert len(stats["over_time"]) == 2
    assert stats["sessions"]["count"] == 2 and stats["sessions"]["days_since_last"] == pytest.approx(
        1 / 48, abs=1e-3
    )
    assert stats["model_switches"] == {"count": 1, "right_after_output": 1}
    context = stats["by_context"]
    assert set(context) == {"with reference documents", "without"}
    assert context["with reference documents"]["shown"] == 2 and context["without"]["shown"] == 4
    assert context["with reference documents"]["acceptance_rate"] == 1.0
    assert context["without"]["acceptance_rate"] == 0.25


def test_export_is_one_json_object_a_line(store):
    lines = [json.loads(line) for line in export_jsonl(store)]
    episodes = [line for line in lines if line["type"] == "episode"]
    assert len(episodes) == 6 and {line["type"] for line in lines} == {"episode", "session", "model_switch"}
    by_id = {line["id"]: line for line in episodes}
    assert [o["status"] for o in by_id["e1"]["outcomes"]] == ["unchanged", "reverted"]
    assert [e["kind"] for e in by_id["e1"]["events"]] == ["shown", "accepted"]


@pytest.mark.skipif(
    not shutil.which(CHROMIUM), reason="needs Debian's chromium (apt-get install -y chromium)"
)
def test_the_html_report_draws_its_charts_in_a_real_browser(store, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(compute_stats(store)))
    assert "http://" not in page.read_text().replace("http://www.w3.org/2000/svg", "")  # self-contained
    profile = tmp_path / "profile"
    result = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    dom = result.stdout
    assert 'data-charts-drawn="5"' in dom, result.stderr[-2000:]
    # over_time: 2 days; persistence: 2 checkpoints x 5 statuses; by_model: 2; by_language: 2;
    # by_context: 2.
    assert len(re.findall(r"<rect ", dom)) == 2 + 10 + 2 + 2 + 2
    assert "acceptance 50.0%" in dom
