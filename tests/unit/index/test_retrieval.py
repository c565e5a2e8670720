"""search(): definitions found first, behaviour questions answered, fusion at least as good as either
ranker, and odd queries handled — on a small real repository indexed with the real Indexer."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from context.index.indexer import Indexer
from context.index.retrieval import MODES, analyse_query, search, split_identifier
from context.index.store import IndexStore

FILES = {
    "netkit/urls.py": '''
        """Small URL helpers."""

        def split_url(url):
            """Split a URL into scheme, host, path and query parts."""
            scheme, _, rest = url.partition("://")
            host, _, path = rest.partition("/")
            path, _, query = path.partition("?")
            return scheme, host, "/" + path, query


        def join_url(base, ref):
            """Resolve a reference against a base address the way a browser does."""
            if "://" in ref:
                return ref
            scheme, host, path, _ = split_url(base)
            return f"{scheme}://{host}{path.rsplit('/', 1)[0]}/{ref}"


        def parse_query(query):
            """Turn 'a=1&b=2' into a mapping from keys to values."""
            pairs = (item.split("=", 1) for item in query.split("&") if item)
            return {key: value for key, value in pairs}
    ''',
    "netkit/text.py": '''
        """Text helpers."""

        def expand_tabs(line, size=8):
            """Replace every tab character with blanks up to the next tab stop."""
            out = []
            for ch in line:
                if ch == "\\t":
                    out.append(" " * (size - len(out) % size))
                else:
                    out.append(ch)
            return "".join(out)


        def shell_quote(word):
            """Make a word safe to pass to a POSIX shell: wrap it in single quotes."""
            return "'" + word.replace("'", "'\\"'\\"'") + "'"


        class LineWrapper:
            """Break a paragraph into lines no wider than a given width."""

            def __init__(self, width):
                self.width = width

            def wrap(self, paragraph):
                lines, current = [], ""
                for word in paragraph.split():
                    if current and len(current) + 1 + len(word) > self.width:
                        lines.append(current)
                        current = word
                    else:
                        current = f"{current} {word}".strip()
                return lines + ([current] if current else [])
    ''',
    "netkit/checksum.py": '''
        """Checksums."""

        _TABLE = []


        def crc32_of(data):
            """Compute the CRC-32 checksum of a byte string (polynomial 0xEDB88320)."""
            crc = 0xFFFFFFFF
            for byte in data:
                crc ^= byte
                for _ in range(8):
                    crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
            return crc ^ 0xFFFFFFFF


        class LRUCache:
            """Keep the most recently used entries, evicting the oldest when full."""

            def __init__(self, capacity):
                self.capacity = capacity
                self.items = {}

            def get(self, key):
                value = self.items.pop(key)
                self.items[key] = value
                return value

            def evict_oldest(self):
                oldest = next(iter(self.items))
                del self.items[oldest]
    ''',
    "tests/test_urls.py": """
        from netkit.urls import split_url, join_url


        def test_split_url():
            assert split_url("http://h/p?q")[1] == "h"
            assert split_url("http://h/")[2] == "/"


        def test_join_url():
            assert join_url("http://h/a/b", "c") == "http://h/a/c"
    """,
    "README.md": """
        # netkit

        URL splitting, tab expansion and checksums. Call split_url to split a URL.
    """,
}

# (query, rel, symbol) — one labelled answer each.
LABELLED = [
    ("where is split_url defined", "netkit/urls.py", "split_url"),
    ("definition of LRUCache", "netkit/checksum.py", "LRUCache"),
    ("join_url", "netkit/urls.py", "join_url"),
    ("LineWrapper.wrap", "netkit/text.py", "LineWrapper.wrap"),
    ("replace tab characters with blanks", "netkit/text.py", "expand_tabs"),
    ("compute the CRC of some bytes", "netkit/checksum.py", "crc32_of"),
    ("make a word safe for the shell", "netkit/text.py", "shell_quote"),
    ("turn a query string into a mapping of keys to values", "netkit/urls.py", "parse_query"),
    ("evict the oldest cache entry", "netkit/checksum.py", "LRUCache.evict_oldest"),
    ("break a paragraph into lines of a given width", "netkit/text.py", "LineWrapper"),
]


def _write_repo(root: Path) -> dict[str, str]:
    texts = {}
    for rel, body in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        text = textwrap.dedent(body).lstrip("\n")
        path.write_text(text, encoding="utf-8")
        texts[rel] = text
    return texts


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("netkit")
    texts = _write_repo(root)
    store = IndexStore(tmp_path_factory.mktemp("db") / "index.db")
    report = Indexer([root], store).index_all()
    assert report.files == len(FILES)
    yield store, texts
    store.close()


def _def_line(text: str, symbol: str) -> int:
    name = symbol.rsplit(".", 1)[-1]
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith((f"def {name}(", f"class {name}:", f"class {name}(")):
            return number
    raise AssertionError(f"{symbol} not in text")


def _matches(hit, rel: str, symbol: str, texts: dict[str, str]) -> bool:
    if hit.rel != rel:
        return False
    if hit.symbol and hit.symbol.rsplit(".", 1)[-1] == symbol.rsplit(".", 1)[-1]:
        return True
    return hit.start_line <= _def_line(texts[rel], symbol) <= hit.end_line


def _rank(hits, rel, symbol, texts) -> int | None:
    return next((i for i, h in enumerate(hits, 1) if _matches(h, rel, symbol, texts)), None)


@pytest.mark.parametrize("mode", ["symbols", "fused"])
def test_exact_definition_comes_first(repo, mode):
    store, texts = repo
    hits = search(store, "where is split_url defined", 5, mode=mode)
    assert hits, mode
    top = hits[0]
    assert (top.rel, top.symbol) == ("netkit/urls.py", "split_url")
    assert top.start_line == _def_line(texts["netkit/urls.py"], "split_url")
    assert top.end_line >= top.start_line + 5


def test_bm25_alone_finds_the_definition_near_the_top(repo):
    store, texts = repo
    hits = search(store, "where is split_url defined", 5, mode="bm25")
    # A short README that mentions the name can outrank it on words alone: fusion fixes that.
    assert _rank(hits, "netkit/urls.py", "split_url", texts) <= 3


def test_camel_case_and_dotted_definitions(repo):
    store, _ = repo
    assert search(store, "definition of LRUCache", 3)[0].symbol == "LRUCache"
    assert search(store, "LineWrapper.wrap", 3)[0].symbol == "LineWrapper.wrap"
    # Split words find the joined identifier too.
    assert search(store, "where is the line wrapper class", 3, mode="symbols")[0].symbol == "LineWrapper"


def test_definition_beats_its_uses_in_tests(repo):
    store, _ = repo
    hits = search(store, "split_url", 5)
    assert hits[0].rel == "netkit/urls.py"
    assert any(h.rel == "tests/test_urls.py" for h in hits)


@pytest.mark.parametrize(
    ("query", "rel", "symbol"),
    [row for row in LABELLED if " " in row[0] and not row[0].startswith(("where", "definition"))],
)
def test_behaviour_query_finds_the_function(repo, query, rel, symbol):
    store, texts = repo
    hits = search(store, query, 3)
    assert _rank(hits, rel, symbol, texts) is not None, [(h.rel, h.symbol) for h in hits]


def test_hits_carry_one_based_line_ranges_of_their_text(repo):
    store, texts = repo
    for mode in MODES:
        for hit in search(store, "url query split", 10, mode=mode):
            lines = texts[hit.rel].splitlines()
            assert 1 <= hit.start_line <= hit.end_line <= len(lines)
            assert lines[hit.start_line - 1].strip() in hit.text, (mode, hit)
            assert Path(hit.path).is_absolute()


def test_results_are_deduplicated(repo):
    store, _ = repo
    for mode in MODES:
        hits = search(store, "split url join url query", 10, mode=mode)
        keys = [(h.path, h.symbol) for h in hits if h.symbol]
        assert len(keys) == len(set(keys)), mode
        for i, a in enumerate(hits):
            for b in hits[i + 1 :]:
                if a.path == b.path:
                    assert (a.start_line, a.end_line) != (b.start_line, b.end_line)


def _scores(store, texts, mode, k=5):
    found, reciprocal = 0, 0.0
    for query, rel, symbol in LABELLED:
        rank = _rank(search(store, query, k, mode=mode), rel, symbol, texts)
        found += rank is not None
        reciprocal += 1 / rank if rank else 0.0
    return found / len(LABELLED), reciprocal / len(LABELLED)


def test_fused_at_least_as_good_as_each_ranker(repo):
    store, texts = repo
    recall = {mode: _scores(store, texts, mode) for mode in MODES}
    assert recall["fused"][0] == 1.0, recall
    for single in ("bm25", "symbols"):
        assert recall["fused"][0] >= recall[single][0], recall
        assert recall["fused"][1] >= recall[single][1] - 1e-9, recall
    # Each single ranker misses something the other finds: fusion is doing work.
    assert recall["symbols"][0] < 1.0


@pytest.mark.parametrize(
    "query",
    [
        "",
        "   ",
        "!!!@@@###",
        "(((",
        '"',
        "*",
        "AND OR NOT NEAR",
        "col:text",
        "'; DROP TABLE files; --",
        "\x00\x01",
        "ünïcödé 🐍 wörds",
        "x" * 100_000,
        "split " * 5_000,
        "a the of is",
    ],
)
@pytest.mark.parametrize("mode", MODES)
def test_junk_queries_are_safe(repo, query, mode):
    store, _ = repo
    hits = search(store, query, 5, mode=mode)
    assert isinstance(hits, list) and len(hits) <= 5
    for hit in hits:
        assert 1 <= hit.start_line <= hit.end_line


def test_long_query_still_finds_its_words(repo):
    store, _ = repo
    hits = search(store, "split_url " + "zzz " * 10_000, 3)
    assert hits and hits[0].symbol == "split_url"


def test_k_and_mode_are_checked(repo):
    store, _ = repo
    assert search(store, "url", 0) == []
    assert len(search(store, "url split join query tab crc", 2)) == 2
    with pytest.raises(ValueError, match="unknown search mode"):
        search(store, "url", 3, mode="vector")


def test_query_analysis_keeps_identifiers_and_drops_question_words():
    terms = analyse_query("where is the ArgumentParser.parse_known_args method defined?")
    assert terms.words == ["ArgumentParser.parse_known_args"]
    assert terms.identifiers == ["ArgumentParser.parse_known_args"]
    assert terms.kind_hint == "method"
    assert analyse_query("code that expands tabs to spaces").words == ["expands", "tabs", "spaces"]
    assert analyse_query("CSV reader").identifiers == []
    assert split_identifier("HTTPConnection.get_response") == ["http", "connection", "get", "response"]
