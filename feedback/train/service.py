"""One training round end to end: load, build the data, train, evaluate, gate, promote.

Used by `squidcode train` (in the foreground) and by the background scheduler. A round resumes the
run in progress if there is one, otherwise starts from the promoted adapter (or a fresh one).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from context.config import ModelConfig, SquidConfig, TrainConfig
from context.errors import TrainingError
from feedback.preference import PreferenceFit, fit_preference
from feedback.rewards import RewardWeights, score_output

from .adapters import AdapterRef, AdapterRegistry
from .dataset import (
    EpisodeSource,
    TrainingExample,
    examples_from_source,
    load_task_set,
    reward_context,
    split_by_time,
)
from .status import TrainPaths, train_paths, write_status
from .store_source import NEXT_EDIT_SOURCE

if TYPE_CHECKING:
    from context.fim import FimFormat

    from .trainer import StepRecord

__all__ = [
    "BUNDLED_TASKS",
    "RoundResult",
    "episode_reward",
    "indexed_python",
    "load_training_data",
    "run_round",
    "task_reward",
    "training_inputs",
]

log = logging.getLogger(__name__)

BUNDLED_TASKS = Path(__file__).resolve().parent / "data" / "grpo_tasks.json"
MIN_EPISODES = 8  # below this the verifiable tasks are the training data


@dataclass(frozen=True)
class RoundResult:
    state: str  # "promoted" | "rejected" | "stopped" ("trained" on a data-parallel process other than 0)
    steps: int
    adapter: str | None
    message: str


def task_reward(text: str, example: TrainingExample) -> float:
    """The reward of a sample for a task (or an episode, without the user's preference): a repair
    task's by its checks and tests (`repair_tasks.repair_example_reward`), others by
    `feedback.rewards.score_output`."""
    if example.verification.get("source") == "repair":
        from .repair_tasks import repair_example_reward

        return repair_example_reward(text, example)
    if example.verification.get("source") == NEXT_EDIT_SOURCE:
        from context.next_edit_model import rewrite_reward

        return rewrite_reward(text, example.original, example.kept_text, example.reverted_text)
    return score_output(text, reward_context(example)).total


def episode_reward(fit: PreferenceFit | None, weight: float) -> Callable[[str, TrainingExample], float]:
    """The reward of a sample for a recorded episode: `task_reward`, plus the user's learned
    preference when one was fitted and predicts them (not for a task made from the repository's
    code: its answer is the code that stands there, whoever wrote it)."""
    if fit is None or fit.model is None or weight <= 0:
        return task_reward
    scorer, weights = fit.model.score, RewardWeights(preference=weight)

    def reward(text: str, example: TrainingExample) -> float:
        if is_repository_task(example) or example.verification.get("source") == NEXT_EDIT_SOURCE:
            # (the preference was fitted on completions and agent answers, not on rewritten regions)
            return task_reward(text, example)
        return score_output(text, reward_context(example, preference=scorer), weights).total

    return reward


def is_repository_task(example: TrainingExample) -> bool:
    """A task made from the workspace's code (`repo_tasks`, `repair_tasks`), not a recorded episode."""
    return example.verification.get("source") in ("repository", "repair")


def load_training_data(
    config: TrainConfig, source: EpisodeSource | None, repository: Sequence[TrainingExample] = ()
) -> tuple[list[TrainingExample], list[TrainingExample], list[TrainingExample]]:
    """(train, held_out, regression): episodes split by time; the task set's newest part is the
    fixed regression set, its older part trains while there are too few episodes. Tasks made from
    the repository's code (`repository`) are split by file: their held-out files join the held-out
    set (a new list, never the regression set itself)."""
    tasks = load_task_set(Path(config.task_set) if config.task_set else BUNDLED_TASKS)
    task_train, regression = split_by_time(tasks, max(config.holdout_fraction, 0.2))
    episodes = examples_from_source(source) if source is not None else []
    if len(episodes) >= MIN_EPISODES:
        train, held_out = split_by_time(episodes, config.holdout_fraction)
    else:
        train, held_out = task_train, regression
    if repository:
        from .repo_tasks import split_files

        repo_train, repo_held = split_files(list(repository), max(config.holdout_fraction, 0.2), config.seed)
        train, held_out = [*train, *repo_train], [*held_out, *repo_held]
    return train, held_out, regression


def _served_squid(config: SquidConfig):
    """The Squid settings tasks are prompted with: the server's, or none when it serves without
    references (asked for without them, wherever they are)."""
    return config.squid if config.squid.enabled else replace(config.squid, max_documents=0)


def repository_training_tasks(config: SquidConfig, tokenizer, roots: Sequence[Path]) -> list[TrainingExample]:
    """`train.repository_tasks` tasks from the workspace's code (none when it is 0), with the
    completion and Squid settings the server serves with."""
    if config.train.repository_tasks <= 0 or not roots:
        return []
    from context.prompt_record import TokenizerCodec

    from .repo_tasks import workspace_tasks

    squid = _served_squid(config)
    tasks = workspace_tasks(list(roots), TokenizerCodec(tokenizer), completion=config.completion, squid=squid,
                            max_tasks=config.train.repository_tasks, seed=config.train.seed,
                            require_reference=squid.max_documents > 0, fim=task_fim(config, tokenizer))
    log.info("repository tasks: %d from %s", len(tasks), ", ".join(map(str, roots)))
    return tasks


def task_fim(config: SquidConfig, tokenizer) -> FimFormat | None:
    """The fill-in-the-middle format the workspace's completion tasks are asked in (`train.fim`);
    None: the text before the cursor only."""
    from context.fim import special_tokens_of, taught

    return taught(config.train.fim, special_tokens_of(tokenizer))


def trained_fim(config: SquidConfig, tokenizer, repository: Sequence[TrainingExample],
                promoted: AdapterRef | None) -> str:
    """The format an adapter of this round answers in, for its meta.json ("" = none): the tasks'
    format when the round trained on the workspace's completion tasks, else the format of the
    adapter it continues (recorded episodes are asked as they were served)."""
    fmt = task_fim(config, tokenizer)
    if fmt is not None and any(ex.served is not None and ex.served.fim for ex in repository):
        return fmt.template if fmt.name == "template" else fmt.name
    return str((promoted.meta if promoted else {}).get("fim") or "")


def training_inputs(config: SquidConfig, source: EpisodeSource | None = None,
                    roots: Sequence[Path] | None = None) -> str:
    """A digest of what a round would train on: the training settings, the recorded episodes with
    their outcomes (`source`, by default the local feedback store) and, with
    `train.repository_tasks` or `train.repair_tasks`, the workspace's Python files as its index
    has them (brought up to date here: after the server's first pass that only checks them). The
    background scheduler starts a round only when it differs from the last finished round's."""
    digest = hashlib.sha256(json.dumps(asdict(config.train), sort_keys=True, default=str).encode())
    if source is None:
        from feedback.store import default_db_path

        from .store_source import FeedbackStoreSource

        source = FeedbackStoreSource(default_db_path(config.feedback))
    for ex in examples_from_source(source):
        digest.update(json.dumps([ex.id, ex.kept_text, ex.reverted, ex.reverted_text]).encode())
    roots = [Path.cwd()] if roots is None else roots
    if (config.train.repository_tasks > 0 or config.train.repair_tasks > 0) and roots:
        for path, content_hash in indexed_python(roots).items():
            digest.update(f"\0{path}\0{content_hash}".encode())
    return digest.hexdigest()


def indexed_python(roots: Sequence[Path]) -> dict[str, str]:
    """The workspace's Python files as its index has them ({path: content hash}, in the index's
    order), the index brought up to date first (after the server's first pass that only checks)."""
    from context.index.indexer import Indexer, default_index_path
    from context.index.store import IndexStore

    absolute = [Path(r).absolute() for r in roots]
    store = IndexStore(default_index_path(absolute))
    try:
        Indexer(absolute, store, workers=0).index_all()
        return {row.path: row.content_hash for row in store.all_files() if row.language == "python"}
    finally:
        store.close()


def repair_training_tasks(config: SquidConfig, runtime, roots: Sequence[Path],
                          cache: Path | None = None) -> list[TrainingExample]:
    """`train.repair_tasks` repair tasks for the agent from the first workspace root (none when it
    is 0 or its tests do not pass), prompted as the agent prompts them; the tasks kept in `cache`
    while the workspace's Python files stay the same."""
    if config.train.repair_tasks <= 0 or not roots:
        return []
    from .repair_tasks import cached_repair_tasks, repair_examples, repair_tasks

    root = Path(roots[0])
    options = {"max_tasks": config.train.repair_tasks, "seed": config.train.seed,
               "timeout_s": config.agent.test_timeout_s}
    if cache is not None:
        tasks = cached_repair_tasks(root, cache, **options)
    else:
        tasks = repair_tasks(root, **options)
    examples = repair_examples(tasks, root, runtime, replace(config.agent, memory=False))
    log.info("repair tasks: %d from %s", len(examples), root)
    return examples


def _load_model(config: SquidConfig):
    from context.runtime import ModelRuntime

    model_config = ModelConfig(path=config.model.path, device=config.train.device, dtype=config.model.dtype,
                               threads=config.train.threads, cache_dir=config.model.cache_dir)
    return ModelRuntime(model_config, config.resolved_cache_dir()).load()


def run_round(
    config: SquidConfig, *, steps: int | None = None, source: EpisodeSource | None = None,
    should_stop: Callable[[], bool] = lambda: False, paths: TrainPaths | None = None,
    on_step: Callable[[StepRecord, int], None] | None = None, roots: Sequence[Path] | None = None,
) -> RoundResult:
    """Train `steps` steps (default train.steps) then gate; stopped early it keeps the checkpoint.

    Episodes come from `source`, by default the user's local feedback store (feedback.db_path).
    `on_step(record, target_step)` follows each step (on process 0 only), as the status file does.
    `roots`: the workspace whose code `train.repository_tasks` makes tasks of (default: the
    current directory, where the background trainer runs).
    """
    from .gate import decide_promotion
    from .policy import attach_lora
    from .trainer import GrpoTrainer

    cfg = config.train
    paths = paths or train_paths(config)
    registry = AdapterRegistry(paths.adapters)
    write_status(paths.status, "loading", adapter=registry.current_id())
    if source is None:
        from feedback.store import default_db_path

        from .store_source import FeedbackStoreSource

        source = FeedbackStoreSource(default_db_path(config.feedback))
    runtime = _load_model(config)
    roots = [Path.cwd()] if roots is None else roots
    repository = [*repository_training_tasks(config, runtime.tokenizer, roots),
                  *repair_training_tasks(config, runtime, roots, paths.root / "repair_tasks.json")]
    train, held_out, regression = load_training_data(cfg, source, repository)
    if not train:
        raise TrainingError("no training examples: record some episodes or configure train.task_set")
    regression_ids = {ex.id for ex in regression}
    from_episodes = any(ex.id not in regression_ids and not is_repository_task(ex) for ex in held_out)
    # The preference is fitted on the training split only: the gate's held-out episodes stay unseen.
    fit = fit_preference(train) if from_episodes and cfg.preference_weight > 0 else None
    if fit is not None:
        log.info("preference: %s", fit.reason)
    reward_fn = episode_reward(fit, cfg.preference_weight)
    promoted = registry.current()
    model = attach_lora(runtime.model, cfg.lora_rank, cfg.lora_alpha,
                        adapter_path=str(promoted.path) if promoted else None, seed=cfg.seed)
    trainer = GrpoTrainer(model, runtime.tokenizer, cfg, train, reward_fn, paths.run_dir)
    resumed = trainer.resume()
    target = (trainer.step_count if resumed else 0) + (steps or cfg.steps)
    log.info("training (%s) to step %d on %d examples", "resumed" if resumed else "new", target, len(train))

    def report_step(record) -> None:
        if trainer.rank != 0:
            return
        history = [asdict(r) for r in trainer.history[-50:]]
        write_status(paths.status, "training", step=record.step, steps=target, reward=record.mean_reward,
                     kl=record.kl, adapter=registry.current_id(), history=history)
        if on_step is not None:
            on_step(record, target)

    trainer.run(target, should_stop=should_stop, on_step=report_step)
    if trainer.rank != 0:
        # Process 0 evaluates, gates and promotes; the others only trained alongside it.
        return RoundResult("trained", trainer.step_count, registry.current_id(), "data-parallel worker")
    if trainer.step_count < target:
        message = f"stopped at step {trainer.step_count} of {target}; the next run resumes from here"
        write_status(paths.status, "stopped", step=trainer.step_count, steps=target,
                     adapter=registry.current_id(), message=message)
        return RoundResult("stopped", trainer.step_count, registry.current_id(), message)
    write_status(paths.status, "evaluating", step=trainer.step_count, steps=target,
                 adapter=registry.current_id())
    preference = fit.model.score if fit is not None and fit.model is not None else None
    spots = gate_spots(config, runtime.tokenizer, roots, [*train, *held_out]) if preference else []
    decision, metrics = _gate(model, runtime.tokenizer, cfg, held_out, regression, promoted, decide_promotion,
                              reward_fn, preference=preference, spots=spots)
    # Too few recorded episodes: the task set trained, and its regression part was the held-out set.
    metrics["data"] = {"source": "episodes" if from_episodes else "task set", "train": len(train),
                       "held_out": len(held_out), "regression": len(regression),
                       "repository": {"train": sum(map(is_repository_task, train)),
                                      "held_out": sum(map(is_repository_task, held_out))}}
    if fit is not None:
        metrics["preference"] = fit.summary()
    # (`skipped`: groups whose samples all scored alike, which teach nothing; `user_texts`: groups
    # with the text the user wrote as a sample.)
    metrics["steps"] = [{"step": r.step, "reward": round(r.mean_reward, 4), "kl": round(r.kl, 5),
                         "seconds": round(r.seconds, 2), "groups": r.groups, "skipped": r.skipped_groups,
                         "user_texts": r.user_texts}
                        for r in trainer.history]
    # The format the adapter answers in, which the server serves it with (`context.adapters`).
    metrics["fim"] = trained_fim(config, runtime.tokenizer, repository, promoted)
    result = _finish(registry, model, paths, decision, metrics, trainer.step_count)
    write_status(paths.status, result.state, step=result.steps, steps=target, adapter=registry.current_id(),
                 message=result.message, metrics=metrics)
    return result


def gate_spots(config: SquidConfig, tokenizer, roots: Sequence[Path],
               examples: Sequence[TrainingExample]) -> list[TrainingExample]:
    """Up to `train.gate_spots` spots for the gate, from the workspace's Python files that none of
    the recorded `examples` is about: a function's body or a statement hidden, the cursor where it
    starts, prompted as the server prompts there (its window, its Squid references). They have no
    outcome; the learned preference scores the answers there (`gate.keep_estimate`). They are spread
    over those files (`repository_tasks` with no cap per file): a small workspace still gets all of
    them, and a large one gets them from all over, not from its first files by name."""
    if config.train.gate_spots <= 0 or not roots:
        return []
    from pygls.uris import to_fs_path

    from context.prompt_record import TokenizerCodec

    from .gate import GATE_SPOT
    from .repo_tasks import body_positions, statement_positions, workspace_tasks

    worked = set()
    for ex in examples:
        if ex.group.startswith("file:") and not is_repository_task(ex):
            worked.add(str(Path(to_fs_path(ex.group.split("#", 1)[0]) or "").absolute()))
    squid = _served_squid(config)
    max_lines = config.completion.max_lines

    def positions(text: str):
        return body_positions(text) + statement_positions(text, max_lines)

    tasks = workspace_tasks(list(roots), TokenizerCodec(tokenizer), completion=config.completion, squid=squid,
                            max_tasks=config.train.gate_spots, seed=config.train.seed, per_file=None,
                            require_reference=False, positions_of=positions, fim=task_fim(config, tokenizer),
                            skip=lambda path: str(Path(path).absolute()) in worked)
    log.info("gate spots: %d in files no episode is about (%d files with episodes)", len(tasks), len(worked))
    return [replace(t, id=f"spot-{t.id}", verification={**t.verification, "source": GATE_SPOT})
            for t in tasks]


def _gate(model, tokenizer, cfg: TrainConfig, held_out, regression, promoted, decide, reward_fn, *,
          preference: Callable[[str], float] | None = None, spots: Sequence[TrainingExample] = ()):
    """Held-out episodes are scored as training scores them; the regression tasks by their tests
    and solutions alone (the user's preference is not what they check). With a learned
    `preference`, what the user would keep of the answers at the held-out episodes and at `spots`
    is estimated for both adapters (`gate.keep_estimate`) and decides."""
    from .gate import eval_metrics, evaluate, keep_estimate, keep_estimates

    def spot_keep(text: str, example: TrainingExample) -> float:
        return keep_estimate(text, example, preference)[0] or 0.0

    def on(examples, adapter=True, replaces=None):
        if examples is spots:  # scored by the preference alone; no KL: the episodes' say how far it moved
            return evaluate(model, tokenizer, examples, spot_keep, cfg.max_new_tokens, adapter=adapter,
                            kl=False)
        fn = task_reward if examples is regression else reward_fn
        return evaluate(model, tokenizer, examples, fn, cfg.max_new_tokens, adapter=adapter,
                        replaces=replaces)

    if promoted is None:
        candidate, candidate_reg, candidate_spots = on(held_out), on(regression), on(spots)
        baseline, baseline_reg = on(held_out, adapter=False), on(regression, adapter=False)
        baseline_spots = on(spots, adapter=False)
    else:
        # The adapter in use now is the one to beat: load it beside the candidate and compare (the
        # candidate's KL from it says how much the round changed).
        model.load_adapter(str(promoted.path), adapter_name="baseline")
        try:
            candidate, candidate_reg = on(held_out, replaces="baseline"), on(regression, replaces="baseline")
            candidate_spots = on(spots)
            model.set_adapter("baseline")
            baseline, baseline_reg, baseline_spots = on(held_out), on(regression), on(spots)
        finally:
            model.set_adapter("default")
            model.delete_adapter("baseline")
    keep = None
    if preference is not None:
        judged = [*held_out, *spots]
        keep = (keep_estimates([*candidate.outputs, *candidate_spots.outputs], judged, preference),
                keep_estimates([*baseline.outputs, *baseline_spots.outputs], judged, preference))
    decision = decide(candidate, baseline, candidate_reg, baseline_reg, tolerance=cfg.promote_tolerance,
                      max_kl=cfg.promote_max_kl, min_kl=cfg.promote_min_kl, keep=keep,
                      keep_margin=cfg.promote_keep_margin)
    metrics = {"held_out": eval_metrics(candidate), "held_out_baseline": eval_metrics(baseline),
               "regression": eval_metrics(candidate_reg), "regression_baseline": eval_metrics(baseline_reg),
               "reasons": list(decision.reasons)}
    if keep is not None:
        from .gate import keep_gain

        gain, se, compared = keep_gain(*keep)
        metrics["keep"] = {"candidate": round(keep[0].mean, 4), "baseline": round(keep[1].mean, 4),
                           "gain": round(gain, 4), "se": round(se, 4) if se != float("inf") else None,
                           "compared": compared, "spots": len(spots), "episodes": len(held_out),
                           "candidate_kinds": keep[0].counts(), "baseline_kinds": keep[1].counts()}
    return decision, metrics


def _finish(
    registry: AdapterRegistry, model, paths: TrainPaths, decision, metrics, steps: int
) -> RoundResult:
    ref = registry.add_version(lambda d: model.save_pretrained(str(d)),
                               {"steps": steps, "promoted": decision.promote, **metrics})
    # The round is over either way: the next one starts from the promoted adapter.
    shutil.rmtree(paths.run_dir, ignore_errors=True)
    if decision.promote:
        registry.promote(ref.id)
        return RoundResult("promoted", steps, ref.id, f"promoted {ref.id}: {decision.reasons[0]}")
    return RoundResult("rejected", steps, registry.current_id(),
                       f"kept {registry.current_id() or 'the base model'}; {ref.id} rejected: "
                       + "; ".join(decision.reasons))
