"""Edit tracking: regions moved through incremental changes, judged at checkpoints on a test clock."""

from __future__ import annotations

import pytest

from feedback.tracking import EditTracker, TextChange, classify, normalised_distance, region_text


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def apply(text: str, change: TextChange) -> str:
    """The document after `change` (a reference implementation, code points as columns)."""
    lines = text.split("\n")

    def offset(pos):
        return sum(len(line) + 1 for line in lines[: pos[0]]) + pos[1]

    return text[: offset(change.start)] + change.text + text[offset(change.end) :]


@pytest.fixture
def clock() -> Clock:
    return Clock()


def tracker_with(clock: Clock, text: str, start, end, new_text: str, old_text: str = ""):
    tracker = EditTracker([30, 120], clock=clock)
    region = tracker.track("ep", "file:///a.py", start, end, new_text, old_text, text)
    return tracker, region


def edit(tracker: EditTracker, text: str, *changes: TextChange) -> str:
    for change in changes:
        text = apply(text, change)
    tracker.apply_changes("file:///a.py", list(changes), text)
    return text


BASE = "def f(x):\n    return x + 1\n\nprint(f(2))\n"
INSERTED = "return x + 1"


def current(tracker, text):
    (region,) = tracker.tracked()
    return region_text(text, region.start, region.end)


def test_changes_before_the_region_move_it(clock):
    tracker, _ = tracker_with(clock, BASE, (1, 4), (1, 16), INSERTED)
    text = edit(tracker, BASE, TextChange((0, 0), (0, 0), "import os\n\n"))
    text = edit(tracker, text, TextChange((3, 0), (3, 4), "  "))  # same line, before the region
    assert current(tracker, text) == INSERTED
    # Deleting the line breaks above pulls it up again.
    text = edit(tracker, text, TextChange((0, 9), (2, 0), ""))
    assert current(tracker, text) == INSERTED


def test_changes_after_or_touching_the_end_leave_it(clock):
    tracker, region = tracker_with(clock, BASE, (1, 4), (1, 16), INSERTED)
    text = edit(tracker, BASE, TextChange((1, 16), (1, 16), "  # note"), TextChange((3, 0), (3, 5), "log"))
    assert (region.start, region.end) == ((1, 4), (1, 16))
    assert current(tracker, text) == INSERTED


def test_edits_inside_grow_and_shrink_the_region(clock):
    tracker, _ = tracker_with(clock, BASE, (1, 4), (1, 16), INSERTED)
    text = edit(tracker, BASE, TextChange((1, 15), (1, 16), "2\n    # two lines now"))
    assert current(tracker, text) == "return x + 2\n    # two lines now"
    text = edit(tracker, text, TextChange((1, 10), (2, 19), ""))
    assert current(tracker, text) == "return"


def test_a_multi_edit_change_applies_in_order(clock):
    tracker, _ = tracker_with(clock, BASE, (1, 4), (1, 16), INSERTED)
    # One didChange, three edits, each against the text the previous one left.
    text = edit(
        tracker,
        BASE,
        TextChange((0, 0), (0, 0), "# a\n"),
        TextChange((2, 4), (2, 10), "yield"),
        TextChange((2, 0), (2, 0), "\t"),
    )
    assert current(tracker, text) == "yield x + 1"


def test_changes_across_the_boundaries_clip_the_region(clock):
    tracker, _ = tracker_with(clock, BASE, (1, 4), (1, 16), INSERTED)
    text = edit(tracker, BASE, TextChange((1, 0), (1, 10), "  out ="))  # across the start
    assert current(tracker, text) == "  out = x + 1"
    text = edit(tracker, text, TextChange((1, 12), (3, 2), "9; "))  # across the end
    assert current(tracker, text) == "  out = x + 9; "


def test_a_full_text_change_is_diffed_into_a_range(clock):
    tracker, _ = tracker_with(clock, BASE, (1, 4), (1, 16), INSERTED)
    after = "# header\n" + BASE.replace("print(f(2))", "print(f(3))")
    tracker.apply_changes("file:///a.py", [TextChange(None, None, after)], after)
    assert current(tracker, after) == INSERTED


def test_utf16_columns_count_astral_characters_twice(clock):
    text = 'x = "😀"; y = 1\n'
    tracker = EditTracker([30], clock=clock)
    tracker.track("ep", "u", (0, 10), (0, 15), "y = 1", "", text)  # 😀 is 2 UTF-16 units
    after = 'x = "😀!"; y = 1\n'
    tracker.apply_changes("u", [TextChange((0, 7), (0, 7), "!")], after)
    (region,) = tracker.tracked()
    assert region_text(after, region.start, region.end) == "y = 1"


def test_checkpoints_judge_on_the_test_clock(clock):
    tracker, region = tracker_with(clock, BASE, (1, 4), (1, 16), INSERTED)
    clock.now += 29.9
    assert tracker.due() == []
    clock.now += 0.2
    (first,) = tracker.due()
    assert (first.checkpoint_s, first.status, first.kept_text, first.source) == (
        30,
        "unchanged",
        INSERTED,
        "open",
    )
    edit(tracker, BASE, TextChange((1, 4), (1, 16), "return x * 2 + 1 if x else 0"))
    clock.now += 200  # past the last checkpoint: judged once more, then forgotten
    (last,) = tracker.due()
    assert last.checkpoint_s == 120 and last.status == "modified"
    assert tracker.tracked() == [] and tracker.next_due() is None


def test_undo_of_an_insertion_is_a_revert(clock):
    tracker, _ = tracker_with(clock, BASE, (1, 4), (1, 16), INSERTED)
    edit(tracker, BASE, TextChange((1, 4), (1, 16), ""))
    clock.now += 31
    (observation,) = tracker.due()
    assert observation.status == "reverted"


def test_deleting_an_insertion_bit_by_bit_is_removed_not_reverted(clock):
    tracker, _ = tracker_with(clock, BASE, (1, 4), (1, 16), INSERTED)
    text = edit(tracker, BASE, TextChange((1, 10), (1, 16), ""))
    edit(tracker, text, TextChange((1, 4), (1, 10), ""))
    clock.now += 31
    assert tracker.due()[0].status == "removed"


def test_agent_edit_undone_by_retyping_the_old_text_is_reverted(clock):
    old = "return x + 1"
    text = BASE.replace(old, "return x + 2")
    tracker, _ = tracker_with(clock, text, (1, 4), (1, 16), "return x + 2", old_text=old)
    edit(tracker, text, TextChange((1, 15), (1, 16), "1"))
    clock.now += 31
    assert tracker.due()[0].status == "reverted"


def test_swallowed_region_is_found_again_after_a_reformat(clock):
    tracker, _ = tracker_with(clock, BASE, (1, 4), (1, 16), INSERTED)
    formatted = BASE.replace("\n\nprint", "\n\n\nprint")
    # A formatter replacing the whole document as one range edit.
    tracker.apply_changes("file:///a.py", [TextChange((0, 0), (4, 0), formatted)], formatted)
    clock.now += 31
    assert tracker.due()[0].status == "unchanged"


def test_closed_documents_are_judged_on_their_last_text_and_resume_on_reopen(clock):
    tracker, _ = tracker_with(clock, BASE, (1, 4), (1, 16), INSERTED)
    text = edit(tracker, BASE, TextChange((1, 15), (1, 16), "5"))
    tracker.close("file:///a.py")
    assert tracker.reopen("file:///a.py", "something else") is False
    clock.now += 31
    (observation,) = tracker.due()
    assert (observation.status, observation.source, observation.kept_text) == (
        "mostly_unchanged",
        "closed",
        "return x + 5",
    )
    assert tracker.reopen("file:///a.py", text) is True
    text = edit(tracker, text, TextChange((1, 4), (1, 16), ""))
    clock.now += 100
    assert tracker.due()[0].status == "removed"


def test_renames_carry_regions_to_the_new_uri(clock):
    tracker, _ = tracker_with(clock, BASE, (1, 4), (1, 16), INSERTED)
    tracker.rename("file:///a.py", "file:///b.py")
    after = "# moved\n" + BASE
    tracker.apply_changes("file:///b.py", [TextChange((0, 0), (0, 0), "# moved\n")], after)
    (region,) = tracker.tracked("file:///b.py")
    assert region_text(after, region.start, region.end) == INSERTED


def test_an_accepted_insertion_not_yet_reported_is_expected_in_the_next_change(clock):
    tracker = EditTracker([30], clock=clock)
    before = "def f(x):\n    \n"
    assert tracker.track_edit("ep", "u", (1, 4), INSERTED, "", before) is None
    after = "def f(x):\n    " + INSERTED + "\n"
    (region,) = tracker.apply_changes("u", [TextChange((1, 4), (1, 4), INSERTED)], after)
    assert region_text(after, region.start, region.end) == INSERTED


def test_an_insertion_already_in_the_document_is_found_near_the_cursor(clock):
    tracker = EditTracker([30], clock=clock)
    text = "a = 1\nb = a + 1\nc = a + 1\n"
    region = tracker.track_edit("ep", "u", (2, 4), "a + 1", "", text)
    assert (region.start, region.end) == ((2, 4), (2, 9))


@pytest.mark.parametrize(
    ("current", "expected"),
    [
        ("return x + 1", "unchanged"),
        ("return x + 2", "mostly_unchanged"),
        ("raise ValueError(x)", "modified"),
        ("   ", "removed"),
        ("", "removed"),
    ],
)
def test_classification(current, expected):
    assert classify("return x + 1", "", current)[0] == expected


def test_normalised_distance_is_levenshtein_over_the_longer():
    assert normalised_distance("kitten", "sitting") == pytest.approx(3 / 7)
    assert normalised_distance("", "abc") == 1.0
    assert normalised_distance("same", "same") == 0.0
    long_a, long_b = "x" * 3000, "x" * 2900 + "y" * 100
    assert normalised_distance(long_a, long_b) == pytest.approx(100 / 3000)


def test_close_then_rename_then_open_resumes_on_the_new_name(clock):
    tracker, _ = tracker_with(clock, BASE, (1, 4), (1, 16), INSERTED)
    tracker.close("file:///a.py")
    tracker.rename("file:///a.py", "file:///b.py")
    assert tracker.reopen("file:///b.py", BASE)
    after = BASE.replace("x + 1", "x + 9")
    tracker.apply_changes("file:///b.py", [TextChange((1, 15), (1, 16), "9")], after)
    clock.now += 31
    (observation,) = tracker.due()
    assert (observation.kept_text, observation.source) == ("return x + 9", "open")
