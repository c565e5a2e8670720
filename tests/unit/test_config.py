"""Layered configuration: every bad value becomes a problem naming its source and setting, the
default (or a lower layer's value) is used, and nothing raises."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from context.config import (
    CompletionConfig,
    ConfigLayer,
    ModelConfig,
    SquidConfig,
    config_from_mapping,
    default_cache_dir,
    load_config_file,
    merge_layers,
    user_config_path,
)


def test_empty_layers_give_defaults():
    config, problems = merge_layers([])
    assert config == SquidConfig()
    assert problems == []
    config, problems = config_from_mapping({})
    assert config == SquidConfig() and problems == []


def test_valid_values_are_applied():
    config, problems = config_from_mapping(
        {
            "log_level": "DEBUG",
            "model": {"device": "CPU", "dtype": "float32", "threads": 2, "path": "/m", "cache_dir": None},
            "completion": {
                "enabled": False,
                "max_tokens": 8,
                "temperature": 1,
                "stop": ["\n\n", "#"],
                "debounce_ms": 0,
            },
        }
    )
    assert problems == []
    assert config.log_level == "debug"
    assert config.model == ModelConfig(path="/m", device="cpu", dtype="float32", threads=2)
    assert config.completion.enabled is False
    assert config.completion.max_tokens == 8
    assert config.completion.temperature == 1.0 and isinstance(config.completion.temperature, float)
    assert config.completion.stop == ("\n\n", "#")
    assert config.completion.debounce_ms == 0


# -- one bad value at a time ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "values, setting, words",
    [
        # unknown keys, at the top and inside sections
        ({"colour": "blue"}, "colour", "unknown setting"),
        ({"completion": {"max_tokenz": 8}}, "completion.max_tokenz", "unknown setting"),
        ({"model": {"gpu": True}}, "model.gpu", "unknown setting"),
        ({"max_tokens": 8}, "max_tokens", "unknown setting"),
        # wrong types
        ({"completion": {"max_tokens": "lots"}}, "completion.max_tokens", "must be an integer"),
        ({"completion": {"max_tokens": 8.0}}, "completion.max_tokens", "must be an integer"),
        ({"completion": {"max_tokens": True}}, "completion.max_tokens", "must be an integer"),
        ({"completion": {"max_tokens": None}}, "completion.max_tokens", "must be an integer"),
        ({"completion": {"temperature": "warm"}}, "completion.temperature", "must be a number"),
        ({"completion": {"temperature": False}}, "completion.temperature", "must be a number"),
        ({"completion": {"enabled": "yes"}}, "completion.enabled", "must be true or false"),
        ({"completion": {"enabled": 1}}, "completion.enabled", "must be true or false"),
        ({"completion": {"stop": "\n"}}, "completion.stop", "list of non-empty strings"),
        ({"completion": {"stop": ["ok", ""]}}, "completion.stop", "list of non-empty strings"),
        ({"completion": {"stop": [1]}}, "completion.stop", "list of non-empty strings"),
        ({"model": {"path": 42}}, "model.path", "must be a string"),
        ({"model": {"device": 0}}, "model.device", "must be a string"),
        ({"log_level": ["info"]}, "log_level", "must be a string"),
        # out of range
        ({"completion": {"max_tokens": 0}}, "completion.max_tokens", "between 1 and 1024"),
        ({"completion": {"max_tokens": 10**9}}, "completion.max_tokens", "between 1 and 1024"),
        ({"completion": {"max_tokens": -1}}, "completion.max_tokens", "between"),
        ({"completion": {"temperature": 2.5}}, "completion.temperature", "between 0.0 and 2.0"),
        ({"completion": {"temperature": -0.1}}, "completion.temperature", "between"),
        ({"completion": {"temperature": math.nan}}, "completion.temperature", "between"),
        ({"completion": {"temperature": math.inf}}, "completion.temperature", "between"),
        ({"completion": {"debounce_ms": 60_000}}, "completion.debounce_ms", "between"),
        ({"model": {"threads": -2}}, "model.threads", "between"),
        # choices
        ({"model": {"device": "tpu"}}, "model.device", "must be one of auto, cpu, cuda, mps"),
        ({"model": {"dtype": "int4"}}, "model.dtype", "must be one of"),
        ({"log_level": "verbose"}, "log_level", "must be one of debug, info, warning, error"),
        ({"agent": {"type_checker": "mypy"}}, "agent.type_checker", "must be one of auto, ty, basedpyright"),
        # sections that are not tables
        ({"completion": 5}, "completion", "must be a table"),
        ({"model": "big"}, "model", "must be a table"),
        ({"completion": ["max_tokens", 8]}, "completion", "must be a table"),
    ],
)
def test_bad_value_is_a_problem_and_the_default_is_used(values, setting, words):
    config, problems = config_from_mapping(values, source="my-settings")
    assert config == SquidConfig(), "a bad value must leave the default in place"
    assert len(problems) == 1, problems
    problem = problems[0]
    assert problem.startswith("my-settings: "), problem
    assert f"'{setting}'" in problem, problem
    assert words in problem, problem


def test_bad_value_problem_names_the_default():
    _, problems = config_from_mapping({"completion": {"max_tokens": "lots"}})
    assert problems == [
        "settings: 'completion.max_tokens' must be an integer, got 'lots'; "
        "this value is ignored (default: 32)"
    ]


@pytest.mark.parametrize("values", ["max_tokens=8", 42, ["completion"], True])
def test_a_layer_that_is_not_a_table_is_a_problem(values):
    config, problems = merge_layers([ConfigLayer("initializationOptions", values)])
    assert config == SquidConfig()
    assert len(problems) == 1 and problems[0].startswith("initializationOptions: ")
    assert "must be a table" in problems[0]


@pytest.mark.parametrize("values", [None, [], {}])
def test_null_or_empty_settings_are_no_settings(values):
    """null means "no settings"; Lua clients send an empty table as []."""
    config, problems = merge_layers(
        [
            ConfigLayer("user", {"completion": {"max_tokens": 7}}),
            ConfigLayer("initializationOptions", values),
            ConfigLayer("workspace settings", {"completion": values}),
        ]
    )
    assert problems == []
    assert config.completion.max_tokens == 7


def test_good_values_next_to_bad_ones_are_kept():
    config, problems = config_from_mapping(
        {
            "completion": {"max_tokens": "lots", "temperature": 0.5, "debounce_ms": -3, "max_lines": 3},
            "model": {"device": "tpu", "threads": 4},
            "surprise": 1,
        }
    )
    assert config.completion.max_tokens == CompletionConfig().max_tokens
    assert config.completion.debounce_ms == CompletionConfig().debounce_ms
    assert config.completion.temperature == 0.5
    assert config.completion.max_lines == 3
    assert config.model.device == "auto" and config.model.threads == 4
    assert len(problems) == 4
    for setting in ("completion.max_tokens", "completion.debounce_ms", "model.device", "surprise"):
        assert any(f"'{setting}'" in p for p in problems), (setting, problems)


def test_range_bounds_are_inclusive():
    config, problems = config_from_mapping(
        {"completion": {"max_tokens": 1024, "temperature": 0, "debounce_ms": 0, "prefix_tokens": 16}}
    )
    assert problems == []
    assert config.completion.max_tokens == 1024 and config.completion.prefix_tokens == 16


# -- layers ----------------------------------------------------------------------------------


def test_later_layers_win_key_by_key():
    config, problems = merge_layers(
        [
            ConfigLayer("user", {"completion": {"max_tokens": 10, "temperature": 0.3}, "log_level": "debug"}),
            ConfigLayer("workspace", {"completion": {"max_tokens": 20}, "model": {"device": "cpu"}}),
            ConfigLayer("initializationOptions", {"completion": {"max_lines": 2}}),
            ConfigLayer("workspace settings", {"completion": {"max_tokens": 40}}),
        ]
    )
    assert problems == []
    assert config.completion.max_tokens == 40  # the last layer that set it
    assert config.completion.temperature == 0.3  # set only by the first layer
    assert config.completion.max_lines == 2
    assert config.model.device == "cpu"
    assert config.log_level == "debug"


def test_a_bad_value_in_a_later_layer_does_not_override_an_earlier_good_one():
    config, problems = merge_layers(
        [
            ConfigLayer("user", {"completion": {"max_tokens": 12}}),
            ConfigLayer("initializationOptions", {"completion": {"max_tokens": "lots"}}),
        ]
    )
    assert config.completion.max_tokens == 12
    assert len(problems) == 1 and problems[0].startswith("initializationOptions: ")
    assert "'completion.max_tokens'" in problems[0]


def test_a_broken_section_in_a_later_layer_keeps_earlier_values():
    config, problems = merge_layers(
        [
            ConfigLayer("user", {"completion": {"max_tokens": 12}, "model": {"device": "cpu"}}),
            ConfigLayer("workspace", {"completion": "oops", "model": {"bogus": 1}}),
        ]
    )
    assert config.completion.max_tokens == 12 and config.model.device == "cpu"
    assert len(problems) == 2 and all(p.startswith("workspace: ") for p in problems)


def test_problems_come_in_layer_order_and_name_their_source():
    _, problems = merge_layers(
        [
            ConfigLayer("/home/u/.config/squidcode/config.toml", {"completion": {"max_tokens": 0}}),
            ConfigLayer("/proj/.squidcode.toml", {"model": {"device": "tpu"}}),
            ConfigLayer("initializationOptions", {"nope": 1}),
        ]
    )
    assert [p.split(": ", 1)[0] for p in problems] == [
        "/home/u/.config/squidcode/config.toml",
        "/proj/.squidcode.toml",
        "initializationOptions",
    ]


def test_layers_are_not_mutated():
    first = {"completion": {"max_tokens": 10}}
    second = {"completion": {"temperature": 0.2}}
    merge_layers([ConfigLayer("a", first), ConfigLayer("b", second)])
    assert first == {"completion": {"max_tokens": 10}}
    assert second == {"completion": {"temperature": 0.2}}


def test_merged_config_is_hashable_and_comparable():
    """The server compares model settings across reloads to decide whether to reload the model."""
    a, _ = config_from_mapping({"model": {"device": "cpu"}, "completion": {"stop": ["x"]}})
    b, _ = config_from_mapping({"model": {"device": "CPU"}, "completion": {"stop": ("x",)}})
    assert a == b and hash(a) == hash(b)
    assert a.model == b.model


# -- files -----------------------------------------------------------------------------------


def test_missing_file_is_empty_without_problems(tmp_path):
    assert load_config_file(tmp_path / "nope.toml") == ({}, [])


def test_valid_file_is_read(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('log_level = "warning"\n[completion]\nmax_tokens = 48\nstop = ["#"]\n')
    values, problems = load_config_file(path)
    assert problems == []
    config, problems = merge_layers([ConfigLayer(str(path), values)])
    assert problems == []
    assert config.completion.max_tokens == 48 and config.completion.stop == ("#",)
    assert config.log_level == "warning"


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"[completion\nmax_tokens = 8\n", id="unclosed-table"),
        pytest.param(b"max_tokens = \n", id="missing-value"),
        pytest.param(b"[completion]\nmax_tokens = 8\nmax_tokens = 9\n", id="duplicate-key"),
        pytest.param(b'name = "\xff\xfe"\n', id="not-utf8"),
        pytest.param(b"\x00\x01\x02", id="binary"),
    ],
)
def test_broken_toml_is_a_problem_not_an_exception(tmp_path, content):
    path = tmp_path / ".squidcode.toml"
    path.write_bytes(content)
    values, problems = load_config_file(path)
    assert values == {}
    assert len(problems) == 1
    assert problems[0].startswith(f"{path}: ")
    assert "ignored" in problems[0]


def test_unreadable_path_is_a_problem(tmp_path):
    folder = tmp_path / "config.toml"
    folder.mkdir()
    values, problems = load_config_file(folder)
    assert values == {}
    assert len(problems) == 1 and str(folder) in problems[0] and "cannot read" in problems[0]


def test_file_values_are_validated_like_any_layer(tmp_path):
    path = tmp_path / ".squidcode.toml"
    path.write_text('[completion]\nmax_tokens = "many"\ntemperature = 0.1\n[model]\ndevice = "tpu"\n')
    values, problems = load_config_file(path)
    assert problems == []
    config, problems = merge_layers([ConfigLayer(str(path), values)])
    assert config.completion.temperature == pytest.approx(0.1)
    assert config.completion.max_tokens == 32 and config.model.device == "auto"
    assert len(problems) == 2 and all(p.startswith(f"{path}: ") for p in problems)


# -- paths -------------------------------------------------------------------------------------


def test_xdg_paths(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert user_config_path() == tmp_path / "cfg" / "squidcode" / "config.toml"
    assert default_cache_dir() == tmp_path / "cache" / "squidcode"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert user_config_path() == Path.home() / ".config" / "squidcode" / "config.toml"
    assert default_cache_dir() == Path.home() / ".cache" / "squidcode"


def test_resolved_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert SquidConfig().resolved_cache_dir() == tmp_path / "squidcode"
    config, problems = config_from_mapping({"model": {"cache_dir": "~/models-cache"}})
    assert problems == []
    assert config.resolved_cache_dir() == Path.home() / "models-cache"
