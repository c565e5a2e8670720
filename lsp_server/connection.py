"""The connection to the client, as seen from worker threads and at its end: posting onto an event
loop that may have closed, and a protocol output that tolerates a client that has gone away."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

__all__ = ["ClientOutput", "post_to_loop"]

log = logging.getLogger(__name__)


def post_to_loop(loop: asyncio.AbstractEventLoop, fn: Callable, *args) -> bool:
    """`loop.call_soon_threadsafe(fn, *args)` from a worker thread; False (dropped) once the loop
    has closed: the connection ended while the thread was still reporting."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        return False
    return True


class ClientOutput:
    """The stream the server writes the protocol to, tolerant of a client that has gone away.

    Once a write fails (the client closed its end: a broken pipe, or the stream closed at `exit`)
    the rest is dropped quietly: what the server still reports while it stops has no reader.
    """

    def __init__(self, stream):
        self._stream = stream
        self.closed = False

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            self._stream.write(data)
        except (OSError, ValueError) as exc:  # BrokenPipeError, or "I/O operation on closed file"
            self._lost(exc)

    def flush(self) -> None:
        if self.closed:
            return
        try:
            self._stream.flush()
        except (OSError, ValueError) as exc:
            self._lost(exc)

    def close(self) -> None:
        self.closed = True
        try:
            self._stream.close()
        except (OSError, ValueError):
            pass

    def _lost(self, exc: Exception) -> None:
        self.closed = True
        log.info("the client's end of the connection is closed (%s); output dropped from here", exc)
