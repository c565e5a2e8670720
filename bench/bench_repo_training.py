"""Teaching the model its repository: GRPO on tasks made from its own code, against supervised LoRA.

    python bench/bench_repo_training.py                         # click, 1 seed, ~30 min on 2 cores
    python bench/bench_repo_training.py --packages click,jinja2 --seeds 0,1,2 --steps 40
    python bench/bench_repo_training.py --device cuda --configs grpo --steps 150 --eval-every 25  # a GPU
    python bench/bench_repo_training.py --git-dir /work/.mirror/pallets+click/repo --eval-path src/click \
        --eval-commits 40                                       # lines written after the training commit

A real third-party package installed in this venv is copied into a temporary git workspace and
indexed; `feedback.train.repo_tasks` makes its completion tasks there (a statement hidden where a
Squid reference, a definition from another file found through the index, defines a name it uses;
prompted as the server serves that cursor). Whole files are held out (`split_files`). Then, in one
run, on the held-out files' tasks (greedy, the trainer's sampling path, cut as the server cuts):

- base: the embedded model with its Squid references, and without them (`refs off`);
- grpo: the LoRA adapter after `--steps` GRPO steps on the training files' tasks (the trainer's
  `GrpoTrainer`, the reward `feedback.train.service.task_reward`: parses, edit similarity to the
  hidden code, 1 when exact), with and without its references;
- sft: a fresh LoRA adapter trained by cross-entropy on the hidden code of the same tasks, through
  the same composed references, for the same number of example passes as GRPO's prompts;
  with and without references;
- sft+grpo: supervised first, then GRPO on the same adapter (the order the issue suggests).

With `--git-dir` (a repository's history) the split is in time, not by file, as the issue prefers:
the workspace is the repository at a training commit (`--train-commit`, default: the one before
the last `--eval-commits` commits that touch `--eval-path`), every file of it trained on; the
held-out tasks are the statements those later commits added under `--eval-path`, each asked in its
file as the commit left it (the index brought up to the commit, so the references are what the
server would compose then), a statement that stood verbatim in the file before the commit (moved
code, nobody types it) left out. `needs_reference` marks the cross-file subset.

`--configs` picks the trained arms (default all three); the base is always evaluated.

Metrics of the first line of each answer against the hidden statement's first line (stripped): exact
match, edit similarity (`bench_completion.edit_similarity`), identifier exact match; and the mean
reward. Machine time of each training. Each seed trains afresh (its own shuffle and samples).
Results: bench/results/repo-training-DATE.json and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
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

import torch  # noqa: E402
from bench_completion import copy_package, edit_similarity, first_line, identifiers  # noqa: E402

CONFIGS = ("grpo", "sft", "sft+grpo")  # the trained arms; "base" is always evaluated


def _scores(answer: str, example) -> dict:
    got, want = first_line(answer, "next_line"), first_line(example.kept_text, "next_line")
    return {"exact": float(got == want), "es": edit_similarity(got, want),
            "id_em": float(identifiers(got) == identifiers(want))}


def without_references(example):
    return replace(example, served=replace(example.served, references=(), reference_tokens=0))


def evaluate(model, tokenizer, examples, max_new_tokens: int, adapter: bool) -> dict:
    """Greedy answers on `examples` (with the adapter, or the base model), scored."""
    from feedback.train.gate import evaluate as gate_evaluate
    from feedback.train.service import task_reward

    result = gate_evaluate(model, tokenizer, examples, task_reward, max_new_tokens, adapter=adapter)
    rows = [{"id": ex.id, "group": ex.group, "answer": out, "want": ex.kept_text, **_scores(out, ex)}
            for ex, out in zip(examples, result.outputs, strict=True)]
    return {"reward": result.mean_reward, "rows": rows, **_means(rows)}


def _means(rows: list[dict]) -> dict:
    return {k: statistics.fmean(r[k] for r in rows) if rows else 0.0 for k in ("exact", "es", "id_em")}


def both(model, tokenizer, held, max_new_tokens: int, adapter: bool, refs_off: bool = True) -> dict:
    """Scores with the references, and without them (None when `refs_off` is false)."""
    bare = [without_references(e) for e in held]
    return {"refs": evaluate(model, tokenizer, held, max_new_tokens, adapter),
            "refs_off": evaluate(model, tokenizer, bare, max_new_tokens, adapter) if refs_off else None}


def train_grpo(model, tokenizer, train, held, args, seed: int,
               run_dir: Path) -> tuple[float, list[dict], list[dict]]:
    from context.config import TrainConfig
    from feedback.train.service import task_reward
    from feedback.train.trainer import GrpoTrainer

    config = TrainConfig(steps=args.steps, group_size=args.group_size, prompts_per_step=args.prompts_per_step,
                         learning_rate=args.lr, max_new_tokens=args.max_new_tokens, seed=seed,
                         checkpoint_every=10_000, user_text_in_group=args.user_text_in_group)
    trainer = GrpoTrainer(model, tokenizer, config, train, task_reward, run_dir)
    started = time.perf_counter()
    curve, evaluating = [], [0.0]

    def on_step(record) -> None:
        # The held-out exact match along the way (with references): a curve that a time limit cannot
        # take away whole. Its time is not training time.
        if args.eval_every and record.step % args.eval_every == 0 and record.step < args.steps:
            began = time.perf_counter()
            point = evaluate(model, tokenizer, held, args.max_new_tokens, adapter=True)
            evaluating[0] += time.perf_counter() - began
            curve.append({"step": record.step, "exact": point["exact"], "es": point["es"],
                          "seconds": time.perf_counter() - started - evaluating[0]})
            print(f"    step {record.step}: held-out exact {point['exact']:.1%}, ES {point['es']:.3f} "
                  f"({curve[-1]['seconds']:.0f} s)", flush=True)

    history = trainer.run(args.steps, on_step=on_step)
    log = [{"step": r.step, "reward": r.mean_reward, "kl": r.kl} for r in history]
    return time.perf_counter() - started - evaluating[0], log, curve


def sft_group(model, tokenizer, example):
    """The hidden code as one 'sample' of the example's prompt (the tokens the server's answer would
    be: the healed whitespace, then the code, then a line break), after its composed references."""
    from feedback.train.policy import SampledGroup, completion_prompt, reference_prefix

    prompt, heal = completion_prompt(tokenizer, example)
    target = heal + example.kept_text[len(example.prompt_lead):] + "\n"
    ids = torch.tensor([tokenizer.encode(target, add_special_tokens=False)], dtype=torch.long)
    return SampledGroup(prompt, ids, torch.ones_like(ids), [target],
                        reference_prefix(model, tokenizer, example))


def train_sft(model, tokenizer, train, args, seed: int) -> tuple[float, list[float]]:
    import random

    from feedback.train.policy import group_logprobs
    from feedback.train.references import weights_changed

    passes = args.steps * args.prompts_per_step
    order = []
    rng = random.Random(seed)
    while len(order) < passes:
        block = list(range(len(train)))
        rng.shuffle(block)
        order += block
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.sft_lr, weight_decay=0.0)
    losses = []
    started = time.perf_counter()
    for start in range(0, passes, args.prompts_per_step):
        optimizer.zero_grad(set_to_none=True)
        model.train()
        for index in order[start:start + args.prompts_per_step]:
            group = sft_group(model, tokenizer, train[index])
            loss = -group_logprobs(model, group, 1.0).mean() / args.prompts_per_step
            loss.backward()
            losses.append(float(loss.detach()) * args.prompts_per_step)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        weights_changed(model)
        model.eval()
    return time.perf_counter() - started, losses


# -- a repository's history: train at one commit, ask for the lines written after it -------------

def fim_of(args):
    """The fill-in-the-middle format the tasks are prompted in (`--fim`, as `completion.fim`); None:
    the text before the cursor only."""
    from context.fim import resolve

    setting = getattr(args, "fim", "")
    return resolve(setting, ()) if setting else None


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout


def added_lines(root: Path, commit: str, path: str) -> set[int]:
    """The 0-based line numbers of `path` at `commit` that the commit added (against its first
    parent)."""
    diff = _git(root, "diff", "-U0", "--no-color", f"{commit}^1", commit, "--", path)
    added: set[int] = set()
    for start, count in re.findall(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", diff, re.M):
        first, n = int(start), 1 if count == "" else int(count)
        added.update(range(first - 1, first - 1 + n))
    return added


def history_tasks(args, root: Path, codec, index_path: Path):
    """(train, held, info): the workspace's tasks at the training commit, and the statements the
    later commits added under `args.eval_path`, asked as each commit left its file."""
    from context.config import CompletionConfig
    from context.index.indexer import Indexer
    from context.index.store import IndexStore
    from feedback.train.repo_tasks import repository_tasks, statement_positions, workspace_tasks

    subprocess.run(["git", "clone", "-q", "--no-checkout", str(args.git_dir), str(root)], check=True)
    head = _git(root, "rev-parse", "HEAD").strip()
    touching = _git(root, "rev-list", "--first-parent", head, "--", args.eval_path).split()
    if args.train_commit:
        base = _git(root, "rev-parse", args.train_commit).strip()
    else:
        base = _git(root, "rev-parse", f"{touching[args.eval_commits - 1]}^1").strip()
    later = _git(root, "rev-list", "--reverse", "--first-parent", f"{base}..{head}", "--",
                 args.eval_path).split()[: args.eval_commits]
    _git(root, "checkout", "-q", base)
    train = workspace_tasks([root], codec, index_path=index_path, per_file=args.per_file,
                            max_tasks=args.max_tasks, seed=0, require_reference=not args.all_statements,
                            fim=fim_of(args))
    store = IndexStore(index_path)
    held = []
    try:
        for commit in later:
            _git(root, "checkout", "-q", commit)
            Indexer([root], store, workers=0).index_all()
            changed = _git(root, "diff", "--name-only", f"{commit}^1", commit, "--", args.eval_path).split()
            for rel in changed:
                file = root / rel
                if not rel.endswith(".py") or not file.exists():
                    continue
                text = file.read_text(encoding="utf-8")
                added = added_lines(root, commit, rel)
                try:
                    before = _git(root, "show", f"{commit}^1:{rel}")
                except subprocess.CalledProcessError:
                    before = ""
                lines = text.splitlines(keepends=True)

                def written(text: str, added=added, lines=lines, before=before) -> list:
                    return [p for p in statement_positions(text, CompletionConfig().max_lines)
                            if set(range(p.start, p.end)) <= added
                            and "".join(lines[p.start:p.end]) not in before]

                held += repository_tasks([(str(file), text)], symbols=store.symbols_named, codec=codec,
                                         roots=[root], per_file=None, max_tasks=10_000,
                                         require_reference=False, positions_of=written, fim=fim_of(args),
                                         label=lambda path, c=commit, r=rel: f"{c[:8]}:{r}")
    finally:
        store.close()
    found = len(held)
    if len(held) > args.max_eval:
        keep = sorted(random.Random(0).sample(range(len(held)), args.max_eval))
        held = [held[i] for i in keep]  # in the order the commits wrote them
    info = {"git_dir": str(args.git_dir), "train_commit": base, "eval_commits": later,
            "written_statements": found,
            "needs_reference": sum(bool(t.verification.get("needs_reference")) for t in held)}
    print(f"history: trained at {base[:8]}, {len(later)} later commits under {args.eval_path} wrote "
          f"{found} statements; asking {len(held)} ({info['needs_reference']} a reference can help)",
          flush=True)
    return train, held, info


def run_package(package: str, args, seeds: list[int], work: Path) -> dict:
    from context.config import ModelConfig
    from context.prompt_record import TokenizerCodec
    from context.runtime import ModelRuntime
    from feedback.train.policy import attach_lora
    from feedback.train.repo_tasks import split_files, workspace_tasks

    runtime = ModelRuntime(ModelConfig(threads=args.threads, device=args.device, dtype=args.dtype)).load()
    tokenizer = runtime.tokenizer
    started = time.perf_counter()
    history = {}
    if args.git_dir:
        train, held, history = history_tasks(args, work / f"ws-{package}", TokenizerCodec(tokenizer),
                                             work / f"{package}.db")
        tasks = train + held
    else:
        root = work / f"ws-{package}"  # the package in root/package, committed
        copy_package(package, root)
        tasks = workspace_tasks([root], TokenizerCodec(tokenizer), index_path=work / f"{package}.db",
                                per_file=args.per_file, max_tasks=args.max_tasks, seed=0,
                                require_reference=not args.all_statements, fim=fim_of(args))
        train, held = split_files(tasks, args.holdout, seed=0)
    made_s = time.perf_counter() - started
    files = len({t.group for t in train}), len({t.group for t in held})
    print(f"{package}: {len(tasks)} tasks in {made_s:.0f} s; train {len(train)} ({files[0]} files), "
          f"held out {len(held)} ({files[1]} files)", flush=True)
    out = {"package": package, "tasks": len(tasks), "train": len(train), "held_out": len(held),
           "held_out_files": sorted({t.group for t in held}), "task_seconds": made_s, "seeds": {},
           **history}
    model = attach_lora(runtime.model, args.rank, args.alpha)
    model.eval()
    out["base"] = both(model, tokenizer, held, args.max_new_tokens, adapter=False,
                       refs_off=not args.without_refs_off)
    _say_row(package, "base", None, out["base"])
    initial = {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}
    for seed in seeds:
        runs = {}
        for kind in args.configs:
            model.load_state_dict(initial, strict=False)
            torch.manual_seed(seed)
            from feedback.train.references import weights_changed

            weights_changed(model)
            seconds, log = 0.0, {}
            if kind.startswith("sft"):
                took, log["sft"] = train_sft(model, tokenizer, train, args, seed)
                seconds += took
            if kind.endswith("grpo"):
                took, log["grpo"], log["curve"] = train_grpo(model, tokenizer, train, held, args, seed,
                                                             work / f"run-{package}-{seed}-{kind}")
                seconds += took
            result = both(model, tokenizer, held, args.max_new_tokens, adapter=True,
                          refs_off=not args.without_refs_off)
            result.update(seconds=seconds, log=log)
            runs[kind] = result
            _say_row(package, kind, seed, result)
        out["seeds"][str(seed)] = runs
    return out


def _say_row(package, kind, seed, result) -> None:
    on, off = result["refs"], result["refs_off"] or {"exact": float("nan"), "es": float("nan")}
    extra = f" ({result['seconds'] / 60:.1f} min)" if "seconds" in result else ""
    print(f"  {package} {kind}{'' if seed is None else f' seed {seed}'}{extra}: exact {on['exact']:.1%} "
          f"(refs off {off['exact']:.1%}), ES {on['es']:.3f} ({off['es']:.3f}), reward {on['reward']:.3f}",
          flush=True)


def markdown(results: list[dict]) -> str:
    lines = ["| package | config | seeds | exact (refs) | exact (refs off) | ES (refs) | ES (refs off) | "
             "ID-EM (refs) | train min |", "|---|---|---|---|---|---|---|---|---|"]
    for pkg in results:
        lines.append(_row(pkg["package"], "base", [pkg["base"]]))
        for kind in CONFIGS:
            runs = [runs[kind] for runs in pkg["seeds"].values() if kind in runs]
            if runs:
                lines.append(_row(pkg["package"], kind, runs))
    return "\n".join(lines)


def _row(package: str, kind: str, results: list[dict]) -> str:
    def cell(side: str, key: str, pct: bool) -> str:
        if any(r[side] is None for r in results):
            return "-"
        values = [r[side][key] for r in results]
        fmt = (lambda v: f"{100 * v:.1f}%") if pct else (lambda v: f"{v:.3f}")
        text = fmt(statistics.fmean(values))
        return text + (f" [{fmt(min(values))}, {fmt(max(values))}]" if len(values) > 1 else "")

    minutes = [r["seconds"] / 60 for r in results if "seconds" in r]
    cells = [package, kind, str(len(results)) if minutes else "-", cell("refs", "exact", True),
             cell("refs_off", "exact", True), cell("refs", "es", False), cell("refs_off", "es", False),
             cell("refs", "id_em", True), f"{statistics.fmean(minutes):.1f}" if minutes else "-"]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packages", default="click")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--sft-lr", type=float, default=2e-4)
    parser.add_argument("--user-text-in-group", action="store_true",
                        help="GRPO: the hidden code as its group's last sample when no sample shows it "
                        "(`train.user_text_in_group`, as the learning loop's measured plan trains)")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--per-file", type=int, default=8)
    parser.add_argument("--max-tasks", type=int, default=160)
    parser.add_argument("--holdout", type=float, default=0.3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", default="float32", help="model.dtype (float32: as the CPU runs train)")
    parser.add_argument("--eval-every", type=int, default=0,
                        help="also score the held-out tasks every N GRPO steps (printed as it goes)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="trained arms, comma-separated: "
                        + ", ".join(CONFIGS))
    parser.add_argument("--all-statements", action="store_true",
                        help="training tasks at every statement, not only where a reference defines a name")
    parser.add_argument("--git-dir", type=Path, default=None,
                        help="a repository's history: train at --train-commit, ask for later commits' lines")
    parser.add_argument("--train-commit", default=None)
    parser.add_argument("--eval-commits", type=int, default=40)
    parser.add_argument("--eval-path", default=".", help="where the later commits' statements are asked")
    parser.add_argument("--max-eval", type=int, default=60,
                        help="at most this many of the later statements (a seeded choice)")
    parser.add_argument("--without-refs-off", action="store_true",
                        help="score only with the references (half the evaluation time)")
    parser.add_argument("--fim", default="", help="prompt every task in this fill-in-the-middle format "
                        "(a `completion.fim` template with {prefix} and {suffix}): the text after the "
                        "cursor too")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    args.configs = [c for c in args.configs.split(",") if c]
    unknown = set(args.configs) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown --configs {sorted(unknown)}; choose from {', '.join(CONFIGS)}")
    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="squidcode-repo-training-") as tmp:
        packages = [args.git_dir.parent.name.split("+")[-1] if args.git_dir.name == "repo"
                    else args.git_dir.name] if args.git_dir else args.packages.split(",")
        for package in packages:
            results.append(run_package(package, args, seeds, Path(tmp)))
    table = markdown(results)
    print(table)
    out = args.out or REPO / "bench" / "results" / f"repo-training-{time.strftime('%Y-%m-%d-%H%M')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"argv": sys.argv, "args": {k: str(v) for k, v in vars(args).items()}, "cpu": platform.processor(),
            "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}
    out.write_text(json.dumps({"meta": meta, "results": results, "table": table}, indent=1))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
