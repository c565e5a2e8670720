"""Per-machine speed settings (`context.tuning`): choices from given costs, the user's settings
winning, and the cache keyed by CPU and model that a broken file never breaks."""

from __future__ import annotations

import json
import os
import time

import pytest

from context import tuning
from context.config import CompletionConfig, ModelConfig, config_from_mapping
from context.tuning import (
    CONTEXT_TOKENS,
    PROBE_TOKENS,
    UNTUNED,
    WIDTHS,
    MachineCosts,
    PassCosts,
    choose,
    describe,
    load_costs,
    resolve,
    store_costs,
    tuning_file,
    tuning_key,
    worth_measuring_again,
)
from kernels.cpu_decode import STALE_S, prune_stale


def passes(step_ms: float, token_cost: float, threads: int = 1, per_token_ms: float = 1.0,
           per_position_us: float = 0.5) -> PassCosts:
    """Costs where a pass of w tokens costs 1 + token_cost * (w - 1) steps, and prefilling costs
    `per_token_ms` a token plus `per_position_us` a (token, attended position)."""
    step = step_ms / 1000
    a, b = per_token_ms / 1000, per_position_us / 1e6
    at_start = PROBE_TOKENS * a + b * PROBE_TOKENS * PROBE_TOKENS / 2
    at_context = PROBE_TOKENS * a + b * PROBE_TOKENS * (CONTEXT_TOKENS + PROBE_TOKENS / 2)
    return PassCosts(threads, {w: step * (1 + token_cost * (w - 1)) for w in WIDTHS}, (at_start, at_context))


def machine(*per_threads: PassCosts, engine: str = "fused", cores: int = 2) -> MachineCosts:
    by_threads = {c.threads: c for c in per_threads}
    return MachineCosts("Test CPU", cores, engine, by_threads, measured_at=time.time())


# The 2-core Intel Xeon of docs/benchmarks.md (two threads): a 10.2 ms step, a 16-token verify pass
# of 31.5 ms, and a 512-token window after 1,034 reference tokens prefilled in about 0.85 s.
INTEL = PassCosts(2, {1: 0.0102, 2: 0.0125, 4: 0.0137, 8: 0.0204, 16: 0.0315},
                  passes(10.2, 0.1, per_token_ms=1.0, per_position_us=0.5).prefill_s)


def test_the_prefill_model_gives_back_the_window_costs_it_was_built_from():
    at = passes(10, 0.1, per_token_ms=1.0, per_position_us=0.5)
    assert at.prefill_window_s(512, 1024) == pytest.approx(0.512 + 0.5e-6 * (512 * 1024 + 512 * 512 / 2))
    assert at.width_s(12) == pytest.approx((at.pass_s[8] + at.pass_s[16]) / 2)


def test_a_cheap_verify_pass_gets_a_long_draft_and_a_compute_bound_one_none():
    cheap = choose(machine(INTEL, cores=4))
    assert cheap.draft_tokens >= 11
    assert 0.1 < cheap.draft_token_cost < 0.2
    # Barely cheaper than decoding token by token: a short draft at most.
    barely = choose(machine(passes(10, 0.45)))
    assert 0 < barely.draft_tokens < cheap.draft_tokens
    assert barely.draft_token_cost == pytest.approx(0.45)
    # A verify pass of w tokens costs nearly w steps: drafting never pays.
    bound = choose(machine(passes(10, 0.85)))
    assert bound.draft_tokens == 0
    assert bound.why["draft_tokens"].startswith("off:")


def test_a_slow_prefill_gets_a_smaller_keystroke_budget():
    intel = choose(machine(INTEL, cores=4))
    # 384 tokens predict 0.62 s of prefill + 0.24 s of decoding: over 0.8 s; 320 fits.
    assert intel.keystroke_prefill_tokens == 320
    assert intel.keystroke_s <= tuning.KEYSTROKE_TARGET_S
    slow = choose(machine(passes(10.2, 0.1, per_token_ms=2.0, per_position_us=1.0)))
    fast = choose(machine(passes(10.2, 0.1, per_token_ms=0.25, per_position_us=0.1)))
    assert slow.keystroke_prefill_tokens < intel.keystroke_prefill_tokens < fast.keystroke_prefill_tokens
    # Nothing fits: the least budget, and the reason says the target is out of reach.
    hopeless = choose(machine(passes(60, 0.1, per_token_ms=4.0, per_position_us=2.0)))
    assert hopeless.keystroke_prefill_tokens == min(tuning.KEYSTROKE_BUDGETS)
    assert "over the 0.8 s target" in hopeless.why["keystroke_prefill_tokens"]


def test_more_threads_only_where_they_are_clearly_faster():
    one = passes(20, 0.2, threads=1, per_token_ms=2.0)
    twice_as_fast = passes(11, 0.2, threads=2, per_token_ms=1.0)
    barely_faster = passes(19, 0.2, threads=2, per_token_ms=1.9)
    assert choose(machine(one, twice_as_fast)).threads == 0  # every core (one while busy)
    assert choose(machine(one, barely_faster)).threads == 1
    # On 8 cores where 4 threads are best: 4, not "every core".
    eight = machine(one, passes(8, 0.2, threads=4, per_token_ms=0.8),
                    passes(9, 0.2, threads=8, per_token_ms=0.9), cores=8)
    assert choose(eight).threads == 4
    # A count skipped for a slower step is never chosen: it is not in by_threads.
    assert choose(machine(one)).threads == 1


def test_a_thread_count_the_user_set_decides_which_costs_the_rest_is_chosen_from():
    one = passes(20, 0.2, threads=1, per_token_ms=2.0)
    two = passes(11, 0.2, threads=2, per_token_ms=1.0)
    costs = machine(one, two)
    assert choose(costs, {"threads": 1}).keystroke_prefill_tokens < choose(costs).keystroke_prefill_tokens
    assert choose(costs, {"threads": 1}).why["threads"] == "set by you"


def test_decode_threads_are_tuned_only_for_torch_steps():
    one, two = passes(30, 0.5, threads=1), passes(18, 0.5, threads=2)
    assert choose(machine(one, two, engine="fused")).decode_threads == UNTUNED["decode_threads"]
    assert choose(machine(one, two, engine="torch")).decode_threads == 2


def test_the_users_settings_win_and_off_keeps_the_untuned_defaults():
    costs = machine(passes(10, 0.85, per_token_ms=3.0))  # tuned: no drafts, a short budget
    tuned = resolve(ModelConfig(), costs)
    assert tuned.draft_tokens == 0 and tuned.keystroke_prefill_tokens < 512
    mine = resolve(ModelConfig(draft_tokens=7, threads=2, decode_threads=3), costs,
                   keystroke_prefill_tokens=900)
    assert (mine.draft_tokens, mine.threads, mine.decode_threads) == (7, 2, 3)
    assert mine.keystroke_prefill_tokens == 900
    for untuned in (resolve(ModelConfig(tune="off"), costs), resolve(ModelConfig(), None)):
        assert untuned.draft_tokens == UNTUNED["draft_tokens"]
        assert untuned.keystroke_prefill_tokens == UNTUNED["keystroke_prefill_tokens"]
        assert (untuned.threads, untuned.decode_threads) == (UNTUNED["threads"], UNTUNED["decode_threads"])


def test_the_config_takes_tune_and_leaves_tuned_settings_unset():
    config, problems = config_from_mapping({"model": {"tune": "off", "draft_tokens": None},
                                            "completion": {"keystroke_prefill_tokens": 256}})
    assert not problems
    assert config.model.tune == "off" and config.model.draft_tokens is None
    assert config.completion.keystroke_prefill_tokens == 256
    assert ModelConfig().threads is None and CompletionConfig().keystroke_prefill_tokens is None
    _, problems = config_from_mapping({"model": {"tune": "sometimes", "draft_tokens": "many"}})
    assert any("model.tune" in p and "auto, off" in p for p in problems)
    assert any("model.draft_tokens" in p and "tuned for this CPU" in p for p in problems)


def test_doctor_text_says_what_was_measured_chosen_and_overridden():
    costs = machine(INTEL, cores=4)
    lines = describe(costs, ModelConfig(draft_tokens=4), CompletionConfig())
    text = "\n".join(lines)
    assert text.startswith("Test CPU, 4 cores, fused steps")
    assert "a pass of N tokens (ms) 1: 10.2, 2: 12.5, 4: 13.7, 8: 20.4, 16: 31.5" in text
    assert f"model.draft_tokens = 4: set by you (tuned: {choose(costs).draft_tokens})" in text
    assert "completion.keystroke_prefill_tokens = 320: 320: a first keystroke" in text
    assert "off (model.tune" in describe(costs, ModelConfig(tune="off"), CompletionConfig())[0]


# -- the cache --------------------------------------------------------------------------------------


def test_costs_survive_the_cache_and_another_identity_is_measured_again(tmp_path):
    costs = MachineCosts("Test CPU", 2, "fused", {1: passes(10, 0.2), 2: passes(6, 0.2, threads=2)},
                         busy=True, seconds=2.5, measured_at=1000.0, skipped={4: 0.02})
    key = tuning_key("machine=x86_64; model name=Intel Xeon; flags=avx512f", "fused step a.so", "SmolLM2", 2)
    path = tuning_file(tmp_path, key)
    store_costs(path, key, costs)
    assert load_costs(path, key) == costs
    other = tuning_key("machine=x86_64; model name=AMD EPYC; flags=avx2", "fused step a.so", "SmolLM2", 2)
    assert tuning_file(tmp_path, other) != path
    assert load_costs(tuning_file(tmp_path, other), other) is None  # nothing cached: measure
    # The same file name under another key (a hash collision, or a hand-copied file): not used.
    assert load_costs(path, other) is None


@pytest.mark.parametrize("content", ["{not json", "[]", '{"key": "k"}',
                                     '{"key": "k", "costs": {"by_threads": {}}}',
                                     '{"key": "k", "costs": {"cpu": "x", "cores": 2, "engine": "fused", '
                                     '"busy": false, "seconds": 1, "measured_at": 0, "skipped": {}, '
                                     '"by_threads": {"1": {"pass_s": {"1": -1}, "prefill_s": [1, 1]}}}}', ""])
def test_a_corrupt_cache_file_is_ignored_never_an_error(tmp_path, content):
    path = tmp_path / "tuning-0.json"
    path.write_text(content)
    assert load_costs(path, "k") is None


def test_stale_tuning_files_are_pruned_with_the_libraries(tmp_path):
    keep = tmp_path / "cpu_decode-new.so"
    keep.write_bytes(b"")
    old, fresh = tmp_path / "tuning-old.json", tmp_path / "tuning-fresh.json"
    for path in (old, fresh):
        path.write_text("{}")
    long_ago = time.time() - STALE_S - 60
    os.utime(old, (long_ago, long_ago))
    assert prune_stale(keep) == [old]
    assert fresh.exists()


def test_measured_only_at_an_idle_start_and_busy_measurements_again_at_most_hourly(monkeypatch):
    costs = machine(passes(10, 0.2))
    busy = MachineCosts(costs.cpu, 2, "fused", costs.by_threads, busy=True, measured_at=time.time())
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    assert worth_measuring_again(None)
    assert not worth_measuring_again(costs)
    assert not worth_measuring_again(busy)  # measured a moment ago
    assert worth_measuring_again(busy, now=time.time() + tuning.REMEASURE_BUSY_AFTER_S + 1)
    # A busy machine is never measured at a start: a server there starts as fast as before.
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0, 4.0, 4.0))
    assert not worth_measuring_again(busy, now=time.time() + tuning.REMEASURE_BUSY_AFTER_S + 1)
    assert not worth_measuring_again(None)


def test_the_cached_file_is_json_a_person_can_read(tmp_path):
    key = tuning_key("cpu", "engine", "model", 2)
    path = tuning_file(tmp_path, key)
    store_costs(path, key, machine(passes(10, 0.2)))
    data = json.loads(path.read_text())
    assert data["key"] == key and data["costs"]["by_threads"]["1"]["pass_s"]["1"] == pytest.approx(0.01)
    assert not list(tmp_path.glob(".tuning-*"))  # no staged file left behind
