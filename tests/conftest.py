"""Shared fixtures: the real model (converted once per machine into the squidcode cache), the
server command, and the bundled example workspace."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

from context.config import ModelConfig, default_cache_dir
from context.runtime import ModelRuntime, get_runtime

# tests/data holds fixtures, among them the agent's repair tasks whose own tests fail on purpose.
collect_ignore_glob = ["data/*"]

REPO = Path(__file__).resolve().parent.parent
# The longest files, longest first (durations from a fresh-clone run on the 2-core machine): run on
# two workers (`./dev test`), a file each at a time, they start first, and the short files fill in
# around them; last, the learning loop alone kept one worker busy for 4 minutes after the other was done.
SLOW_FIRST = (
    "e2e/test_learning_loop.py", "e2e/test_team_loop.py", "e2e/test_vscode.py", "e2e/test_lsp_server.py",
    "e2e/test_shutdown.py", "e2e/test_demo.py", "unit/index/test_stdlib_recall.py",
    "e2e/test_neovim_plugin.py", "e2e/test_neovim.py", "unit/test_runtime_cache.py", "e2e/test_wheel.py",
    "unit/squid/test_bench.py", "e2e/test_feedback_kill.py", "e2e/test_openai_server.py",
    "unit/train/test_repair_tasks.py",
)
SERVER_CMD = [sys.executable, "-m", "lsp_server", "serve"]
DEMO_WORKSPACE = REPO / "lsp_server" / "demo_workspace"
# Servers started by tests record feedback (on by default) into a throwaway folder, not the user's.
os.environ.setdefault("SQUIDCODE_DATA_DIR", tempfile.mkdtemp(prefix="squidcode-test-data-"))


@pytest.fixture(scope="session", autouse=True)
def plain_pytest_in_subprocesses():
    """The agent's test runs, repair tasks and reward checks start pytest on small projects that
    need no plugin; this venv's entry-point plugins (pytest-lsp, xdist, ...) would add 3-4 s to each
    start. Set in each worker once it runs (xdist's workers themselves keep their plugins), and kept
    through the agent's scrubbed environment (`agent.contain.scrubbed_env`)."""
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    yield
    os.environ.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread_per_worker():
    """On `./dev test`'s two workers, each worker's own forward passes run on one torch thread: two
    workers of two threads on two cores spin against each other (see `one_torch_thread`). A test
    that sets its own count still does; a serial run keeps torch's default."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def model_cache_dir() -> Path:
    """The default cache dir, holding a converted copy of the embedded model.

    Servers started by the tests load from it in about a second instead of converting the GGUF
    file again (~20 s); the first test session on a machine pays the conversion once.
    """
    cache = default_cache_dir()
    ModelRuntime(ModelConfig(), cache)._model_dir()
    return cache


@pytest.fixture(scope="session")
def runtime(model_cache_dir) -> ModelRuntime:
    """The embedded model, loaded in the test process (shared by the unit tests)."""
    return get_runtime(ModelConfig(), model_cache_dir)


@pytest.fixture
def one_torch_thread():
    """One torch thread for a test: on a shared 2-core machine torch's thread pool spins, and a
    forward pass or a training step takes 10-30x longer."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_collection_modifyitems(config, items):
    """`SLOW_FIRST`'s files first, in that order; the rest as collected."""
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    tests_dir = Path(__file__).resolve().parent

    def key(item) -> int:
        try:
            rel = Path(str(item.path)).resolve().relative_to(tests_dir).as_posix()
        except ValueError:
            return len(rank)
        return rank.get(rel, len(rank))

    items.sort(key=key)  # stable: a file's tests keep their order
