"""The background GRPO trainer: dataset, objective, loop, adapters and their promotion.

Modules: `dataset` (examples from episodes, the task set, the split by time), `grpo` (advantages and
the loss), `logprobs` (per-token log-probs), `policy` (LoRA, sampling), `trainer` (the loop,
checkpoints, data parallel), `references` (a completion's Squid reference documents composed as
the server composed them), `gate` (evaluation and the promotion decision), `adapters` (versions,
the promoted pointer, rollback, applying it to a runtime), `status` (the status file), `scheduler`
(the idle-time background process), `service` (one round end to end), `reader_round` (the
workspace's Squid reader, distilled by the scheduler when it has nothing new to train on).
Importing this package imports none of them, so the server reads the status without loading torch.
"""

__all__ = [
    "adapters", "dataset", "gate", "grpo", "logprobs", "policy", "reader_round", "references", "scheduler",
    "service", "status", "trainer",
]
