"""A team's loop end to end on real parts: a PostgreSQL server, the collector as a process, two
members' `squidcode serve` processes recording what their users keep and undo and uploading it, the
trainer run by `torchrun --nproc-per-node 2` through the real CLI on the team's pooled episodes, the
promoted adapter published, both members generating with it without a restart, and a member of
another team never getting it.

Whether pooled training *helps* is a measurement, not a test; the round here is one short step with a
permissive gate so that the publishing and pulling after it always happen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO
from tests.e2e.raw_lsp import RawLspClient, start_client
from tests.postgres import NO_POSTGRES, have_postgres, postgres_server
from tests.unit.feedback.test_upload import TOKEN, Collector, free_port, wait

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_postgres(), reason=NO_POSTGRES)]
psycopg = pytest.importorskip("psycopg", reason="needs psycopg (pip install psycopg[binary])")

OTHER = "other-team-token-987654"
# What each member's user writes: a function header, the completion asked at `return `, and what the
# user then does with an accepted completion (keep it, or undo it).
SPOTS = [
    ("area", "def area(width, height):\n    return ", "keep"),
    ("double", "def double(value):\n    return ", "keep"),
    ("half", "def half(x):\n    return ", "revert"),
    ("total", "def total(items):\n    return ", "keep"),
    ("square", "def square(n):\n    return ", "revert"),
]
STATUS = "squidcode.train.status"


def command(client: RawLspClient, name: str, argument: dict) -> dict:
    response = client.request("workspace/executeCommand", {"command": name, "arguments": [argument]})
    assert "result" in response, (response, client.tail())
    return response["result"]


def member(tmp_path: Path, name: str, url: str, token: str, share: bool) -> RawLspClient:
    home = tmp_path / name
    workspace = home / "ws"
    workspace.mkdir(parents=True)
    client = start_client(home, name)
    client.workspace, client.train_dir = workspace, home / "train"
    client.initialize(root=workspace, options={
        "completion": {"max_tokens": 8, "debounce_ms": 0},
        "index": {"enabled": False},
        "train": {"dir": str(client.train_dir)},
        "feedback": {"db_path": str(home / "feedback.db"), "checkpoints_s": [0.3], "dismiss_after_s": 60,
                     "endpoint": url, "token": token, "upload_interval_s": 0.2, "team_adapter": True,
                     "team_adapter_interval_s": 0.5},
    })
    if share:  # the user's consent, as the editor's command gives it
        assert command(client, "squidcode.feedback.setShare", {"on": True})["share"] is True
    return client


def use_completions(client: RawLspClient) -> list[str]:
    """Each spot: a completion shown, accepted (inserted, then the item's command), kept or undone."""
    episodes = []
    for name, text, action in SPOTS:
        uri = (client.workspace / f"{name}.py").as_uri()
        client.open(uri, text)
        column = len(text.split("\n")[1])
        response = client.inline_completion(uri, {"line": 1, "character": column})
        items = response["result"]["items"] if isinstance(response["result"], dict) else response["result"]
        assert items, (name, response)
        item = items[0]
        inserted = item["insertText"]
        lines = inserted.split("\n")
        end = {"line": len(lines), "character": len(lines[-1])} if len(lines) > 1 else \
            {"line": 1, "character": column + len(inserted)}
        here = {"line": 1, "character": column}
        client.notify("textDocument/didChange", {
            "textDocument": {"uri": uri, "version": 2},
            "contentChanges": [{"range": {"start": here, "end": here}, "text": inserted}]})
        (argument,) = item["command"]["arguments"]
        command(client, "squidcode.completion.accept", argument)
        if action == "revert":
            client.notify("textDocument/didChange", {
                "textDocument": {"uri": uri, "version": 3},
                "contentChanges": [{"range": {"start": here, "end": end}, "text": ""}]})
        episodes.append(argument["episodeId"])
    return episodes


def uploaded_outcomes(postgres_url: str) -> int:
    with psycopg.connect(postgres_url) as conn:
        query = "SELECT COUNT(*) FROM received WHERE team = 'acme' AND tbl = 'outcomes'"
        return conn.execute(query).fetchone()[0]


def loaded_adapter(client: RawLspClient) -> str | None:
    return command(client, STATUS, {})["loadedAdapter"]


@pytest.mark.timeout(900)
def test_a_teams_pooled_feedback_trains_an_adapter_its_members_and_only_they_switch_to(tmp_path):
    with postgres_server() as postgres_url:
        (tmp_path / "collector").mkdir()
        collector = Collector(tmp_path / "collector", free_port(), db=postgres_url)
        collector.tokens.write_text(f"acme={TOKEN}\nother={OTHER}\n")
        collector.start()
        members: list[RawLspClient] = []
        try:
            alice = member(tmp_path, "alice", collector.url, TOKEN, share=True)
            members.append(alice)
            bob = member(tmp_path, "bob", collector.url, TOKEN, share=True)
            members.append(bob)
            stranger = member(tmp_path, "stranger", collector.url, OTHER, share=False)
            members.append(stranger)
            episodes = use_completions(alice) + use_completions(bob)
            # Both members' episodes and their judged outcomes reach the team's store.
            wait(lambda: uploaded_outcomes(postgres_url) >= len(episodes), timeout=60)
            with psycopg.connect(postgres_url) as conn:
                stored = {row[0] for row in conn.execute(
                    "SELECT id FROM received WHERE team = 'acme' AND tbl = 'episodes'")}
            assert set(episodes) <= stored

            trainer = tmp_path / "trainer"
            trainer.mkdir()
            bundled = json.loads((REPO / "feedback" / "train" / "data" / "grpo_tasks.json").read_text())
            newest = max(bundled["tasks"], key=lambda task: (task["created_at"], task["id"]))
            (trainer / "tasks.json").write_text(json.dumps({**bundled, "tasks": [newest]}))
            # One short step; a gate that promotes any adapter that changes an answer (the loop's
            # plumbing is what this checks), with several optimiser updates so that one does.
            (trainer / ".squidcode.toml").write_text(
                f'[feedback]\nendpoint = "{collector.url}"\ntoken = "{TOKEN}"\n'
                f'[train]\ndir = "{trainer / "train"}"\ntask_set = "{trainer / "tasks.json"}"\n'
                "group_size = 2\nprompts_per_step = 1\nmax_new_tokens = 12\nlearning_rate = 0.02\n"
                "updates_per_batch = 3\npromote_tolerance = 2.0\npromote_max_kl = 100.0\n"
                "promote_min_kl = 0.0\npreference_weight = 0.0\nnice = 0\n")
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            run = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                 str(free_port()), "-m", "lsp_server", "train", "--once", "--json", "--steps", "1",
                 "--source", postgres_url, "--team", "acme"],
                cwd=trainer, env=env, capture_output=True, text=True, timeout=600)
            assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
            results = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
            # Process 1 trained alongside; process 0 gated and promoted.
            assert sorted(r["state"] for r in results) == ["promoted", "trained"], results
            (promoted,) = [r for r in results if r["state"] == "promoted"]
            status = json.loads((trainer / "train" / "status.json").read_text())
            data = status["metrics"]["data"]
            assert data["source"] == "episodes"
            assert data["train"] + data["held_out"] == len(episodes)  # the pooled data, both members'

            publish = subprocess.run([sys.executable, "-m", "lsp_server", "train", "publish", "--json"],
                                     cwd=trainer, env=env, capture_output=True, text=True, timeout=120)
            assert publish.returncode == 0, publish.stderr
            version = json.loads(publish.stdout)["stored"]
            assert version.startswith(promoted["adapter"])

            # Both members switch to it without a restart, and complete with it.
            for client in (alice, bob):
                wait(lambda client=client: loaded_adapter(client) == "v0001", timeout=120)
                response = client.inline_completion((client.workspace / "area.py").as_uri(),
                                                    {"line": 1, "character": 11})
                assert "result" in response, response
                assert loaded_adapter(client) == "v0001"
            # The other team's member polled all along and got nothing; asked by name, neither.
            time.sleep(1.5)
            assert loaded_adapter(stranger) is None
            assert not (stranger.train_dir / "adapters").exists() or \
                not any((stranger.train_dir / "adapters").iterdir())
            hidden = httpx.get(f"{collector.url}/v1/adapters/{version}",
                               headers={"Authorization": f"Bearer {OTHER}"})
            assert hidden.status_code == 404
        finally:
            for client in members:
                client.close()
            collector.stop()
