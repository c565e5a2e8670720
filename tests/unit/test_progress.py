"""The progress display: plain, rate-limited lines on stderr when it is not a terminal, a live bar
when it is, and never a byte on stdout."""

from __future__ import annotations

import io

import pytest

from context.progress import ProgressDisplay, note, progress


class TerminalStream(io.StringIO):
    """A StringIO that says it is a terminal, as stderr does in an interactive shell."""

    def isatty(self) -> bool:
        return True


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(text: str) -> list[str]:
    return text.strip().splitlines()


def test_plain_lines_go_to_stderr_and_nothing_to_stdout(capsys):
    with progress(4, "indexing /src", unit="files") as shown:
        for _ in range(4):
            shown.update(1)
    out, err = capsys.readouterr()
    assert out == ""
    written = lines(err)
    assert written[0] == "squidcode: indexing /src: started, 4 files"
    assert all(line.startswith("squidcode: indexing /src: ") for line in written)
    assert written[-1].startswith("squidcode: indexing /src: done, 4/4 files (100%) in ")
    assert "\r" not in err  # no bar drawing into a log


def test_plain_lines_are_limited_to_one_per_tenth(capsys):
    with progress(1000, "work") as shown:
        for _ in range(1000):
            shown.update(1)
    written = lines(capsys.readouterr().err)
    # started, one line per tenth reached before the end (10%..90%), done
    assert len(written) == 11
    assert [line.split(": ", 2)[2].split(" ")[0] for line in written[1:-1]] == [
        f"{n}/1000" for n in range(100, 1000, 100)]


def test_plain_lines_without_a_total_come_at_most_every_interval():
    stream, clock = io.StringIO(), ManualClock()
    shown = ProgressDisplay(None, "training", "steps", stream, live=False, interval_s=5.0, clock=clock)
    for _ in range(20):
        clock.now += 1.0
        shown.update(1)
    shown.close()
    written = lines(stream.getvalue())
    assert written[0] == "squidcode: training: started"
    assert [line.split(": ", 2)[2] for line in written[1:-1]] == [
        "5 steps, 5.0s", "10 steps, 10.0s", "15 steps, 15.0s", "20 steps, 20.0s"]
    assert written[-1] == "squidcode: training: done, 20 steps in 20.0s"


def test_postfix_values_are_shown_kept_and_removed_with_none():
    stream, clock = io.StringIO(), ManualClock()
    shown = ProgressDisplay(3, "converting", "stages", stream, live=False, interval_s=5.0, clock=clock)
    shown.update(0, stage="tokenizer")
    clock.now += 3.0
    shown.update(1, stage="weights", kl=0.0031234567)
    shown.update(1, stage=None)
    shown.close()
    written = lines(stream.getvalue())
    assert written[1] == "squidcode: converting: 1/3 stages (33%), 3.0s, stage=weights, kl=0.003123"
    assert written[2] == "squidcode: converting: 2/3 stages (66%), 3.0s, kl=0.003123"
    assert written[-1] == "squidcode: converting: stopped at 2/3 stages (66%) after 3.0s, kl=0.003123"


def test_update_to_takes_the_cores_done_and_total_callback_shape():
    stream = io.StringIO()
    with progress(None, "indexing", unit="files", stream=stream) as shown:
        shown.update_to(0, 50)
        shown.update_to(25, 50)
        shown.update_to(50, 50)
    written = lines(stream.getvalue())
    assert written[1].startswith("squidcode: indexing: 25/50 files (50%), ")
    assert written[-1].startswith("squidcode: indexing: done, 50/50 files (100%) in ")


def test_a_failure_inside_the_block_says_so_and_propagates():
    stream = io.StringIO()
    with pytest.raises(KeyError), progress(10, "work", unit="items", stream=stream) as shown:
        shown.update(3)
        raise KeyError("boom")
    assert lines(stream.getvalue())[-1].startswith("squidcode: work: failed at 3/10 items (30%) after ")


def test_a_terminal_gets_a_live_bar_instead_of_lines():
    stream = TerminalStream()
    with progress(4, "indexing", unit="files", stream=stream) as shown:
        shown.update(2, reward=0.5)
        shown.update(2)
    drawn = stream.getvalue()
    assert "\r" in drawn and "indexing" in drawn and "4/4" in drawn and "reward=0.5" in drawn
    assert "squidcode: " not in drawn


def test_note_writes_one_line_to_stderr(capsys):
    note("promotion gate: evaluating")
    assert capsys.readouterr() == ("", "squidcode: promotion gate: evaluating\n")


def test_a_closed_stream_does_not_stop_the_work():
    stream = io.StringIO()
    stream.close()
    with progress(2, "work", stream=stream) as shown:
        shown.update(2)
    note("still fine", stream)
