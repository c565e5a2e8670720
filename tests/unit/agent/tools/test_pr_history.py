"""pr_history over a real git repository with a merged branch, and the forge API against a loopback double."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.tools import default_registry
from agent.tools.history import pull_request_numbers
from tests.unit.agent.conftest import git


@pytest.fixture
def repo(project):
    git(project, "init", "-q", "-b", "main")
    git(project, "config", "user.email", "dev@example.com")
    git(project, "config", "user.name", "Dev")
    git(project, "add", ".")
    git(project, "commit", "-qm", "calc: first version")
    git(project, "checkout", "-qb", "fix-add")
    (project / "calc.py").write_text((project / "calc.py").read_text().replace("a - b", "a + b"))
    git(project, "commit", "-qam", "calc: add adds\n\nIt subtracted since the first version.")
    git(project, "checkout", "-q", "main")
    git(project, "merge", "-q", "--no-ff", "fix-add", "-m", "Merge pull request #42 from dev/fix-add")
    git(project, "remote", "add", "origin", "git@github.com:acme/calc.git")
    return project


def test_history_of_a_line_range_names_commits_pr_and_blame(ctx, repo):
    result = default_registry().call(ctx, "pr_history", {"path": "calc.py", "start": 5, "end": 5})
    assert result.ok, result.output
    assert "calc: add adds (PR #42)" in result.output
    assert "It subtracted since the first version." in result.output
    assert "-    return a - b" in result.output and "+    return a + b" in result.output
    assert "last written by:" in result.output and "Dev: calc: add adds (1 lines)" in result.output


def test_history_of_a_whole_file_and_bad_ranges(ctx, repo):
    registry = default_registry()
    whole = registry.call(ctx, "pr_history", {"path": "calc.py"})
    assert "calc: first version" in whole.output and "calc: add adds" in whole.output
    assert not registry.call(ctx, "pr_history", {"path": "calc.py", "start": 5, "end": 2}).ok
    assert not registry.call(ctx, "pr_history", {"path": "../etc.py"}).ok


def test_outside_a_repository_the_error_is_clear(ctx):
    result = default_registry().call(ctx, "pr_history", {"path": "calc.py"})
    assert not result.ok and "git log failed" in result.output


def test_pull_request_numbers_from_messages():
    assert pull_request_numbers("Merge pull request #7 from a/b") == [7]
    assert pull_request_numbers("Fix parsing (#123)") == [123]
    assert pull_request_numbers("Merge branch 'x'\n\nSee merge request group/proj!9") == [9]
    assert pull_request_numbers("no number here") == []


class FakeForgeServer:
    """A loopback double of the GitHub REST API's pull request endpoints."""

    def __init__(self):
        self.paths: list[str] = []
        self.auth: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802
                outer.paths.append(self.path)
                outer.auth.append(self.headers.get("Authorization", ""))
                if self.path.endswith("/pulls/42"):
                    body = {"title": "Make add add", "body": "add() subtracted; found by the cart totals."}
                elif self.path.endswith("/pulls/42/comments"):
                    body = [{"path": "calc.py", "body": "Please add a test for negatives."}]
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


def test_with_a_token_pull_request_details_come_from_the_forge(ctx, repo, monkeypatch):
    forge = FakeForgeServer()
    try:
        monkeypatch.setenv("SQUID_TEST_FORGE_TOKEN", "t0ken")
        ctx.config = type(ctx.config)(forge_api_url=forge.url, forge_token_env="SQUID_TEST_FORGE_TOKEN")
        result = default_registry().call(ctx, "pr_history", {"path": "calc.py", "start": 5, "end": 5})
        assert "PR #42: Make add add" in result.output
        assert (
            "found by the cart totals" in result.output
            and "Please add a test for negatives." in result.output
        )
        assert forge.paths == ["/repos/acme/calc/pulls/42", "/repos/acme/calc/pulls/42/comments"]
        assert forge.auth == ["Bearer t0ken", "Bearer t0ken"]
    finally:
        forge.httpd.shutdown()


def test_without_a_token_nothing_is_sent(ctx, repo, monkeypatch):
    forge = FakeForgeServer()
    try:
        monkeypatch.delenv("SQUID_TEST_FORGE_TOKEN", raising=False)
        ctx.config = type(ctx.config)(forge_api_url=forge.url, forge_token_env="SQUID_TEST_FORGE_TOKEN")
        result = default_registry().call(ctx, "pr_history", {"path": "calc.py", "start": 5, "end": 5})
        assert result.ok and "PR #42:" not in result.output and forge.paths == []
    finally:
        forge.httpd.shutdown()
