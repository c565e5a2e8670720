"""The GRPO training loop: sample groups, score them, step the LoRA adapter, checkpoint.

The loop does not know which model it trains: it takes a peft-wrapped causal LM, a tokenizer, the
examples and a reward function. One optimizer step = `prompts_per_step` groups per process, each
group one micro-batch (gradient accumulation over groups). With torch.distributed initialised,
every process samples its own groups and the adapter gradients are averaged across processes
before the step (data parallel; launched by `torchrun`, tested on gloo with 2 CPU processes).

A checkpoint (adapter, optimizer, step, history, random state) is written atomically every
`checkpoint_every` steps and when the loop is stopped; `resume()` continues from it, so stopping
the trainer at any moment loses at most the step in progress.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from context.config import TrainConfig

from .dataset import TrainingExample
from .grpo import GrpoLossConfig, group_advantages, grpo_loss
from .heap import release_freed_heap
from .policy import (
    SampledGroup,
    example_prompt_ids,
    group_logprobs,
    guided_group,
    reference_logprobs,
    sample_example,
    user_text_group,
)
from .references import composer_for, release_memory, round_start, weights_changed

__all__ = ["GrpoTrainer", "RewardFn", "StepRecord"]

RewardFn = Callable[[str, TrainingExample], float]
CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class StepRecord:
    """What one optimizer step did (averaged over processes)."""

    step: int
    mean_reward: float
    kl: float
    loss: float
    clip_fraction: float
    skipped_groups: int
    groups: int
    seconds: float
    user_texts: int = 0  # groups whose last sample was the user's own text (`user_text_group`)


@dataclass
class _ScoredGroup:
    group: SampledGroup
    rewards: torch.Tensor  # [G]
    user_text: bool = False  # the last sample is what the user wrote (`user_text_group`)
    ref_logps: torch.Tensor | None = None  # [G, C]
    old_logps: torch.Tensor | None = None  # [G, C]


class GrpoTrainer:
    """GRPO on a peft model; see the module docstring."""

    def __init__(
        self, model, tokenizer, config: TrainConfig, examples: Sequence[TrainingExample],
        reward_fn: RewardFn, run_dir: Path,
    ):
        if not examples:
            raise ValueError("GRPO needs at least one training example")
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.examples = list(examples)
        self.reward_fn = reward_fn
        self.run_dir = Path(run_dir)
        self.loss_config = GrpoLossConfig(
            beta=config.beta, epsilon_low=config.epsilon_low, epsilon_high=config.epsilon_high,
            loss_type=config.loss_type, max_completion_length=config.max_new_tokens,
        )
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.trainable, lr=config.learning_rate, weight_decay=0.0)
        self.step_count = 0
        self.history: list[StepRecord] = []
        self.rank, self.world_size = _dist_rank_world()
        self._broadcast_weights()
        self._prompt_cache: dict[str, torch.Tensor] = {}
        # Completions served after Squid reference documents are trained after them (composed by
        # `feedback.train.references`); the base model's document caches are kept in the run folder.
        composer_for(model, tokenizer, self.run_dir / "squid", per_round=config.reference_weights == "round")

    # -- one step ------------------------------------------------------------------------------

    def batch_examples(self, step: int) -> list[tuple[int, TrainingExample]]:
        """(global slot, example) pairs this process trains on at `step`: a seeded shuffle per
        epoch, sharded by rank, so N processes see what one process with N times the batch would."""
        per_rank = self.config.prompts_per_step
        picked = []
        for slot in range(self.rank * per_rank, (self.rank + 1) * per_rank):
            index = step * per_rank * self.world_size + slot
            epoch, offset = divmod(index, len(self.examples))
            order = list(range(len(self.examples)))
            random.Random(self.config.seed * 7919 + epoch).shuffle(order)
            picked.append((slot, self.examples[order[offset]]))
        return picked

    def train_step(self) -> StepRecord:
        """Sample, score and take one optimizer step (or `updates_per_batch` of them)."""
        with round_start(self.model):  # the reference documents as the round's weights encode them
            return self._train_step()

    def _train_step(self) -> StepRecord:
        started = time.perf_counter()
        scored = [self._sample_and_score(ex, slot) for slot, ex in self.batch_examples(self.step_count)]
        rewards = torch.stack([s.rewards for s in scored])  # [groups, G]
        advantages, informative = group_advantages(rewards, self.config.scale_rewards)
        live = [i for i in range(len(scored)) if informative[i]]
        release_freed_heap()  # sampling's caches: gone before the loss's activations arrive
        self._prepare_logprobs([scored[i] for i in live])
        release_freed_heap()  # the reference pass's activations
        tokens = _all_reduce_sum(float(sum(scored[i].group.mask.sum() for i in live)))
        loss_total = kl_total = clip_total = 0.0
        # No informative group anywhere: no step at all (Adam's momentum would still move the weights).
        updates = self.config.updates_per_batch if _all_reduce_sum(float(len(live))) > 0 else 0
        self.model.train()
        for i in set(range(len(scored))) - set(live):
            scored[i].group.context = None  # no loss reads this group's composition
        for update in range(updates):
            # The loss reads the compositions made above (or composes again after an update):
            # the document caches they came from make room for the backward pass.
            release_memory(self.model)
            self.optimizer.zero_grad(set_to_none=True)
            for i in live:
                loss, stats = self._group_loss(scored[i], advantages[i], tokens)
                loss.backward()
                if update == updates - 1:
                    scored[i].group.context = None  # read for the last time: room for the next group's
                release_freed_heap()  # this group's activations, before the next group's
                loss_total += float(loss.detach())
                kl_total += stats.kl / len(live)
                clip_total += stats.clip_fraction / len(live)
            self._average_gradients()
            torch.nn.utils.clip_grad_norm_(self.trainable, 1.0)
            self.optimizer.step()
            weights_changed(self.model)  # Squid reference caches of the old weights are stale
        release_freed_heap()  # the backward pass's activations and gradients
        self.model.eval()
        self.step_count += 1
        updates = max(updates, 1)
        record = StepRecord(
            step=self.step_count,
            mean_reward=_all_reduce_mean(float(rewards.mean())),
            kl=_all_reduce_mean(kl_total / updates),
            loss=_all_reduce_mean(loss_total / updates),
            clip_fraction=_all_reduce_mean(clip_total / updates),
            skipped_groups=int(_all_reduce_sum(float(len(scored) - len(live)))),
            groups=len(scored) * self.world_size,
            seconds=time.perf_counter() - started,
            user_texts=int(_all_reduce_sum(float(sum(s.user_text for s in scored)))),
        )
        self.history.append(record)
        return record

    def _sample_and_score(self, example: TrainingExample, slot: int) -> _ScoredGroup:
        # Reproducible across a resume and across process counts: the seed names the step and slot.
        torch.manual_seed(self.config.seed * 1_000_003 + self.step_count * 4099 + slot)
        prompt = self._prompt_cache.get(example.id)
        if prompt is None:
            prompt = self._prompt_cache[example.id] = example_prompt_ids(self.tokenizer, example)
        self.model.eval()
        group = sample_example(self.model, self.tokenizer, example, prompt, self.config.group_size,
                               self.config.max_new_tokens, self.config.temperature)
        rewards = torch.tensor([self.reward_fn(text, example) for text in group.texts])
        guide = example.verification.get("guide")
        if guide and self.config.guide_flat_groups and bool((rewards == rewards[0]).all()):
            # Every sample earned the same: nothing to compare. A task with a known answer (a repair
            # task's fix) gets it as its last sample, so the group says what earns more.
            group = guided_group(self.tokenizer, example, group, guide)
            rewards[-1] = self.reward_fn(group.texts[-1], example)
        elif self.config.user_text_in_group:
            written = user_text_group(self.tokenizer, example, group, self.config.max_new_tokens)
            if written is not None:
                rewards[-1] = self.reward_fn(written.texts[-1], example)
                return _ScoredGroup(written, rewards, user_text=True)
        return _ScoredGroup(group, rewards)

    def _prepare_logprobs(self, scored: list[_ScoredGroup]) -> None:
        temperature = self.config.temperature
        for item in scored:
            if self.config.beta != 0.0:
                item.ref_logps = reference_logprobs(self.model, item.group, temperature)
            if self.config.updates_per_batch > 1:
                # Several updates on one batch: the ratio is against the sampling policy, fixed here.
                with torch.no_grad():
                    item.old_logps = group_logprobs(self.model, item.group, temperature)

    def _group_loss(self, item: _ScoredGroup, advantages: torch.Tensor, tokens: float):
        logps = group_logprobs(self.model, item.group, self.config.temperature)
        return grpo_loss(
            logps, item.old_logps, item.ref_logps, advantages, item.group.mask, self.loss_config,
            grad_accum=self.config.prompts_per_step, num_items_in_batch=tokens, world_size=self.world_size,
        )

    def _broadcast_weights(self) -> None:
        """Every process starts from process 0's trainable weights: averaged gradients keep the
        processes' copies equal only if they start equal (a fresh adapter drawn in each process,
        or an adapter file that changed between their reads, would not)."""
        if self.world_size == 1:
            return
        import torch.distributed as dist

        for param in self.trainable:
            dist.broadcast(param.data, src=0)

    def _average_gradients(self) -> None:
        if self.world_size == 1:
            return
        import torch.distributed as dist

        for param in self.trainable:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad /= self.world_size

    # -- the loop ------------------------------------------------------------------------------

    def run(
        self, steps: int, should_stop: Callable[[], bool] = lambda: False,
        on_step: Callable[[StepRecord], None] | None = None,
    ) -> list[StepRecord]:
        """Train until `steps` steps in total were taken or `should_stop()`; checkpoint on the way."""
        done: list[StepRecord] = []
        # Every process must take the same number of steps (they meet in all_reduce): one that is
        # told to stop stops them all.
        while self.step_count < steps and not _any_process(should_stop()):
            record = self.train_step()
            done.append(record)
            if on_step is not None:
                on_step(record)
            if self.step_count % self.config.checkpoint_every == 0:
                self.save_checkpoint()
        self.save_checkpoint()
        return done

    # -- checkpoints ---------------------------------------------------------------------------

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / CHECKPOINT

    def save_checkpoint(self) -> Path | None:
        """Write the adapter, optimizer and progress atomically (process 0 only)."""
        if self.rank != 0:
            return None
        tmp = self.run_dir / f".{CHECKPOINT}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.model.save_pretrained(str(tmp / "adapter"))
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        state = {"step": self.step_count, "history": [asdict(r) for r in self.history],
                 "config": asdict(self.config)}
        (tmp / "state.json").write_text(json.dumps(state, indent=1))
        old = self.run_dir / f".{CHECKPOINT}.old-{os.getpid()}"
        if self.checkpoint_dir.exists():
            os.replace(self.checkpoint_dir, old)
        os.replace(tmp, self.checkpoint_dir)
        shutil.rmtree(old, ignore_errors=True)
        return self.checkpoint_dir

    def resume(self) -> bool:
        """Continue from the checkpoint in `run_dir` if there is one; True when resumed."""
        state_path = self.checkpoint_dir / "state.json"
        if not state_path.is_file():
            return False
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        state = json.loads(state_path.read_text())
        weights = load_file(str(self.checkpoint_dir / "adapter" / "adapter_model.safetensors"))
        set_peft_model_state_dict(self.model, weights)
        weights_changed(self.model, restart=True)
        self.optimizer.load_state_dict(torch.load(self.checkpoint_dir / "optimizer.pt", weights_only=True))
        self.step_count = int(state["step"])
        self.history = [StepRecord(**r) for r in state["history"]]
        return True


def _dist_rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_reduce_sum(value: float) -> float:
    rank_world = _dist_rank_world()
    if rank_world[1] == 1:
        return value
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return float(tensor)


def _any_process(flag: bool) -> bool:
    return _all_reduce_sum(1.0 if flag else 0.0) > 0


def _all_reduce_mean(value: float) -> float:
    return _all_reduce_sum(value) / _dist_rank_world()[1]
