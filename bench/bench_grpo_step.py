"""Step time and peak memory of one GRPO step: squidcode's trainer against TRL's GRPOTrainer.

Same settings on both sides: SmolLM2-135M-Instruct + LoRA (r 8, alpha 16, the same target
modules), G = 4 completions of up to 64 tokens at temperature 1.0, one prompt per step, beta 0.04,
dapo loss, AdamW lr 1e-4, float32 on the CPU, one torch thread. Each side runs in its own process
(so peak memory is its own): one warm-up step, then `--steps` timed steps, on the same prompts of
the bundled task set. Peak memory is the peak resident set size during the timed steps minus the
resident size after the model is loaded, sampled every 10 ms.

    python bench/bench_grpo_step.py --steps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """The highest resident set size seen while running, sampled by a thread."""

    def __init__(self) -> None:
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _setup():
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    from context.config import ModelConfig, default_cache_dir
    from context.runtime import ModelRuntime
    from feedback.train.dataset import load_task_set
    from feedback.train.service import BUNDLED_TASKS

    runtime = ModelRuntime(ModelConfig(threads=1), default_cache_dir())
    model_dir = runtime._model_dir()
    return model_dir, load_task_set(BUNDLED_TASKS)


def run_ours(steps: int) -> dict:
    from dataclasses import replace

    from context.config import TrainConfig
    from context.runtime import ModelRuntime
    from feedback.train.policy import attach_lora
    from feedback.train.service import task_reward
    from feedback.train.trainer import GrpoTrainer

    model_dir, tasks = _setup()
    from context.config import ModelConfig

    runtime = ModelRuntime(ModelConfig(path=str(model_dir), threads=1)).load()
    config = replace(TrainConfig(), group_size=4, prompts_per_step=1, max_new_tokens=64, temperature=1.0,
                     learning_rate=1e-4, beta=0.04, loss_type="dapo", checkpoint_every=10**6)
    model = attach_lora(runtime.model, config.lora_rank, config.lora_alpha)
    trainer = GrpoTrainer(model, runtime.tokenizer, config, tasks, task_reward, Path("/tmp/bench-grpo-ours"))
    trainer.train_step()  # warm-up
    base = rss_bytes()
    times = []
    with PeakRss() as peak:
        for _ in range(steps):
            started = time.perf_counter()
            record = trainer.train_step()
            times.append(time.perf_counter() - started)
            print("ours", record, flush=True)
    return {"step_s": times, "peak_rss_delta_mb": (peak.peak - base) / 2**20}


def run_trl(steps: int) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from feedback.train.dataset import prompt_messages
    from feedback.train.policy import LORA_TARGETS
    from feedback.train.service import task_reward

    model_dir, tasks = _setup()
    by_id = {t.id: t for t in tasks}
    data = Dataset.from_dict(
        {"prompt": [prompt_messages(t) for t in tasks], "task_id": [t.id for t in tasks]}
    )

    def reward(completions, task_id, **kwargs):
        return [task_reward(c[0]["content"], by_id[i]) for c, i in zip(completions, task_id, strict=True)]

    times: list[float] = []
    marks = {"base": 0, "peak": None}

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 1:  # the first step is the warm-up
                marks["base"] = rss_bytes()
                marks["peak"] = PeakRss().__enter__()
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step > 1:
                times.append(time.perf_counter() - self.started)
                print("trl step", state.global_step, times[-1], flush=True)

    args = GRPOConfig(
        output_dir="/tmp/bench-grpo-trl", num_generations=4, per_device_train_batch_size=4,
        gradient_accumulation_steps=1, max_completion_length=64, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=1e-4, beta=0.04, loss_type="dapo", max_steps=steps + 1, use_cpu=True, bf16=False,
        report_to=[], logging_steps=1, save_strategy="no", dataloader_num_workers=0, seed=0,
        gradient_checkpointing=False,
    )
    peft_config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=list(LORA_TARGETS),
                             task_type="CAUSAL_LM")
    from context.config import ModelConfig
    from context.runtime import ModelRuntime

    # An instance, as on our side: the converted config names no architecture for TRL to load by.
    runtime = ModelRuntime(ModelConfig(path=str(model_dir), threads=1)).load()
    trainer = GRPOTrainer(model=runtime.model, reward_funcs=reward, args=args, train_dataset=data,
                          processing_class=runtime.tokenizer, peft_config=peft_config, callbacks=[Timer()])
    trainer.train()
    peak = marks["peak"]
    peak.__exit__(None, None, None)
    return {"step_s": times, "peak_rss_delta_mb": (peak.peak - marks["base"]) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--side", choices=["ours", "trl"])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "grpo-step.json")
    args = parser.parse_args()
    if args.side:
        result = (run_ours if args.side == "ours" else run_trl)(args.steps)
        print("RESULT " + json.dumps(result), flush=True)
        return
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_before": os.getloadavg()}
    for side in ("trl", "ours"):  # TRL first: a setup problem there shows before the long half
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.run([sys.executable, __file__, "--side", side, "--steps", str(args.steps)],
                              capture_output=True, text=True, cwd=REPO, env=env)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"{side} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        result = json.loads(line[len("RESULT "):])
        result["median_step_s"] = statistics.median(result["step_s"])
        results[side] = result
        results[f"load_after_{side}"] = os.getloadavg()
    results["trl_over_ours_step_time"] = results["trl"]["median_step_s"] / results["ours"]["median_step_s"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
