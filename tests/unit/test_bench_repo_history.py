"""The repository-training benchmark's split in time (`bench/bench_repo_training.py --git-dir`): the
workspace as it stood at the training commit is what trains; what later commits wrote under the
evaluation path is what is asked, each statement in its file as its commit left it. Real git, a
real index, the embedded model's tokenizer."""

from __future__ import annotations

import argparse
import subprocess
import textwrap

from bench.bench_repo_training import added_lines, history_tasks

PARSE = textwrap.dedent('''\
    def parse_header(text):
        name, _, value = text.partition(":")
        return name.strip(), value.strip()
    ''')
NAMES = textwrap.dedent('''\
    def header_names(lines):
        names = [parse_header(line)[0] for line in lines]
        return sorted(names)
    ''')
# The later commit swaps the two functions: whichever the diff calls added stood there before.
HEADERS_BEFORE, HEADERS_AFTER = PARSE + "\n\n" + NAMES, NAMES + "\n\n" + PARSE
CLIENT_BEFORE = textwrap.dedent('''\
    from pkg.headers import parse_header


    def read_headers(lines):
        found = {}
        for line in lines:
            name, value = parse_header(line)
            found[name.lower()] = value
        return found
    ''')
# The later commit: a new function (two statements written), and `found = {}` moved into it from
# `read_headers` (moved code: nobody types it).
CLIENT_AFTER = textwrap.dedent('''\
    from pkg.headers import parse_header


    def read_headers(lines):
        return first_headers(lines, len(lines))


    def first_headers(lines, limit):
        found = {}
        for line in lines[:limit]:
            name, value = parse_header(line)
            found[name.lower()] = value
        total = len(found) + limit
        return found
    ''')


def _git(root, *args):
    identity = ["-c", "user.name=t", "-c", "user.email=t@localhost", "-c", "commit.gpgsign=false"]
    return subprocess.run(["git", *identity, *args], cwd=root, check=True, capture_output=True,
                          text=True).stdout.strip()


def _history(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    _git(repo, "init", "-q")
    (repo / "pkg" / "headers.py").write_text(HEADERS_BEFORE)
    (repo / "pkg" / "client.py").write_text(CLIENT_BEFORE)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "first")
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "pkg" / "client.py").write_text(CLIENT_AFTER)
    (repo / "pkg" / "headers.py").write_text(HEADERS_AFTER)
    (repo / "tests" / "test_client.py").write_text("def test_it():\n    value = 3\n    assert value\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "second")
    return repo, first, _git(repo, "rev-parse", "HEAD")


def test_added_lines_are_the_ones_the_commit_wrote(tmp_path):
    repo, _, second = _history(tmp_path)
    after = CLIENT_AFTER.splitlines()
    got = {after[i] for i in added_lines(repo, second, "pkg/client.py")}
    assert "    return first_headers(lines, len(lines))" in got
    assert "    total = len(found) + limit" in got
    assert "    for line in lines[:limit]:" in got
    assert "from pkg.headers import parse_header" not in got  # unchanged
    assert added_lines(repo, second, "pkg/headers.py")  # the swap: lines the diff calls added


def test_the_later_commits_statements_are_asked_and_the_training_commits_code_trains(runtime, tmp_path):
    repo, first, second = _history(tmp_path)
    args = argparse.Namespace(git_dir=repo, train_commit=None, eval_commits=1, eval_path="pkg", per_file=20,
                              max_tasks=100, all_statements=True, max_eval=60)
    train, held, info = history_tasks(args, tmp_path / "ws", runtime, tmp_path / "index.db")
    assert info["train_commit"] == first and info["eval_commits"] == [second]
    asked = sorted(task.kept_text.strip() for task in held)
    # Written by the later commit under pkg/: not the tests' lines, not the loop's body nor the
    # swapped functions of headers.py (they stood verbatim before: moved, not written).
    assert asked == sorted(["return first_headers(lines, len(lines))", "for line in lines[:limit]:",
                            "total = len(found) + limit"])
    for task in held:
        assert task.group == f"{second[:8]}:pkg/client.py"
        assert "first_headers" in task.prompt_text or "first_headers" in task.kept_text
        assert task.kept_text.strip() not in task.prompt_text  # hidden at its cursor
    # Training is the workspace at the first commit: its statements, none of the later ones.
    trained = {task.kept_text.strip() for task in train}
    assert "found = {}" in trained and "return found" in trained
    assert not trained & set(asked)
    # The parse_header call asked later has its definition among the references, as the server
    # would compose it at that commit.
    loop = next(t for t in held if t.kept_text.strip().startswith("for line"))
    assert loop.verification["path"].endswith("pkg/client.py")
