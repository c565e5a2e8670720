"""Team adapters through a real collector process (SQLite store): published by the training
machine (`squidcode train publish`), pulled, checked and promoted by a member, invisible to another
team, refused when altered; a member who rolled back is not overruled by the same version."""

from __future__ import annotations

import json
import sqlite3

import httpx
import pytest

from context.errors import AdapterError
from feedback import team_adapters
from feedback.team_adapters import pack_adapter, publish_adapter, pull_team_adapter, unpack_adapter
from feedback.train.adapters import AdapterRegistry
from lsp_server.cli import main
from tests.unit.feedback.test_upload import TOKEN, Collector, free_port

OTHER = "other-team-token-987654"


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def collector(tmp_path_factory):
    server = Collector(tmp_path_factory.mktemp("collector"), free_port())
    server.tokens.write_text(f"acme={TOKEN}\nother={OTHER}\n")
    server.start()
    yield server
    server.stop()


def _adapter(root, payload: bytes = b"\x00weights" * 100) -> AdapterRegistry:
    """A registry holding one promoted adapter (its files as peft writes them, stand-in bytes)."""
    registry = AdapterRegistry(root)

    def save(directory):
        (directory / "adapter_model.safetensors").write_bytes(payload)
        (directory / "adapter_config.json").write_text('{"r": 8}')

    registry.promote(registry.add_version(save, {"metrics": {"held_out": 0.7}}).id)
    return registry


def test_a_published_adapter_reaches_the_teams_members_once_and_no_one_else(tmp_path, collector):
    trainer = _adapter(tmp_path / "trainer")
    ref = trainer.current()
    assert publish_adapter(collector.url, TOKEN, ref.path, "v0001-1", ref.meta) == {"stored": "v0001-1"}
    with pytest.raises(AdapterError, match="published already"):
        publish_adapter(collector.url, TOKEN, ref.path, "v0001-1", ref.meta)
    # Another team sees nothing: neither the newest nor the version by name.
    assert pull_team_adapter(collector.url, OTHER, AdapterRegistry(tmp_path / "stranger")) is None
    hidden = httpx.get(f"{collector.url}/v1/adapters/v0001-1", headers=auth(OTHER))
    assert hidden.status_code == 404
    assert httpx.get(f"{collector.url}/v1/adapters/latest").status_code == 401
    # A member installs it, byte for byte, and promotes it; asking again changes nothing.
    member = AdapterRegistry(tmp_path / "member")
    local = pull_team_adapter(collector.url, TOKEN, member)
    assert local == "v0001" and member.current_id() == "v0001"
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        assert (member.current().path / name).read_bytes() == (ref.path / name).read_bytes()
    assert member.current().meta["team_version"] == "v0001-1"
    assert member.current().meta["team_meta"]["metrics"] == {"held_out": 0.7}
    assert pull_team_adapter(collector.url, TOKEN, member) is None
    # Rolled back to the base model, the member keeps that until a newer version is published.
    member.rollback()
    assert pull_team_adapter(collector.url, TOKEN, member) is None and member.current_id() is None


def test_an_altered_adapter_is_refused_by_the_collector_and_by_members(tmp_path, collector):
    ref = _adapter(tmp_path / "trainer", b"other weights" * 10).current()
    body = pack_adapter(ref.path, "v0002-2", {})
    body["files"]["adapter_model.safetensors"] = body["files"]["adapter_config.json"]
    refused = httpx.post(f"{collector.url}/v1/adapters", json=body, headers=auth(TOKEN))
    assert refused.status_code == 422 and "sha256" in refused.json()["error"]
    # Altered after it was stored (the collector's database edited): the member refuses it.
    publish_adapter(collector.url, TOKEN, ref.path, "v0003-3", {})
    with sqlite3.connect(collector.db) as db:
        (stored,) = db.execute("SELECT payload FROM adapters WHERE version = 'v0003-3'").fetchone()
        payload = json.loads(stored)
        payload["files"]["adapter_model.safetensors"] = payload["files"]["adapter_model.safetensors"][:-8]
        db.execute("UPDATE adapters SET payload = ? WHERE version = 'v0003-3'", [json.dumps(payload)])
    member = AdapterRegistry(tmp_path / "member")
    with pytest.raises(AdapterError, match="malformed|do not match"):
        pull_team_adapter(collector.url, TOKEN, member)
    assert member.current_id() is None and member.versions() == []


def test_the_size_limit_and_malformed_bodies(tmp_path, monkeypatch):
    ref = _adapter(tmp_path / "trainer").current()
    body = pack_adapter(ref.path, "v1", {})
    assert unpack_adapter(json.loads(json.dumps(body)))[0] == "v1"
    for broken in ({**body, "version": "../x"}, {**body, "files": {"../x": "AA=="}}, {"version": "v1"}):
        with pytest.raises(ValueError):
            unpack_adapter(broken)
    monkeypatch.setattr(team_adapters, "MAX_ADAPTER_BYTES", 100)
    with pytest.raises(AdapterError, match="at most 100"):
        pack_adapter(ref.path, "v1", {})


def test_squidcode_train_publish_sends_the_promoted_adapter(tmp_path, collector, monkeypatch, capsys):
    train_dir = tmp_path / "train"
    (tmp_path / ".squidcode.toml").write_text(
        f'[train]\ndir = "{train_dir}"\n[feedback]\nendpoint = "{collector.url}"\ntoken = "{OTHER}"\n')
    monkeypatch.chdir(tmp_path)
    assert main(["train", "publish"]) == 1
    assert "no promoted adapter" in capsys.readouterr().err
    _adapter(train_dir / "adapters")
    assert main(["train", "publish", "--json"]) == 0
    stored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["stored"]
    latest = httpx.get(f"{collector.url}/v1/adapters/latest", headers=auth(OTHER)).json()
    assert latest["version"] == stored and latest["meta"]["local_id"] == "v0001"


def test_the_collector_reports_what_a_team_uploaded_to_that_team_only(tmp_path, collector):
    from feedback.store import FeedbackStore
    from tests.unit.train.test_store_source import _record

    db, kept, reverted, shown_only = _record(tmp_path)
    local = FeedbackStore(db, readonly=True)
    events = [{"id": row["id"], "table": table, "row": row}
              for table in ("episodes", "events", "outcomes") for row in local.rows(table)]
    local.close()
    sent = httpx.post(f"{collector.url}/v1/events", json={"events": events}, headers=auth(TOKEN))
    assert sent.json()["accepted"] == len(events)
    report = httpx.get(f"{collector.url}/v1/report", headers=auth(TOKEN)).json()
    assert report["db"] == "team acme" and report["episodes"] == 3 and report["shown"] == 3
    assert report["accepted"] == 2 and report["revert_rate"] == 0.5  # one kept, one undone
    # None was composed with reference documents: all three are the "without" share.
    assert {name: part["shown"] for name, part in report["by_context"].items()} == {"without": 3}
    assert httpx.get(f"{collector.url}/v1/report", headers=auth(OTHER)).json()["episodes"] == 0
    page = httpx.get(f"{collector.url}/v1/report?format=html", headers=auth(TOKEN))
    assert page.headers["content-type"].startswith("text/html") and "team acme" in page.text
    assert httpx.get(f"{collector.url}/v1/report").status_code == 401
