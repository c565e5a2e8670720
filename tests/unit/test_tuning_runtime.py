"""The runtime measures this machine once, caches what it measured beside the compiled step, and
runs with the settings chosen from it where the configuration leaves them unset (real model)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from context import tuning
from context.config import CompletionConfig, ModelConfig, SquidConfig
from context.tuning import MachineCosts, PassCosts, load_costs, store_costs, tuning_file
from kernels import cpu_decode
from lsp_server.doctor import check_tuning

pytestmark = pytest.mark.skipif(cpu_decode.compiler() is None, reason="no C compiler (cc): install gcc")


@pytest.fixture
def tuning_cache(tmp_path, monkeypatch):
    """A private folder for the tuning files (the compiled step stays where it was built)."""
    monkeypatch.setenv("SQUIDCODE_KERNEL_CACHE", str(tmp_path / "kernels"))
    return tmp_path / "kernels"


def fresh(runtime, **changes):
    """A runtime over the session's loaded model, with its own engine and tuning lookup."""
    return runtime.sharing_weights(dataclasses.replace(runtime.config, **changes))


def engine_of(runtime):
    import torch

    with torch.inference_mode():
        return runtime._current_engine()


def slow_prefill_costs(cores: int) -> MachineCosts:
    """A machine whose prefill is slow (a keystroke can afford the least window) and whose verify
    passes cost nearly as much as decoding their tokens one by one (no drafts)."""
    step = 0.05
    at = PassCosts(1, {w: step * (1 + 0.9 * (w - 1)) for w in tuning.WIDTHS}, (0.5, 1.0))
    return MachineCosts("Slow CPU", cores, "fused", {1: at}, measured_at=time.time())


def cache_costs(runtime, costs: MachineCosts) -> None:
    """A fixed measurement cached for `runtime`'s machine, engine and model (how tests and
    short-lived processes run without measuring)."""
    key = runtime.tuning_key(engine_of(runtime))
    store_costs(tuning_file(cpu_decode.cache_root(), key), key, costs)


def test_one_real_calibration_is_cached_and_read_back_by_the_next_start(runtime, tuning_cache, monkeypatch):
    real_measure, measured = tuning.measure_costs, []

    def counted(*args, **kwargs):
        measured.append(1)
        return real_measure(*args, **kwargs)

    monkeypatch.setattr(tuning, "measure_costs", counted)
    first = fresh(runtime)
    engine_of(first)  # the engine alone (packing the weights once per process) is not measuring
    first.prepare(retune=True)  # measured now even on a busy machine (as `doctor --retune` does)
    costs = first.costs
    assert costs is not None and first.tuning_path.parent == tuning_cache
    print(f"measured in {costs.seconds:.1f} s (busy: {costs.busy})")
    assert costs.seconds < 60  # a few seconds on a quiet 2-core machine; a loaded one stretches it
    assert 1 in costs.by_threads and set(costs.by_threads[1].pass_s) == set(tuning.WIDTHS)
    assert all(s > 0 for at in costs.by_threads.values() for s in (*at.pass_s.values(), *at.prefill_s))
    settings = first.settings
    assert 0 <= settings.draft_tokens <= 15
    assert settings.keystroke_prefill_tokens in tuning.KEYSTROKE_BUDGETS
    assert measured == [1]
    # The next process: read back, not measured again.
    second = fresh(runtime)
    second.prepare()
    assert measured == [1] and second.costs == costs
    # Another CPU sharing this cache (another model name and flags) has no costs here: its first
    # start measures its own.
    here = second.tuning_key()
    another = cpu_decode.cpu_identity().replace("model name=", "model name=Other ")
    monkeypatch.setattr(cpu_decode, "cpu_identity", lambda: another)
    other = fresh(runtime)
    engine_of(other)
    assert other.costs is None
    assert other.tuning_key() != here and another in other.tuning_key()


def test_a_cached_measurement_sets_what_the_configuration_leaves_unset(runtime, tuning_cache, monkeypatch):
    # On a busy machine (as a test run's often is) the start measures nothing, and still reads the
    # cache, also after the engine was built before the measurement was cached.
    monkeypatch.setattr(tuning, "machine_busy", lambda *args, **kwargs: True)
    cores = tuning.available_cores()
    tuned = fresh(runtime)
    cache_costs(tuned, slow_prefill_costs(cores))
    tuned.prepare()  # reads the cached measurement: nothing is measured
    assert tuned.settings.draft_tokens == 0  # verify passes too dear here
    assert tuned.settings.keystroke_prefill_tokens == min(tuning.KEYSTROKE_BUDGETS)
    assert tuned.settings.threads == (0 if cores == 1 else 1)
    # The keystroke budget applies where a caller asks for the tuned one (prefill_limit=None: the
    # completion setting left unset) ...
    ids = runtime.encode(Path(tuning.__file__).read_text())[:400]
    result = tuned.generate(ids, max_new_tokens=2, prefill_limit=None)
    assert result.prompt_tokens == min(tuning.KEYSTROKE_BUDGETS) and result.dropped_tokens == 400 - 128
    # ... and never over the user's own settings.
    mine = fresh(runtime, draft_tokens=6, threads=2)
    engine_of(mine)
    assert mine.costs == tuned.costs
    assert (mine.settings.draft_tokens, mine.settings.threads) == (6, 2)
    assert mine.generate(ids, max_new_tokens=2, prefill_limit=300).prompt_tokens == 300
    # tune = "off": the fixed defaults, whatever is cached.
    off = fresh(runtime, tune="off")
    engine_of(off)
    assert off.costs is None
    assert off.settings.draft_tokens == tuning.UNTUNED["draft_tokens"]
    assert off.settings.keystroke_prefill_tokens == tuning.UNTUNED["keystroke_prefill_tokens"]


def test_a_corrupt_cache_file_is_measured_again_not_an_error(runtime, tuning_cache, monkeypatch):
    broken = fresh(runtime)
    key = broken.tuning_key(engine_of(broken))
    path = tuning_file(cpu_decode.cache_root(), key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"key": "half-written')
    engine_of(fresh(runtime))  # a generation's lookup: nothing usable, untuned defaults, no error
    measured = []
    fixed = slow_prefill_costs(tuning.available_cores())

    def measure_standin(engine, cpu="", threads=None):  # stands in for the seconds of real timing
        measured.append(cpu)
        return fixed

    monkeypatch.setattr(tuning, "measure_costs", measure_standin)
    monkeypatch.setattr(tuning, "machine_busy", lambda cores=None: False)  # an idle start measures
    again = fresh(runtime)
    again.prepare()
    assert measured and again.costs == fixed
    assert load_costs(path, key) == fixed  # the broken file replaced by a good one


def test_doctor_prints_the_measured_costs_the_choice_and_the_users_overrides(
    runtime, tuning_cache, monkeypatch
):
    monkeypatch.setattr(tuning, "machine_busy", lambda *args, **kwargs: True)  # as above
    config = SquidConfig(model=dataclasses.replace(runtime.config, draft_tokens=4),
                         completion=CompletionConfig(keystroke_prefill_tokens=256))
    checked = fresh(runtime, draft_tokens=4)
    cache_costs(checked, slow_prefill_costs(tuning.available_cores()))
    check = check_tuning(config, checked)
    assert check.ok and not check.required
    assert check.detail.startswith("Slow CPU")
    assert "a pass of N tokens (ms) 1: 50.0, 2: 95.0" in check.detail
    assert "model.draft_tokens = 4: set by you (tuned: 0)" in check.detail
    assert "completion.keystroke_prefill_tokens = 256: set by you (tuned: 128)" in check.detail
    assert "model.decode_threads = 1: the fused step decodes" in check.detail
    assert str(checked.tuning_path) in check.detail
    default = check_tuning(SquidConfig(model=ModelConfig()), fresh(runtime))
    assert "model.draft_tokens = 0: off:" in default.detail
