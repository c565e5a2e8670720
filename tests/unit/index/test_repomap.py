"""render_repo_map(): the focus file's dependencies first, specific names outweigh common ones,
`names` pull their files up, the token budget holds, and the output is deterministic."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from context.index.indexer import Indexer
from context.index.repomap import default_token_counter, rank_files, render_repo_map
from context.index.store import IndexStore

FILES = {
    "app/main.py": """
        from shop.db import Database, open_database
        from shop.models import Order

        def main():
            db = open_database("shop.sqlite")
            order = Order(db, 7)
            order.total_price()
            Database.vacuum(db)
            setup()
    """,
    "shop/db.py": """
        class Database:
            def __init__(self, path):
                self.path = path

            def vacuum(self):
                return self.path


        def open_database(path):
            return Database(path)


        def setup():
            pass
    """,
    "shop/models.py": """
        from shop.pricing import apply_discount
        from util.text import slugify

        class Order:
            def __init__(self, db, number):
                self.db = db
                self.number = number

            def total_price(self):
                return apply_discount(100, 0.1)

            def slug(self):
                return slugify(str(self.number))
    """,
    "shop/pricing.py": """
        def apply_discount(amount, rate):
            return amount * (1 - rate)


        def setup():
            pass
    """,
    "util/text.py": """
        def slugify(text):
            return "-".join(text.lower().split())


        def setup():
            pass
    """,
    # Unrelated to app/main.py: nothing it uses lives here, and it uses nothing of the others.
    "tools/plot.py": """
        def draw_chart(points):
            return [p * 2 for p in points]


        def render_legend(labels):
            return ", ".join(labels)


        def setup():
            pass
    """,
    "tools/report.py": """
        from tools.plot import draw_chart, render_legend

        def report():
            draw_chart([1, 2])
            render_legend(["a"])
    """,
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("shop")
    for rel, body in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(body).lstrip("\n"), encoding="utf-8")
    store = IndexStore(tmp_path_factory.mktemp("db") / "index.db")
    Indexer([root], store).index_all()
    yield store
    store.close()


def _files(repo_map: str) -> list[str]:
    return [line[:-1] for line in repo_map.splitlines() if line and not line.startswith(" ")]


def _block(repo_map: str, rel: str) -> list[str]:
    lines = repo_map.splitlines()
    start = lines.index(rel + ":") + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith(" ")), len(lines))
    return lines[start:end]


def test_focus_dependencies_come_first(store):
    repo_map = render_repo_map(store, focus="app/main.py", token_budget=4000)
    files = _files(repo_map)
    assert "app/main.py" not in files
    assert set(files[:2]) == {"shop/db.py", "shop/models.py"}
    # Second-hand dependencies (through models.py) rank before files main.py never reaches.
    assert files.index("shop/pricing.py") < files.index("tools/plot.py")
    assert files.index("util/text.py") < files.index("tools/plot.py")


def test_focus_by_absolute_path_matches_focus_by_rel(store):
    main = next(p for p, _ in rank_files(store) if p.endswith("/app/main.py"))
    assert Path(main).is_absolute()
    assert render_repo_map(store, focus=main) == render_repo_map(store, focus="app/main.py")


def test_common_names_carry_less_weight(store):
    """`setup` is defined in four files: main.py's call to it must not lift tools/plot.py much."""
    ranks = rank_files(store, focus="app/main.py")
    db = next(r for p, r in ranks if p.endswith("/shop/db.py"))
    plot = next(r for p, r in ranks if p.endswith("/tools/plot.py"))
    assert db > 3 * plot, ranks


def test_names_pull_their_definitions_up(store):
    plain = _files(render_repo_map(store, focus="app/main.py", token_budget=4000))
    named = _files(render_repo_map(store, focus="app/main.py", names=["draw_chart"], token_budget=4000))
    assert named.index("tools/plot.py") < plain.index("tools/plot.py")


def test_lists_most_referenced_signatures_with_their_lines(store):
    repo_map = render_repo_map(store, focus="app/main.py", token_budget=4000)
    block = _block(repo_map, "shop/db.py")
    assert "  class Database (line 1)" in block
    assert "    def vacuum(self) (line 5)" in block
    assert "  def open_database(path) (line 9)" in block
    # Listed in line order.
    assert block.index("  class Database (line 1)") < block.index("  def open_database(path) (line 9)")


@pytest.mark.parametrize("budget", [1, 15, 40, 80, 160, 1024])
def test_respects_the_token_budget(store, budget):
    repo_map = render_repo_map(store, focus="app/main.py", token_budget=budget)
    assert default_token_counter(repo_map) <= budget
    if budget >= 40:
        assert repo_map.startswith(("shop/db.py:", "shop/models.py:"))


def test_bigger_budget_shows_more_and_keeps_the_order(store):
    small = render_repo_map(store, focus="app/main.py", token_budget=60)
    large = render_repo_map(store, focus="app/main.py", token_budget=600)
    assert len(large) > len(small) > 0
    assert _files(large)[: len(_files(small))] == _files(small)


def test_custom_token_counter(store):
    def words(text: str) -> int:
        return len(text.split())

    repo_map = render_repo_map(store, focus="app/main.py", token_budget=25, count_tokens=words)
    assert 0 < words(repo_map) <= 25


def test_deterministic(store):
    first = render_repo_map(store, focus="shop/models.py", names=["slugify"], token_budget=300)
    assert first == render_repo_map(store, focus="shop/models.py", names=["slugify"], token_budget=300)
    assert first == render_repo_map(store, focus="shop/models.py", names=("slugify",), token_budget=300)


def test_without_focus_and_on_an_empty_index(store, tmp_path):
    assert _files(render_repo_map(store, token_budget=4000))
    with IndexStore(tmp_path / "empty.db") as empty:
        assert render_repo_map(empty, focus="x.py") == ""
    assert render_repo_map(store, focus="no/such/file.py", token_budget=0) == ""


def test_graph_is_reused_until_the_index_changes(tmp_path, monkeypatch):
    from context.index import repomap

    (tmp_path / "a.py").write_text("from b import helper\n\n\ndef main():\n    return helper()\n")
    (tmp_path / "b.py").write_text("def helper():\n    return 1\n")
    builds = []
    real_build = repomap._build_graph
    # Counts builds; the real builder still does the work.
    monkeypatch.setattr(repomap, "_build_graph",
                        lambda s, pause=None: builds.append(1) or real_build(s, pause))
    with IndexStore(tmp_path / "db" / "index.sqlite3") as store:
        indexer = Indexer([tmp_path], store)
        indexer.index_all()
        first = render_repo_map(store, focus=str(tmp_path / "a.py"))
        assert render_repo_map(store, focus=str(tmp_path / "a.py")) == first
        assert len(builds) == 1
        (tmp_path / "b.py").write_text("def helper_renamed():\n    return 1\n")
        indexer.update_paths([tmp_path / "b.py"])
        changed = render_repo_map(store, focus=str(tmp_path / "a.py"))
        assert len(builds) == 2
        assert "helper_renamed" in changed and "def helper()" not in changed
