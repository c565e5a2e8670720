"""The recorder: what the server and the agent call to record episodes and follow their edits.

Every public method returns at once. Rows are redacted and reduced to the storage mode on the
caller's thread (cheap), queued, and written by one background thread in batched transactions, so a
slow, locked or full database never blocks the editor. Edit tracking (`feedback.tracking`) runs on
the caller's thread under a lock: it is position arithmetic only.

    recorder = FeedbackRecorder(config.feedback)
    episode = recorder.record_completion_episode(uri=..., position=(3, 4), output="x + 1", ...)
    recorder.accept_completion(episode, text=None, document_text=...)
    recorder.on_did_change(uri, [TextChange(...)], text_after)     # each didChange
    recorder.tick()                                                 # about once a second
"""

from __future__ import annotations

import json
import logging
import queue
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from context.config import FeedbackConfig
from context.errors import FeedbackStoreError
from context.prompt_record import ServedPrompt
from context.sqlite_file import OpenedFile

from .consent import Consent
from .redact import for_storage, redact
from .store import (
    EXTRA_CODE_KEYS,
    JSON_COLUMNS,
    REFERENCE_TABLE,
    SERVED_PROMPT_KEY,
    FeedbackStore,
    default_db_path,
    translate_sqlite_error,
)
from .tracking import EditTracker, Observation, Pos, TextChange

__all__ = ["FeedbackRecorder", "new_id", "SERVED_PROMPT_KEY"]

log = logging.getLogger(__name__)

# Rows held in memory while the database cannot be written (read-only, full disk); beyond, the
# oldest are dropped and counted: recording is best-effort, the editor is not.
MAX_PENDING_ROWS = 100_000
_RETRY_S = (0.05, 0.2, 1.0, 5.0, 30.0)
_SESSION_TOUCH_S = 60.0


def new_id() -> str:
    return uuid.uuid4().hex


def sanitize_row(table: str, row: dict[str, Any], mode: str) -> dict[str, Any]:
    """`row` as it may be written: every code text redacted, then kept, hashed or dropped per `mode`.

    Values of the JSON columns may arrive as JSON text (as queued) or as objects.
    """
    row = {k: json.loads(v) if k in JSON_COLUMNS and isinstance(v, str) else v for k, v in row.items()}
    if table == "episodes":
        served = (row.get("extra") or {}).get(SERVED_PROMPT_KEY)
        if served is not None:
            stored = _stored_prompt(served, row.get("prompt_text"), mode)
            row["extra"] = {**row["extra"], SERVED_PROMPT_KEY: stored}
        row["prompt_text"], row["prompt_hash"] = for_storage(row.get("prompt_text"), mode)
        row["output"], row["output_hash"] = for_storage(row.get("output"), mode)
        row["instruction"] = (
            redact(row["instruction"]).text if row.get("instruction") and mode != "none" else None
        )
        row["context_refs"] = [
            {k: (redact(v).text if isinstance(v, str) and k != "hash" else v) for k, v in ref.items()}
            for ref in row.get("context_refs") or []
        ]
        if row.get("candidates") is not None:
            row["candidates"] = [_sanitize_candidate(c, mode) for c in row["candidates"]]
        code = {key: for_storage(value, mode)[0] for key, value in (row.get("extra") or {}).items()
                if key in EXTRA_CODE_KEYS and isinstance(value, str)}
        if code:
            row["extra"] = {**row["extra"], **code}
        if isinstance((row.get("extra") or {}).get("steps"), list):
            row["extra"] = {**row["extra"], "steps": [_sanitize_step(s, mode) for s in row["extra"]["steps"]]}
    elif table == "events" and isinstance(row.get("data"), dict):
        data = dict(row["data"])
        for key in ("new_text", "old_text"):
            if key in data:
                data[key], data[f"{key}_hash"] = for_storage(data[key], mode)
        row["data"] = data
    elif table == "outcomes":
        row["kept_text"], row["kept_hash"] = for_storage(row.get("kept_text"), mode)
    elif table == REFERENCE_TABLE:
        # Queued only where code is kept; a text redaction changed no longer spells its hash's tokens.
        served = row["text"] if mode == "full" else ""
        row["text"] = redact(served).text
        row["redacted"] = int(mode != "full" or row["text"] != served)
    return row


def _stored_prompt(served: dict, window: str | None, mode: str) -> dict:
    """A served prompt as an episode keeps it: redacted, its token ids only where redaction left the
    window as it was (ids of a secret spell the secret), no code at all unless `mode` keeps code."""
    record = ServedPrompt.from_json(served, text=window or "")
    stored = record.for_storage(lambda text: redact(text).text, keep_code=mode == "full")
    return stored.to_json(with_text=False)


def _sanitize_step(step: Any, mode: str) -> Any:
    """An agent step as stored: its tool name and outcome as they are; every text it carries (the
    arguments: paths, queries, edit blocks; the model's raw answer; the error) redacted, and kept
    as text only where `mode` keeps code (else its hash)."""
    if not isinstance(step, dict):
        return None  # not a step the agent writes (`StepRecord.to_json`): nothing of it is stored

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            text, digest = for_storage(value, mode)
            return text if mode == "full" else digest
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return {k: (v if k in ("tool", "ok") else clean(v)) for k, v in step.items()}


def _sanitize_candidate(candidate: dict, mode: str) -> dict:
    clean = dict(candidate)
    clean["diff"], clean["diff_hash"] = for_storage(candidate.get("diff"), mode)
    if isinstance(clean.get("checks"), str):
        clean["checks"] = redact(clean["checks"]).text
    return clean


class FeedbackRecorder:
    """Records episodes, events and outcomes into the local store from a background writer."""

    def __init__(
        self,
        config: FeedbackConfig,
        *,
        db_path: Path | str | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        consent: Consent | None = None,
        store_factory: Callable[[Path], FeedbackStore] = FeedbackStore,
    ):
        self.db_path = Path(db_path) if db_path else default_db_path(config)
        self.consent = consent or Consent.beside(self.db_path)
        self.config = self.consent.apply(config)
        self.clock, self.monotonic = clock, monotonic
        self.store_factory = store_factory
        self.tracker = EditTracker(config.checkpoints_s, clock=monotonic)
        # Called with each judged checkpoint (an Observation) after it is queued for the store,
        # on the thread that runs `tick`; the server's agent memory learns from them.
        self.outcome_listeners: list[Callable[[Observation], None]] = []
        self.session_id = new_id()
        self.dropped = 0
        self._session_row: dict[str, Any] | None = None  # as written: again into a replaced store
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._submitted = 0
        self._written = 0
        self._written_cv = threading.Condition()
        # (uri, kind) -> (episode, monotonic time shown): one live suggestion of each kind per document
        # (an inline completion and a next-edit suggestion are shown side by side).
        self._shown: dict[tuple[str, str], tuple[str, float]] = {}
        self._episodes: dict[str, dict[str, Any]] = {}  # live completion episodes: uri, position, output
        self._last_output: tuple[str, float, str | None] | None = None  # episode, time, model
        self._model_id: str | None = None
        self._session_touched = 0.0
        self._stopping = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="squid-feedback-writer", daemon=True)
        self._writer.start()
        if self.config.record:
            self._start_session()

    # -- configuration -------------------------------------------------------------------------

    def reconfigure(self, config: FeedbackConfig) -> None:
        """New settings (the consent file still wins for record/share)."""
        was_recording = self.config.record
        self.config = self.consent.apply(config)
        self.tracker.checkpoints_s = sorted(self.config.checkpoints_s)
        if was_recording and not self.config.record:
            self._stop_tracking()
        elif self.config.record and not was_recording:
            self._start_session()

    def set_record(self, on: bool) -> None:
        self.consent.save(record=on)
        self.reconfigure(replace(self.config, record=on))

    def set_share(self, on: bool) -> None:
        self.consent.save(share=on)
        self.reconfigure(replace(self.config, share=on))

    @property
    def sharing(self) -> bool:
        return bool(self.config.record and self.config.share and self.config.endpoint and self.config.token)

    def _stop_tracking(self) -> None:
        with self._lock:
            self.tracker = EditTracker(self.config.checkpoints_s, clock=self.monotonic)
            self._shown.clear()
            self._episodes.clear()

    # -- episodes ------------------------------------------------------------------------------

    def record_completion_episode(
        self,
        *,
        uri: str,
        position: Pos,
        output: str,
        prompt_text: str = "",
        model_id: str | None,
        adapter_id: str | None = None,
        language: str | None = None,
        context_refs: Iterable[dict] = (),
        latency_s: float | None = None,
        extra: dict | None = None,
        served: ServedPrompt | None = None,
        kind: str = "completion",
        replaces: str = "",
    ) -> str | None:
        """A completion shown to the user; its id, or None when recording is off.

        `kind` "next_edit": a next-edit suggestion, replacing `replaces` at `position` with `output`
        (an episode of its own kind, followed to the same checkpoints once accepted).

        `served` is the prompt it was answered from: its window's text is stored as the episode's
        `prompt_text`, the rest in `extra[SERVED_PROMPT_KEY]` (redacted on the writer thread). Without
        it `prompt_text` is the text before the cursor and `extra` may say how the prompt was built.
        """
        if not self.config.record:
            return None
        if served is not None:
            prompt_text = served.text
            extra = {**(extra or {}), SERVED_PROMPT_KEY: served.to_json(with_text=False)}
        if kind != "completion" and (same := self._still_shown(uri, kind, position, output, replaces)):
            return same  # the same suggestion asked for again (the cursor moved): the same episode
        episode_id = new_id()
        now, mono = self.clock(), self.monotonic()
        self._note_output(episode_id, mono, model_id)
        with self._lock:
            superseded = self._shown.pop((uri, kind), None)
            self._shown[(uri, kind)] = (episode_id, mono)
            self._episodes[episode_id] = {"uri": uri, "position": position, "output": output, "shown": mono,
                                          "replaces": replaces}
            if superseded:
                self._episodes.pop(superseded[0], None)
        if superseded:
            self._event(superseded[0], "dismissed", {"reason": "superseded", "by": episode_id})
        self._episode(
            episode_id,
            kind=kind,
            ts=now,
            model_id=model_id,
            adapter_id=adapter_id,
            uri=uri,
            language=language,
            prompt_text=prompt_text,
            output=output,
            context_refs=list(context_refs),
            extra={**(extra or {}), "position": list(position), "latency_s": latency_s,
                   **({"replaces": replaces} if kind != "completion" else {})},
        )
        self._event(episode_id, "shown", {"uri": uri, "position": list(position)})
        if served is not None and self.config.storage == "full":
            # Reference documents' texts, once per content hash, in the store's table of their own.
            for ref in served.references:
                if ref.text is not None:
                    self._put(REFERENCE_TABLE, {"hash": ref.hash, "ts": now, "text": ref.text})
        return episode_id

    def _still_shown(self, uri: str, kind: str, position: Pos, output: str, replaces: str) -> str | None:
        with self._lock:
            shown = self._shown.get((uri, kind))
            live = self._episodes.get(shown[0]) if shown else None
        if live and (live["position"], live["output"], live["replaces"]) == (position, output, replaces):
            return shown[0]
        return None

    def record_agent_episode(
        self,
        instruction: str,
        model_id: str | None,
        adapter_id: str | None,
        context_refs: Iterable[dict],
        candidates: list[dict],
        chosen: int | None,
        prompt_text: str,
        *,
        uri: str | None = None,
        output: str | None = None,
        steps: list[dict] | None = None,
        extra: dict | None = None,
    ) -> str | None:
        """An agent run: the K candidates ({diff, verified, checks, logprob}) and the chosen index."""
        if not self.config.record:
            return None
        episode_id = new_id()
        self._note_output(episode_id, self.monotonic(), model_id)
        if output is None and chosen is not None and 0 <= chosen < len(candidates):
            output = candidates[chosen].get("diff")
        self._episode(
            episode_id,
            kind="agent",
            ts=self.clock(),
            model_id=model_id,
            adapter_id=adapter_id,
            uri=uri,
            instruction=instruction,
            prompt_text=prompt_text,
            output=output,
            context_refs=list(context_refs),
            candidates=[dict(c) for c in candidates],
            chosen=chosen,
            extra={**(extra or {}), "steps": steps or []},
        )
        return episode_id

    def _episode(self, episode_id: str, **fields: Any) -> None:
        row = dict.fromkeys(("uri", "language", "instruction", "candidates", "chosen"))
        self._put("episodes", {**row, "id": episode_id, "session_id": self.session_id, **fields})

    # -- what the user did ---------------------------------------------------------------------

    def accept_completion(self, episode_id: str, text: str | None, document_text: str | None) -> bool:
        """The user accepted (all of, or `text` of) a shown completion; starts tracking it."""
        if not self.config.record or not episode_id:
            return False
        with self._lock:
            live = self._episodes.pop(episode_id, None)
            for key, (shown, _) in list(self._shown.items()):
                if shown == episode_id:
                    del self._shown[key]
        if live is None:
            self._event(episode_id, "accepted", {"late": True})
            return False
        accepted = text if text is not None else live["output"]
        kind = "accepted" if accepted == live["output"] else "partially_accepted"
        elapsed = self.monotonic() - live["shown"]
        self._event(episode_id, kind, {"chars": len(accepted), "after_s": round(elapsed, 3)})
        if document_text is not None:
            with self._lock:
                self.tracker.track_edit(
                    episode_id, live["uri"], live["position"], accepted, live["replaces"], document_text
                )
        return True

    def episode_uri(self, episode_id: str) -> str | None:
        """The document a live (shown, not yet accepted or dismissed) completion belongs to."""
        with self._lock:
            live = self._episodes.get(episode_id)
        return live["uri"] if live else None

    def track_applied_edit(
        self,
        episode_id: str,
        uri: str,
        range: tuple[Pos, Pos],
        new_text: str,
        old_text: str,
        document_text: str | None = None,
    ) -> bool:
        """An agent edit replacing `range` (before the edit) of `uri` was applied: follow it.

        `document_text` is the document's text now (after the edit, or before it when the editor
        has not reported the change yet); without it (document not open) only the event is kept.
        """
        if not self.config.record:
            return False
        start = tuple(range[0])
        self._event(
            episode_id,
            "applied",
            {
                "uri": uri,
                "range": [list(range[0]), list(range[1])],
                "new_text": new_text,
                "old_text": old_text,
            },
        )
        if document_text is None:
            return False
        with self._lock:
            region = self.tracker.track_edit(episode_id, uri, start, new_text, old_text, document_text)
        return region is not None

    def follows(self, uri: str) -> bool:
        """Whether didChange of `uri` needs to reach `on_did_change` (lock-free: a dict lookup)."""
        return self.tracker.follows(uri)

    def on_did_change(self, uri: str, changes: list[TextChange], text_after: str) -> None:
        """One didChange of `uri` (the hot path: position arithmetic only)."""
        with self._lock:
            self.tracker.apply_changes(uri, changes, text_after)

    def dismiss_shown(self, uri: str, kind: str, reason: str) -> None:
        """The suggestion of `kind` shown in `uri`, if one is live, dismissed by the user (`reason`)."""
        with self._lock:
            shown = self._shown.pop((uri, kind), None)
            if shown:
                self._episodes.pop(shown[0], None)
        if shown:
            self._event(shown[0], "dismissed", {"reason": reason})

    def on_close(self, uri: str) -> None:
        with self._lock:
            self.tracker.close(uri)
            closed = [self._shown.pop(key) for key in list(self._shown) if key[0] == uri]
        for shown in closed:
            self._event(shown[0], "dismissed", {"reason": "closed"})

    def on_open(self, uri: str, text: str) -> None:
        with self._lock:
            self.tracker.reopen(uri, text)

    def on_rename(self, old_uri: str, new_uri: str) -> None:
        with self._lock:
            self.tracker.rename(old_uri, new_uri)

    def note_model(self, model_id: str | None) -> None:
        """The configured model is now `model_id`; a change right after an output is a switch away."""
        previous, self._model_id = self._model_id, model_id
        if previous is None or previous == model_id or not self.config.record:
            return
        last = self._last_output
        after = None if last is None else round(self.monotonic() - last[1], 3)
        self._put(
            "model_switches",
            {
                "id": new_id(),
                "ts": self.clock(),
                "from_model": previous,
                "to_model": model_id,
                "last_episode_id": last[0] if last else None,
                "seconds_after_output": after,
            },
        )

    def _note_output(self, episode_id: str, mono: float, model_id: str | None) -> None:
        self._last_output = (episode_id, mono, model_id)
        if self._model_id is None:
            self._model_id = model_id

    # -- time passing --------------------------------------------------------------------------

    def tick(self) -> int:
        """Judge due checkpoints and time out unaccepted completions; returns rows queued."""
        if not self.config.record:
            return 0
        mono = self.monotonic()
        with self._lock:
            observations = self.tracker.due(mono)
            expired = [
                (key, ep)
                for key, (ep, shown) in self._shown.items()
                if mono - shown >= self.config.dismiss_after_s
            ]
            for key, episode_id in expired:
                del self._shown[key]
                self._episodes.pop(episode_id, None)
        for _, episode_id in expired:
            self._event(episode_id, "dismissed", {"reason": "timeout"})
        for observation in observations:
            self._outcome(observation)
            for listener in self.outcome_listeners:
                try:
                    listener(observation)
                except Exception:  # noqa: BLE001 - a listener must not stop the recording
                    log.exception("feedback: an outcome listener failed")
        if mono - self._session_touched >= _SESSION_TOUCH_S:
            self._session_touched = mono
            self._queue.put(("touch", self.session_id, self.clock()))
        return len(expired) + len(observations)

    def _outcome(self, observation: Observation) -> None:
        self._put(
            "outcomes",
            {
                "id": new_id(),
                "episode_id": observation.episode_id,
                "region_id": observation.region_id,
                "checkpoint_s": observation.checkpoint_s,
                "ts": self.clock(),
                "status": observation.status,
                "distance": round(observation.distance, 4),
                "kept_text": observation.kept_text,
                "source": observation.source,
            },
        )

    def _event(self, episode_id: str | None, kind: str, data: dict) -> None:
        self._put(
            "events",
            {"id": new_id(), "episode_id": episode_id, "kind": kind, "ts": self.clock(), "data": data},
        )

    def _start_session(self) -> None:
        now = self.clock()
        self._queue.put(
            (
                "session",
                {
                    "id": self.session_id,
                    "started_at": now,
                    "last_seen": now,
                    "day": datetime.fromtimestamp(now).strftime("%Y-%m-%d"),
                },
            )
        )

    # -- the writer ----------------------------------------------------------------------------

    def _put(self, table: str, row: dict) -> None:
        if not self.config.record:
            return
        with self._written_cv:
            self._submitted += 1
        self._queue.put(("row", table, row, self.sharing, self.config.storage))

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every row queued so far is written (or dropped); False on timeout."""
        with self._written_cv:
            target = self._submitted
            return self._written_cv.wait_for(lambda: self._written >= target, timeout)

    def pending(self) -> int:
        with self._written_cv:
            return self._submitted - self._written

    def close(self, timeout: float = 5.0) -> None:
        self.flush(timeout)
        self._stopping.set()
        self._queue.put(("stop",))
        self._writer.join(timeout)

    def _write_loop(self) -> None:
        store: FeedbackStore | None = None
        opened: OpenedFile | None = None  # the file the store has open
        backlog: list[tuple] = []
        failures = 0
        stop = False
        while True:
            backlog += self._drain(block=not backlog, timeout=_RETRY_S[min(failures, len(_RETRY_S) - 1)])
            stop = stop or any(item[0] == "stop" for item in backlog)
            if stop and not self._writable(backlog):
                return
            try:
                if store is not None and opened is not None and opened.replaced():
                    self._let_go_of_replaced(store, opened)
                    store = None
                if store is None:
                    store = self.store_factory(self.db_path)
                    opened = OpenedFile(self.db_path)
                    if self._session_row is not None:  # the session goes on in a new file
                        store.write([("sessions", self._session_row)])
                self._commit(store, backlog)
                opened.note_journals()
                backlog, failures = [], 0
                self.last_error = None
                if stop:
                    store.close()
                    return
            except (FeedbackStoreError, sqlite3.Error) as exc:
                if isinstance(exc, sqlite3.Error):
                    exc = translate_sqlite_error(exc, self.db_path)
                failures += 1
                if str(exc) != self.last_error:
                    log.warning("feedback not written yet (%d rows waiting): %s", len(backlog), exc)
                self.last_error = str(exc)
                backlog = self._trim(backlog)
                if self._stopping.is_set():
                    return
                time.sleep(_RETRY_S[min(failures - 1, len(_RETRY_S) - 1)])

    def _let_go_of_replaced(self, store: FeedbackStore, opened: OpenedFile) -> None:
        """The store's file was deleted or replaced while it was open: close it.

        SQLite would go on writing into the unlinked file (every row lost at close) or beside a
        replacement. The writer opens the path again; rows written before stay with the old file.
        """
        log.warning("feedback store %s was deleted or replaced while squidcode ran; recording goes on "
                    "in a new file there (what was written before is not in it)", self.db_path)
        store.close()
        opened.drop_orphan_journals()

    def _drain(self, block: bool, timeout: float) -> list[tuple]:
        items = []
        try:
            items.append(self._queue.get(block=block, timeout=timeout if block else None))
            while len(items) < 5000:
                items.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return items

    @staticmethod
    def _writable(backlog: list[tuple]) -> bool:
        return any(item[0] in ("row", "session", "touch") for item in backlog)

    def _commit(self, store: FeedbackStore, backlog: list[tuple]) -> None:
        # Redaction happens here, on the writer thread, before anything reaches the disk.
        shared = [(i[1], sanitize_row(i[1], i[2], i[4])) for i in backlog if i[0] == "row" and i[3]]
        private = [(i[1], sanitize_row(i[1], i[2], i[4])) for i in backlog if i[0] == "row" and not i[3]]
        for item in backlog:
            if item[0] == "session":
                row = dict(item[1])
                previous = store.last_session_seen()
                gap = None if previous is None else (row["started_at"] - previous) / 86400
                row["days_since_previous"] = None if gap is None else round(gap, 4)
                store.write([("sessions", row)])
                self._session_row = row
            elif item[0] == "touch":
                store.touch_session(item[1], item[2])
        store.write(private)
        store.write(shared, share=True)
        self._mark_written(len(shared) + len(private))

    def _trim(self, backlog: list[tuple]) -> list[tuple]:
        excess = len(backlog) - MAX_PENDING_ROWS
        if excess <= 0:
            return backlog
        self.dropped += excess
        log.warning("feedback store unwritable: dropped the %d oldest rows", excess)
        self._mark_written(sum(1 for item in backlog[:excess] if item[0] == "row"))
        return backlog[excess:]

    def _mark_written(self, count: int) -> None:
        with self._written_cv:
            self._written += count
            self._written_cv.notify_all()

    # -- status --------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The `squidcode.feedback.status` object of docs/protocol.md."""
        counts: dict[str, int | None] = {"episodes": None, "events": None, "pending_upload": None}
        if self.db_path.exists():
            try:
                store = FeedbackStore(self.db_path, readonly=True, timeout_s=0.5)
                try:
                    counts = {
                        "episodes": store.count("episodes"),
                        "events": store.count("events"),
                        "pending_upload": store.outbox_size(),
                    }
                finally:
                    store.close()
            except (FeedbackStoreError, sqlite3.Error) as exc:
                # e.g. the writer has created the file but not yet its tables
                log.info("feedback status without counts: %s", exc)
        return {
            "record": self.config.record,
            "share": self.config.share,
            "storage": self.config.storage,
            "db": str(self.db_path),
            **counts,
            "endpoint": self.config.endpoint,
            "unwritten": self.pending(),
            "dropped": self.dropped,
            "error": self.last_error,
        }
