"""Fixtures for the agent tests: a small real project (git repository, tests, ruff config)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agent.overlay import Overlay
from agent.sandbox import Workspace
from agent.tools import ToolContext
from context.config import AgentConfig

CALC = '''"""Arithmetic helpers."""


def add(a, b):
    return a - b


def mean(values):
    return sum(values) / len(values)
'''
TEST_CALC = """from calc import add, mean


def test_add():
    assert add(2, 3) == 5


def test_mean():
    assert mean([1, 2, 3]) == 2
"""


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "calc.py").write_text(CALC)
    (root / "test_calc.py").write_text(TEST_CALC)
    (root / "pyproject.toml").write_text(
        '[tool.ruff]\nline-length = 100\n[tool.ruff.lint]\nselect = ["E", "F"]\n'
    )
    return root


@pytest.fixture
def ctx(project: Path) -> ToolContext:
    workspace = Workspace([project])
    return ToolContext(workspace, Overlay(workspace), AgentConfig(test_timeout_s=30, tool_timeout_s=20))
