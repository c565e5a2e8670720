"""Progress for work people wait on (indexing, the one-time model conversion, training steps,
benchmarks): a live bar in a terminal, plain rate-limited lines everywhere else.

    with progress(total, "indexing /src", unit="files") as shown:
        indexer.index_all(progress=shown.update_to)   # the core's (done, total) callback
    with progress(None, "training", unit="steps") as shown:
        shown.update_to(step, total=steps, reward=0.41, kl=0.003)

Everything goes to stderr, never to stdout: stdout carries the protocol in `squidcode serve` and
the JSON of `--json` commands. When stderr is a terminal, tqdm draws a bar; otherwise (CI, a pipe,
an editor reading the server's stderr into its log) the display writes plain lines: one when it
starts, then at most one per tenth of the total or per `interval_s` seconds, and one when it ends.

The core keeps reporting through its own callbacks (the indexer's `progress(done, total)`, the
trainer's `on_step`): the CLI feeds them into this display, the language server into `$/progress`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

__all__ = ["PLAIN_INTERVAL_S", "ProgressDisplay", "note", "progress", "start_progress"]

# A log read later needs a line every few seconds at most; more is noise.
PLAIN_INTERVAL_S = 5.0
PREFIX = "squidcode: "


@contextmanager
def progress(
    total: int | None, description: str, *, unit: str = "", stream: TextIO | None = None,
    live: bool | None = None, interval_s: float = PLAIN_INTERVAL_S,
) -> Iterator[ProgressDisplay]:
    """A display of `total` units of work (None: not known yet) on `stream` (default: stderr).

    `live` forces the bar (True) or plain lines (False); by default the bar is drawn only when the
    stream is a terminal.
    """
    display = start_progress(total, description, unit=unit, stream=stream, live=live, interval_s=interval_s)
    try:
        yield display
    except BaseException:
        display.close(failed=True)
        raise
    display.close()


def start_progress(
    total: int | None, description: str, *, unit: str = "", stream: TextIO | None = None,
    live: bool | None = None, interval_s: float = PLAIN_INTERVAL_S,
) -> ProgressDisplay:
    """`progress()` for a display whose end is not a block's end: the caller calls `close()`."""
    out = stream if stream is not None else sys.stderr
    if live is None:
        live = _is_terminal(out)
    return ProgressDisplay(total, description, unit, out, live, interval_s)


def note(message: str, stream: TextIO | None = None) -> None:
    """One line about a stage that has no count (the promotion gate, a benchmark's phase)."""
    _write_line(PREFIX + message, stream if stream is not None else sys.stderr)


class ProgressDisplay:
    """What `progress()` yields. `update(n, **postfix)` adds n units; `update_to(done, total)` sets
    the position (the shape of the core's callbacks). Postfix values are shown after the count
    (`reward=0.412`) and kept until replaced; a value of None removes its key."""

    def __init__(self, total: int | None, description: str, unit: str, stream: TextIO, live: bool,
                 interval_s: float, clock: Callable[[], float] = time.monotonic):
        self.total = total
        self.done = 0
        self.postfix: dict[str, object] = {}
        self.description = description
        self.unit = unit
        self._stream = stream
        self._interval_s = interval_s
        self._clock = clock
        self._started = self._last_line = clock()
        self._last_tenth = 0
        self.closed = False
        self._bar = _tqdm_bar(total, description, unit, stream) if live else None
        if self._bar is None:
            self._write("started" + (f", {total} {unit}".rstrip() if total else ""))

    def update(self, n: int = 1, **postfix) -> None:
        self._advance(self.done + n, None, postfix)

    def update_to(self, done: int, total: int | None = None, **postfix) -> None:
        self._advance(done, total, postfix)

    def _advance(self, done: int, total: int | None, postfix: dict) -> None:
        if self.closed:
            return
        step = done - self.done
        self.done = done
        if total is not None:
            self.total = total
        for key, value in postfix.items():
            if value is None:
                self.postfix.pop(key, None)
            else:
                self.postfix[key] = value
        if self._bar is not None:
            self._draw(step, total, bool(postfix))
        elif self._line_due():
            self._write(self._position() + f", {self._elapsed():.1f}s" + self._postfix_text())

    def _draw(self, step: int, total: int | None, postfix_changed: bool) -> None:
        if total is not None and total != self._bar.total:
            self._bar.total = total
        if postfix_changed:
            self._bar.set_postfix_str(_format_postfix(self.postfix, ", "), refresh=False)
        if step:
            self._bar.update(step)
        else:
            self._bar.refresh()

    def _line_due(self) -> bool:
        if self.total and self.done >= self.total:
            return False  # the closing line reports the end
        now = self._clock()
        tenth = int(10 * self.done / self.total) if self.total else 0
        if now - self._last_line < self._interval_s and tenth <= self._last_tenth:
            return False
        self._last_line, self._last_tenth = now, tenth
        return True

    def close(self, failed: bool = False) -> None:
        """End the display: close the bar, or write the last line (done, stopped short, failed)."""
        if self.closed:
            return
        self.closed = True
        if self._bar is not None:
            self._bar.close()
            return
        elapsed = f"{self._elapsed():.1f}s"
        if failed:
            line = f"failed at {self._position()} after {elapsed}"
        elif self.total and self.done < self.total:
            line = f"stopped at {self._position()} after {elapsed}"
        else:
            line = f"done, {self._position()} in {elapsed}"
        self._write(line + self._postfix_text())

    def _position(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        if not self.total:
            return f"{self.done}{unit}"
        return f"{self.done}/{self.total}{unit} ({int(100 * self.done / self.total)}%)"

    def _elapsed(self) -> float:
        return self._clock() - self._started

    def _postfix_text(self) -> str:
        return f", {_format_postfix(self.postfix, ', ')}" if self.postfix else ""

    def _write(self, text: str) -> None:
        _write_line(f"{PREFIX}{self.description}: {text}", self._stream)


def _write_line(line: str, stream: TextIO) -> None:
    try:
        print(line, file=stream, flush=True)
    except (OSError, ValueError):
        pass  # stderr gone (a closed pipe): the work goes on without its progress lines


def _format_postfix(postfix: dict[str, object], sep: str) -> str:
    return sep.join(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}"
                    for key, value in postfix.items())


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def _tqdm_bar(total: int | None, description: str, unit: str, stream: TextIO):
    from tqdm import tqdm  # only for a terminal: plain lines need nothing beyond the stdlib

    return tqdm(total=total, desc=description, unit=unit or "it", file=stream, dynamic_ncols=True,
                mininterval=0.2)
