"""`squidcode train`: a round on a tiny model through the CLI (train, gate, promote, status,
rollback), a rejected round, and a SIGTERM mid-round that loses nothing."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from feedback.train.trainer import StepRecord
from lsp_server.cli import main
from lsp_server.cli_train import StepProgress, step_postfix
from tests.unit.train.conftest import tiny_model_dir  # noqa: F401 - fixture

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def workspace(tmp_path, tiny_model_dir, monkeypatch):  # noqa: F811 - the fixture above
    train_dir = tmp_path / "train"
    (tmp_path / ".squidcode.toml").write_text(
        f'[model]\npath = "{tiny_model_dir}"\n'
        f'[train]\ndir = "{train_dir}"\ngroup_size = 2\nprompts_per_step = 1\nmax_new_tokens = 4\n'
        "learning_rate = 0.01\nnice = 0\nthreads = 1\npromote_tolerance = 2.0\npromote_max_kl = 100.0\n"
    )
    monkeypatch.chdir(tmp_path)
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    yield tmp_path
    signal.signal(signal.SIGTERM, previous[0])
    signal.signal(signal.SIGINT, previous[1])


def run_json(capsys, *argv) -> dict:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_once_trains_gates_promotes_and_rolls_back(workspace, capsys):
    result = run_json(capsys, "train", "--once", "--steps", "2", "--json")
    assert result["state"] == "promoted" and result["adapter"] == "v0001" and result["steps"] == 2
    status = run_json(capsys, "train", "status", "--json")
    assert status["state"] == "promoted" and status["promoted"] == "v0001" and status["versions"] == ["v0001"]
    assert set(status["metrics"]) >= {"held_out", "regression", "held_out_baseline", "reasons"}
    version = workspace / "train" / "adapters" / "versions" / "v0001"
    assert (version / "adapter_model.safetensors").is_file() and (version / "meta.json").is_file()
    steps = json.loads((version / "meta.json").read_text())["steps"]
    # Each step with its groups, and those whose samples all scored alike (they teach nothing).
    assert [s["step"] for s in steps] == [1, 2] and all(s["groups"] == 1 and 0 <= s["skipped"] <= 1
                                                       for s in steps)
    assert not (workspace / "train" / "run").exists()  # the round is over: the next starts from v0001
    assert run_json(capsys, "train", "rollback", "--json") == {"promoted": None}
    capsys.readouterr()
    assert main(["train", "status"]) == 0
    assert "adapter in use: none (base model); versions: v0001" in capsys.readouterr().out
    assert main(["train", "rollback"]) == 1
    assert "nothing to roll back" in capsys.readouterr().err


def test_once_reports_each_step_with_reward_and_kl_on_stderr(workspace, capsys):
    capsys.readouterr()
    assert main(["train", "--once", "--steps", "2", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["state"] == "promoted"  # stdout holds the JSON result alone
    lines = [line for line in err.splitlines() if line.startswith("squidcode: ")]
    assert lines[0] == "squidcode: training: started"
    assert re.fullmatch(r"squidcode: training: 1/2 steps \(50%\), [\d.]+s, reward=\S+, kl=\S+", lines[1])
    assert re.fullmatch(r"squidcode: training: done, 2/2 steps \(100%\) in [\d.]+s, reward=\S+, kl=\S+",
                        lines[2])
    assert lines[3] == "squidcode: promotion gate: evaluating the new adapter against the one in use"


def test_step_progress_shows_a_step_records_reward_and_kl():
    record = StepRecord(step=3, mean_reward=0.41234, kl=0.0031234, loss=0.1, clip_fraction=0.0,
                        skipped_groups=0, groups=2, seconds=12.5)
    assert step_postfix(record) == {"reward": 0.41234, "kl": 0.0031234}
    stream = io.StringIO()
    with StepProgress(stream) as on_step:
        on_step(record, 6)
    lines = stream.getvalue().splitlines()
    assert re.fullmatch(r"squidcode: training: 3/6 steps \(50%\), [\d.]+s, reward=0\.4123, kl=0\.003123",
                        lines[1])
    assert lines[-1].startswith("squidcode: training: stopped at 3/6 steps (50%) after ")


def test_a_round_over_the_kl_limit_is_rejected(workspace, capsys):
    toml = workspace / ".squidcode.toml"
    toml.write_text(toml.read_text().replace("promote_max_kl = 100.0", "promote_max_kl = 0.0"))
    result = run_json(capsys, "train", "--once", "--steps", "2", "--json")
    assert result["state"] == "rejected" and result["adapter"] is None and "KL" in result["message"]
    status = run_json(capsys, "train", "status", "--json")
    assert status["promoted"] is None and status["versions"] == ["v0001"]


def test_sigterm_stops_the_round_and_the_next_run_resumes(workspace, capsys):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lsp_server", "train", "--once", "--steps", "500", "--json"],
        cwd=workspace,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    status_path = workspace / "train" / "status.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if status_path.is_file() and json.loads(status_path.read_text()).get("step", 0) >= 2:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    result = json.loads(out.strip().splitlines()[-1])
    assert proc.returncode == 0 and result["state"] == "stopped"
    stopped_at = result["steps"]
    checkpoint = json.loads((workspace / "train" / "run" / "checkpoint" / "state.json").read_text())
    assert checkpoint["step"] == stopped_at >= 2
    status = run_json(capsys, "train", "status", "--json")
    assert status["state"] == "stopped" and "resumes" in status["message"]
    resumed = run_json(capsys, "train", "--once", "--steps", "1", "--json")
    assert resumed["steps"] == stopped_at + 1 and resumed["state"] == "promoted"


def test_background_mode_needs_train_enabled(workspace, capsys):
    assert main(["train"]) == 2
    assert "train.enabled is false" in capsys.readouterr().err


def test_background_trainer_process_runs_reports_and_stops(workspace, monkeypatch):
    from context.config import load_file_config
    from feedback.train.scheduler import spawn_background
    from feedback.train.status import read_status, train_paths

    toml = workspace / ".squidcode.toml"
    toml.write_text(toml.read_text().replace("[train]\n", "[train]\nenabled = true\nidle_load = 64.0\n"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    config, problems = load_file_config([workspace])
    assert not problems
    paths = train_paths(config)
    pid = spawn_background(config_root=workspace, paths=paths)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and read_status(paths.status).get("step", 0) < 1:
            time.sleep(0.2)
        status = read_status(paths.status)
        assert status["pid"] == pid and status["state"] in ("training", "evaluating", "promoted", "loading")
        # A second start finds it running and does not start another.
        assert spawn_background(config_root=workspace, paths=paths) == pid
    finally:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _running(pid):
        time.sleep(0.2)
    assert not _running(pid)
    assert read_status(paths.status)["state"] in ("stopped", "promoted", "rejected")


def _running(pid: int) -> bool:
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return finished == 0


def test_a_round_mixes_in_tasks_made_from_the_workspaces_code(workspace, capsys):
    """`train.repository_tasks`: the round makes completion tasks from the workspace it runs in,
    trains on some files' tasks and gates on the others' (`feedback.train.repo_tasks`)."""
    config = workspace / ".squidcode.toml"
    config.write_text(config.read_text() + "repository_tasks = 8\n")
    (workspace / "units.py").write_text("def to_metres(feet):\n    return feet * 0.3048\n")
    for name in ("walk", "run", "swim"):
        (workspace / f"{name}.py").write_text(f"from units import to_metres\n\n\ndef {name}(feet):\n"
                                              "    metres = to_metres(feet)\n    return metres\n")
    result = run_json(capsys, "train", "--once", "--steps", "1", "--json")
    assert result["state"] in ("promoted", "rejected")
    data = run_json(capsys, "train", "status", "--json")["metrics"]["data"]
    assert data["repository"]["train"] >= 1 and data["repository"]["held_out"] >= 1
    assert data["repository"]["train"] + data["repository"]["held_out"] == 3  # one call per file
    assert data["held_out"] > data["repository"]["held_out"]  # the regression tasks are still gated


def test_training_from_a_collector_store_needs_the_team_and_says_what_is_missing(workspace, capsys):
    assert main(["train", "--once", "--team", "acme"]) == 1
    assert "give --source too" in capsys.readouterr().err
    assert main(["train", "--once", "--source", "sqlite:/nowhere/collector.db"]) == 1
    assert "--team" in capsys.readouterr().err
    assert main(["train", "--once", "--steps", "1", "--source", f"sqlite:{workspace / 'none.db'}",
                 "--team", "acme"]) == 1
    assert "no collector database" in capsys.readouterr().err


def test_torchrun_processes_use_gloo_on_the_cpu_and_on_gpus_nccl_each_on_its_own_gpu(monkeypatch):
    """The process-group choice under torchrun. No GPU here: CUDA's presence and the group's start
    are test doubles that record what they were asked (the real gloo group is in test_team_loop)."""
    from dataclasses import replace

    import torch
    import torch.distributed as dist

    from context.config import SquidConfig
    from lsp_server.cli_train import _init_distributed

    calls = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend: calls.append(("group", backend)))
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: calls.append(("gpu", index)))

    def for_device(device: str) -> SquidConfig:
        config = SquidConfig()
        return replace(config, train=replace(config.train, device=device))

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    _init_distributed(for_device("cpu"))
    assert calls == []  # one process: no group
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    _init_distributed(for_device("cpu"))
    assert calls == [("group", "gloo")]
    calls.clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for device in ("cuda", "auto"):
        _init_distributed(for_device(device))
        assert calls == [("gpu", 1), ("group", "cpu:gloo,cuda:nccl")], device
        calls.clear()


def test_train_reader_refuses_missing_folders_and_distils_one_from_python_files(workspace, capsys):
    import shutil
    import sysconfig

    assert main(["train", "reader"]) == 2
    assert "needs --files DIR" in capsys.readouterr().err
    assert main(["train", "reader", "--files", str(workspace / "nowhere")]) == 2
    assert "not a folder" in capsys.readouterr().err
    src = workspace / "src"
    (src / "skipped").mkdir(parents=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("argparse.py", "ast.py", "calendar.py", "configparser.py", "csv.py", "datetime.py",
                 "difflib.py", "email/message.py", "enum.py", "fractions.py"):
        shutil.copy(stdlib / name, src / Path(name).name)
    shutil.copy(stdlib / "inspect.py", src / "skipped" / "inspect.py")
    out = workspace / "reader"
    report = run_json(capsys, "train", "reader", "--files", str(src), "--exclude", "skipped/*", "--sets", "1",
                      "--epochs", "2", "--out", str(out), "--json")
    assert report["tasks"] == 5 and report["documents"] == 10 and len(report["epoch_losses"]) == 2
    assert not any("skipped" in name for name in report["sources"])
    assert json.loads((out / "squid_reader.json").read_text())["kind"] == "squid-reader"
    assert (out / "adapter_model.safetensors").is_file()
