"""Completion tasks made from the workspace's own code (`feedback.train.repo_tasks`): a statement
hidden in a real indexed workspace, asked for with the prompt and the Squid references the server
serves at that cursor, only where a reference defines a name the statement uses; split by file."""

from __future__ import annotations

import textwrap
from dataclasses import replace

import pytest

from agent.completion import CompletionRequest, complete
from context.config import CompletionConfig, SquidCacheConfig, TrainConfig
from context.index.indexer import Indexer
from context.index.store import IndexStore
from context.squid.keys import token_hash
from context.squid.references import CompletionReferences
from context.squid.service import SquidService
from feedback.train.repo_tasks import (
    Position,
    body_positions,
    repository_tasks,
    split_files,
    statement_positions,
    workspace_tasks,
)
from feedback.train.service import episode_reward, is_repository_task, load_training_data, task_reward

HEADERS = textwrap.dedent('''\
    """Header parsing."""


    def parse_header(text: str) -> tuple[str, str]:
        """Split `Name: value`."""
        name, _, value = text.partition(":")
        return name.strip(), value.strip()
    ''')
CLIENT = textwrap.dedent('''\
    from headers import parse_header


    def read_headers(lines):
        """Headers from raw lines."""
        found = {}
        for line in lines:
            if not line:
                break
            name, value = parse_header(line)
            found[name.lower()] = value
        return found
    ''')
LOCAL_ONLY = textwrap.dedent('''\
    def double(x):
        y = x * 2
        return y
    ''')
SQUID = SquidCacheConfig(document_tokens=64)


@pytest.fixture
def workspace(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "headers.py").write_text(HEADERS)
    (root / "client.py").write_text(CLIENT)
    (root / "local.py").write_text(LOCAL_ONLY)
    (root / "broken.py").write_text("def f(:\n    return parse_header(x)\n")
    return root


def test_statement_positions_are_whole_statements_that_start_their_line():
    text = textwrap.dedent('''\
        """Doc."""
        import os


        def f(a):
            """Doc."""
            x = g(a,
                  b)
            if x:
                y = 1; z = 2
            try:
                return h(x)
            except OSError:
                pass
            return (1 +
                    2 +
                    3 + 4)
        ''')
    lines = text.splitlines()
    positions = statement_positions(text, max_lines=2)
    got = {lines[p.start].strip(): (p.end - p.start, p.indent) for p in positions}
    assert got == {"x = g(a,": (2, "    "), "if x:": (1, "    "), "y = 1; z = 2": (1, "        "),
                   "return h(x)": (1, "        "), "pass": (1, "        ")}
    assert statement_positions("def f(:\n", 3) == []
    assert [lines[p.start].strip() for p in statement_positions(text, 3)][-1] == "return (1 +"


def test_a_task_hides_a_statement_that_a_reference_definition_helps_with(runtime, workspace, tmp_path):
    tasks = workspace_tasks([workspace], runtime, index_path=tmp_path / "index.db", squid=SQUID, per_file=10)
    by_kept = {t.kept_text: t for t in tasks}
    # Only the statement that calls the other file's function: the others use local names only.
    assert list(by_kept) == ["        name, value = parse_header(line)"]
    task = by_kept["        name, value = parse_header(line)"]
    assert task.group == "client.py" and is_repository_task(task)
    served = task.served
    # The editor's document at that moment: the statement gone, the cursor at its indentation.
    assert served.text.endswith("            break\n        ")
    assert "parse_header(line)" not in served.text
    assert served.following_lines[0] == "        found[name.lower()] = value"
    assert task.prompt_text + task.prompt_lead == served.text and task.prompt_lead == "        "
    (ref,) = served.references
    assert ref.text.startswith("# headers.py:4\ndef parse_header(text: str)")
    assert ref.hash == token_hash(runtime.encode(ref.text)[: SQUID.document_tokens])
    assert served.reference_tokens == ref.tokens

    without = workspace_tasks([workspace], runtime, index_path=tmp_path / "index.db", squid=SQUID,
                              per_file=10, require_reference=False)
    assert {"    y = x * 2", "    return y"} <= {t.kept_text for t in without}
    assert all(t.group != "broken.py" for t in without)  # a file that does not parse gives none


def test_the_task_prompt_is_the_one_the_server_serves_at_that_cursor(runtime, workspace, tmp_path):
    """The same window ids and the same reference documents (by content hash) as a real completion
    asked at the task's cursor in the task's document, through the index's symbols."""
    with IndexStore(tmp_path / "index.db") as store:
        Indexer([workspace], store, workers=0).index_all()
        path = str(workspace / "client.py")
        (task,) = repository_tasks([(path, CLIENT)], symbols=store.symbols_named, codec=runtime, squid=SQUID,
                                   roots=[workspace])
        lines = CLIENT.splitlines(keepends=True)
        line = task.verification["line"] - 1
        document = "".join(lines[:line]) + task.prompt_lead + "\n" + "".join(lines[line + 1:])
        offset = len("".join(lines[:line])) + len(task.prompt_lead)
        service = SquidService(runtime, SQUID, None, start_thread=False)
        references = CompletionReferences(service, current_path=path, open_documents={path: document},
                                          search=None, roots=[workspace], symbols=store.symbols_named)
        service.context_for(references.documents(document[:offset]), wait=True)
        runtime.forget_prefix()
        completion = complete(runtime, CompletionRequest(document, offset, "python", path),
                              replace(CompletionConfig(), max_tokens=4), references=references)
        service.stop()
    assert completion is not None
    assert completion.prompt.ids == task.served.ids and completion.prompt.heal == task.served.heal
    assert [r.hash for r in completion.prompt.references] == [r.hash for r in task.served.references]
    assert [r.text for r in completion.prompt.references] == [r.text for r in task.served.references]


def test_tasks_split_by_whole_files_and_join_the_gate_not_the_regression_set(runtime, workspace, tmp_path):
    (workspace / "more.py").write_text("from headers import parse_header\n\n\nPAIR = parse_header('a: b')\n")
    tasks = workspace_tasks([workspace], runtime, index_path=tmp_path / "index.db", squid=SQUID, per_file=10)
    assert {t.group for t in tasks} == {"client.py", "more.py"}
    train, held = split_files(tasks, 0.5)
    assert train and held and not {t.group for t in train} & {t.group for t in held}
    assert split_files(tasks, 0.5) == (train, held)  # the same files every time

    train_all, held_out, regression = load_training_data(TrainConfig(holdout_fraction=0.5), None, tasks)
    assert [t for t in train_all if is_repository_task(t)] == train
    assert [t for t in held_out if is_repository_task(t)] == held
    assert not any(map(is_repository_task, regression))
    assert held_out is not regression and set(map(id, regression)) <= set(map(id, held_out))


def test_a_repository_task_is_rewarded_for_the_code_that_stands_there_not_the_users_preference(
        runtime, workspace, tmp_path):
    from feedback.preference import PreferenceFit

    (task,) = workspace_tasks([workspace], runtime, index_path=tmp_path / "index.db", squid=SQUID)

    class Prefers:  # a fitted preference that loves one text (a stand-in for the fitted model)
        @staticmethod
        def score(code: str) -> float:
            return 1.0 if "nothing" in code else 0.0

    fit = PreferenceFit(model=Prefers(), kept=1, not_kept=1, balanced_accuracy=None, reason="test double")
    reward = episode_reward(fit, weight=5.0)
    exact = "        name, value = parse_header(line)"
    assert reward(exact, task) == task_reward(exact, task) == pytest.approx(1.0)
    assert reward("        nothing = 1", task) == task_reward("        nothing = 1", task) < 0.6
    assert task_reward("        name, value = parse_header(", task) == 0.0  # does not parse


class Episodes:
    """An episode source of plain records (the feedback store's shape), for the inputs digest."""

    def __init__(self, *records):
        self.records = list(records)

    def episodes_with_outcomes(self, since, until):
        return iter(self.records)


def test_a_rounds_inputs_change_with_the_workspaces_code_and_the_episodes(workspace, tmp_path, monkeypatch):
    from context.config import SquidConfig
    from feedback.train.service import training_inputs

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = SquidConfig(train=TrainConfig(repository_tasks=50))
    episode = {"id": "e1", "created_at": 1.0, "kept_text": "return 1", "outcome": "kept"}
    source = Episodes(episode)
    first = training_inputs(config, source, [workspace])
    assert training_inputs(config, source, [workspace]) == first  # nothing changed
    (workspace / "notes.txt").write_text("not code")
    assert training_inputs(config, source, [workspace]) == first  # not a Python file
    (workspace / "local.py").write_text(LOCAL_ONLY + "\n\ndef triple(x):\n    return x * 3\n")
    edited = training_inputs(config, source, [workspace])
    assert edited != first
    reverted = Episodes({**episode, "outcome": "reverted", "kept_text": None, "output": "return 1"})
    assert training_inputs(config, reverted, [workspace]) != edited  # the same episode, a new outcome
    # Without repository tasks the workspace is not read at all: only the episodes count.
    off = SquidConfig(train=TrainConfig(repository_tasks=0))
    (workspace / "local.py").write_text(LOCAL_ONLY)
    assert training_inputs(off, source, [workspace]) == training_inputs(off, source, [tmp_path / "elsewhere"])


def test_body_positions_are_whole_function_bodies_below_their_def_line():
    text = ('def f(x):\n    """Doc."""\n    return x\n\n\ndef g(): return 1\n\n\n'
            'class A:\n    def m(self):\n        pass\n')
    assert body_positions(text) == [Position(1, 3, "    "), Position(10, 11, "        ")]
    assert body_positions("def f(:\n") == []


def test_gate_spots_are_served_prompts_in_files_no_episode_is_about(runtime, workspace, tmp_path,
                                                                   monkeypatch):
    from context.config import SquidConfig
    from feedback.train.dataset import TrainingExample
    from feedback.train.gate import GATE_SPOT
    from feedback.train.service import gate_spots

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    worked_on = TrainingExample(id="e1", created_at=1.0, instruction="", original="", kept_text="    pass",
                                group=f"{(workspace / 'client.py').as_uri()}#read_headers")
    config = SquidConfig(train=TrainConfig(gate_spots=12))
    spots = gate_spots(config, runtime.tokenizer, [workspace], [worked_on])
    assert spots and {s.group for s in spots} == {"headers.py", "local.py"}  # not client.py, nor broken.py
    assert all(s.verification["source"] == GATE_SPOT and s.id.startswith("spot-") for s in spots)
    assert not any(map(is_repository_task, spots))  # never trained on, never in the held-out set
    # A function's whole body is one kind of spot: the cursor below `def`, the body gone.
    body = next(s for s in spots if s.kept_text.startswith('    """Split'))
    assert body.served.text.endswith('def parse_header(text: str) -> tuple[str, str]:\n    ')
    assert "partition" not in body.served.text
    assert body.prompt_text + body.prompt_lead == body.served.text
    # Episodes about nothing in the workspace leave every parsing file to the gate; 0 spots: none.
    assert {s.group for s in gate_spots(config, runtime.tokenizer, [workspace], [])} == {
        "headers.py", "client.py", "local.py"}
    assert gate_spots(SquidConfig(train=TrainConfig(gate_spots=0)), runtime.tokenizer, [workspace], []) == []


def _module(functions: int, name: str) -> str:
    return "".join(f"def {name}_{i}(x):\n    y = x + {i}\n    return y * 2\n\n\n" for i in range(functions))


def test_gate_spots_fill_their_count_in_a_small_workspace_and_spread_over_a_large_one(runtime, tmp_path,
                                                                                    monkeypatch):
    from context.config import SquidConfig
    from feedback.train.service import gate_spots

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = SquidConfig(train=TrainConfig(gate_spots=12))
    small = tmp_path / "small"
    small.mkdir()
    for name in ("alpha", "beta"):
        (small / f"{name}.py").write_text(_module(6, name))
    spots = gate_spots(config, runtime.tokenizer, [small], [])
    # Two files, twelve spots asked: all twelve, six from each, no two prompted alike (a body and
    # its first statement are the same question to a prompt without the text after the cursor).
    assert len(spots) == 12
    assert sorted(s.group for s in spots) == ["alpha.py"] * 6 + ["beta.py"] * 6
    assert len({s.prompt_text for s in spots}) == 12
    large = tmp_path / "large"
    large.mkdir()
    names = [f"m{i:02d}" for i in range(20)]
    for name in names:
        (large / f"{name}.py").write_text(_module(3, name))
    spots = gate_spots(config, runtime.tokenizer, [large], [])
    # Twenty files, twelve spots: one from each of twelve files, not the first files by name.
    groups = [s.group for s in spots]
    assert len(groups) == 12 and len(set(groups)) == 12
    assert sorted(groups) != [f"{name}.py" for name in names[:12]]
    # The same seed, the same spots; another seed, other files.
    assert [s.id for s in gate_spots(config, runtime.tokenizer, [large], [])] == [s.id for s in spots]
    other = SquidConfig(train=TrainConfig(gate_spots=12, seed=1))
    assert {s.group for s in gate_spots(other, runtime.tokenizer, [large], [])} != set(groups)


def test_a_task_in_the_taught_fim_format_is_the_prompt_served_in_it(runtime, workspace, tmp_path):
    """`train.fim`: the task carries the text after the cursor in the format, and its ids are the
    ones a completion at that cursor is served with in that format (as while an adapter trained in it
    is applied); the adapter's meta then names the format (`trained_fim`), and a round without such
    tasks keeps the format of the adapter it continues."""
    from context.config import SquidConfig
    from context.fim import TAUGHT_TEMPLATE, taught
    from feedback.train.adapters import AdapterRef
    from feedback.train.service import task_fim, trained_fim

    fmt = taught("auto", ())
    with IndexStore(tmp_path / "index.db") as store:
        Indexer([workspace], store, workers=0).index_all()
        path = str(workspace / "client.py")
        (task,) = repository_tasks([(path, CLIENT)], symbols=store.symbols_named, codec=runtime,
                                   squid=replace(SQUID, max_documents=0), roots=[workspace],
                                   require_reference=False, per_file=1, fim=fmt)
    line = task.verification["line"] - 1
    lines = CLIENT.splitlines(keepends=True)
    assert task.served.fim == TAUGHT_TEMPLATE and task.served.suffix == "\n" + "".join(lines[line + 1:])
    document = "".join(lines[:line]) + task.prompt_lead + "\n" + "".join(lines[line + 1:])
    offset = len("".join(lines[:line])) + len(task.prompt_lead)
    runtime.forget_prefix()
    completion = complete(runtime, CompletionRequest(document, offset, "python", path),
                          replace(CompletionConfig(), max_tokens=4, fim=TAUGHT_TEMPLATE))
    assert completion is not None and completion.prompt.ids == task.served.ids

    config = SquidConfig(train=TrainConfig(fim="auto"))
    assert task_fim(config, runtime.tokenizer) == fmt
    assert trained_fim(config, runtime.tokenizer, [task], None) == TAUGHT_TEMPLATE
    earlier = AdapterRef("v0001", tmp_path, {"fim": "codellama"})
    assert trained_fim(config, runtime.tokenizer, [], earlier) == "codellama"
    assert trained_fim(config, runtime.tokenizer, [], None) == ""
    off = SquidConfig(train=TrainConfig(fim="off"))
    assert task_fim(off, runtime.tokenizer) is None
    assert trained_fim(off, runtime.tokenizer, [task], earlier) == "codellama"
