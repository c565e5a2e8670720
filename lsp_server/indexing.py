"""Runs the workspace index for the server: background pass with `$/progress`, then a status
notification (`squidcode/indexStatus`) whenever what the index holds changes."""

from __future__ import annotations

import asyncio
import logging

from lsprotocol import types

from context.errors import SquidcodeError
from context.index.service import IndexService

from .connection import post_to_loop

__all__ = ["start_index", "stop_index", "INDEX_STATUS"]

log = logging.getLogger(__name__)

INDEX_STATUS = "squidcode/indexStatus"


def start_index(ls) -> None:
    """Start indexing the workspace roots in the background (never awaited by requests)."""
    stop_index(ls)
    config = ls.config.index
    if not config.enabled or not ls.workspace_roots:
        ls.window_log_message(types.LogMessageParams(
            type=types.MessageType.Info,
            message="index: off" if not config.enabled else "index: no workspace folder to index"))
        return
    try:
        service = IndexService(ls.workspace_roots, config)
    except (SquidcodeError, OSError) as exc:
        log.error("index unavailable: %s", exc)
        return
    ls.index_service = service
    loop = asyncio.get_running_loop()
    reporter = _ProgressReporter(ls, loop)

    def finish(error: str | None) -> None:
        asyncio.ensure_future(reporter.end("index failed" if error else "index ready"))
        send_index_status(ls)

    def on_done(report, error) -> None:
        post_to_loop(loop, finish, error)

    service.start(
        on_progress=reporter.report_threadsafe,
        on_done=on_done,
        on_update=lambda: post_to_loop(loop, send_index_status, ls),
    )


def stop_index(ls) -> None:
    service = getattr(ls, "index_service", None)
    if service is not None:
        ls.index_service = None
        service.stop()


def send_index_status(ls) -> None:
    service = getattr(ls, "index_service", None)
    if service is None:
        return
    ls.protocol.notify(INDEX_STATUS, service.status())
    ls.state_changed()


class _ProgressReporter:
    """`$/progress` for the indexing pass, fed from the indexing thread."""

    def __init__(self, ls, loop: asyncio.AbstractEventLoop):
        self._ls = ls
        self._loop = loop
        self._token: str | None = None
        self._last_percent = -1
        self._begun = asyncio.ensure_future(self._begin())

    async def _begin(self) -> None:
        self._token = await self._ls.begin_progress("Indexing", "scanning the workspace")

    def report_threadsafe(self, done: int, total: int) -> None:
        if not total:
            return
        percent = int(done * 100 / total)
        if percent != self._last_percent:
            self._last_percent = percent
            post_to_loop(self._loop, self._report, done, total, percent)

    def _report(self, done: int, total: int, percent: int) -> None:
        if self._token is not None:
            self._ls.work_done_progress.report(self._token, types.WorkDoneProgressReport(
                message=f"{done}/{total} files", percentage=percent))

    async def end(self, message: str) -> None:
        # A small workspace can finish before the client has accepted the progress token.
        await self._begun
        self._ls.end_progress(self._token, message)
