"""`squidcode train`: run the GRPO trainer, show its status, roll the promoted adapter back.

    squidcode train                 the scheduler, in the foreground: trains while the machine is idle
    squidcode train --once          one training round now (idle or not), then the promotion gate
    squidcode train --steps N       the round's length (default: train.steps)
    squidcode train --source postgresql://... --team NAME
                                    train on a team's pooled feedback (the collector's store)
    squidcode train status [--json] what the trainer is doing, and the adapter in use
    squidcode train rollback        go back to the adapter promoted before (or the base model)
    squidcode train publish         send the promoted adapter to the team's collector (feedback.endpoint)
    squidcode train reader --files DIR [--files DIR ...] [--out DIR]
                                    distil a Squid reader adapter from the Python files under DIR
                                    (`squidcode bench squid --reader DIR` measures it)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import threading
import time
from pathlib import Path

__all__ = ["StepProgress", "add_train_parser", "config_for_cwd", "run_train", "step_postfix"]


def add_train_parser(sub) -> None:
    train = sub.add_parser("train", help="train the model on the recorded feedback (GRPO, LoRA adapters)")
    train.add_argument("action", nargs="?", choices=["status", "rollback", "publish", "reader"],
                       help="status: show progress; rollback: restore the previous adapter; reader: "
                            "distil a Squid reader adapter from --files")
    train.add_argument("--once", action="store_true", help="one training round now, then exit")
    train.add_argument("--steps", type=_positive_int, metavar="N", help="steps in the round")
    train.add_argument("--json", action="store_true", help="print JSON")
    train.add_argument("--source", metavar="STORE",
                       help="train on a team's pooled feedback in a collector store (postgresql://... or "
                            "sqlite:PATH) instead of this machine's; needs --team")
    train.add_argument("--team", metavar="NAME", help="the team whose uploaded episodes --source reads")
    reader = train.add_argument_group("reader", "squidcode train reader")
    reader.add_argument("--files", metavar="DIR", action="append", default=[],
                        help="a folder whose Python files make the reader's tasks (repeatable)")
    reader.add_argument("--exclude", metavar="GLOB", action="append", default=[],
                        help="leave out files whose path under their --files folder matches (click/*)")
    reader.add_argument("--out", metavar="DIR", help="where the reader goes (default: <train dir>/reader)")
    reader.add_argument("--sets", type=_positive_int, default=40, help="document sets (5 tasks each)")
    reader.add_argument("--epochs", type=_positive_int, default=3, help="passes over the tasks")
    reader.add_argument("--threads", type=_positive_int, help="torch CPU threads")


def _positive_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return int(value)


def config_for_cwd():
    """The file configuration of the workspace around the current directory; problems go to stderr."""
    from context.config import WORKSPACE_CONFIG_NAME, load_file_config

    cwd = Path.cwd().resolve()
    root = next((d for d in (cwd, *cwd.parents) if (d / WORKSPACE_CONFIG_NAME).is_file()), None)
    config, problems = load_file_config([root] if root else [])
    for problem in problems:
        print(f"squidcode: configuration: {problem}", file=sys.stderr)
    return config


def run_train(args) -> int:
    from context.errors import SquidcodeError

    config = config_for_cwd()
    try:
        if args.action == "status":
            return _status(config, args.json)
        if args.action == "rollback":
            return _rollback(config, args.json)
        if args.action == "publish":
            return _publish(config, args.json)
        if args.action == "reader":
            return _reader(config, args)
        return _train(config, args)
    except SquidcodeError as exc:
        print(f"squidcode: {exc}", file=sys.stderr)
        return 1


def _reader(config, args) -> int:
    from context.runtime import get_runtime
    from feedback.train.squid_reader import ReaderSettings, distil_reader, source_documents
    from feedback.train.status import train_paths

    if not args.files:
        print("squidcode: train reader needs --files DIR (a folder of Python files)", file=sys.stderr)
        return 2
    missing = [d for d in args.files if not Path(d).is_dir()]
    if missing:
        print(f"squidcode: not a folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    settings = ReaderSettings(sets=args.sets, epochs=args.epochs)
    runtime = get_runtime(config.model, config.resolved_cache_dir())
    documents = source_documents(runtime, [Path(d) for d in args.files], min_tokens=2 * settings.doc_tokens,
                                 limit=settings.files, seed=settings.seed,
                                 exclude=tuple(args.exclude))
    if len(documents) <= settings.docs:
        print(f"squidcode: {len(documents)} Python files of {2 * settings.doc_tokens}+ tokens under "
              f"{', '.join(args.files)}; a reader needs more than {settings.docs}", file=sys.stderr)
        return 1
    out = Path(args.out) if args.out else train_paths(config).root / "reader"
    report = distil_reader(runtime, documents, out, settings, log=lambda m: print(m, file=sys.stderr))
    if args.json:
        print(json.dumps(report.__dict__))
    else:
        print(f"reader saved to {report.path}: {report.tasks} tasks from {report.documents} files, "
              f"KL {report.epoch_losses[0]:.4f} -> {report.epoch_losses[-1]:.4f}, "
              f"{report.teacher_s + report.train_s:.0f} s")
    return 0


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


def _publish(config, as_json: bool) -> int:
    """The promoted adapter to the team's collector, with the gate's metrics beside it."""
    from context.errors import AdapterError
    from feedback.team_adapters import publish_adapter
    from feedback.train.adapters import AdapterRegistry
    from feedback.train.status import train_paths
    from feedback.upload import collector_tls

    endpoint, token = config.feedback.endpoint, config.feedback.token
    if not endpoint or not token:
        raise AdapterError("publishing needs the team's collector: set feedback.endpoint and feedback.token")
    ref = AdapterRegistry(train_paths(config).adapters).current()
    if ref is None:
        raise AdapterError("no promoted adapter to publish (the base model is in use)")
    version = f"{ref.id}-{int(ref.meta.get('created_at') or 0)}"
    answer = publish_adapter(endpoint, token, ref.path, version, {"local_id": ref.id, **ref.meta},
                             verify=collector_tls(config.feedback.ca_file))
    print(json.dumps(answer) if as_json else f"published adapter {ref.id} as {version}")
    return 0


def _train(config, args) -> int:
    from feedback.train.scheduler import install_stop_signals, run_scheduler

    stop = threading.Event()
    install_stop_signals(stop)
    _init_distributed(config)
    source = _source(args)
    if args.once:
        from feedback.train.service import run_round

        os.nice(max(0, config.train.nice - os.nice(0)))
        with StepProgress() as on_step:
            result = run_round(config, steps=args.steps, should_stop=stop.is_set, on_step=on_step,
                               source=source)
        # The gate's decision is the command's result: stdout, as text or JSON.
        print(json.dumps(result.__dict__) if args.json else f"{result.state}: {result.message}")
        return 0
    if not config.train.enabled:
        print("squidcode: train.enabled is false; set it in the config to train in the background "
              "(or run `squidcode train --once`)", file=sys.stderr)
        return 2
    if source is None:
        rounds = run_scheduler(config, stop=stop, steps=args.steps, round_fn=_reported_round)
    else:
        from feedback.train.service import training_inputs

        rounds = run_scheduler(config, stop=stop, steps=args.steps,
                               round_fn=functools.partial(_reported_round, source=source),
                               inputs_fn=lambda config: training_inputs(config, source))
    print(f"scheduler stopped after {rounds} round(s)")
    return 0


def _source(args):
    """The episodes' source: a team's collector store (`--source`, `--team`), or None (local)."""
    from context.errors import SquidcodeError

    if args.source is None:
        if args.team:
            raise SquidcodeError("--team names whose data --source reads; give --source too")
        return None
    from feedback.train.team_source import CollectorSource

    return CollectorSource(args.source, args.team or "")


def _init_distributed(config) -> None:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1): data-parallel training.

    On GPUs each process takes the GPU of its local rank (torchrun's LOCAL_RANK) before the model is
    loaded: "cuda" then names that GPU, and NCCL refuses two processes on one GPU anyway. Gradients
    (on the GPU) go through NCCL; the trainer's few CPU scalars (rewards, stop flags) through gloo."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    import torch
    import torch.distributed as dist

    from context.runtime import resolve_device

    if dist.is_initialized():
        return
    if resolve_device(config.train.device) == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("cpu:gloo,cuda:nccl")
    else:
        dist.init_process_group("gloo")


def _reported_round(config, **kwargs):
    """One scheduler round with its steps and the gate's decision on stderr (the trainer's log)."""
    from context.progress import note
    from feedback.train.service import run_round

    with StepProgress() as on_step:
        result = run_round(config, on_step=on_step, **kwargs)
    note(f"round {result.state}: {result.message}")
    return result


def step_postfix(record) -> dict[str, float]:
    """What a training step's progress line shows of its `StepRecord`."""
    return {"reward": record.mean_reward, "kl": record.kl}


class StepProgress:
    """A round's training steps on stderr (a bar, or plain lines), fed by `run_round(on_step=...)`.

    It opens with the round, so that loading the model is not silent, and closes after the last
    step, saying that the promotion gate evaluates next (which takes a while of its own). Under
    torchrun only process 0 reports.
    """

    def __init__(self, stream=None):
        self._stream = stream
        self._display = None

    def __enter__(self) -> StepProgress:
        from context.progress import start_progress

        if os.environ.get("RANK", "0") == "0":
            self._display = start_progress(None, "training", unit="steps", stream=self._stream)
        return self

    def __call__(self, record, target: int) -> None:
        from context.progress import note

        if self._display is None or self._display.closed:
            return
        self._display.update_to(record.step, target, **step_postfix(record))
        if record.step >= target:
            self._display.close()
            note("promotion gate: evaluating the new adapter against the one in use", self._stream)

    def __exit__(self, exc_type, exc, traceback) -> None:
        if self._display is not None:
            self._display.close(failed=exc_type is not None)
