"""The next-edit benchmark (bench/bench_next_edit.py): its delta-chrF, the measure Zed reports for
edit prediction, on small hand-checked changes; and its cases with related code, from a real git
history made here, read by the real model."""

from __future__ import annotations

import subprocess

import pytest

from bench.bench_next_edit import RepositoryReferences, cases, delta_chrf, run_case

ORIGINAL = "total = price * count\nreturn total\n"
EXPECTED = "subtotal = price * count\nreturn total\n"


def test_the_same_change_scores_100_and_no_change_0():
    assert delta_chrf(ORIGINAL, EXPECTED, EXPECTED) == 100.0
    assert delta_chrf(ORIGINAL, EXPECTED, ORIGINAL) == 0.0
    assert delta_chrf(ORIGINAL, ORIGINAL, ORIGINAL) == 100.0  # nothing to do, nothing done


def test_a_near_change_scores_between_and_the_undo_direction_does_not_match():
    # Character n-grams do not know where a change is: the same word changed on the next line
    # scores high, a near spelling lower (fewer of its n-grams are the ones the hunk adds).
    near = delta_chrf(ORIGINAL, EXPECTED, "sub_total = price * count\nreturn total\n")
    elsewhere = delta_chrf(ORIGINAL, EXPECTED, "total = price * count\nreturn subtotal\n")
    assert 25.0 < near < elsewhere < 100.0
    # Removing what the expected change adds is not half right: added and removed never match.
    removal = delta_chrf(EXPECTED, ORIGINAL, ORIGINAL.replace("total =", "subsubtotal ="))
    assert removal == pytest.approx(0.0)


def test_whitespace_is_ignored():
    assert delta_chrf(ORIGINAL, EXPECTED, "subtotal  =  price * count\nreturn total\n") == 100.0


def test_a_case_with_related_code_composes_the_definition_from_another_file(runtime, tmp_path):
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (tmp_path / "shop.py").write_text("def price_of(item):\n    return item.price * item.quantity\n")
    cart = "from shop import price_of\n\n\ndef total(items):\n    first = price_of(items[0])\n" \
           "    count = len(items)\n    rest = price_of(items[1])\n    return first + rest + count\n"
    (tmp_path / "cart.py").write_text(cart)
    git("add", ".")
    git("commit", "-qm", "cart")
    (tmp_path / "cart.py").write_text(cart.replace("price_of(items[0])", "price_of(items[0]) * 2")
                                      .replace("price_of(items[1])", "price_of(items[1]) * 2"))
    git("commit", "-qam", "double")
    [(sha, path, before, first, second, changes)] = list(cases(tmp_path / ".git", 10))
    assert path == "cart.py" and before == cart
    repository = RepositoryReferences(tmp_path / ".git", runtime)
    assert set(repository.tree(sha)) == {"/repo/shop.py", "/repo/cart.py"}
    row = run_case(before, first, second, changes, "model+refs", runtime,
                   repository.for_case(sha, path, before))
    assert repository.documents == 1 and row["seconds"] > 0  # shop.py's price_of, composed once timed


def test_a_rename_across_files_is_followed_and_judged_against_the_commit(tmp_path):
    """A commit renames `total` at its definition and in the two files that import it, but not in a
    file with its own `total`: the chain from the definition reaches both importers' lines (each
    right), offers nothing in the unrelated file, and counts the lines the commit renamed."""
    from bench.bench_next_edit import across_files, across_summary

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    files = {
        "shop/report.py": "def total(items):\n    return sum(items)\n\n\ndef other():\n    return 1\n",
        "shop/checkout.py": "from shop.report import total\n\n\ndef pay(cart):\n    return total(cart)\n",
        "shop/receipt.py": "from shop import report\n\n\ndef show(cart):\n    print(report.total(cart))\n",
        "shop/tax.py": "def total(amounts):\n    return sum(amounts)\n",
    }
    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    git("add", ".")
    git("commit", "-qm", "shop")
    for rel in ("shop/report.py", "shop/checkout.py", "shop/receipt.py"):
        (tmp_path / rel).write_text(files[rel].replace("total", "subtotal"))
    git("commit", "-qam", "rename total")
    rows = across_files(tmp_path / ".git", 10)
    (row,) = [r for r in rows if r["path"] == "shop/report.py"]
    assert (row["old"], row["new"]) == ("total", "subtotal")
    # checkout: its import, then its call; receipt: `report.total`. All right, none in tax.py.
    assert row["offered_elsewhere"] == 3 and row["right_elsewhere"] == 3 and row["wrong"] is None
    assert row["wanted_elsewhere"] == 3
    summary = across_summary(rows)
    assert summary["right_elsewhere"] == 1.0 and summary["recall_elsewhere"] == 1.0


def test_a_repeat_across_files_is_followed_and_a_wrong_offer_ends_the_chain(tmp_path):
    """A commit changes `timeout=5` to `timeout=10` in one call of conn.py and in pool.py, but not in
    the same call in retry.py: the chain offers pool.py's (right), then retry.py's (wrong: the
    commit left it) and stops there."""
    from bench.bench_next_edit import across_files, across_summary

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    call = "    return connect(host, timeout=5)\n"
    files = {"conn.py": "def reconnect(host):\n" + call, "retry.py": "def retry(host):\n" + call,
             "pool.py": "def pool(host):\n" + call}
    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    for rel, text in files.items():
        (tmp_path / rel).write_text(text)
    git("add", ".")
    git("commit", "-qm", "net")
    for rel in ("conn.py", "pool.py"):
        (tmp_path / rel).write_text(files[rel].replace("timeout=5", "timeout=10"))
    git("commit", "-qam", "longer timeout")
    rows = [r for r in across_files(tmp_path / ".git", 10) if r["kind"] == "repeat"]
    (row,) = [r for r in rows if r["path"] == "conn.py"]
    assert (row["offered_elsewhere"], row["right_elsewhere"]) == (2, 1)
    assert row["wrong"]["path"] == "retry.py"
    assert across_summary([row])["right_elsewhere"] == 0.5


def test_a_case_is_adjacent_only_when_no_other_hunk_stands_between_its_two_changes(tmp_path):
    from bench.bench_next_edit import adjacent

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    lines = [f"x{i} = {i}" for i in range(1, 11)]
    (tmp_path / "m.py").write_text("\n".join(lines) + "\n")
    git("add", ".")
    git("commit", "-qm", "one")
    changed = list(lines)
    for i in (0, 3, 4, 8):  # one-line changes at lines 1 and 9, a two-line change at 4-5
        changed[i] = changed[i].replace("=", "= 2 *")
    (tmp_path / "m.py").write_text("\n".join(changed) + "\n")
    git("commit", "-qam", "two")
    [(sha, path, _, first, second, _)] = list(cases(tmp_path / ".git", 10))
    assert (first[0], second[0]) == (1, 9) and not adjacent(tmp_path / ".git", sha, path, 1, 9)
    changed[1], changed[6] = "x2 = -2", "x7 = -7"  # two one-line changes, nothing between
    (tmp_path / "m.py").write_text("\n".join(changed) + "\n")
    git("commit", "-qam", "three")
    [(sha, path, _, first, second, _), _] = list(cases(tmp_path / ".git", 10))
    assert (first[0], second[0]) == (2, 7) and adjacent(tmp_path / ".git", sha, path, 2, 7)


def test_a_wrong_first_offer_whose_next_place_is_the_hunk_is_right_within_two():
    before = "def f(count):\n    x = count\n    return count\n"
    # `count` renamed in the signature; the developer's next hunk is the return, not the line between.
    first, second = (1, "def f(count):", "def f(total):"), (3, "    return count", "    return total")
    row = run_case(before, first, second)
    assert row["exact"] is False and row["exact_within_two"] is True
    # The line between is the first offer: exact at once, so within two as well.
    row = run_case(before, first, (2, "    x = count", "    x = total"))
    assert row["exact"] is True and row["exact_within_two"] is True
