"""Team collection, opt-in: a background thread that uploads the outbox to the team's collector.

Only rows recorded while sharing was on are in the outbox (`FeedbackStore.write(share=True)`), and
the outbox lives in the database, so it survives restarts and offline spells. Each row keeps its
id, and the collector ignores ids it has, so a batch sent twice (a lost response) is stored once.
The reference documents (Squid) a shared completion was composed with go with it, once per
collector: the team trains on the prompt its members were served.

The rules, per answer: 2xx: the batch leaves the outbox. 401/403: the token is wrong; uploads pause
until the settings change. 413: the batch is halved (a single row too big is dropped). 408/429/5xx,
no answer: retry with exponential backoff. Any other 4xx: the collector cannot use the batch;
retrying cannot help, so it is dropped, and said so in the log.
"""

from __future__ import annotations

import logging
import random
import ssl
import threading
from pathlib import Path

import httpx

from context.errors import FeedbackStoreError, FeedbackUploadError

from .redact import RULES_VERSION
from .store import FeedbackStore, collector_key

__all__ = ["Uploader", "UPLOAD_PATH", "MAX_BACKOFF_S", "collector_tls"]

log = logging.getLogger(__name__)

UPLOAD_PATH = "/v1/events"


def collector_tls(ca_file: str | None) -> ssl.SSLContext | bool:
    """httpx's `verify` for the collector: the default checks, or the system's CAs and `ca_file`'s."""
    if not ca_file:
        return True
    path = Path(ca_file).expanduser()
    context = ssl.create_default_context()
    try:
        context.load_verify_locations(cafile=str(path))
    except (OSError, ssl.SSLError) as exc:
        raise FeedbackUploadError(f"feedback.ca_file {path} is not a readable PEM certificate: {exc}"
                                  ) from exc
    return context


MAX_BACKOFF_S = 300.0
_TIMEOUT_S = 10.0


class Uploader:
    """Sends the outbox of `recorder`'s store while `recorder.sharing`; never raises into its caller."""

    def __init__(self, recorder, transport: httpx.BaseTransport | None = None):
        self.recorder = recorder
        self.transport = transport
        self.failures = 0
        self.sent = 0
        self.dropped = 0
        self.paused: str | None = None  # why uploads wait for a settings change
        self.last_result = "idle"
        self._batch_limit: int | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="squid-feedback-upload", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Settings changed (or a test wants a round now): clear a pause and try at once."""
        self.paused = None
        self.failures = 0
        self._wake.set()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _delay(self) -> float:
        interval = self.recorder.config.upload_interval_s
        if self.failures == 0:
            return interval
        base = min(1.0, interval)
        return min(MAX_BACKOFF_S, base * 2 ** (self.failures - 1)) * random.uniform(0.8, 1.2)

    def _run(self) -> None:
        store: FeedbackStore | None = None
        client: httpx.Client | None = None
        ca_file: str | None = None
        try:
            while not self._stop.is_set():
                self._wake.wait(self._delay())
                self._wake.clear()
                if self._stop.is_set() or self.paused or not self.recorder.sharing:
                    continue
                try:
                    if client is None or ca_file != self.recorder.config.ca_file:
                        # A new CA file in the settings takes effect at the next round.
                        if client is not None:
                            client.close()
                            client = None
                        ca_file = self.recorder.config.ca_file
                        client = httpx.Client(transport=self.transport, timeout=_TIMEOUT_S,
                                              verify=collector_tls(ca_file))
                    store = store or FeedbackStore(self.recorder.db_path)
                    self.last_result = self.send_once(client, store)
                except FeedbackUploadError as exc:  # the CA file: nothing to retry until it changes
                    self.paused = str(exc)
                    log.warning("feedback sharing paused: %s", exc)
                except FeedbackStoreError as exc:
                    self.failures += 1
                    log.warning("feedback upload waits for the store: %s", exc)
                except Exception:  # noqa: BLE001 - the uploader must never take the server down
                    self.failures += 1
                    log.exception("feedback upload failed unexpectedly; will retry")
        finally:
            if client is not None:
                client.close()

    def send_once(self, client: httpx.Client, store: FeedbackStore) -> str:
        """One round: send up to one batch; returns what happened (for logs and tests)."""
        config = self.recorder.config
        limit = self._batch_limit or config.upload_batch
        delivered_to = collector_key(config.endpoint or "", config.token or "")
        batch = store.outbox_batch(limit, delivered_to)
        if not batch:
            return "idle"
        url = config.endpoint.rstrip("/") + UPLOAD_PATH
        try:
            response = client.post(
                url, json={"events": batch, "redaction_rules": RULES_VERSION},
                headers={"Authorization": f"Bearer {config.token}"},
            )
        except httpx.HTTPError as exc:
            return self._retry(FeedbackUploadError(f"collector {config.endpoint} unreachable: {exc}"))
        code = response.status_code
        ids = [item["id"] for item in batch]
        if 200 <= code < 300:
            store.outbox_delivered(ids, delivered_to)
            self.sent += len(ids)
            self.failures, self._batch_limit = 0, None
            if len(batch) == limit:
                self._wake.set()  # more waiting: next round at once
            return f"sent {len(ids)}"
        if code in (401, 403):
            self.paused = f"the collector refused the token ({code})"
            log.warning("feedback sharing paused: %s; fix feedback.token", self.paused)
            return "unauthorized"
        if code == 413:
            if len(batch) == 1:
                return self._drop(store, ids, "too large for the collector")
            self._batch_limit = max(1, len(batch) // 2)
            self._wake.set()
            return "smaller"
        if code in (408, 429) or code >= 500:
            return self._retry(FeedbackUploadError(f"collector answered {code}"))
        return self._drop(store, ids, f"rejected by the collector ({code}: {response.text[:200]})")

    def _retry(self, error: FeedbackUploadError) -> str:
        self.failures += 1
        log.warning("feedback upload will be retried (attempt %d): %s", self.failures, error)
        return "retry"

    def _drop(self, store: FeedbackStore, ids: list[str], why: str) -> str:
        store.outbox_remove(ids)
        self.dropped += len(ids)
        log.warning("feedback upload: dropped %d rows %s", len(ids), why)
        return "dropped"
