"""Distil full prefill into Squid: train a reader adapter (`context.squid.reader`) from source files.

A task is a set of documents (the first `doc_tokens` tokens of `docs` files) and a query of
`query_tokens` tokens: half the queries quote a span of one of the set's documents (the model can
copy from its context), half come from a file outside the set, as `squidcode bench squid` draws them.
The teacher is the base model's full prefill of prefix + documents + query and its greedy
continuation of `continuation` tokens; the student is the same model with the reader, reading the
documents' Squid-composed caches (encoded alone by the base model, re-rotated into place, with the
settings' recovery). The loss is KL(teacher || student) at every query and continuation position, so
the reader learns to give, on composed caches, the next-token distribution full prefill gives.

The teacher's log-probs are kept in bfloat16 for every position of every task: tasks x (query +
continuation) x vocabulary x 2 bytes (200 tasks of SmolLM2: 1.5 GB). The documents' caches are kept
once each; a set's composition is made again when the training reaches its tasks (each epoch visits
the sets in a shuffled order, a set's tasks together), never held for every set at once (it was: 190
MB a set of 8 x 512 tokens, 10.6 GB at 56 sets).
"""

from __future__ import annotations

import fnmatch
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from context.squid.compose import Recovery, compose, full_prefill, greedy_continuation
from context.squid.encode import build_cache, cache_tensors, document_key, encode_document, encode_prefix
from context.squid.keys import model_identity
from context.squid.reader import READER_FILE

from .policy import attach_lora

__all__ = ["ReaderReport", "ReaderSettings", "ReaderStopped", "distil_reader", "source_documents",
           "workspace_documents"]


@dataclass(frozen=True)
class ReaderSettings:
    docs: int = 8  # documents per task set
    doc_tokens: int = 512
    query_tokens: int = 48
    continuation: int = 32
    queries_per_set: int = 5
    sets: int = 40
    epochs: int = 3
    learning_rate: float = 2e-4
    rank: int = 16
    alpha: int = 32
    seed: int = 0
    recovery: Recovery = Recovery()  # the composition the reader is trained to read
    files: int = 120  # source files read (documents and other files' queries)


@dataclass
class ReaderReport:
    path: str
    tasks: int
    documents: int
    epoch_losses: list[float] = field(default_factory=list)
    teacher_s: float = 0.0
    train_s: float = 0.0
    sources: list[str] = field(default_factory=list)  # the files the tasks were made from
    # On held-out documents (`held_out`): the mean KL from full prefill of the composition read
    # without the reader and with it (None: no held-out documents).
    held_out_kl: float | None = None
    held_out_kl_reader: float | None = None


class ReaderStopped(Exception):
    """`should_stop` said stop: the distillation ended between two tasks, nothing saved."""


def source_documents(runtime, roots: list[Path], *, min_tokens: int, limit: int, seed: int = 0,
                     exclude: tuple[str, ...] = ()) -> list[tuple[str, list[int]]]:
    """Up to `limit` Python files under `roots` with at least `min_tokens` tokens, as (name, token ids),
    drawn in an order shuffled by `seed`; a file whose path relative to its root matches a glob of
    `exclude` (`click/*`) is left out. A file is read as UTF-8 (undecodable bytes replaced); only its
    first `min_tokens * 12` characters are tokenized."""
    files = [p for root in roots for p in Path(root).rglob("*.py")
             if not any(fnmatch.fnmatch(p.relative_to(root).as_posix(), g) for g in exclude)]
    return workspace_documents(runtime, files, min_tokens=min_tokens, limit=limit, seed=seed)


def workspace_documents(runtime, files: list[Path], *, min_tokens: int, limit: int,
                        seed: int = 0) -> list[tuple[str, list[int]]]:
    """`source_documents` of a list of files (the index's, say)."""
    files = sorted({p.resolve() for p in files if _size(p) > min_tokens * 3})
    random.Random(seed).shuffle(files)
    out = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:  # gone since it was listed
            continue
        ids = runtime.encode(text[: min_tokens * 12])
        if len(ids) >= min_tokens:
            out.append((str(path), ids))
            if len(out) >= limit:
                break
    return out


def _size(path: Path) -> int:
    try:
        return path.stat().st_size if path.is_file() else 0
    except OSError:
        return 0


def _queries(rng: random.Random, documents: list[list[int]], others: list[list[int]],
             settings: ReaderSettings) -> list[list[int]]:
    out = []
    for i in range(settings.queries_per_set):
        quoted = i % 2 == 0 or not others
        ids = documents[rng.randrange(len(documents))] if quoted else others[rng.randrange(len(others))]
        low = len(ids) // 4 if quoted else 0
        start = rng.randrange(low, max(low + 1, len(ids) - settings.query_tokens - 8))
        out.append(list(ids[start : start + settings.query_tokens]))
    return out


def _logits(runtime, cache, ids: list[int], start: int) -> torch.Tensor:
    """Next-token logits [len(ids), vocab] of `ids` at positions start.. on `cache` (extended)."""
    out = runtime.model(input_ids=torch.tensor([ids], device=runtime.device),
                        position_ids=torch.arange(start, start + len(ids), device=runtime.device)[None],
                        cache=cache, use_cache=True)
    return out.logits[0].float()


@dataclass
class _Task:
    set_index: int
    ids: list[int]  # the query and the continuation but its last token
    teacher: torch.Tensor  # [len(ids), vocab] log-probs, bfloat16


def _teacher_tasks(runtime, prefix, entries, texts, settings: ReaderSettings, log, should_stop):
    """(tasks, the documents of each set): the teacher's half of the distillation."""
    rng = random.Random(settings.seed)
    tasks, sets = [], []
    for index in range(settings.sets):
        if should_stop():
            raise ReaderStopped(f"stopped at task set {index + 1} of {settings.sets}")
        chosen = rng.sample(range(len(entries)), settings.docs)
        docs = [entries[i] for i in chosen]
        sets.append(docs)
        ids = list(prefix.token_ids) + [t for d in docs for t in d.token_ids]
        full, _ = full_prefill(runtime, ids)
        keys, values = cache_tensors(full)
        outside = set(range(len(texts))) - set(chosen)
        others = [texts[i] for i in sorted(outside)]
        for query in _queries(rng, [list(d.token_ids) for d in docs], others, settings):
            if should_stop():  # a set's queries take most of a minute on two cores
                raise ReaderStopped(f"stopped in task set {index + 1} of {settings.sets}")
            continuation = greedy_continuation(runtime, keys, values, query, len(ids), settings.continuation)
            seq = query + continuation[:-1]
            teacher = torch.log_softmax(_logits(runtime, build_cache(runtime.model.config, keys, values), seq,
                                                len(ids)), -1)
            tasks.append(_Task(index, seq, teacher.to(torch.bfloat16)))
        log(f"reader: task set {index + 1}/{settings.sets} ({len(tasks)} tasks)")
    return tasks, sets


def distil_reader(runtime, documents: list[tuple[str, list[int]]], out_dir: Path,
                  settings: ReaderSettings = ReaderSettings(),
                  log: Callable[[str], None] = lambda message: None, *,
                  held_out: list[tuple[str, list[int]]] = (),
                  should_stop: Callable[[], bool] = lambda: False) -> ReaderReport:
    """Train a reader on `documents` (name, token ids) and save it to `out_dir` (peft files plus
    `READER_FILE`). `runtime` must be the base model (no adapter applied); it is left so.

    With `held_out` documents (at least 3), task sets made from them alone measure the reader: the
    report's `held_out_kl` (the composition read without it) and `held_out_kl_reader` (with it).
    `should_stop` is asked between tasks; when it says stop, ReaderStopped is raised and nothing
    is saved."""
    if runtime.adapter_id is not None:
        raise ValueError(f"adapter {runtime.adapter_id} is applied: a reader is distilled from the base "
                         "model")
    if len(documents) <= settings.docs:
        raise ValueError(f"{len(documents)} documents: a task set takes {settings.docs} and queries "
                         "need files outside it")
    out_dir = Path(out_dir)
    started = time.perf_counter()
    with torch.inference_mode():
        prefix = encode_prefix(runtime)

        def teacher(docs, task_settings):
            entries = []
            for name, ids in docs:  # up to 120 documents: asked between them too
                if should_stop():
                    raise ReaderStopped(f"stopped encoding the documents ({len(entries)} of {len(docs)})")
                entries.append(encode_document(runtime, prefix, ids[: task_settings.doc_tokens],
                                               document_key(runtime, prefix, f"reader:{name}"), source=name))
            return _teacher_tasks(runtime, prefix, entries, [ids for _, ids in docs], task_settings, log,
                                  should_stop)

        tasks, sets = teacher(documents, settings)
        held_settings = _held_out_settings(settings, len(held_out))
        held_tasks, held_sets = teacher(held_out, held_settings) if held_settings else ([], [])
    report = ReaderReport(str(out_dir), len(tasks), len(documents), teacher_s=time.perf_counter() - started,
                          sources=[name for name, _ in documents])
    identity = model_identity(runtime)
    wrapper = attach_lora(runtime.model, settings.rank, settings.alpha, seed=settings.seed)
    try:
        started = time.perf_counter()
        report.epoch_losses = _train(runtime, wrapper, tasks, prefix, sets, settings, log, should_stop)
        report.train_s = time.perf_counter() - started
        if held_tasks:
            report.held_out_kl, report.held_out_kl_reader = _held_out_kl(
                runtime, wrapper, held_tasks, prefix, held_sets, settings.recovery)
            log(f"reader: held-out KL {report.held_out_kl:.4f} without the reader, "
                f"{report.held_out_kl_reader:.4f} with it")
        out_dir.mkdir(parents=True, exist_ok=True)
        wrapper.save_pretrained(str(out_dir))
    finally:
        runtime.model = wrapper.unload()
    settings_json = {**asdict(settings), "recovery": asdict(settings.recovery)}
    info = {"kind": "squid-reader", "model": identity, "recovery": settings.recovery.name,
            "settings": settings_json, "report": asdict(report)}
    (out_dir / READER_FILE).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return report


def _held_out_settings(settings: ReaderSettings, documents: int) -> ReaderSettings | None:
    """The task sets held-out documents make: a quarter as many sets (at least 2), of as many
    documents as leave one outside for the other-file queries; None below 3 documents."""
    if documents < 3:
        return None
    return replace(settings, sets=max(2, settings.sets // 4), docs=min(settings.docs, documents - 1),
                   seed=settings.seed + 1)


def _kl(teacher: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(teacher || student), both log-probs [positions, vocab]."""
    return (teacher.exp() * (teacher - student)).sum(-1).mean()


@torch.no_grad()
def _held_out_kl(runtime, wrapper, tasks: list[_Task], prefix, sets,
                 recovery: Recovery) -> tuple[float, float]:
    """(without the reader, with it): the mean KL from full prefill on `tasks`."""
    without, reading = [], []
    current, composed = None, None
    for task in tasks:
        if task.set_index != current:
            current = task.set_index
            composed = None
            composed = _composition(runtime, wrapper, prefix, sets[current], recovery)
        keys, values, length = composed
        teacher = task.teacher.float()
        reading.append(float(_kl(teacher, _student(runtime, keys, values, task.ids, length))))
        with wrapper.disable_adapter():
            without.append(float(_kl(teacher, _student(runtime, keys, values, task.ids, length))))
    return statistics.mean(without), statistics.mean(reading)


def _student(runtime, keys, values, ids: list[int], start: int) -> torch.Tensor:
    """Log-probs [len(ids), vocab] of `ids` read after the composition (`keys`, `values`)."""
    cache = build_cache(runtime.model.config, keys, values)
    return torch.log_softmax(_logits(runtime, cache, ids, start), -1)


def _composition(runtime, wrapper, prefix, docs, recovery: Recovery):
    """(keys, values, length) of `docs` composed as the product composes them, by the base model."""
    with wrapper.disable_adapter(), torch.inference_mode():
        context = compose(runtime, prefix, docs, recovery=recovery)
    # Made under inference mode: copied out of it so the student's backward may save them.
    return context.keys.clone(), context.values.clone(), context.offset


def _epoch_order(tasks: list[_Task], seed: int) -> list[int]:
    """Task indices: the sets in a shuffled order, each set's tasks together and shuffled."""
    rng = random.Random(seed)
    by_set: dict[int, list[int]] = {}
    for index, task in enumerate(tasks):
        by_set.setdefault(task.set_index, []).append(index)
    order = []
    for set_index in rng.sample(sorted(by_set), len(by_set)):
        members = by_set[set_index]
        rng.shuffle(members)
        order += members
    return order


def _train(runtime, wrapper, tasks: list[_Task], prefix, sets, settings: ReaderSettings, log,
           should_stop) -> list[float]:
    params = [p for p in wrapper.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.learning_rate, weight_decay=0.0)
    wrapper.train()
    losses = []
    for epoch in range(settings.epochs):
        seen, current, composed = [], None, None
        for index in _epoch_order(tasks, settings.seed + epoch):
            if should_stop():
                raise ReaderStopped(f"stopped in epoch {epoch + 1} of {settings.epochs}")
            task = tasks[index]
            if task.set_index != current:
                current = task.set_index
                composed = None  # one set's composition at a time
                composed = _composition(runtime, wrapper, prefix, sets[current], settings.recovery)
            keys, values, length = composed
            loss = _kl(task.teacher.float(), _student(runtime, keys, values, task.ids, length))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen.append(float(loss.detach()))
        losses.append(statistics.mean(seen))
        log(f"reader: epoch {epoch + 1}/{settings.epochs}, KL {losses[-1]:.4f}")
    wrapper.eval()
    return losses
