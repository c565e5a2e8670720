"""Data parallel through torch.distributed: two CPU processes on gloo, one group each, end with the
same adapter as one process that trains both groups with gradient accumulation."""

from __future__ import annotations

import os
import socket
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .test_trainer import CONFIG, lora_state, make_trainer

STEPS = 2


def length_reward(text: str, example) -> float:
    return len(text.split()) / 6


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        # Each process draws another fresh adapter (as two processes whose generators differ would):
        # the trainer starts them all from process 0's.
        trainer = make_trainer(Path(out) / f"rank{rank}", replace(CONFIG, prompts_per_step=1), length_reward,
                               lora_seed=rank)
        assert (trainer.rank, trainer.world_size) == (rank, world)
        trainer.run(STEPS)
        torch.save({"lora": lora_state(trainer.model), "rewards": [r.mean_reward for r in trainer.history]},
                   Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_match_one_process_with_accumulation(tmp_path):
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    single = make_trainer(tmp_path / "single", replace(CONFIG, prompts_per_step=2), length_reward)
    single.run(STEPS)
    expected = lora_state(single.model)
    assert any(float(v.abs().sum()) > 0 for k, v in expected.items() if "lora_B" in k)
    for result in ranks:
        for name, value in expected.items():
            # Float32 sums in another order, amplified by Adam at lr 0.05: up to ~2e-6 apart.
            assert torch.allclose(result["lora"][name], value, atol=1e-5), name
    # The logged reward is averaged over processes: the same as the single process's batch mean.
    assert ranks[0]["rewards"] == ranks[1]["rewards"]
    single_rewards = torch.tensor([r.mean_reward for r in single.history])
    assert torch.allclose(torch.tensor(ranks[0]["rewards"]), single_rewards)
    # Only process 0 writes checkpoints.
    assert (tmp_path / "rank0" / "run" / "checkpoint" / "state.json").is_file()
    assert not (tmp_path / "rank1" / "run" / "checkpoint").exists()
