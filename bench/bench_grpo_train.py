"""Does GRPO raise the embedded model's reward on the verifiable task set within a CPU budget?

Trains a LoRA adapter on SmolLM2-135M-Instruct with the bundled tasks (complete a function so its
tests pass; split by time into train and held-out), one torch thread at low priority, for at most
`--minutes` in total including the held-out evaluations before and after. Writes the per-step
reward and KL to JSON and both curves to a PNG.

    python bench/bench_grpo_train.py --minutes 30
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from context.config import ModelConfig, TrainConfig, default_cache_dir
from context.runtime import ModelRuntime
from feedback.rewards import score_output
from feedback.train.dataset import load_task_set, reward_context, split_by_time
from feedback.train.gate import evaluate
from feedback.train.policy import attach_lora
from feedback.train.trainer import GrpoTrainer

TASKS = Path(__file__).resolve().parent.parent / "feedback" / "train" / "data" / "grpo_tasks.json"


def reward(text, example) -> float:
    return score_output(text, reward_context(example)).total


def plot(history: list[dict], path: Path, before: float, after: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax1.plot(steps, [h["mean_reward"] for h in history], ".", alpha=0.4, label="group mean reward")
    window = 8
    smooth = [sum(h["mean_reward"] for h in history[max(0, i - window + 1): i + 1]) / len(
        history[max(0, i - window + 1): i + 1]) for i in range(len(history))]
    ax1.plot(steps, smooth, "-", label=f"running mean ({window} steps)")
    ax1.axhline(before, color="grey", ls="--", label=f"held-out before {before:.3f}")
    ax1.axhline(after, color="green", ls="--", label=f"held-out after {after:.3f}")
    ax1.set_xlabel("step")
    ax1.set_ylabel("reward")
    ax1.legend(fontsize=7)
    ax2.plot(steps, [h["kl"] for h in history], "-")
    ax2.set_xlabel("step")
    ax2.set_ylabel("k3 KL to base (per token)")
    fig.suptitle("GRPO on SmolLM2-135M-Instruct + LoRA, CPU, 1 thread, low priority")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--updates", type=int, default=1, help="optimizer steps per sampled batch")
    parser.add_argument("--train-tasks", type=int, default=0,
                        help="train on only the N oldest training tasks, cycled (0: all of them)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/grpo-train.json"))
    args = parser.parse_args()
    started = time.monotonic()
    deadline = started + args.minutes * 60
    os.nice(10)
    torch.set_num_threads(1)
    config = replace(TrainConfig(), learning_rate=args.lr, prompts_per_step=1, group_size=4,
                     max_new_tokens=64, temperature=args.temperature, updates_per_batch=args.updates,
                     checkpoint_every=10, holdout_fraction=0.25)
    runtime = ModelRuntime(ModelConfig(threads=1), default_cache_dir()).load()
    model = attach_lora(runtime.model, config.lora_rank, config.lora_alpha)
    train, held_out = split_by_time(load_task_set(TASKS), config.holdout_fraction)
    if args.train_tasks:
        train = train[: args.train_tasks]
    eval_started = time.monotonic()
    before = evaluate(model, runtime.tokenizer, held_out, reward, config.max_new_tokens)
    eval_s = time.monotonic() - eval_started
    print(f"held-out before: {before}  ({eval_s:.0f}s)", flush=True)
    run_dir = Path(tempfile.mkdtemp(prefix="squid-grpo-bench-"))  # checkpoints: not results
    trainer = GrpoTrainer(model, runtime.tokenizer, config, train, reward, run_dir)
    # Leave room for the final evaluation (plus a margin for a slow last step).
    stop_at = deadline - eval_s * 1.3 - 90
    trainer.run(10_000, should_stop=lambda: time.monotonic() > stop_at,
                on_step=lambda r: print(r, flush=True))
    after = evaluate(model, runtime.tokenizer, held_out, reward, config.max_new_tokens)
    print(f"held-out after: {after}", flush=True)
    history = [asdict(r) for r in trainer.history]
    third = max(1, len(history) // 3)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average": os.getloadavg(),
        "minutes": (time.monotonic() - started) / 60,
        "config": asdict(config),
        "train_examples": len(train), "held_out_examples": len(held_out),
        "held_out_before": asdict(before), "held_out_after": asdict(after),
        "train_reward_first_third": sum(h["mean_reward"] for h in history[:third]) / third,
        "train_reward_last_third": sum(h["mean_reward"] for h in history[-third:]) / third,
        "steps": len(history), "history": history,
    }
    if args.train_tasks:
        # Each pass over the cycled tasks scores the same prompts: comparable from pass to pass.
        n = args.train_tasks
        result["train_reward_per_pass"] = [
            sum(h["mean_reward"] for h in history[i: i + n]) / n for i in range(0, len(history) - n + 1, n)
        ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    plot(history, args.out.with_suffix(".png"), before.mean_reward, after.mean_reward)
    print(json.dumps({k: v for k, v in result.items() if k != "history"}, indent=1))


if __name__ == "__main__":
    main()
