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
SERVER_CMD = [sys.executable, "-m", "lsp_server", "serve"]
DEMO_WORKSPACE = REPO / "lsp_server" / "demo_workspace"
# Servers started by tests record feedback (on by default) into a throwaway folder, not the user's.
os.environ.setdefault("SQUIDCODE_DATA_DIR", tempfile.mkdtemp(prefix="squidcode-test-data-"))


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
