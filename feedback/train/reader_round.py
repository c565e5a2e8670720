"""The workspace's own Squid reader, distilled by the background scheduler while the machine is idle.

`squidcode train reader --files DIR` distils a reader by hand; with `train.reader_sets` the
scheduler does it for the workspace it runs in, when it has nothing new to train the adapter on:

  - when: no reader of this workspace was distilled yet for this model, or at least a quarter of
    its Python files (as the index has them) changed, appeared or went since the last one;
  - from what: its Python files long enough to be references (`source_documents`' rule, read from
    the index's list, so ignored and generated folders stay out); about a quarter of them (at least
    3, chosen by the hash of their path, so a file stays on its side) are held out;
  - kept only if it reads the held-out files' compositions closer to full prefill than the base
    model reads them (the mean KL of the next-token distributions falls by `MIN_GAIN` of itself);
  - where: `<train dir>/reader`, replaced whole (the previous one kept as `reader.previous`); the
    server reads compositions through it while `squid.reader` names no other folder and no LoRA
    adapter is applied, picking up a new one at its next request (no restart).

A busy machine or a stop signal ends the distillation between two tasks with nothing saved; the next
idle period starts it again (a distillation is minutes to an hour; no half-made reader is kept).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from context.config import SquidConfig

from .status import TrainPaths, write_status

__all__ = ["MIN_GAIN", "READER_DIR", "ReaderRound", "reader_due", "run_reader_round", "workspace_reader"]

log = logging.getLogger(__name__)

READER_DIR = "reader"
INPUTS_FILE = "reader_inputs.json"  # what the last finished distillation read
MIN_GAIN = 0.05  # the held-out KL must fall by at least this share of itself
CHANGED_SHARE = 0.25  # the share of the workspace's files that must change before distilling again
HELD_OUT_SHARE = 0.25


@dataclass(frozen=True)
class ReaderRound:
    state: str  # "promoted" | "rejected" | "stopped" | "skipped" | "failed"
    message: str
    held_out_kl: float | None = None
    held_out_kl_reader: float | None = None
    seconds: float = 0.0


def workspace_reader(config: SquidConfig) -> Path | None:
    """The reader completions read compositions through: `squid.reader`, or else, with
    `train.reader_sets`, the one the scheduler distilled (None while there is none)."""
    if config.squid.reader:
        return Path(config.squid.reader).expanduser()
    if config.train.reader_sets <= 0:
        return None
    from context.squid.reader import READER_FILE

    from .status import train_paths

    folder = train_paths(config).root / READER_DIR
    return folder if (folder / READER_FILE).is_file() else None


def _inputs(config: SquidConfig, files: dict[str, str]) -> dict:
    model = {"path": config.model.path, "dtype": config.model.dtype}
    return {"model": model, "sets": config.train.reader_sets, "seed": config.train.seed, "files": files}


def _last_inputs(paths: TrainPaths) -> dict | None:
    try:
        data = json.loads((paths.root / INPUTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def reader_due(config: SquidConfig, paths: TrainPaths, files: dict[str, str]) -> bool:
    """Whether the workspace's files (`{path: content hash}`) call for a new distillation."""
    last = _last_inputs(paths)
    now = _inputs(config, files)
    if last is None or {k: v for k, v in last.items() if k != "files"} != {
            k: v for k, v in now.items() if k != "files"}:
        return True
    before = last.get("files") if isinstance(last.get("files"), dict) else {}
    paths_seen = set(before) | set(files)
    changed = sum(before.get(p) != files.get(p) for p in paths_seen)
    return bool(paths_seen) and changed >= CHANGED_SHARE * len(paths_seen)


def _record(paths: TrainPaths, inputs: dict) -> None:
    path = paths.root / INPUTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(inputs), encoding="utf-8")
    os.replace(tmp, path)


def _rank(name: str, roots: Sequence[Path]) -> float:
    """Where a file's path (relative to its root: the same wherever the workspace lives) hashes, in [0, 1]."""
    path = Path(name)
    for root in roots:
        if path.is_relative_to(root):
            path = path.relative_to(root)
            break
    return int(hashlib.sha256(path.as_posix().encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def split_documents(documents: list[tuple[str, list[int]]],
                    roots: Sequence[Path] = ()) -> tuple[list, list]:
    """(train, held out): the documents whose path hashes into the lowest quarter are held out, so
    a file stays on its side as others come and go; when fewer than 3 do, the 3 lowest (none below
    6 documents)."""
    if len(documents) < 6:
        return list(documents), []
    roots = [Path(r).resolve() for r in roots]
    rank = {name: _rank(name, roots) for name, _ in documents}
    ranked = sorted(documents, key=lambda doc: rank[doc[0]])
    held = [d for d in ranked if rank[d[0]] < HELD_OUT_SHARE]
    chosen = {name for name, _ in (held if len(held) >= 3 else ranked[:3])}
    return [d for d in documents if d[0] not in chosen], [d for d in documents if d[0] in chosen]


def run_reader_round(config: SquidConfig, *, paths: TrainPaths, should_stop: Callable[[], bool],
                     roots: Sequence[Path] | None = None, runtime=None, settings=None) -> ReaderRound | None:
    """Distil, gate and promote the workspace's reader when one is due; None when none is.
    `settings` (`squid_reader.ReaderSettings`): the distillation's, `train.reader_sets` sets by default."""
    from .service import indexed_python

    if config.train.reader_sets <= 0:
        return None
    roots = [Path.cwd()] if roots is None else list(roots)
    files = indexed_python(roots)
    if not reader_due(config, paths, files):
        return None
    inputs = _inputs(config, files)
    started = time.perf_counter()
    write_status(paths.status, "loading", message="loading the model to distil the Squid reader")
    result = _distil(config, paths, files, roots, should_stop, runtime, settings)
    result = replace(result, seconds=time.perf_counter() - started)
    if result.state != "stopped":
        _record(paths, inputs)  # the same files are not tried again, kept or not
    state = {"skipped": "idle", "failed": "error"}.get(result.state, result.state)
    write_status(paths.status, state, message=f"Squid reader: {result.message}", reader=result.__dict__)
    log.info("squid reader: %s", result.message)
    return result


def _distil(config: SquidConfig, paths: TrainPaths, files: dict[str, str], roots, should_stop, runtime,
            settings) -> ReaderRound:
    from context.runtime import get_runtime

    from .squid_reader import ReaderSettings, ReaderStopped, distil_reader, workspace_documents

    settings = settings or ReaderSettings(sets=config.train.reader_sets, seed=config.train.seed)
    runtime = runtime or get_runtime(config.model, config.resolved_cache_dir())
    documents = workspace_documents(runtime, [Path(p) for p in files], min_tokens=2 * settings.doc_tokens,
                                    limit=settings.files, seed=settings.seed)
    train, held = split_documents(documents, roots)
    if len(train) < 3 or not held:
        return ReaderRound("skipped", f"{len(documents)} Python files of {2 * settings.doc_tokens}+ tokens; "
                           "a reader needs at least 6 (3 to learn from, 3 to check it on)")
    settings = replace(settings, docs=min(settings.docs, len(train) - 1))
    next_dir = paths.root / f"{READER_DIR}.next"
    shutil.rmtree(next_dir, ignore_errors=True)

    def progress(message: str) -> None:
        write_status(paths.status, "training", message=f"distilling the Squid reader: {message}")

    try:
        report = distil_reader(runtime, train, next_dir, settings, progress, held_out=held,
                               should_stop=should_stop)
    except ReaderStopped as exc:
        shutil.rmtree(next_dir, ignore_errors=True)
        return ReaderRound("stopped", f"{exc}; the next idle period starts it again")
    except (ValueError, RuntimeError, OSError) as exc:  # the trainer goes on; these files are not retried
        shutil.rmtree(next_dir, ignore_errors=True)
        return ReaderRound("failed", f"failed: {exc}")
    without, reading = report.held_out_kl, report.held_out_kl_reader
    figures = (f"held-out KL {without:.4f} without it, {reading:.4f} with it ({len(held)} files held out, "
               f"{len(train)} read)")
    if reading > without * (1.0 - MIN_GAIN):
        shutil.rmtree(next_dir, ignore_errors=True)
        return ReaderRound("rejected", f"not kept: {figures}", without, reading)
    folder, previous = paths.root / READER_DIR, paths.root / f"{READER_DIR}.previous"
    if folder.exists():
        shutil.rmtree(previous, ignore_errors=True)
        os.replace(folder, previous)
    os.replace(next_dir, folder)
    return ReaderRound("promoted", f"kept at {folder}: {figures}", without, reading)
