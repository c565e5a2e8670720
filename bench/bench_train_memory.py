"""Peak memory and step time of the trainer at the learning loop's settings, phase by phase.

The learning loop (`bench/learning_loop.py --full`) trains with the product's settings plus its own:
G = 4 samples of up to 32 tokens for 2 prompts a step, lr 2e-4, one torch thread per core, prompts
of 256 tokens before the cursor, and Squid on as the product ships it (up to 4 reference documents
of up to 512 tokens, composed as prefilled caches before the prompt). This runs the same trainer on
the same kind of examples without the editor: completion tasks made from the loop's training modules
(`feedback.train.repo_tasks`, the references the server would compose there), one warm-up step,
`--steps` timed steps, then the promotion gate's evaluation of a few held-out tasks. Each side runs
in a fresh process; its peak is VmHWM (the kernel's exact high-water mark of the resident set).

The breakdown: VmHWM is reset (`/proc/self/clear_refs`) at each phase's start and end, so each
phase's peak is its own (a phase inside another, composing references inside sampling, counts in
both). Phases: sample (generate the group, its references composed by the adapter's weights),
compose, reference (the KL term's log-probs, adapter off), forward (policy log-probs and loss),
backward, optimizer, gate.

Sides: `ours` (the trainer of this tree), `before` (the trainer as at `--before`, a git revision,
extracted to a temporary folder and imported from there), and `trl` (TRL's GRPOTrainer at the same
settings, each prompt given as the reference documents' text followed by the prompt text: the same
tokens in, no composition).

    nice -n 5 python bench/bench_train_memory.py --steps 3 --before bcecfb1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
if os.environ.get("SQUIDCODE_BENCH_SOURCE"):  # the "before" side: squidcode as at another commit
    sys.path.insert(0, os.environ["SQUIDCODE_BENCH_SOURCE"])

SIDES = ("ours", "before", "trl")
ADDRESS_SPACE_GIB = 16
GATE_EXAMPLES = 4


# -- memory ------------------------------------------------------------------------------------


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # resets VmHWM to the current RSS


class Phases:
    """Per-phase peak RSS (MiB) and seconds, through VmHWM resets; phases may nest."""

    def __init__(self) -> None:
        self.peak_mb: dict[str, float] = defaultdict(float)
        self.seconds: dict[str, float] = defaultdict(float)
        self.stack: list[str] = []
        self.overall_mb = 0.0

    def _fold(self) -> None:
        peak = _status_kib("VmHWM") / 1024
        self.overall_mb = max(self.overall_mb, peak)
        for name in self.stack:
            self.peak_mb[name] = max(self.peak_mb[name], peak)
        _reset_peak()

    def wrap(self, name: str, fn):
        def wrapped(*args, **kwargs):
            self._fold()
            self.stack.append(name)
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - started
                self._fold()
                self.stack.pop()

        return wrapped

    def finish(self) -> float:
        self._fold()
        return self.overall_mb


# -- the loop's settings ------------------------------------------------------------------------


def loop_config(threads: int, train_settings: tuple[str, ...] = ()):
    """`TrainConfig` as `bench/learning_loop.py --full` writes it (`workspace_config`, FULL), with
    `threads` torch threads (the loop: one per core) and `train_settings`, TOML lines: the plan's own
    and `--train-setting`'s (`main` merges them; a side does not import the loop, which the `before`
    side would take from its own tree)."""
    import tomllib

    from context.config import TrainConfig

    return replace(TrainConfig(), steps=30, threads=threads, max_new_tokens=32, learning_rate=2e-4, seed=0,
                   checkpoint_every=10**6, **tomllib.loads("\n".join(train_settings)))


def loop_examples(tokenizer, workdir: Path, count: int, references: int):
    """Completion tasks from the learning loop's training modules, prompted as its server prompts
    (256 tokens before the cursor), each after `references` Squid reference documents of up to
    `document_tokens` tokens (the product's defaults allow 4 of 512: the most the loop's episodes
    can bring). The references are the other modules' opening lines (the loop's workspace has few
    cross-file definitions for `select_definitions` to find without its open buffers)."""
    from bench.simulated_user import TRAINING_MODULES, copy_modules
    from context.config import CompletionConfig, SquidCacheConfig
    from context.prompt_record import ReferenceIdentity, TokenizerCodec
    from context.squid.keys import token_hash
    from feedback.train.repo_tasks import workspace_tasks

    workspace = workdir / "workspace"
    files = sorted(copy_modules(workspace, TRAINING_MODULES))
    codec, squid = TokenizerCodec(tokenizer), SquidCacheConfig()
    completion = replace(CompletionConfig(), prefix_tokens=256)
    tasks = workspace_tasks([workspace], codec, index_path=workdir / "index.db", completion=completion,
                            squid=squid, max_tasks=count, seed=0, require_reference=False)
    documents = {path.name: _document(codec, path.read_text(), squid.document_tokens) for path in files}
    out = []
    for number, task in enumerate(tasks):
        others = [name for name in sorted(documents) if name != Path(task.group).name]
        names = [others[(number + k) % len(others)] for k in range(references)]
        identities = tuple(ReferenceIdentity(token_hash(documents[name][0]), name, len(documents[name][0]),
                                             documents[name][1]) for name in names)
        tokens = sum(r.tokens for r in identities)
        served = replace(task.served, references=identities, reference_tokens=tokens)
        out.append(replace(task, served=served))
    return out


def _document(codec, text: str, budget: int) -> tuple[list[int], str]:
    """The longest run of whole lines from the start of `text` within `budget` tokens: (ids, text)."""
    kept = []
    for line in text.splitlines(keepends=True):
        if len(codec.encode("".join(kept) + line)) > budget:
            break
        kept.append(line)
    body = "".join(kept)
    return codec.encode(body), body


def _load(threads: int):
    import torch

    from context.config import ModelConfig, default_cache_dir
    from context.runtime import ModelRuntime

    torch.manual_seed(0)
    return ModelRuntime(ModelConfig(threads=threads), default_cache_dir()).load()


# -- the sides ----------------------------------------------------------------------------------


def run_ours(steps: int, workdir: Path, threads: int, references: int,
             settings: tuple[str, ...] = ()) -> dict:
    import torch

    from feedback.train import gate
    from feedback.train import trainer as trainer_module
    from feedback.train.policy import attach_lora
    from feedback.train.references import ReferenceComposer
    from feedback.train.service import task_reward

    config = loop_config(threads, settings)
    runtime = _load(config.threads)
    loaded_mb = _status_kib("VmRSS") / 1024
    examples = loop_examples(runtime.tokenizer, workdir, 16 + GATE_EXAMPLES, references)
    train, held_out = examples[:-GATE_EXAMPLES], examples[-GATE_EXAMPLES:]
    phases = Phases()
    trainer_module.sample_example = phases.wrap("sample", trainer_module.sample_example)
    trainer_module.reference_logprobs = phases.wrap("reference", trainer_module.reference_logprobs)
    ReferenceComposer.compose = phases.wrap("compose", ReferenceComposer.compose)
    torch.Tensor.backward = phases.wrap("backward", torch.Tensor.backward)
    trainer_module.GrpoTrainer._group_loss = phases.wrap("forward", trainer_module.GrpoTrainer._group_loss)
    model = attach_lora(runtime.model, config.lora_rank, config.lora_alpha)
    trainer = trainer_module.GrpoTrainer(model, runtime.tokenizer, config, train, task_reward,
                                         workdir / "run")
    trainer.optimizer.step = phases.wrap("optimizer", trainer.optimizer.step)
    times, records = [], []
    for step in range(steps + 1):
        started = time.perf_counter()
        record = trainer.train_step()
        if step > 0:  # the first step is the warm-up
            times.append(time.perf_counter() - started)
        records.append({"reward": round(record.mean_reward, 4), "kl": round(record.kl, 6),
                        "loss": round(record.loss, 6), "skipped": record.skipped_groups})
        print("ours", record, flush=True)
    train_peak = phases.finish()
    evaluate = phases.wrap("gate", gate.evaluate)
    evaluate(model, runtime.tokenizer, held_out, task_reward, config.max_new_tokens)
    evaluate(model, runtime.tokenizer, held_out, task_reward, config.max_new_tokens, adapter=False)
    phases.finish()
    contexts = [ex.served.reference_tokens for ex in train]
    return {
        "step_s": times, "loaded_rss_mb": round(loaded_mb), "train_peak_rss_mb": round(train_peak),
        "peak_rss_mb": round(max(phases.overall_mb, train_peak)),
        "phase_peak_mb": {k: round(v) for k, v in phases.peak_mb.items()},
        "phase_s": {k: round(v, 1) for k, v in phases.seconds.items()},
        "records": records, "examples": len(train),
        "reference_tokens_median": statistics.median(contexts) if contexts else 0,
    }


def run_trl(steps: int, workdir: Path, threads: int, references: int,
            settings: tuple[str, ...] = ()) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from feedback.train.policy import LORA_TARGETS
    from feedback.train.service import task_reward

    config = loop_config(threads, settings)
    runtime = _load(config.threads)
    loaded_mb = _status_kib("VmRSS") / 1024
    examples = loop_examples(runtime.tokenizer, workdir, 16 + GATE_EXAMPLES, references)[:-GATE_EXAMPLES]
    by_id = {ex.id: ex for ex in examples}
    # The same tokens in: the reference documents' text, then the prompt, as one plain-text prompt.
    prompts = ["".join(ref.text for ref in ex.served.references) + ex.prompt_text + ex.prompt_lead
               for ex in examples]
    data = Dataset.from_dict({"prompt": prompts, "task_id": [ex.id for ex in examples]})

    def reward(completions, task_id, **kwargs):
        return [task_reward(by_id[i].prompt_lead + c, by_id[i])
                for c, i in zip(completions, task_id, strict=True)]

    times: list[float] = []
    marks: dict = {}

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 1:  # the first step is the warm-up
                _reset_peak()
                marks["reset"] = True
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step > 1:
                times.append(time.perf_counter() - self.started)
                print("trl step", state.global_step, times[-1], flush=True)

    args = GRPOConfig(
        output_dir=str(workdir / "trl"), num_generations=config.group_size,
        per_device_train_batch_size=config.group_size * config.prompts_per_step,
        gradient_accumulation_steps=1,
        max_completion_length=config.max_new_tokens, temperature=config.temperature, top_p=1.0, top_k=0,
        learning_rate=config.learning_rate, beta=config.beta, loss_type=config.loss_type,
        max_steps=steps + 1, use_cpu=True, bf16=False, report_to=[], logging_steps=1, save_strategy="no",
        dataloader_num_workers=0, seed=0, epsilon=config.epsilon_low, epsilon_high=config.epsilon_high,
        gradient_checkpointing=True,  # TRL's default, and the measure that fits its long prompts at all
    )
    peft_config = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                             target_modules=list(LORA_TARGETS), task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=runtime.model, reward_funcs=reward, args=args, train_dataset=data,
                          processing_class=runtime.tokenizer, peft_config=peft_config, callbacks=[Timer()])
    trainer.train()
    return {"step_s": times, "loaded_rss_mb": round(loaded_mb),
            "peak_rss_mb": round(_status_kib("VmHWM") / 1024),
            "prompt_chars_median": statistics.median(map(len, prompts))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch threads (the loop: one per core; on a busy machine 1 measures steadier)")
    parser.add_argument("--references", type=int, default=4,
                        help="Squid reference documents before each prompt (up to 512 tokens each)")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, of {', '.join(SIDES)}")
    parser.add_argument("--before", default="HEAD", help="the git revision the `before` side runs")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--train-setting", action="append", default=[], metavar="KEY=VALUE",
                        help="another [train] setting (`group_size=8`), as bench/learning_loop.py takes it")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "train-memory.json")
    args = parser.parse_args()
    if not args.side:  # here, where importing the loop cannot shadow the `before` side's modules
        from bench.learning_loop import FULL, merged_settings, train_setting

        try:
            given = [train_setting(text) for text in args.train_setting]
        except argparse.ArgumentTypeError as exc:
            parser.error(str(exc))
        args.train_setting = list(merged_settings(FULL.train_settings, given))
    if args.side:
        # A side that runs away fails with an allocation error instead of taking the machine's memory.
        limit = ADDRESS_SPACE_GIB * 2**30
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        with tempfile.TemporaryDirectory(prefix="squidcode-train-memory-") as tmp:
            run = run_trl if args.side == "trl" else run_ours  # `before` is `ours` on other sources
            result = run(args.steps, Path(tmp), args.threads, args.references, tuple(args.train_setting))
        print("RESULT " + json.dumps(result), flush=True)
        return
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "load_before": os.getloadavg(), "steps": args.steps, "threads": args.threads,
                     "references": args.references, "train_settings": args.train_setting}
    results["before_revision"] = subprocess.run(["git", "rev-parse", "--short", args.before], cwd=REPO,
                                                capture_output=True, text=True, check=True).stdout.strip()
    for side in args.sides.split(","):
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        if side == "before":
            source = Path(tempfile.mkdtemp(prefix="squidcode-before-"))
            archive = subprocess.run(["git", "archive", args.before], cwd=REPO, capture_output=True,
                                     check=True)
            subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
            env["SQUIDCODE_BENCH_SOURCE"] = str(source)
        proc = subprocess.run([sys.executable, __file__, "--side", side, "--steps", str(args.steps),
                               "--threads", str(args.threads), "--references", str(args.references),
                               *("--train-setting=" + "=".join(part.strip() for part in line.split("=", 1))
                                 for line in args.train_setting)],
                              capture_output=True, text=True, cwd=REPO, env=env)
        if side == "before":
            shutil.rmtree(source, ignore_errors=True)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"{side} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        result = json.loads(line[len("RESULT "):])
        result["median_step_s"] = round(statistics.median(result["step_s"]), 2)
        results[side] = result
        results[f"load_after_{side}"] = os.getloadavg()
        print(side, json.dumps(result), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
