"""Per-machine speed settings: what the runtime's passes cost on this CPU, and the settings chosen
from those costs (the draft length, the keystroke prefill budget, the thread counts).

The compiled step is built with `-march=native` for whichever CPU it runs on, and the same build
spends its time in different places on different CPUs: a verify pass of several tokens is
compute-bound where a decoding step is bandwidth-bound, so a CPU with narrower vectors pays more
per drafted token, and a slower prefill needs a shorter keystroke window to answer in time. So the
runtime measures, once per machine (`ModelRuntime.prepare`, while the model loads), on its own
engine and weights, after `CONTEXT_TOKENS` cached positions:
  - a decoding step and verify passes of `WIDTHS` tokens;
  - a `PROBE_TOKENS`-token prefill chunk at position 0 and after the context;
each at 1 thread, up to 4, and every core (`thread_candidates`). That takes a few seconds. The costs
are cached beside the compiled step (`kernels.cpu_decode.cache_root`), keyed by the CPU's model and
flags, the compiled library, the model and the cores (`tuning_key`); later starts and short-lived
processes read them back, and a file that does not parse or belongs to another key is measured
again, never an error.

`choose` turns costs into settings (pure: tested with given costs); `resolve` applies a tuned value
only where the user left the setting unset (None in `ModelConfig` / `CompletionConfig`), and
`model.tune = "off"` keeps the fixed defaults of `UNTUNED`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .config import CompletionConfig, ModelConfig

__all__ = [
    "MachineCosts",
    "PassCosts",
    "RuntimeSettings",
    "Tuning",
    "UNTUNED",
    "choose",
    "cpu_model_name",
    "describe",
    "explicit_settings",
    "load_costs",
    "machine_busy",
    "measure_costs",
    "resolve",
    "store_costs",
    "thread_candidates",
    "tuning_file",
    "tuning_key",
    "worth_measuring_again",
]

log = logging.getLogger(__name__)

TUNE_FORMAT = 1  # bump when what is measured changes: older files are then measured again
# Timed passes attend to this many cached positions: about what a keystroke's window and its two
# reference documents hold.
CONTEXT_TOKENS = 1024
WIDTHS = (1, 2, 4, 8, 16)  # tokens per timed pass; 16 is the fused step's widest (FUSED_MAX_TOKENS)
PROBE_TOKENS = 128  # one timed prefill chunk
REPEATS = 3  # each pass is timed this many times and the fastest kept: other processes only add time
# Past this, measuring stops after the round it is in (the first is always whole): a loaded machine
# must not hold a server's start for long.
MEASURE_BUDGET_S = 12.0
# The settings a keystroke must meet: the first keystroke at a new place prefills its window after
# the open reference documents (two of 512 tokens, as bench/runtime.py types with) and continues
# for a short suggestion; both within `KEYSTROKE_TARGET_S`, which leaves 0.2 s of the 1 s a
# suggestion may take to composing references, tokenizing and finishing it.
REFERENCE_TOKENS = 1024
KEYSTROKE_NEW_TOKENS = 24
KEYSTROKE_TARGET_S = 0.8
KEYSTROKE_BUDGETS = (128, 192, 256, 320, 384, 448, 512, 640, 768, 1024)
# A draft of a copied span comes true token after token (on bench/runtime.py's copy edits 93-100%
# of drafted tokens): the draft length is the one with the best expected tokens per second at this
# rate; below `MIN_DRAFT_GAIN` times a plain step's, prompt lookup does not pay here.
COPY_ACCEPTANCE = 0.95
MIN_DRAFT_GAIN = 1.25
# More threads must buy this much (they collapse when another process holds a core).
MORE_THREADS_GAIN = 1.1
# Costs measured while the machine was busy are measured again at a start that finds it idle, at
# most this often (a shared machine's servers should not each pay it).
REMEASURE_BUSY_AFTER_S = 3600.0
# What each tuned setting is with `model.tune = "off"` (or where nothing could be measured).
UNTUNED = {"threads": 0, "decode_threads": 1, "draft_tokens": 15, "keystroke_prefill_tokens": 512}
UNTUNED_DRAFT_TOKEN_COST = 0.2  # `context.lookup.DraftLengths`' default
# Where each tuned setting lives in the configuration.
SETTING_NAMES = {"threads": "model.threads", "decode_threads": "model.decode_threads",
                 "draft_tokens": "model.draft_tokens",
                 "keystroke_prefill_tokens": "completion.keystroke_prefill_tokens"}


@dataclass(frozen=True)
class PassCosts:
    """What the engine's passes cost at one thread count, in seconds."""

    threads: int
    # tokens per pass -> one pass after `CONTEXT_TOKENS` cached positions (1 token: a decoding step)
    pass_s: dict[int, float]
    # a `PROBE_TOKENS`-token prefill chunk at position 0, and after `CONTEXT_TOKENS` positions
    prefill_s: tuple[float, float]

    @property
    def step_s(self) -> float:
        return self.pass_s[1]

    def width_s(self, width: int) -> float:
        """One pass of `width` tokens, interpolated between the measured widths."""
        widths = sorted(self.pass_s)
        if width in self.pass_s:
            return self.pass_s[width]
        below = max((w for w in widths if w < width), default=widths[0])
        above = min((w for w in widths if w > width), default=widths[-1])
        if above == below:
            return self.pass_s[below] * width / below
        share = (width - below) / (above - below)
        return self.pass_s[below] + share * (self.pass_s[above] - self.pass_s[below])

    def prefill_window_s(self, tokens: int, after: int) -> float:
        """Prefilling `tokens` after `after` cached positions: a cost per token plus one per
        position each token attends to, both from the two timed chunks."""
        at_start, at_context = self.prefill_s
        per_position = max(0.0, (at_context - at_start) / (PROBE_TOKENS * CONTEXT_TOKENS))
        per_token = max(0.0, at_start / PROBE_TOKENS - per_position * PROBE_TOKENS / 2)
        return tokens * per_token + per_position * (tokens * after + tokens * tokens / 2)

    def keystroke_s(self, budget: int) -> float:
        """A first keystroke at a new place: its window prefilled after the references, then a
        short continuation decoded step by step."""
        return self.prefill_window_s(budget, REFERENCE_TOKENS) + KEYSTROKE_NEW_TOKENS * self.step_s


@dataclass(frozen=True)
class MachineCosts:
    """Everything measured on one machine, for one engine and model."""

    cpu: str  # the CPU's model name, for people
    cores: int  # the cores this process may use
    engine: str  # "fused" (kernels/cpu_decode.c) or "torch" steps
    by_threads: dict[int, PassCosts]
    busy: bool = False  # another process held the cores while measuring: measured again when idle
    seconds: float = 0.0  # what measuring took
    measured_at: float = 0.0  # time.time()
    # threads -> a decoding step, for counts whose step was no faster than on fewer threads: not
    # measured further (more threads that do not speed a step up are collapsing under load)
    skipped: dict[int, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"cpu": self.cpu, "cores": self.cores, "engine": self.engine, "busy": self.busy,
                "seconds": self.seconds, "measured_at": self.measured_at,
                "skipped": {str(t): s for t, s in self.skipped.items()},
                "by_threads": {str(t): {"pass_s": {str(w): s for w, s in c.pass_s.items()},
                                        "prefill_s": list(c.prefill_s)}
                               for t, c in self.by_threads.items()}}

    @classmethod
    def from_json(cls, data: Mapping) -> MachineCosts:
        """Raises KeyError, TypeError or ValueError on anything but what `to_json` wrote."""
        by_threads = {}
        for threads, costs in data["by_threads"].items():
            passes = {int(w): float(s) for w, s in costs["pass_s"].items()}
            start, context = (float(s) for s in costs["prefill_s"])
            if 1 not in passes or min(passes.values(), default=0) <= 0 or min(start, context) <= 0:
                raise ValueError("a measured cost is missing or not positive")
            by_threads[int(threads)] = PassCosts(int(threads), passes, (start, context))
        if not by_threads or data["engine"] not in ("fused", "torch"):
            raise ValueError("no thread count measured, or an unknown engine")
        skipped = {int(t): float(s) for t, s in data["skipped"].items()}
        return cls(str(data["cpu"]), int(data["cores"]), data["engine"], by_threads, bool(data["busy"]),
                   float(data["seconds"]), float(data["measured_at"]), skipped)


@dataclass(frozen=True)
class Tuning:
    """The settings chosen for one machine's costs, each with the reason, as `doctor` prints them."""

    threads: int
    decode_threads: int
    draft_tokens: int
    draft_token_cost: float  # a drafted token's share of a decoding step (`DraftLengths.token_cost`)
    keystroke_prefill_tokens: int
    keystroke_s: float  # the predicted first keystroke at a new place, with these settings
    why: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RuntimeSettings:
    """The values the runtime runs with: the user's where set, else tuned, else `UNTUNED`."""

    threads: int
    decode_threads: int
    draft_tokens: int
    draft_token_cost: float
    keystroke_prefill_tokens: int


# -- choosing -------------------------------------------------------------------------------------


def choose(costs: MachineCosts, fixed: Mapping[str, int] | None = None) -> Tuning:
    """The settings for `costs`; `fixed`: the ones the user set (`explicit_settings`), which the
    others are planned around (a fixed thread count decides which costs the rest is chosen from)."""
    fixed = fixed or {}
    threads, measured, why_threads = _choose_threads(costs, fixed)
    at = costs.by_threads[measured]
    decode_threads, why_decode = _choose_decode_threads(costs, fixed)
    draft, cost, why_draft = _choose_draft(at, fixed)
    budget, why_budget = _choose_keystroke_budget(at)
    why = {"threads": why_threads, "decode_threads": why_decode, "draft_tokens": why_draft,
           "keystroke_prefill_tokens": why_budget}
    return Tuning(threads, decode_threads, draft, cost, budget, at.keystroke_s(budget), why)


def _measured_for(costs: MachineCosts, threads: int) -> int:
    """The measured thread count nearest below `threads` (0: every core)."""
    wanted = threads or costs.cores
    counts = sorted(costs.by_threads)
    return max((t for t in counts if t <= wanted), default=counts[0])


def _fewest_fast(by_count: Mapping[int, float]) -> int:
    """The thread count with the lowest time, preferring fewer unless more are clearly faster."""
    best = min(by_count)
    for count in sorted(by_count)[1:]:
        if by_count[count] * MORE_THREADS_GAIN < by_count[best]:
            best = count
    return best


def _times(by_count: Mapping[int, float]) -> str:
    return ", ".join(f"{s:.2f} s on {_threads(t)}" for t, s in sorted(by_count.items()))


def _choose_threads(costs: MachineCosts, fixed: Mapping[str, int]) -> tuple[int, int, str]:
    """(the setting, the measured count the other choices use, why)."""
    if "threads" in fixed:
        return fixed["threads"], _measured_for(costs, fixed["threads"]), "set by you"
    budget = UNTUNED["keystroke_prefill_tokens"]
    keystroke = {t: c.keystroke_s(budget) for t, c in costs.by_threads.items()}
    best = _fewest_fast(keystroke)
    why = f"a {budget}-token keystroke predicted {_times(keystroke)}"
    if best == max(costs.by_threads) == costs.cores:
        return 0, best, f"every core ({best}; one while the machine is busy): {why}"
    return best, best, f"{best}: {why}"


def _choose_decode_threads(costs: MachineCosts, fixed: Mapping[str, int]) -> tuple[int, str]:
    if "decode_threads" in fixed:
        return fixed["decode_threads"], "set by you"
    if costs.engine == "fused":
        return UNTUNED["decode_threads"], ("the fused step decodes, on `threads`; this applies to torch "
                                           "steps only")
    steps = {t: c.step_s for t, c in costs.by_threads.items()}
    best = _fewest_fast(steps)
    return best, f"a torch decoding step took {_times(steps)}"


def expected_tokens(draft: int, acceptance: float = COPY_ACCEPTANCE) -> float:
    """Tokens one verify pass yields with `draft` drafted tokens, each coming true at `acceptance`
    while the ones before it did: the step's own token, plus the confirmed run."""
    return sum(acceptance**i for i in range(draft + 1))


def _choose_draft(at: PassCosts, fixed: Mapping[str, int]) -> tuple[int, float, str]:
    """(draft_tokens, a drafted token's cost in decoding steps, why)."""
    step = at.step_s
    widest = max(at.pass_s)

    def token_cost(draft: int) -> float:
        if draft <= 0:
            return UNTUNED_DRAFT_TOKEN_COST
        return min(1.0, max(0.0, (at.width_s(min(draft + 1, widest)) - step) / (draft * step)))

    if "draft_tokens" in fixed:
        return fixed["draft_tokens"], token_cost(fixed["draft_tokens"]), "set by you"
    gains = {k: expected_tokens(k) * step / at.width_s(k + 1) for k in range(1, widest)}
    best = max(gains, key=lambda k: (gains[k], -k))
    passes = ", ".join(f"{w} tokens {s / step:.2f}" for w, s in sorted(at.pass_s.items()) if w > 1)
    costs = f"a verify pass costs ({passes}) decoding steps of {step * 1e3:.1f} ms"
    if gains[best] < MIN_DRAFT_GAIN:
        return 0, token_cost(0), (f"off: {costs}; at best {gains[best]:.2f}x a plain step's tokens per "
                                  f"second (drafting needs {MIN_DRAFT_GAIN}x)")
    return best, token_cost(best), (f"{best} (verify width {best + 1}): {costs}; {gains[best]:.2f}x a "
                                    f"plain step's tokens per second on a copied span; a drafted token "
                                    f"costs {token_cost(best):.2f} of a step")


def _choose_keystroke_budget(at: PassCosts) -> tuple[int, str]:
    fits = [b for b in KEYSTROKE_BUDGETS if at.keystroke_s(b) <= KEYSTROKE_TARGET_S]
    budget = max(fits) if fits else min(KEYSTROKE_BUDGETS)
    prefill = at.prefill_window_s(budget, REFERENCE_TOKENS)
    decode = KEYSTROKE_NEW_TOKENS * at.step_s
    why = (f"a first keystroke at a new place predicted {prefill + decode:.2f} s ({budget} tokens "
           f"prefilled after {REFERENCE_TOKENS} of references {prefill:.2f} s, {KEYSTROKE_NEW_TOKENS} "
           f"tokens decoded {decode:.2f} s)")
    if not fits:
        return budget, f"{budget}, the least: {why}, over the {KEYSTROKE_TARGET_S} s target even so"
    return budget, f"{budget}: {why}, within {KEYSTROKE_TARGET_S} s"


# -- applying -------------------------------------------------------------------------------------


def explicit_settings(model: ModelConfig, completion: CompletionConfig | None = None) -> dict[str, int]:
    """The tuned settings the user set (short names, as in `UNTUNED`)."""
    values = {"threads": model.threads, "decode_threads": model.decode_threads,
              "draft_tokens": model.draft_tokens,
              "keystroke_prefill_tokens": None if completion is None else completion.keystroke_prefill_tokens}
    return {name: value for name, value in values.items() if value is not None}


def resolve(model: ModelConfig, costs: MachineCosts | None,
            keystroke_prefill_tokens: int | None = None) -> RuntimeSettings:
    """The settings to run with: each the user's where set, else the tuned one for `costs` (None:
    nothing measured, or `model.tune = "off"`), else `UNTUNED`'s."""
    fixed = explicit_settings(model)
    if keystroke_prefill_tokens is not None:
        fixed["keystroke_prefill_tokens"] = keystroke_prefill_tokens
    tuned = choose(costs, fixed) if costs is not None and model.tune == "auto" else None

    def value(name: str) -> int:
        if name in fixed:
            return fixed[name]
        return getattr(tuned, name) if tuned is not None else UNTUNED[name]

    return RuntimeSettings(value("threads"), value("decode_threads"), value("draft_tokens"),
                           tuned.draft_token_cost if tuned is not None else UNTUNED_DRAFT_TOKEN_COST,
                           value("keystroke_prefill_tokens"))


def describe(costs: MachineCosts | None, model: ModelConfig, completion: CompletionConfig,
             where: Path | None = None) -> list[str]:
    """What was measured, what was chosen and why, and what the user set instead (`doctor`)."""
    if model.tune == "off":
        return ["off (model.tune = \"off\"): fixed defaults " +
                ", ".join(f"{SETTING_NAMES[n]} = {v}" for n, v in UNTUNED.items())]
    if costs is None:
        return ["nothing measured yet (the machine was busy at every start so far, or the model does not run "
                "on the CPU's lean engine): fixed defaults; `squidcode doctor --retune` measures now"]
    fixed = explicit_settings(model, completion)
    tuned = choose(costs, fixed)
    state = " (while the machine was busy: measured again at a quieter start)" if costs.busy else ""
    lines = [f"{costs.cpu}, {costs.cores} cores, {costs.engine} steps; measured in {costs.seconds:.1f} s "
             f"on {time.strftime('%Y-%m-%d %H:%M', time.localtime(costs.measured_at))}{state}"
             + (f" ({where})" if where else "")]
    for threads, at in sorted(costs.by_threads.items()):
        passes = ", ".join(f"{w}: {s * 1e3:.1f}" for w, s in sorted(at.pass_s.items()))
        lines.append(f"  {_threads(threads)}: a pass of N tokens (ms) {passes}; "
                     f"prefill {PROBE_TOKENS / at.prefill_s[0]:.0f} tok/s at 0, "
                     f"{PROBE_TOKENS / at.prefill_s[1]:.0f} tok/s after {CONTEXT_TOKENS}")
    for threads, step in sorted(costs.skipped.items()):
        lines.append(f"  {_threads(threads)}: a decoding step {step * 1e3:.1f} ms, no faster than on fewer: "
                     "not measured further")
    for name, setting in SETTING_NAMES.items():
        if name in fixed:
            lines.append(f"  {setting} = {fixed[name]}: set by you (tuned: {getattr(choose(costs), name)})")
        else:
            lines.append(f"  {setting} = {getattr(tuned, name)}: {tuned.why[name]}")
    return lines


def _threads(count: int) -> str:
    return f"{count} thread{'s' if count > 1 else ''}"


# -- measuring ------------------------------------------------------------------------------------


def cpu_model_name(identity: str) -> str:
    """The model name in `kernels.cpu_decode.cpu_identity()`'s text (else its machine type)."""
    fields = dict(part.partition("=")[::2] for part in identity.split("; "))
    return fields.get("model name") or fields.get("machine") or "unknown CPU"


def thread_candidates(cores: int) -> list[int]:
    return sorted({1, min(4, cores), cores})


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def worth_measuring_again(costs: MachineCosts | None, now: float | None = None) -> bool:
    """Whether to measure now rather than use `costs`: only while the machine is not busy (timings
    under load are mostly the other work's, and a loaded machine's servers should start fast), and
    then where none are cached, or they were measured while it was busy over
    `REMEASURE_BUSY_AFTER_S` ago. Until then the runtime runs with what is cached, else untuned."""
    if machine_busy(costs.cores if costs is not None else None):
        return False
    if costs is None:
        return True
    now = time.time() if now is None else now
    return costs.busy and now - costs.measured_at > REMEASURE_BUSY_AFTER_S


def machine_busy(cores: int | None = None) -> bool:
    """Whether other work holds every core (the 1-minute load average, as the runtime's prefill
    thread count decides it)."""
    try:
        return os.getloadavg()[0] >= (cores or available_cores())
    except OSError:
        return False


def measure_costs(engine, cpu: str = "", threads: list[int] | None = None) -> MachineCosts:
    """Time `engine`'s passes at each thread count (call under `torch.inference_mode`, with nothing
    else running on the engine); its `fused_threads` and torch's thread count are restored.

    Each pass is timed once per round, the rounds going over every thread count and pass in turn,
    and the fastest of `REPEATS` rounds is kept: a burst of other work spoils one timing of several
    passes rather than every timing of one."""
    import torch

    cores = available_cores()
    busy = machine_busy(cores)
    started = time.perf_counter()
    cache = engine.new_cache()
    before = (engine.fused_threads, torch.get_num_threads())

    def use(count: int) -> None:
        engine.fused_threads = count
        torch.set_num_threads(count)

    steps: dict[int, float] = {}
    kept, skipped = [], {}
    try:
        for count in threads or thread_candidates(cores):
            use(count)
            _pass(engine, cache, 1, CONTEXT_TOKENS)  # the first pass at a thread count starts its pool
            steps[count] = min(_pass(engine, cache, 1, CONTEXT_TOKENS) for _ in range(REPEATS))
            if kept and steps[count] >= min(steps[k] for k in kept):
                skipped[count] = steps[count]
            else:
                kept.append(count)
        best: dict[int, dict] = {count: {} for count in kept}
        for round_ in range(REPEATS):
            if round_ and time.perf_counter() - started > MEASURE_BUDGET_S:
                break
            for count in kept:
                use(count)
                timings = {("pass", w): _pass(engine, cache, w, CONTEXT_TOKENS) for w in WIDTHS if w > 1}
                if round_ < REPEATS - 1:  # prefill chunks take longest: one round fewer
                    timings["context"] = _pass(engine, cache, PROBE_TOKENS, CONTEXT_TOKENS)
                    timings["start"] = _pass(engine, cache, PROBE_TOKENS, 0)
                for name, seconds in timings.items():
                    best[count][name] = min(seconds, best[count].get(name, seconds))
    finally:
        engine.fused_threads = before[0]
        torch.set_num_threads(before[1])
    by_threads = {count: _pass_costs(count, steps[count], best[count]) for count in kept}
    busy = busy or machine_busy(cores)
    return MachineCosts(cpu, cores, "fused" if engine.fused_step is not None else "torch", by_threads, busy,
                        time.perf_counter() - started, time.time(), skipped)


def _pass(engine, cache, tokens: int, at: int) -> float:
    """Seconds for one pass of `tokens` tokens after `at` cached positions (placeholders)."""
    import torch

    ids = torch.arange(100, 100 + tokens)[None]  # [1, tokens]: any ids cost the same
    if cache.length < at:
        cache.hold_placeholders(at)
    cache.crop(at)
    started = time.perf_counter()
    engine.forward(ids, cache, greedy=True, all_logits=1 < tokens <= max(WIDTHS))
    return time.perf_counter() - started


def _pass_costs(threads: int, step: float, best: Mapping) -> PassCosts:
    """A wider pass does all a narrower one does: a timing below a narrower pass's is noise."""
    passes, floor = {1: step}, step
    for width in sorted(w for w in WIDTHS if w > 1):
        floor = max(floor, best[("pass", width)])
        passes[width] = floor
    return PassCosts(threads, passes, (best["start"], max(best["context"], best["start"])))


# -- the cache ------------------------------------------------------------------------------------


def tuning_key(cpu_identity: str, engine: str, model: str, cores: int) -> str:
    """Everything the costs depend on: the CPU (model and flags), the compiled step (its file names
    its source, flags and compiler) or torch steps, the model and how it runs, the cores."""
    return "\n".join([f"format={TUNE_FORMAT}", cpu_identity, engine, model, f"cores={cores}"])


def tuning_file(root: Path, key: str) -> Path:
    return root / f"tuning-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def load_costs(path: Path, key: str) -> MachineCosts | None:
    """The costs cached at `path` for `key`; None when missing, unreadable, corrupt or another key's
    (measure again)."""
    try:
        data = json.loads(path.read_text())
        if data.get("key") != key:
            log.info("tuning file %s is another machine's or model's: measuring again", path)
            return None
        costs = MachineCosts.from_json(data["costs"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("ignoring the unreadable tuning file %s (%s): measuring again", path, exc)
        return None
    try:
        os.utime(path)  # read now: not stale (`kernels.cpu_decode.prune_stale`)
    except OSError:
        pass
    return costs


def store_costs(path: Path, key: str, costs: MachineCosts) -> None:
    """Write atomically (a concurrent reader sees the whole file or none); a cache that cannot be
    written only costs the next start another measurement."""
    staged = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".tuning-", suffix=".tmp",
                                         delete=False) as handle:
            staged = Path(handle.name)
            json.dump({"key": key, "costs": costs.to_json()}, handle, indent=1)
        os.replace(staged, path)
    except OSError as exc:
        log.warning("cannot cache this machine's tuning in %s: %s", path, exc)
        if staged is not None:
            staged.unlink(missing_ok=True)
