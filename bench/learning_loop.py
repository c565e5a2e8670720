"""squidcode's learning loop end to end, with a simulated user: does the assistant get better?

    python bench/learning_loop.py            # the short version (`./dev demo` runs it): ~5 minutes
    python bench/learning_loop.py --full     # the measurement: 1 round, ~23 minutes on 2 cores

Everything runs as the product runs it. `squidcode serve` is started as a subprocess on a copy of
a few standard-library modules (`bench/simulated_user.py`), and a pygls client drives it over LSP.
The simulated user asks for inline completions at held-out spots, accepts them, and keeps,
modifies or reverts each one through `didChange`, by a hidden preference. The server's feedback
recorder judges the edits at its checkpoints and stores them in SQLite. `squidcode train --once`
then runs one round: episodes from that store, rewards, GRPO on a LoRA adapter of the embedded
model, the promotion gate. This is the same round the background scheduler runs; it is started
between sessions here so that each round's effect can be measured. The running server picks up a
promoted adapter by itself (its pointer watcher), and the next sessions use it.

Measured: the held-out keep rate before training and after each promoted adapter. Held-out spots
come from modules the user never works on in training sessions, and recording is off while they
are measured. Also measured: the training sessions' checkpoint outcomes as the recorder stored
them, the gate's rewards (held-out episodes, and the fixed regression set), the KL from the base
model, and the time and peak memory of each training round. Results go to
bench/results/learning-loop-DATE.json (and a PNG with --full).

The short version also does the rest of squidcode's main job: it asks the agent for a verified
edit on a small project, applies it, and records it. An episode that ends without a verified edit
applies nothing, and the report says so and why (the episode's stop reason).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lsprotocol import types  # noqa: E402
from pygls.exceptions import JsonRpcException  # noqa: E402

from bench.simulated_user import (  # noqa: E402
    HELD_OUT_MODULES,
    TRAINING_MODULES,
    UNTOUCHED_MODULES,
    USERS,
    Spot,
    copy_modules,
    decide,
    find_spots,
)
from feedback.train.adapters import AdapterRegistry  # noqa: E402
from lsp_server.demo import (  # noqa: E402
    AGENT_INSTRUCTION,
    AGENT_WORKSPACE,
    _demo_client,
    agent_outcome,
    describe_agent,
    start_server,
)

CHECKPOINTS_S = (1.0, 3.0)
REQUEST_TIMEOUT_S = 300.0  # a server that stops answering fails the run instead of hanging it


@dataclass(frozen=True)
class Plan:
    rounds: int
    train_spots: int
    eval_spots: int
    steps: int
    agent: bool
    learning_rate: float = 1e-4  # train.learning_rate (the product's default)
    max_new_tokens: int = 32  # train.max_new_tokens: each sampled answer, and each gate answer
    user: str = "docstring"  # the simulated user's hidden preference (`simulated_user.USERS`)
    seed: int = 0  # train.seed: the trainer's sampling and shuffling
    task_set: str | None = None  # train.task_set: the gate's regression tasks (None: the bundled set)
    gate_spots: int = 32  # train.gate_spots: the gate's spots in files no episode is about
    # Other [train] settings, as TOML lines (`loss_type = "grpo"`): a variant measured beside the
    # product's defaults, recorded with the run.
    train_settings: tuple[str, ...] = ()
    # A diagnostic, not part of the loop: a refused adapter's held-out keep rate too (is the gate
    # right to refuse it?), measured with the pointer moved to it and back.
    judge_refused: bool = False


SHORT = Plan(rounds=1, train_spots=12, eval_spots=12, steps=4, agent=True, gate_spots=8)
# The settings of the measured runs in docs/benchmarks.md, the user-by-seed matrix's (`./dev demo
# --full` runs them).
# The product's group (2 prompts x 4 answers a step): 8 answers a prompt gained the oneline user +12.5
# points in a round at seeds 0 and 1, but nothing in two rounds at seed 2, with the trainer at 2,131
# MiB, over the 2 GiB a background job may take (docs/benchmarks.md, "Variants of the objective for
# the oneline user"); `--train-setting group_size=8` measures it.
# The user's own text as a sample of its group (`train.user_text_in_group`) at 4e-4 taught the oneline
# user where their texts end; at 2e-4 it cost the oneline user 7.5 points. One round: the matrix
# (three seeds a user) was measured with one, 21-24 minutes a run (docs/benchmarks.md, "The matrix
# with the gate's spots spread"); `--rounds N` runs more.
FULL = Plan(rounds=1, train_spots=48, eval_spots=40, steps=30, agent=False, learning_rate=4e-4,
            train_settings=("user_text_in_group = true",))


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def workspace_config(data: Path, plan: Plan, device: str = "cpu", threads: int | None = None) -> str:
    """The workspace's `.squidcode.toml`: the product's settings with short checkpoints, every
    spot's whole 256-token window, and every file the loop writes kept under `data`; `device` "cuda"
    runs model and trainer on the GPU in bfloat16 (bench/gpu_e2e.sh)."""
    gpu = '[model]\ndevice = "cuda"\ndtype = "bfloat16"\n\n' if device == "cuda" else ""
    return f"""# written by bench/learning_loop.py
{gpu}[completion]
debounce_ms = 0
prefix_tokens = 256
# The whole window at every spot: the budget a keystroke at a new place is tuned to per machine (192
# tokens on a 2-core AMD EPYC, 448 on an Intel Xeon) would make the keep rates the machine's.
keystroke_prefill_tokens = 0

[feedback]
db_path = "{data / 'feedback.db'}"
checkpoints_s = [{', '.join(str(c) for c in CHECKPOINTS_S)}]

[train]
dir = "{data / 'train'}"
device = "{device}"
steps = {plan.steps}
threads = {threads or os.cpu_count() or 1}
max_new_tokens = {plan.max_new_tokens}
learning_rate = {plan.learning_rate}
seed = {plan.seed}
gate_spots = {plan.gate_spots}
{f'task_set = "{plan.task_set}"' if plan.task_set else ""}
{chr(10).join(plan.train_settings)}
"""


def pick(spots: list[Spot], count: int) -> list[Spot]:
    """`count` spots spread evenly over the list (deterministic)."""
    if len(spots) <= count:
        return list(spots)
    stride = len(spots) / count
    return [spots[int(i * stride)] for i in range(count)]


def waves(spots: list[Spot]) -> list[list[Spot]]:
    """Spots grouped so that each wave holds at most one spot per file (one open buffer each)."""
    by_file: dict[str, list[Spot]] = {}
    for spot in spots:
        by_file.setdefault(spot.path, []).append(spot)
    out = []
    while any(by_file.values()):
        out.append([queue.pop(0) for queue in by_file.values() if queue])
    return out


def _end_of(start: tuple[int, int], text: str) -> tuple[int, int]:
    lines = text.split("\n")
    if len(lines) == 1:
        return start[0], start[1] + len(text)
    return start[0] + len(lines) - 1, len(lines[-1])


def _range(start: tuple[int, int], end: tuple[int, int]) -> types.Range:
    return types.Range(start=types.Position(*start), end=types.Position(*end))


class Editor:
    """The simulated user's editor: buffers with versions, over a pygls client."""

    def __init__(self, client, workspace: Path):
        self.client, self.workspace = client, workspace
        self.versions: dict[str, int] = {}

    def open(self, path: str, text: str) -> str:
        uri = (self.workspace / path).as_uri()
        self.versions[uri] = 1
        self.client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
        return uri

    def change(self, uri: str, start, end, text: str) -> None:
        self.versions[uri] += 1
        self.client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=self.versions[uri]),
            content_changes=[types.TextDocumentContentChangePartial(range=_range(start, end), text=text)]))

    def close(self, uri: str) -> None:
        self.client.text_document_did_close(types.DidCloseTextDocumentParams(
            text_document=types.TextDocumentIdentifier(uri=uri)))

    async def command(self, name: str, argument: dict | None = None, timeout: float = REQUEST_TIMEOUT_S):
        return await asyncio.wait_for(self.client.workspace_execute_command_async(types.ExecuteCommandParams(
            command=name, arguments=None if argument is None else [argument])), timeout)

    async def complete(self, uri: str, cursor: tuple[int, int]):
        result = await asyncio.wait_for(self.client.text_document_inline_completion_async(
            types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(*cursor),
                context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked))),
            REQUEST_TIMEOUT_S)
        items = result.items if isinstance(result, types.InlineCompletionList) else (result or [])
        return items[0] if items else None


async def run_spots(editor: Editor, spots: list[Spot], *, record: bool,
                    user: str = "docstring") -> list[dict]:
    """One session over `spots`: complete, accept, judge (by `user`'s hidden preference); returns
    what the user did at each spot."""
    await editor.command("squidcode.feedback.setRecord", {"on": record})
    log = []
    for wave in waves(spots):
        opened = []
        for spot in wave:
            uri = editor.open(spot.path, spot.text)
            opened.append(uri)
            asked = time.perf_counter()
            item = await editor.complete(uri, spot.cursor)
            latency = round(time.perf_counter() - asked, 3)
            text = item.insert_text if item is not None else None
            text = text if isinstance(text, str) else getattr(text, "value", None)
            if not text:
                log.append({"spot": f"{spot.path}:{spot.name}", "action": "none", "text": "",
                            "latency_s": latency})
                continue
            start = spot.cursor
            end = _end_of(start, text)
            editor.change(uri, start, start, text)  # the accepted ghost text, typed in
            if item.command is not None:
                await editor.command(item.command.command, *(item.command.arguments or [None]))
            decision = decide(spot, text, user)
            await asyncio.sleep(0.1)  # reading it
            if decision.action != "keep":
                editor.change(uri, start, end, decision.result(text))
            log.append({"spot": f"{spot.path}:{spot.name}", "action": decision.action, "text": text,
                        "retained": decision.retained(text), "latency_s": latency})
        if record:
            await asyncio.sleep(CHECKPOINTS_S[-1] + 1.5)  # the recorder judges at its checkpoints
        for uri in opened:
            editor.close(uri)
    return log


def keep_rate(log: list[dict]) -> float:
    return sum(1 for entry in log if entry["action"] == "keep") / max(1, len(log))


def retained_per_shown(log: list[dict]) -> float:
    """Characters of the suggestions that stayed in the file, per suggestion shown."""
    shown = [entry for entry in log if entry["text"]]
    return sum(entry.get("retained", 0) for entry in shown) / max(1, len(shown))


def recorded_outcomes(db: Path, since: float) -> dict:
    """The recorder's own verdicts on completion episodes since `since`, at each checkpoint."""
    from feedback.store import FeedbackStore

    per_checkpoint: dict[str, dict[str, int]] = {}
    if not db.exists():
        return per_checkpoint
    store = FeedbackStore(db)
    try:
        for record in store.episodes_with_outcomes(since, None):
            if record.episode["kind"] != "completion" or not record.accepted:
                continue
            for outcome in record.outcomes:
                bucket = per_checkpoint.setdefault(f"{outcome['checkpoint_s']:g}s", {})
                bucket[outcome["status"]] = bucket.get(outcome["status"], 0) + 1
    finally:
        store.close()
    return per_checkpoint


def die_with_parent() -> None:
    """In a child before it runs (Linux): kill it when this process dies, killed or not. A bench
    killed by its caller's timeout left its `squidcode train` running on for half an hour."""
    try:
        import ctypes

        # SIGKILL: the trainer takes SIGTERM as "stop after this step", and its gate has no steps.
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the trainer stops when its round ends


def train_round(workspace: Path, steps: int) -> dict:
    """`squidcode train --once`: its result, wall time and peak memory (the child's max RSS)."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "lsp_server", "--log-level", "warning", "train", "--once",
                             "--steps", str(steps), "--json"], cwd=workspace,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=die_with_parent)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    out, err = proc.stdout.read(), proc.stderr.read()
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"squidcode train failed ({proc.returncode}):\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result.update(seconds=round(seconds, 1), peak_rss_mb=round(usage.ru_maxrss / 1024, 1))
    return result


def gate_metrics(data: Path) -> dict:
    status = json.loads((data / "train" / "status.json").read_text())
    return status.get("metrics") or {}


async def wait_for_index(editor: Editor, timeout: float = 300.0) -> float:
    """Seconds until the server's index is built (`squidcode.status`); at once when it has none."""
    started = time.perf_counter()
    while True:
        status = await editor.command("squidcode.status", {})
        state = ((status or {}).get("index") or {}).get("state", "off")
        if state in ("ready", "error", "off", "stopped"):
            if state == "error":
                _say(f"the index failed ({status['index'].get('error')}): completions go without references")
            return time.perf_counter() - started
        if time.perf_counter() - started > timeout:
            raise SystemExit(f"the index was not ready after {timeout:.0f} s")
        await asyncio.sleep(0.25)


async def wait_for_adapter(editor: Editor, adapter: str, timeout: float = 120.0) -> float:
    """Seconds until the running server generates with `adapter` (its pointer watcher swaps it in)."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        status = await editor.command("squidcode.train.status", {})
        if (status or {}).get("loadedAdapter") == adapter:
            return time.perf_counter() - started
        await asyncio.sleep(0.5)
    raise SystemExit(f"the server did not load adapter {adapter} within {timeout:.0f} s")


async def held_out_of_refused(editor: Editor, data: Path, spots: list[Spot], user: str) -> dict:
    """The held-out keep rate of the round's refused adapter (the newest version, not promoted): the
    pointer names it while the held-out spots are asked (recording off), then goes back to the
    adapter in use, as the loop goes on with it."""
    registry = AdapterRegistry(data / "train" / "adapters")
    in_use = registry.current_id()
    refused = registry.versions()[-1].id
    if refused == in_use:
        raise SystemExit(f"the newest adapter {refused} is the one in use: no refused adapter to judge")
    registry.promote(refused)
    try:
        await wait_for_adapter(editor, refused)
        held = await run_spots(editor, spots, record=False, user=user)
    finally:
        if registry.rollback() != in_use:
            raise SystemExit(f"the pointer did not go back to {in_use or 'the base model'}")
        await wait_for_adapter(editor, in_use)
    return {"adapter": refused, "keep_rate": keep_rate(held), "retained_per_shown": retained_per_shown(held),
            "log": held}


def applied_wording(report: dict) -> str:
    """What became of the agent's edit (said only of a verified one: no other is returned)."""
    if not report["applied"]:
        return "not applied"
    return "applied and recorded" if report["tracked"] else "applied, not recorded (recording is off)"


async def agent_edit(data: Path) -> dict:
    """The agent on a small project (a copy of lsp_server/demo_agent): a verified edit, applied
    by the client and reported with `squidcode.agent.applied`, then kept by the user. The report
    says what happened (`lsp_server.demo.agent_outcome`), edit or not."""
    import shutil

    project = data / "agent-project"
    shutil.copytree(AGENT_WORKSPACE, project)
    client = _demo_client([])
    await start_server(client, data / "agent-server.log")
    try:
        await client.initialize_async(types.InitializeParams(
            process_id=None, root_uri=project.as_uri(), capabilities=types.ClientCapabilities(),
            workspace_folders=[types.WorkspaceFolder(uri=project.as_uri(), name="agent")],
            initialization_options={"feedback": {"db_path": str(data / "feedback.db"),
                                                 "checkpoints_s": list(CHECKPOINTS_S)}}))
        client.initialized(types.InitializedParams())
        editor = Editor(client, project)
        uri = editor.open("names.py", (project / "names.py").read_text())
        started = time.perf_counter()
        try:
            result = await editor.command("squidcode.agent.run",
                                          {"instruction": AGENT_INSTRUCTION, "uri": uri, "k": 2})
            outcome = agent_outcome(result, time.perf_counter() - started)
        except JsonRpcException as exc:  # the server said why; the session still ends cleanly
            result, outcome = None, agent_outcome(None, time.perf_counter() - started, str(exc))
        edit = (result or {}).get("edit") or {}
        edits = ((edit.get("changes") or {}).get(uri) or []) if outcome["outcome"] == "verified" else []
        for text_edit in edits:
            rng = text_edit["range"]
            editor.change(uri, (rng["start"]["line"], rng["start"]["character"]),
                          (rng["end"]["line"], rng["end"]["character"]), text_edit["newText"])
        tracked = False
        if edits:
            answer = await editor.command("squidcode.agent.applied", {"episodeId": result["episodeId"]})
            tracked = bool((answer or {}).get("tracked"))
            await asyncio.sleep(CHECKPOINTS_S[-1] + 1.5)
        await client.shutdown_async(None)
        client.exit(None)
    finally:
        await client.stop()
    return {**outcome, "applied": bool(edits), "tracked": tracked}


async def run(plan: Plan, data: Path, device: str = "cpu", train_threads: int | None = None) -> dict:
    workspace = data / "workspace"
    copy_modules(workspace, TRAINING_MODULES + UNTOUCHED_MODULES)
    # The held-out modules reach the server only as open buffers (never written to the workspace), so
    # the gate, which looks for spots in the workspace's files, never sees them.
    copy_modules(data / "held-out", HELD_OUT_MODULES)
    (workspace / ".squidcode.toml").write_text(workspace_config(data, plan, device, train_threads))
    spots = {name: find_spots((workspace / name).read_text(), name) for name in TRAINING_MODULES
             if (workspace / name).is_file()}
    spots.update({name: find_spots((data / "held-out" / name).read_text(), name) for name in HELD_OUT_MODULES
                  if (data / "held-out" / name).is_file()})
    train_spots = pick([s for m in TRAINING_MODULES for s in spots.get(m, [])], plan.train_spots)
    eval_spots = pick([s for m in HELD_OUT_MODULES for s in spots.get(m, [])], plan.eval_spots)
    report: dict = {"plan": plan.__dict__, "train_spots": len(train_spots), "eval_spots": len(eval_spots),
                    "rounds": []}
    if plan.agent:
        _say("agent: asking for a fix on a small project (the edit is verified by its test, then applied)")
        report["agent"] = await agent_edit(data)
        _say(f"agent: {describe_agent(report['agent'], applied_wording(report['agent']))}")
    client = _demo_client([])
    await start_server(client, data / "server.log")
    try:
        await client.initialize_async(types.InitializeParams(
            process_id=None, root_uri=workspace.as_uri(), capabilities=types.ClientCapabilities(),
            workspace_folders=[types.WorkspaceFolder(uri=workspace.as_uri(), name="stdlib-copy")]))
        client.initialized(types.InitializedParams())
        editor = Editor(client, workspace)
        # Squid composes references only from a ready index: measured before it is, the base model's
        # first spots would go without the references every later measurement has.
        report["index_wait_s"] = round(await wait_for_index(editor), 1)
        _say(f"index ready after {report['index_wait_s']} s")
        _say(f"held-out: {len(eval_spots)} completions in {len(HELD_OUT_MODULES)} files the user never "
             "trains on (recording off)")
        base = await run_spots(editor, eval_spots, record=False, user=plan.user)
        sample = next((e for e in base if e["text"]), None)
        if sample:
            _say(f"an inline completion at {sample['spot']} ({sample['action']}):\n{sample['text']}")
        report["held_out"] = [{"adapter": None, "keep_rate": keep_rate(base),
                               "retained_per_shown": retained_per_shown(base), "log": base}]
        _say(f"held-out keep rate, base model: {keep_rate(base):.0%}")
        for number in range(1, plan.rounds + 1):
            since = time.time()
            _say(f"round {number}: the user works on {len(train_spots)} spots (recorded)")
            session = await run_spots(editor, train_spots, record=True, user=plan.user)
            await asyncio.sleep(1.0)
            outcomes = recorded_outcomes(data / "feedback.db", since)
            _say(f"round {number}: user kept {keep_rate(session):.0%}; the recorder stored {outcomes}")
            _say(f"round {number}: training ({plan.steps} GRPO steps, then the promotion gate)...")
            result = train_round(workspace, plan.steps)
            metrics = gate_metrics(data)
            entry = {"round": number, "session_keep_rate": keep_rate(session), "recorded": outcomes,
                     "train": result, "gate": metrics, "session": session}
            _say(f"round {number}: {result['state']} in {result['seconds']} s (trainer peak RSS "
                 f"{result['peak_rss_mb']} MiB): {result['message']}")
            if result["state"] == "promoted":
                entry["swap_s"] = round(await wait_for_adapter(editor, result["adapter"]), 1)
                _say(f"round {number}: the running server switched to {result['adapter']} "
                     f"in {entry['swap_s']} s, no restart")
                held = await run_spots(editor, eval_spots, record=False, user=plan.user)
                report["held_out"].append({"adapter": result["adapter"], "keep_rate": keep_rate(held),
                                           "retained_per_shown": retained_per_shown(held), "log": held})
                _say(f"held-out keep rate with {result['adapter']}: {keep_rate(held):.0%} "
                     f"(base {keep_rate(base):.0%})")
            elif plan.judge_refused and result["state"] == "rejected":
                entry["refused"] = await held_out_of_refused(editor, data, eval_spots, plan.user)
                _say(f"held-out keep rate the refused {entry['refused']['adapter']} would have had: "
                     f"{entry['refused']['keep_rate']:.0%} (base {keep_rate(base):.0%})")
            report["rounds"].append(entry)
        report["status"] = await editor.command("squidcode.status", {})
        await client.shutdown_async(None)
        client.exit(None)
    finally:
        await client.stop()
    return report


def summary(report: dict) -> str:
    rows = ["| round | adapter | held-out keep | session keep | regression reward (base) | KL | "
            "train s | peak RSS MiB |", "|---|---|---|---|---|---|---|---|"]
    base = report["held_out"][0]["keep_rate"]
    rows.append(f"| 0 | base | {base:.0%} | | | | | |")
    held = {h["adapter"]: h["keep_rate"] for h in report["held_out"][1:]}
    for entry in report["rounds"]:
        gate, train = entry["gate"], entry["train"]
        reg, reg_base = gate.get("regression", {}), gate.get("regression_baseline", {})
        adapter = train["adapter"] if train["state"] == "promoted" else f"{train['state']}"
        keep = held.get(train["adapter"]) if train["state"] == "promoted" else None
        shown = '' if keep is None else f'{keep:.0%}'
        if "refused" in entry:  # the diagnostic: what the refused adapter would have given
            shown = f"({entry['refused']['adapter']}: {entry['refused']['keep_rate']:.0%})"
        rows.append(
            f"| {entry['round']} | {adapter} | {shown} | "
            f"{entry['session_keep_rate']:.0%} | {reg.get('mean_reward', 0):.3f} "
            f"({reg_base.get('mean_reward', 0):.3f}) | {reg.get('mean_kl', 0):.4f} | {train['seconds']} | "
            f"{train['peak_rss_mb']} |")
    return f"simulated user: {report['plan'].get('user', 'docstring')}\n" + "\n".join(rows)


def run_outcome(report: dict) -> dict:
    """One run's held-out result: the base model's, the last promoted adapter's, and the gain."""
    base, last = report["held_out"][0], report["held_out"][-1]
    return {"seed": report["plan"]["seed"], "user": report["plan"]["user"],
            "base_keep": base["keep_rate"], "final_keep": last["keep_rate"],
            "gain": last["keep_rate"] - base["keep_rate"],
            "base_retained": base.get("retained_per_shown", 0.0),
            "final_retained": last.get("retained_per_shown", 0.0),
            "promoted": len(report["held_out"]) - 1,
            "peak_rss_mb": max((e["train"].get("peak_rss_mb") or 0 for e in report["rounds"]), default=0),
            "regression": [e["gate"].get("regression", {}).get("mean_reward") for e in report["rounds"]],
            "regression_base": [e["gate"].get("regression_baseline", {}).get("mean_reward")
                                for e in report["rounds"]]}


def matrix_summary(outcomes: list[dict]) -> str:
    """Each run of a seeds matrix, then the mean [min, max] per user."""
    rows = ["| user | seed | held-out keep: base -> final | gain | retained chars per shown: base -> final | "
            "promoted rounds | trainer peak RSS MiB |", "|---|---|---|---|---|---|---|"]
    for o in outcomes:
        rows.append(f"| {o['user']} | {o['seed']} | {o['base_keep']:.0%} -> {o['final_keep']:.0%} | "
                    f"{100 * o['gain']:+.1f} | {o['base_retained']:.1f} -> {o['final_retained']:.1f} | "
                    f"{o['promoted']} | {o['peak_rss_mb']} |")
    for user in sorted({o["user"] for o in outcomes}):
        runs = [o for o in outcomes if o["user"] == user]
        gains = [100 * o["gain"] for o in runs]
        kept = [o["final_retained"] - o["base_retained"] for o in runs]
        rows.append(f"| {user} | mean of {len(runs)} | | {statistics.fmean(gains):+.1f} "
                    f"[{min(gains):+.1f}, {max(gains):+.1f}] | {statistics.fmean(kept):+.1f} "
                    f"[{min(kept):+.1f}, {max(kept):+.1f}] | | |")
    return "\n".join(rows)


NO_PLOT = "no plot: matplotlib is not installed (pip install -e '.[bench]')"


def _pyplot():
    """matplotlib's pyplot without a display, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_matrix(reports: list[dict], path: Path) -> bool:
    """Held-out keep rate by round, one line per run."""
    plt = _pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for report in reports:
        keeps = [h["keep_rate"] for h in report["held_out"]]
        rounds = [0] + [e.get("round") for e in report["rounds"] if e["train"].get("state") == "promoted"]
        if len(rounds) != len(keeps) or None in rounds:  # a report that does not say which round promoted
            rounds = list(range(len(keeps)))
        ax.plot(rounds, keeps, "o-",
                label=f"{report['plan']['user']} seed {report['plan']['seed']}")
    ax.set_xlabel("training round (promoted adapters)")
    ax.set_ylabel("held-out keep rate")
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right", fontsize=7)
    ax.set_title("squidcode learning loop: seeds and users (SmolLM2-135M)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def plot(report: dict, path: Path) -> bool:
    plt = _pyplot()
    if plt is None:
        return False
    rounds = [0] + [e["round"] for e in report["rounds"] if e["train"]["state"] == "promoted"]
    keeps = [h["keep_rate"] for h in report["held_out"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(rounds, keeps, "o-", label="held-out keep rate")
    ax.plot([e["round"] for e in report["rounds"]], [e["session_keep_rate"] for e in report["rounds"]],
            "s--", label="training-session keep rate")
    reg = [e["gate"].get("regression", {}).get("mean_reward") for e in report["rounds"]]
    ax.plot([e["round"] for e in report["rounds"]], reg, "^:", label="regression reward")
    ax.set_xlabel("training round")
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("squidcode learning loop (simulated user, SmolLM2-135M)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="the long measurement (1 round of 30 steps)")
    parser.add_argument("--rounds", type=positive, help="override the number of rounds")
    parser.add_argument("--steps", type=positive, help="override GRPO steps per round")
    parser.add_argument("--learning-rate", type=float, help="override train.learning_rate")
    parser.add_argument("--train-spots", type=positive, help="override the spots of each training session")
    parser.add_argument("--eval-spots", type=positive, help="override the held-out spots")
    parser.add_argument("--no-agent", action="store_true", help="skip the agent edit")
    parser.add_argument("--max-new-tokens", type=int,
                        help="override train.max_new_tokens (tokens per sampled and per gate answer)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: model and trainer on the GPU in bfloat16 (bench/gpu_e2e.sh)")
    parser.add_argument("--train-threads", type=int,
                        help="the trainer's torch threads (default: one per core; on a machine busy with "
                             "other work, 1: a thread pool that waits on busy cores takes 10-30x longer)")
    parser.add_argument("--user", choices=sorted(USERS), nargs="+", default=["docstring"],
                        help="the simulated user's hidden preference (see bench/simulated_user.py); "
                             "several: a run for each")
    parser.add_argument("--seeds", type=seed_list,
                        help="N: run the loop once per train.seed 0..N-1 (per user); or a list, 1,2: those "
                             "seeds (one: 2,). Each run and the mean gain with its min and max, in a table "
                             "and a plot")
    parser.add_argument("--with", dest="earlier", type=Path, nargs="+", default=[],
                        help="reports of earlier runs (this script's JSON, one run each, or a matrix's, "
                             "standing for its runs) to join to the "
                             "matrix's table and plot, so a matrix can be completed in parts")
    parser.add_argument("--task-set", type=Path,
                        help="train.task_set: verifiable tasks whose newest part is the gate's regression "
                             "set (default: the bundled set)")
    parser.add_argument("--gate-spots", type=int,
                        help="override train.gate_spots (the gate's spots in files no episode is about)")
    parser.add_argument("--train-setting", action="append", default=[], type=train_setting,
                        metavar="KEY=VALUE", help="another [train] setting for the run, its value as "
                        "TOML (`loss_type='\"grpo\"'`, `group_size=8`); repeatable")
    parser.add_argument("--out", type=Path, help="where the JSON report goes")
    parser.add_argument("--keep-data", action="store_true", help="keep the workspace, store and adapters")
    parser.add_argument("--judge-refused", action="store_true",
                        help="a diagnostic: also measure each refused adapter's held-out keep rate (the "
                             "pointer names it for the held-out spots, then goes back)")
    args = parser.parse_args(argv)
    plan = FULL if args.full else SHORT
    plan = Plan(args.rounds or plan.rounds, args.train_spots or plan.train_spots,
                args.eval_spots or plan.eval_spots, args.steps or plan.steps,
                plan.agent and not args.no_agent, args.learning_rate or plan.learning_rate,
                args.max_new_tokens or plan.max_new_tokens, args.user[0],
                task_set=str(args.task_set.resolve()) if args.task_set else None,
                gate_spots=plan.gate_spots if args.gate_spots is None else args.gate_spots,
                train_settings=merged_settings(plan.train_settings, args.train_setting),
                judge_refused=args.judge_refused)
    if args.seeds is None and len(args.user) == 1 and not args.earlier:
        return run_one(plan, args)
    # The matrix: every user with every seed, each run a fresh workspace, store and trainer.
    seeds = args.seeds if args.seeds is not None else ([] if args.earlier else [0])  # --with alone: a table
    runs, ok = earlier_reports(args.earlier), True
    reports = [json.loads(Path(path).read_text()) for path in runs]
    name = f"learning-loop-matrix-{'full' if args.full else 'short'}-{time.strftime('%Y-%m-%d')}.json"
    out = args.out or ROOT / "bench" / "results" / name

    def save() -> None:  # after each run: a matrix stopped part way keeps what it measured
        out.write_text(json.dumps({"runs": [run_outcome(r) for r in reports], "reports": runs}, indent=1))

    for user in args.user:
        for seed in seeds:
            one = replace(plan, user=user, seed=seed, agent=plan.agent and not reports)
            run_out = out.with_name(f"{out.stem}-{user}-seed{seed}.json")
            ok = run_one(one, args, run_out) == 0 and ok
            reports.append(json.loads(run_out.read_text()))
            runs.append(str(run_out))
            save()
    save()
    print("\n" + matrix_summary([run_outcome(r) for r in reports]))
    if plot_matrix(reports, out.with_suffix(".png")):
        print(f"plot: {out.with_suffix('.png')}")
    else:
        print(NO_PLOT)
    print(f"matrix: {out}")
    return 0 if ok else 1


def earlier_reports(paths: list[Path]) -> list[str]:
    """`--with`: the run reports named, a matrix's JSON standing for the reports it lists; checked
    before anything runs (a wrong file found after a 40-minute run would cost the run's table)."""
    found = []
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"--with {path}: not a readable JSON report ({exc})") from None
        if isinstance(data, dict) and isinstance(data.get("reports"), list) and "runs" in data:
            found += earlier_reports([Path(p) for p in data["reports"]])
        elif isinstance(data, dict) and {"plan", "held_out", "rounds"} <= data.keys():
            found.append(str(path))
        else:
            raise SystemExit(f"--with {path}: neither a run's report nor a matrix of them")
    return list(dict.fromkeys(found))


WRITTEN = ("dir", "device", "steps", "threads", "max_new_tokens", "learning_rate", "seed", "gate_spots",
           "task_set")  # the [train] settings `workspace_config` writes itself (their own flags)


def train_setting(text: str) -> str:
    """`--train-setting`: KEY=VALUE, a `train` setting other than those with their own flag, its value
    in TOML; the TOML line for the workspace's configuration."""
    import tomllib
    from dataclasses import fields

    from context.config import TrainConfig

    key, _, value = text.partition("=")
    key, value = key.strip(), value.strip()
    if key not in {f.name for f in fields(TrainConfig)}:
        raise argparse.ArgumentTypeError(f"{key!r} is not a train setting")
    if key in WRITTEN:
        raise argparse.ArgumentTypeError(f"{key!r} has its own flag (or is the loop's own: dir, device)")
    try:
        tomllib.loads(f"{key} = {value}")
    except tomllib.TOMLDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{value!r} is not a TOML value ({exc}); a string is quoted") \
            from None
    return f"{key} = {value}"


def merged_settings(plan: tuple[str, ...], given: list[str]) -> tuple[str, ...]:
    """The plan's `[train]` lines with `--train-setting`'s after them, a key given on the command line
    replacing the plan's (`--full --train-setting group_size=4` measures the product's group)."""
    keys = {line.partition("=")[0].strip() for line in given}
    return tuple(line for line in plan if line.partition("=")[0].strip() not in keys) + tuple(given)


def seed_list(text: str) -> list[int]:
    """`--seeds`: "3" is seeds 0, 1, 2; "1,2" is seeds 1 and 2."""
    try:
        if "," not in text:
            return list(range(int(text)))
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds are a count (3) or a list (1,2), not {text!r}") from None


def positive(text: str) -> int:
    """A count of 1 or more (`--rounds 0` had silently meant the plan's own number)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1, not {value}")
    return value


def run_one(plan: Plan, args, out: Path | None = None) -> int:
    """One run of the loop with `plan`; its report (JSON) at `out`."""
    data = Path(tempfile.mkdtemp(prefix="squidcode-loop-"))
    started = time.perf_counter()
    _say(f"squidcode learning loop ({'full' if args.full else 'short'}): {plan.rounds} round(s) of "
         f"{plan.steps} steps, the {plan.user} user, seed {plan.seed}; data in {data}")
    report = asyncio.run(run(plan, data, args.device, args.train_threads))
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["date"] = time.strftime("%Y-%m-%d %H:%M")
    print("\n" + summary(report))
    name = f"learning-loop-{'full' if args.full else 'short'}-{time.strftime('%Y-%m-%d')}.json"
    out = out or args.out or ROOT / "bench" / "results" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    if args.full:
        print(f"plot: {out.with_suffix('.png')}" if plot(report, out.with_suffix(".png")) else NO_PLOT)
    print(f"report: {out}; {report['seconds'] / 60:.1f} min in all")
    if not args.keep_data:
        import shutil

        shutil.rmtree(data, ignore_errors=True)
    promoted_or_rejected = all(e["train"]["state"] in ("promoted", "rejected") for e in report["rounds"])
    return 0 if promoted_or_rejected and report["rounds"] else 1


if __name__ == "__main__":
    sys.exit(main())
