"""bench/learning_loop.py --train-setting: a variant's [train] settings reach the product's configuration
as written, and a setting that is not one, or has its own flag, or is no TOML value is refused."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.learning_loop import Plan, train_setting, workspace_config  # noqa: E402
from context.config import load_file_config  # noqa: E402


def test_a_train_setting_reaches_the_product_configuration(tmp_path):
    settings = (train_setting('loss_type="grpo"'), train_setting(" group_size = 8 "))
    plan = Plan(rounds=1, train_spots=1, eval_spots=1, steps=3, agent=False, train_settings=settings)
    (tmp_path / ".squidcode.toml").write_text(workspace_config(tmp_path / "data", plan))
    config, problems = load_file_config([tmp_path])
    assert problems == []
    assert (config.train.loss_type, config.train.group_size, config.train.steps) == ("grpo", 8, 3)
    # Every spot answers from its whole window, whatever budget this machine's tuning would give.
    assert (config.completion.prefix_tokens, config.completion.keystroke_prefill_tokens) == (256, 0)


@pytest.mark.parametrize("text, says", [("nope=1", "not a train setting"), ("steps=3", "its own flag"),
                                        ("loss_type=grpo", "not a TOML value")])
def test_a_wrong_train_setting_is_refused_with_the_reason(text, says):
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        train_setting(text)


def test_a_setting_on_the_command_line_replaces_the_plans_own():
    from bench.learning_loop import merged_settings

    plan = ("group_size = 8", 'loss_type = "grpo"')
    merged = merged_settings(plan, [train_setting("group_size=4"), train_setting("beta=0.1")])
    assert merged == ('loss_type = "grpo"', "group_size = 4", "beta = 0.1")
    assert merged_settings(plan, []) == plan


@pytest.mark.parametrize("flag", ["--rounds", "--steps", "--train-spots", "--eval-spots"])
def test_a_count_of_zero_is_refused_not_read_as_the_plans_own(flag, capsys):
    from bench.learning_loop import main

    with pytest.raises(SystemExit) as exit_:
        main([flag, "0"])
    assert exit_.value.code == 2 and "at least 1, not 0" in capsys.readouterr().err
