"""The agent on repair tasks made from a real repository: does it fix a bug its tests catch?

A public repository's source (a git directory and a commit, e.g. one brought here by the tool
library's `fetch`, or a plain folder) is copied to a temporary folder, and
`feedback.train.repair_tasks` makes its tasks: a one-line bug in a function its tests cover, kept
when the tests pass without it and fail with it. Whole files are held out as the trainer holds them
out. For each held-out task one episode runs, as `squidcode agent` runs it (the product's agent
settings, K candidates, the pre-test run, Squid-composed documents), on a fresh copy with the bug in,
asked with the task's instruction about the function's lines. Reported per task and in total:

  solved        the episode's chosen candidate makes the task's tests pass (its test files, all of
                them: the user gets a working fix); the agent chose it by its own checks, where a
                test failing before any edit (toolz's `test_has_version` without the package's
                metadata) does not reject an edit (`TestRun.judged_against`)
  chosen        the episode chose a candidate (its own checks verified one)
  pass@1        candidate 0 (greedy) of the first round makes the task's tests pass
  pass@K        one of the first round's K candidates does
  reward        the mean trainer's reward (`repair_reward`) of the first round's candidates
  checks        the share of candidates that followed the format, applied, parsed, linted, passed
  steps         how many steps the episode took, and how many answers did not parse

With `--sft-steps` / `--grpo-steps` the same run also trains a LoRA adapter on the training files'
tasks (prompted with the agent's first step, `repair_tasks.repair_examples`) and runs the held-out
episodes again with it: first supervised on the repository's own fix written as the protocol's edit
block (the model learns the format: the base model's answers mostly do not parse, so GRPO alone
has nothing to compare), then GRPO with the repair reward (its own attempts, checked and tested;
a group whose samples all earn the same gets the fix as its last sample, `train.guide_flat_groups`).

    python bench/bench_agent_repair.py --git-dir /work/.mirror/pytoolz+toolz/repo --commit 5eee30e \\
        --tasks 24 --k 4 --threads 2 [--adapter DIR [--with-base]] [--no-copy-search] [--peer] \\
        [--json out.json]

`--peer`: the same episodes with the base model served by llama.cpp's server (llama-cpp-python,
built by `.ci/install-llama-server.sh`) on the same GGUF, through the agent's OpenAI-compatible
backend with the text tool protocol, as an admin who points squidcode at a local server would run
it (the copy constraint of `agent.copy_search` needs the local model's logits: not there).

toolz (BSD-3-Clause) at 5eee30e: the last commit before its pytest configuration turned warnings into
errors (the agent runs tests with squidcode's interpreter, whose pytest plugins warn).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_foundation import machine_info  # noqa: E402

from feedback.train.repair_tasks import (  # noqa: E402
    RepairTask,
    RepairWorkspace,
    fix_answer,
    repair_reward,
    repair_tasks,
)


def checkout(args, tmp: Path) -> Path:
    root = tmp / "repo"
    if args.root:
        shutil.copytree(args.root, root, ignore=shutil.ignore_patterns(".git", "__pycache__"))
        return root
    root.mkdir()
    archive = subprocess.run(["git", "--git-dir", str(args.git_dir), "archive", args.commit],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root


def split(tasks: list[RepairTask], holdout: float, seed: int) -> tuple[list[RepairTask], list[RepairTask]]:
    """Whole files held out, about `holdout` of the tasks (as `repo_tasks.split_files` splits)."""
    files = sorted({t.path for t in tasks})
    random.Random(seed).shuffle(files)
    held, count = set(), 0
    for path in files:
        if count >= holdout * len(tasks) or len(held) == len(files) - 1:
            break
        held.add(path)
        count += sum(t.path == path for t in tasks)
    return [t for t in tasks if t.path not in held], [t for t in tasks if t.path in held]


def run_episode(backend, config, task: RepairTask, root: Path, original: str,
                scratch: RepairWorkspace) -> dict:
    from agent.loop import AgentLoop, AgentRequest
    from agent.sandbox import Workspace

    with tempfile.TemporaryDirectory(prefix="squid-repair-episode-") as tmp:
        work = Path(tmp) / root.name
        shutil.copytree(root, work, ignore=shutil.ignore_patterns("__pycache__"))
        (work / task.path).write_text(task.broken_text(original), encoding="utf-8")
        subprocess.run(["git", "init", "-q", str(work)], check=True)
        started = time.monotonic()
        result = AgentLoop(backend, Workspace([work]), config).run(
            AgentRequest(task.instruction, work / task.path, line_range=task.span, k=config.k))
        seconds = time.monotonic() - started
    round_one = result.candidates[: config.k]
    verdicts = [repair_reward(task, c.text, scratch, original) for c in round_one]
    verified = [v.checks.get("tests") is True for v in verdicts]
    rewards = [v.reward for v in verdicts]
    chosen = result.candidates[result.chosen] if result.chosen is not None else None
    # Solved: the edit the agent chose makes the task's tests pass (all of its test files), judged
    # as the task was made; the agent's own check only chose it.
    judged = repair_reward(task, chosen.text, scratch, original) if chosen is not None else None
    return {
        "task": task.id, "path": task.path, "function": task.function, "kind": task.kind,
        "seconds": round(seconds, 1), "stop_reason": result.stop_reason,
        "steps": len(result.steps), "invalid_steps": sum(s.tool == "invalid" for s in result.steps),
        "solved": bool(judged and judged.checks.get("tests") is True),
        "chosen": chosen is not None,
        "chosen_answer": chosen.text[:600] if chosen is not None else None,
        "chosen_detail": chosen.detail[:600] if chosen is not None else None,
        "pass@1": bool(verified[:1] and verified[0]), "pass@k": any(verified),
        "reward": statistics.fmean(rewards) if rewards else 0.0,
        "candidates": [{"checks": c.checks, "answer": c.text[:300]} for c in round_one],
        "step_kinds": [s.tool for s in result.steps],
        "invalid_answers": [s.answer[:300] for s in result.steps if s.tool == "invalid"][:3],
    }


def _print_row(label: str, task: RepairTask, row: dict, k: int) -> None:
    print(f"{label} {task.path}:{task.line} {task.kind:10} solved {row['solved']!s:5} "
          f"pass@{k} {row['pass@k']!s:5} reward {row['reward']:.2f} "
          f"steps {row['step_kinds']} {row['seconds']:.0f}s", flush=True)


def run_peer(args, held: list[RepairTask], root: Path, tmp: Path) -> dict:
    """The held-out episodes with the base model served by llama.cpp's server (the peer)."""
    from bench_completion import LlamaServer

    from agent.backends import OpenAIBackend
    from context.config import AgentConfig

    if not LlamaServer.available():
        raise SystemExit("--peer: no llama.cpp server here (run .ci/install-llama-server.sh)")
    server = LlamaServer(tmp / "llama.log", args.threads, n_ctx=8192)
    config = replace(AgentConfig(), k=args.k, memory=False, backend="openai", tool_protocol="text")
    rows = []
    try:
        server.wait_ready()
        backend = OpenAIBackend(server.base_url, "smollm2", native_tools=False, timeout_s=600.0)
        try:
            with RepairWorkspace(root) as scratch:
                for task in held:
                    original = (root / task.path).read_text(encoding="utf-8")
                    rows.append(run_episode(backend, config, task, root, original, scratch))
                    _print_row("llama.cpp", task, rows[-1], args.k)
        finally:
            backend.close()
    finally:
        server.close()
    summary = summarise(rows)
    print(f"llama.cpp: {json.dumps(summary)}", flush=True)
    return {"summary": summary, "tasks": rows}


def train_adapter(args, train: list[RepairTask], root: Path, out: Path) -> dict:
    """Supervised steps on the fixes, then GRPO steps on the repair reward, in a runtime of its own;
    the adapter saved at `out`. Returns the machine time and the losses / rewards on the way."""
    import random as _random

    import torch

    from context.config import ModelConfig, TrainConfig
    from context.runtime import ModelRuntime
    from feedback.train.policy import SampledGroup, attach_lora, example_prompt_ids, group_logprobs
    from feedback.train.repair_tasks import repair_examples
    from feedback.train.service import task_reward
    from feedback.train.trainer import GrpoTrainer

    runtime = ModelRuntime(ModelConfig(threads=args.threads)).load()
    tokenizer = runtime.tokenizer
    started = time.perf_counter()
    examples = repair_examples(train, root, runtime)
    prompts_s = time.perf_counter() - started
    torch.manual_seed(args.seed)
    model = attach_lora(runtime.model, 8, 16)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    rng = _random.Random(args.seed)
    losses = []
    started = time.perf_counter()
    for _ in range(args.sft_steps):
        optimizer.zero_grad(set_to_none=True)
        model.train()
        batch = rng.sample(examples, min(2, len(examples)))
        for example in batch:
            task = RepairTask.from_json(example.verification["task"])
            gold = fix_answer(task)
            target = gold.removeprefix("```") + "\n"  # the prompt ends with the opening fence
            ids = torch.tensor([tokenizer.encode(target, add_special_tokens=False)], dtype=torch.long)
            prompt = example_prompt_ids(tokenizer, example)
            group = SampledGroup(prompt, ids, torch.ones_like(ids), [gold], None)
            loss = -group_logprobs(model, group, 1.0).mean() / len(batch)
            loss.backward()
            losses.append(round(float(loss.detach()) * len(batch), 4))
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        model.eval()
    sft_s = time.perf_counter() - started
    log = []
    started = time.perf_counter()
    if args.grpo_steps:
        config = TrainConfig(steps=args.grpo_steps, group_size=4, prompts_per_step=2, learning_rate=args.lr,
                             max_new_tokens=96, seed=args.seed, checkpoint_every=10_000)
        trainer = GrpoTrainer(model, tokenizer, config, examples, task_reward, out.parent / "run")
        log = [{"step": r.step, "reward": round(r.mean_reward, 3), "kl": round(r.kl, 5)}
               for r in trainer.run(args.grpo_steps)]
    grpo_s = time.perf_counter() - started
    model.save_pretrained(str(out))
    return {"prompts_s": round(prompts_s, 1), "sft_s": round(sft_s, 1), "grpo_s": round(grpo_s, 1),
            "sft_losses": losses, "grpo": log, "examples": len(examples)}


def summarise(rows: list[dict]) -> dict:
    n = max(len(rows), 1)
    cands = [c for r in rows for c in r["candidates"]]
    return {
        "tasks": len(rows),
        **{key: round(sum(r[key] for r in rows) / n, 3) for key in ("solved", "chosen", "pass@1", "pass@k")},
        "reward": round(statistics.fmean(r["reward"] for r in rows), 3) if rows else 0.0,
        "checks": {check: round(sum(bool(c["checks"].get(check)) for c in cands) / max(len(cands), 1), 3)
                   for check in ("format", "applies", "parse", "lint", "tests")},
        "invalid_steps_per_task": round(sum(r["invalid_steps"] for r in rows) / n, 2),
        "episodes_without_candidates": sum(not r["candidates"] for r in rows),
        "seconds_per_task": round(sum(r["seconds"] for r in rows) / n, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--git-dir", type=Path)
    source.add_argument("--root", type=Path, help="a plain folder instead of a git directory")
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--tasks", type=int, default=24, help="tasks made in all (train and held out)")
    parser.add_argument("--per-file", type=int, default=4)
    parser.add_argument("--holdout", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-squid", action="store_true")
    parser.add_argument("--adapter", type=Path, help="a LoRA adapter to serve with (default: the base model)")
    parser.add_argument("--sft-steps", type=int, default=0, help="supervised steps (2 fixes each), then GRPO")
    parser.add_argument("--grpo-steps", type=int, default=0)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--without-fallback", action="store_true",
                        help="also run the base model with agent.edit_fallback off")
    parser.add_argument("--no-copy-search", dest="copy_search", action="store_false",
                        help="agent.copy_search off (on by default, as in the product): the search text "
                             "of an edit block the model opens is not decoded as a copy of the file")
    parser.add_argument("--with-base", action="store_true", help="with --adapter: the base model too")
    parser.add_argument("--peer", action="store_true",
                        help="also the base model served by llama.cpp's server, through the OpenAI backend")
    parser.add_argument("--only-peer", action="store_true", help="the peer's episodes alone (implies --peer)")
    parser.add_argument("--keep-adapter", type=Path, help="save the trained adapter here")
    parser.add_argument("--tasks-json", type=Path, help="write the tasks made (train and held out) here")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from agent.backends import LocalBackend
    from context.config import AgentConfig, ModelConfig, SquidCacheConfig
    from context.runtime import get_runtime

    with tempfile.TemporaryDirectory(prefix="squid-bench-repair-") as tmp:
        root = checkout(args, Path(tmp))
        started = time.monotonic()
        tasks = repair_tasks(root, per_file=args.per_file, max_tasks=args.tasks, seed=args.seed)
        made_s = time.monotonic() - started
        train, held = split(tasks, args.holdout, args.seed)
        print(f"{len(tasks)} tasks in {made_s:.0f} s: train {len(train)} "
              f"({len({t.path for t in train})} files), held out {len(held)} "
              f"({', '.join(sorted({t.path for t in held}))})", flush=True)
        if args.tasks_json:
            args.tasks_json.write_text(json.dumps({"train": [t.to_json() for t in train],
                                                   "held_out": [t.to_json() for t in held]}, indent=1))
        runtime = get_runtime(ModelConfig(threads=args.threads))
        # (label, adapter, agent.edit_fallback): the product's settings, and the base model without
        # the fallback when asked (what the agent did before it).
        adapters = [("base", None, True)]
        if args.without_fallback:
            adapters.insert(0, ("base, no edit fallback", None, False))
        training = None
        if args.adapter:
            adapters = [*(adapters if args.with_base else []), ("adapter", args.adapter, True)]
        if args.sft_steps or args.grpo_steps:
            out = args.keep_adapter or Path(tmp) / "adapter" / "trained"
            training = train_adapter(args, train, root, out)
            shown = {k: v for k, v in training.items() if k != "sft_losses"}
            print(f"trained: {json.dumps(shown)}", flush=True)
            adapters.append(("trained", out, True))
        if args.only_peer:
            adapters = []
        results = {}
        if args.peer or args.only_peer:
            results["llama.cpp"] = run_peer(args, held, root, Path(tmp))
        for label, adapter, fallback in adapters:
            config = replace(AgentConfig(), k=args.k, memory=False, edit_fallback=fallback,
                             copy_search=args.copy_search)
            if adapter is not None:
                from context.adapters import apply_adapter

                apply_adapter(runtime, adapter, label)
            rows = []
            with RepairWorkspace(root) as scratch:
                for task in held:
                    backend = LocalBackend(runtime, squid=None if args.no_squid else SquidCacheConfig())
                    original = (root / task.path).read_text(encoding="utf-8")
                    row = run_episode(backend, config, task, root, original, scratch)
                    rows.append(row)
                    _print_row(label, task, row, args.k)
            results[label] = {"summary": summarise(rows), "tasks": rows}
            print(f"{label}: {json.dumps(results[label]['summary'])}", flush=True)
    summary = {label: r["summary"] for label, r in results.items()}
    summary.update(tasks_made_s=round(made_s, 1), k=args.k, squid=not args.no_squid, threads=args.threads,
                   copy_search=args.copy_search, adapter=str(args.adapter or ""),
                   machine=machine_info(), training=training, train_tasks=len(train), held_out=len(held),
                   held_out_files=sorted({t.path for t in held}))
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
