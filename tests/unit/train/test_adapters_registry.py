"""Adapter versions, the promoted pointer, rollback, the gate's decision, the status file, and the
scheduler's idle detection and stop signal."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest

from context.config import SquidConfig, TrainConfig
from context.errors import AdapterError, SquidcodeError
from feedback.train.adapters import AdapterRegistry, read_pointer
from feedback.train.gate import EvalResult, decide_promotion
from feedback.train.scheduler import IdleDetector, install_stop_signals, run_scheduler
from feedback.train.service import RoundResult
from feedback.train.status import read_status, train_paths, write_status


def save_files(text: str):
    def save(directory):
        (directory / "adapter_config.json").write_text("{}")
        (directory / "weights.txt").write_text(text)

    return save


def test_versions_promotion_and_rollback(tmp_path):
    registry = AdapterRegistry(tmp_path)
    assert registry.current() is None and registry.versions() == []
    first = registry.add_version(save_files("one"), {"steps": 3})
    second = registry.add_version(save_files("two"), {"steps": 5})
    assert (first.id, second.id) == ("v0001", "v0002")
    assert (second.path / "weights.txt").read_text() == "two" and second.meta["steps"] == 5
    registry.promote(first.id)
    third = registry.add_version(save_files("three"), {})
    assert third.meta["parent"] == "v0001"
    registry.promote(third.id)
    assert registry.current().id == "v0003"
    assert registry.rollback() == "v0001" and registry.current_id() == "v0001"
    assert registry.rollback() is None and registry.current() is None
    with pytest.raises(AdapterError, match="nothing to roll back"):
        registry.rollback()
    with pytest.raises(AdapterError, match="v0042"):
        registry.promote("v0042")


def test_a_damaged_pointer_reads_as_the_base_model(tmp_path):
    (tmp_path / "promoted.json").write_text("{not json")
    assert read_pointer(tmp_path)["current"] is None
    (tmp_path / "promoted.json").write_text(json.dumps(["a list"]))
    assert read_pointer(tmp_path)["current"] is None


def result(reward, kl=0.0):
    return EvalResult(reward, kl, 8)


def test_gate_promotes_only_when_rewards_hold_and_kl_is_small():
    ok = decide_promotion(
        result(0.5, 0.01), result(0.51), result(0.4, 0.02), result(0.4), tolerance=0.02, max_kl=0.1
    )
    assert ok.promote
    worse = decide_promotion(result(0.4), result(0.5), result(0.4), result(0.4), tolerance=0.02, max_kl=0.1)
    assert not worse.promote and "held-out" in worse.reasons[0]
    regressed = decide_promotion(
        result(0.6), result(0.5), result(0.3), result(0.4), tolerance=0.02, max_kl=0.1
    )
    assert not regressed.promote and "regression" in regressed.reasons[0]
    drifted = decide_promotion(
        result(0.6, 0.5), result(0.5), result(0.5), result(0.4), tolerance=0.02, max_kl=0.1
    )
    assert not drifted.promote and "KL" in drifted.reasons[0]


def test_status_file_round_trip_and_a_dead_trainer_reads_as_stopped(tmp_path):
    path = tmp_path / "status.json"
    assert read_status(path) == {"state": "idle"}
    write_status(path, "training", step=3, steps=10)
    assert read_status(path)["step"] == 3 and read_status(path)["state"] == "training"
    status = json.loads(path.read_text())
    status["pid"] = 2**22 + 12345  # no such process
    path.write_text(json.dumps(status))
    assert read_status(path)["state"] == "stopped"
    with pytest.raises(ValueError):
        write_status(path, "dancing")


def test_train_paths_follow_the_config(tmp_path):
    config = SquidConfig(train=TrainConfig(dir=str(tmp_path / "t")))
    paths = train_paths(config)
    assert paths.status == tmp_path / "t" / "status.json" and paths.adapters == tmp_path / "t" / "adapters"


def test_idle_detector_discounts_the_trainers_own_load():
    idle = IdleDetector(0.5, loadavg=lambda: (1.8, 0, 0), cores=2)
    assert not idle.is_idle()
    assert idle.is_idle(training=True)


class RecordingRound:
    """Stands in for a training round (a real one loads a model): records how it was asked to run."""

    def __init__(self, fail: bool = False):
        self.calls = []
        self.fail = fail

    def __call__(self, config, *, steps, paths, should_stop):
        self.calls.append((steps, should_stop()))
        if self.fail:
            raise SquidcodeError("no data")


def test_scheduler_waits_while_busy_and_trains_when_idle(tmp_path):
    config = SquidConfig(train=TrainConfig(dir=str(tmp_path), nice=0))
    loads = iter([(9.0, 0, 0)] + [(0.0, 0, 0)] * 10)
    idle = IdleDetector(0.5, loadavg=lambda: next(loads), cores=2)
    round_fn = RecordingRound()
    done = run_scheduler(
        config, stop=threading.Event(), rounds=2, poll_s=0.01, idle=idle, steps=3, round_fn=round_fn
    )
    assert done == 2 and round_fn.calls == [(3, False), (3, False)]


def test_scheduler_reports_a_failed_round_and_goes_on(tmp_path):
    config = SquidConfig(train=TrainConfig(dir=str(tmp_path), nice=0))
    idle = IdleDetector(0.5, loadavg=lambda: (0.0, 0, 0), cores=2)
    run_scheduler(
        config, stop=threading.Event(), rounds=1, poll_s=0.01, idle=idle, round_fn=RecordingRound(fail=True)
    )
    status = read_status(tmp_path / "status.json")
    assert status["state"] == "error" and status["message"] == "no data"


def test_sigterm_sets_the_stop_event():
    stop = threading.Event()
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        install_stop_signals(stop)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(2)
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])


class FinishingRound(RecordingRound):
    """A stand-in round that finishes (rejected by its gate), as a real round that ran its steps does."""

    def __call__(self, config, *, steps, paths, should_stop):
        super().__call__(config, steps=steps, paths=paths, should_stop=should_stop)
        return RoundResult("rejected", steps or 1, None, "kept the base model")


def test_scheduler_starts_a_round_only_when_its_inputs_changed(tmp_path):
    config = SquidConfig(train=TrainConfig(dir=str(tmp_path), nice=0))
    idle = IdleDetector(0.5, loadavg=lambda: (0.0, 0, 0), cores=2)
    seen = iter(["episodes-1", "episodes-1", "episodes-1", "episodes-2"])
    asked = []

    def inputs(cfg):
        asked.append(next(seen))
        return asked[-1]

    round_fn = FinishingRound()
    done = run_scheduler(config, stop=threading.Event(), rounds=2, poll_s=0.01, idle=idle, round_fn=round_fn,
                         inputs_fn=inputs)
    # Twice nothing new: the scheduler waited instead of training on the same data again.
    assert done == 2 and len(round_fn.calls) == 2 and asked == ["episodes-1"] * 3 + ["episodes-2"]
    assert (tmp_path / "last_round_inputs").read_text() == "episodes-2"


def test_scheduler_resumes_a_stopped_round_whatever_its_inputs(tmp_path):
    config = SquidConfig(train=TrainConfig(dir=str(tmp_path), nice=0))
    (tmp_path / "last_round_inputs").write_text("same")
    (tmp_path / "run" / "checkpoint").mkdir(parents=True)
    idle = IdleDetector(0.5, loadavg=lambda: (0.0, 0, 0), cores=2)
    round_fn = FinishingRound()
    assert run_scheduler(config, stop=threading.Event(), rounds=1, poll_s=0.01, idle=idle, round_fn=round_fn,
                         inputs_fn=lambda cfg: "same") == 1
    assert len(round_fn.calls) == 1


def test_scheduler_waits_with_nothing_new_and_says_so(tmp_path):
    config = SquidConfig(train=TrainConfig(dir=str(tmp_path), nice=0))
    (tmp_path / "last_round_inputs").write_text("same")
    idle = IdleDetector(0.5, loadavg=lambda: (0.0, 0, 0), cores=2)
    stop = threading.Event()
    round_fn = FinishingRound()
    timer = threading.Timer(0.3, stop.set)
    timer.start()
    assert run_scheduler(config, stop=stop, poll_s=0.01, idle=idle, round_fn=round_fn,
                         inputs_fn=lambda cfg: "same") == 0
    assert round_fn.calls == []
    status = read_status(tmp_path / "status.json")
    assert status["message"] == "nothing new to train on since the last round"
