"""`squidcode feedback stats|report|export|forget` on a real store."""

from __future__ import annotations

import json
import time

import pytest

from feedback.store import FeedbackStore
from lsp_server.cli import main
from tests.unit.feedback.test_report import fill


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "f.db"
    store = FeedbackStore(path)
    fill(store, time.time())
    store.close()
    return path


def test_stats_json_has_the_documented_keys(db, capsys):
    assert main(["feedback", "stats", "--json", "--db", str(db)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert {"acceptance_rate", "persistence", "revert_rate", "by_model"} <= set(stats)
    assert stats["acceptance_rate"] == 0.5 and set(stats["by_model"]) == {"m1", "m2"}


def test_stats_text(db, capsys):
    assert main(["feedback", "stats", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "acceptance rate: 50.0%" in out and "model m1: acceptance 75.0%" in out
    assert "completions with reference documents: 2 shown, acceptance 100.0%" in out
    assert "completions without: 4 shown, acceptance 25.0%" in out


def test_export_and_report_write_files(db, tmp_path, capsys):
    out = tmp_path / "all.jsonl"
    assert main(["feedback", "export", "--jsonl", "--db", str(db), "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 6 + 2 + 1
    page = tmp_path / "r.html"
    assert main(["feedback", "report", "--html", str(page), "--db", str(db)]) == 0
    assert page.read_text().startswith("<!DOCTYPE html>")


def test_forget_needs_to_be_told_what(db, capsys):
    assert main(["feedback", "forget", "--db", str(db)]) == 2
    assert "--all" in capsys.readouterr().err
    assert main(["feedback", "forget", "--since", "2h", "--db", str(db)]) == 0
    store = FeedbackStore(db)
    assert store.count("episodes") == 3  # the ones from a day ago stay
    assert main(["feedback", "forget", "--all", "--db", str(db)]) == 0
    assert store.count("episodes") == 0 and store.count("sessions") == 0


def test_a_missing_store_and_a_bad_time_are_clear(tmp_path, capsys):
    assert main(["feedback", "stats", "--db", str(tmp_path / "none.db")]) == 1
    assert "no feedback recorded yet" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["feedback", "stats", "--since", "yesterday-ish"])
    assert "ISO date" in capsys.readouterr().err


def test_collector_refuses_to_start_without_tokens(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SQUIDCODE_COLLECTOR_TOKENS", raising=False)
    assert main(["collector", "serve", "--db", str(tmp_path / "c.db")]) == 2
    assert "needs at least one token" in capsys.readouterr().err


def test_a_damaged_store_is_a_message_not_a_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"garbage" * 1000)
    assert main(["feedback", "stats", "--db", str(bad)]) == 1
    assert "damaged" in capsys.readouterr().err
