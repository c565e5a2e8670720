"""`squidcode train`: run the GRPO trainer, show its status, roll the promoted adapter back.

    squidcode train                 the scheduler, in the foreground: trains while the machine is idle
    squidcode train --once          one training round now (idle or not), then the promotion gate
    squidcode train --steps N       the round's length (default: train.steps)
    squidcode train status [--json] what the trainer is doing, and the adapter in use
    squidcode train rollback        go back to the adapter promoted before (or the base model)
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

__all__ = ["add_train_parser", "run_train"]


def add_train_parser(sub) -> None:
    train = sub.add_parser("train", help="train the model on the recorded feedback (GRPO, LoRA adapters)")
    train.add_argument("action", nargs="?", choices=["status", "rollback"],
                       help="status: show progress; rollback: restore the previous adapter")
    train.add_argument("--once", action="store_true", help="one training round now, then exit")
    train.add_argument("--steps", type=_positive_int, metavar="N", help="steps in the round")
    train.add_argument("--json", action="store_true", help="print JSON")


def _positive_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return int(value)


def _config():
    from context.config import WORKSPACE_CONFIG_NAME, load_file_config

    cwd = Path.cwd().resolve()
    root = next((d for d in (cwd, *cwd.parents) if (d / WORKSPACE_CONFIG_NAME).is_file()), None)
    config, problems = load_file_config([root] if root else [])
    for problem in problems:
        print(f"squidcode: configuration: {problem}", file=sys.stderr)
    return config


def run_train(args) -> int:
    from context.errors import SquidcodeError

    config = _config()
    try:
        if args.action == "status":
            return _status(config, args.json)
        if args.action == "rollback":
            return _rollback(config, args.json)
        return _train(config, args)
    except SquidcodeError as exc:
        print(f"squidcode: {exc}", file=sys.stderr)
        return 1


def _status(config, as_json: bool) -> int:
    from feedback.train.adapters import AdapterRegistry
    from feedback.train.status import read_status, train_paths

    paths = train_paths(config)
    status = read_status(paths.status)
    registry = AdapterRegistry(paths.adapters)
    status["promoted"] = registry.current_id()
    status["versions"] = [ref.id for ref in registry.versions()]
    if as_json:
        print(json.dumps(status))
        return 0
    line = f"trainer: {status['state']}"
    if "step" in status:
        line += f", step {status['step']}/{status.get('steps', '?')}"
    if status.get("reward") is not None:
        line += f", reward {status['reward']:.3f}, KL {status.get('kl', 0):.4f}"
    print(line)
    if status.get("message"):
        print(f"  {status['message']}")
    if status.get("updated_at"):
        print(f"  updated {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(status['updated_at']))}")
    print(f"adapter in use: {status['promoted'] or 'none (base model)'}; versions: "
          f"{', '.join(status['versions']) or 'none'}")
    return 0


def _rollback(config, as_json: bool) -> int:
    from feedback.train.adapters import AdapterRegistry
    from feedback.train.status import train_paths

    previous = AdapterRegistry(train_paths(config).adapters).rollback()
    print(json.dumps({"promoted": previous}) if as_json else
          f"rolled back; adapter in use: {previous or 'none (base model)'}")
    return 0


def _train(config, args) -> int:
    from feedback.train.scheduler import install_stop_signals, run_scheduler

    stop = threading.Event()
    install_stop_signals(stop)
    _init_distributed(config)
    if args.once:
        import os

        from feedback.train.service import run_round

        os.nice(max(0, config.train.nice - os.nice(0)))
        result = run_round(config, steps=args.steps, should_stop=stop.is_set)
        print(json.dumps(result.__dict__) if args.json else f"{result.state}: {result.message}")
        return 0
    if not config.train.enabled:
        print("squidcode: train.enabled is false; set it in the config to train in the background "
              "(or run `squidcode train --once`)", file=sys.stderr)
        return 2
    rounds = run_scheduler(config, stop=stop, steps=args.steps)
    print(f"scheduler stopped after {rounds} round(s)")
    return 0


def _init_distributed(config) -> None:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1): data-parallel training."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if config.train.device == "cuda" else "gloo"
        dist.init_process_group(backend)
