"""GRPO step time on two data-parallel processes (torchrun, gloo) against one process, same batch.

Every configuration trains the same global batch per step: 2 prompts of the bundled task set, G = 4
completions of up to 64 tokens each at temperature 1.0, SmolLM2-135M-Instruct + LoRA (r 8), float32
on the CPU:

    one process, 1 thread     prompts_per_step 2
    one process, 2 threads    prompts_per_step 2
    two processes (torchrun)  prompts_per_step 1 each, 1 thread each, gradients all-reduced (gloo)

Each run is one warm-up step then `--steps` timed steps (the trainer's own step time, on process 0);
the configurations alternate for `--runs` rounds, so a noisy machine hits them alike. Step times
vary with how long the sampled answers run; the ratios are of medians over all timed steps.

    python bench/bench_grpo_distributed.py --steps 5 --runs 3 --json bench/results/grpo-distributed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CONFIGS = {
    "1 process, 1 thread": {"procs": 1, "threads": 1, "prompts": 2},
    "1 process, 2 threads": {"procs": 1, "threads": 2, "prompts": 2},
    "2 processes (torchrun), 1 thread each": {"procs": 2, "threads": 1, "prompts": 1},
}


def worker(steps: int, threads: int, prompts: int, out: Path) -> None:
    """One configuration's training (under torchrun when WORLD_SIZE > 1); process 0 writes `out`."""
    from dataclasses import replace

    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    from context.config import ModelConfig, TrainConfig, default_cache_dir
    from context.runtime import ModelRuntime
    from feedback.train.dataset import load_task_set
    from feedback.train.policy import attach_lora
    from feedback.train.service import BUNDLED_TASKS, task_reward
    from feedback.train.trainer import GrpoTrainer

    runtime = ModelRuntime(ModelConfig(threads=threads), default_cache_dir()).load()
    config = replace(TrainConfig(), group_size=4, prompts_per_step=prompts, max_new_tokens=64,
                     temperature=1.0, checkpoint_every=10**6)
    model = attach_lora(runtime.model, config.lora_rank, config.lora_alpha)
    run_dir = out.parent / f"run-{os.getpid()}"
    tasks = load_task_set(BUNDLED_TASKS)
    trainer = GrpoTrainer(model, runtime.tokenizer, config, tasks, task_reward, run_dir)
    trainer.train_step()  # warm-up
    records = [trainer.train_step() for _ in range(steps)]
    if trainer.rank == 0:
        out.write_text(json.dumps({"step_s": [r.seconds for r in records],
                                   "groups": [r.groups for r in records]}))


def run_config(name: str, steps: int, scratch: Path) -> dict:
    spec = CONFIGS[name]
    out = scratch / f"{len(list(scratch.iterdir()))}.json"
    args = ["--worker", "--steps", str(steps), "--threads", str(spec["threads"]), "--prompts",
            str(spec["prompts"]), "--out", str(out)]
    if spec["procs"] == 1:
        command = [sys.executable, __file__, *args]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(spec["procs"]),
                   "--master-port", str(29500 + os.getpid() % 1000), __file__, *args]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(spec["threads"])}
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env)
    if proc.returncode != 0 or not out.is_file():
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per run")
    parser.add_argument("--runs", type=int, default=3, help="rounds of all configurations, alternating")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--prompts", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.threads, args.prompts, args.out)
        return
    import tempfile

    sys.path.insert(0, str(REPO))
    from bench.bench_foundation import cpu_info

    scratch = Path(tempfile.mkdtemp(prefix="bench-grpo-dist-"))
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_info(),
               "load_before": os.getloadavg(), "steps": args.steps, "runs": args.runs, "configs": {}}
    for run in range(args.runs):
        for name in CONFIGS:
            result = run_config(name, args.steps, scratch)
            entry = results["configs"].setdefault(name, {"step_s": [], "run_medians": []})
            entry["step_s"] += result["step_s"]
            entry["run_medians"].append(statistics.median(result["step_s"]))
            assert set(result["groups"]) == {2}, result  # the same global batch in every configuration
            print(f"run {run + 1}: {name}: median step {entry['run_medians'][-1]:.2f} s", flush=True)
    results["load_after"] = os.getloadavg()
    for entry in results["configs"].values():
        entry["median_step_s"] = statistics.median(entry["step_s"])
    medians = {name: entry["median_step_s"] for name, entry in results["configs"].items()}
    two = medians["2 processes (torchrun), 1 thread each"]
    results["speedup_two_processes_over_one_thread"] = medians["1 process, 1 thread"] / two
    results["speedup_two_processes_over_two_threads"] = medians["1 process, 2 threads"] / two
    print(f"\n{results['cpu']}")
    for name, value in medians.items():
        spread = results["configs"][name]["run_medians"]
        print(f"{name:40s} median step {value:6.2f} s  (run medians {', '.join(f'{m:.2f}' for m in spread)})")
    for label, key in (("1 thread: ", "one_thread"), ("2 threads:", "two_threads")):
        print(f"2 processes against 1 process, {label} {results[f'speedup_two_processes_over_{key}']:.2f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
