"""The semantic ranker on a small real repository: background embedding (incremental by content key,
the shared vector cache, pruning, a model change, stopping), cosine ranking fused into search, the
embedding process, and the index service using it. Real SQLite, real tree-sitter, the real model."""

from __future__ import annotations

import re
import textwrap
import time
from pathlib import Path

import pytest

from context.config import IndexConfig
from context.index import service as service_module
from context.index.embeddings import ChunkEmbedder, EmbedderConfig, embeddings_available
from context.index.indexer import Indexer
from context.index.retrieval import search
from context.index.semantic import EmbeddingProcess, SemanticRanker, VectorCache, embed_pending
from context.index.service import IndexService
from context.index.store import IndexStore

pytestmark = pytest.mark.skipif(not embeddings_available(), reason="the embeddings extra is not installed")

FILES = {
    "stats/sampling.py": '''
        def gauss(mu, sigma):
            """Gaussian distribution: mu is the mean, sigma the standard deviation."""
            #BODY
            return mu + sigma * _next()


        def choose_one(items):
            """Pick one element of a non-empty sequence, each equally likely."""
            #BODY
            return items[_below(len(items))]
    ''',
    "text/shellwords.py": '''
        def split_command(line):
            """Split a string using shell-like syntax: quotes group words, backslashes escape."""
            #BODY
            return list(_Lexer(line))


        def pad_left(text, width):
            """Right-align text in a field of the given width."""
            #BODY
            return " " * (width - len(text)) + text
    ''',
    "io/archive.py": '''
        class TarReader:
            """Read members out of a tape archive."""

            def members(self):
                return list(self._index)

            def extract(self, name, target):
                """Write one member's bytes to a file below target."""
                #BODY
                _copy(self._open(name), target)
    ''',
}
PARAPHRASES = [
    ("draw a normally distributed random number", "gauss"),
    ("break a command line into words the way a POSIX shell does", "split_command"),
    ("pick a random element from a list", "choose_one"),
]


# Definitions this long are chunks of their own (small neighbours would be merged into one).
_BODY = "".join(f"total = total + {i}\n" for i in range(42))


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        text = re.sub(r"^( *)#BODY\n", lambda m: textwrap.indent(_BODY, m.group(1)), textwrap.dedent(text),
                      flags=re.M)
        path.write_text(text.lstrip(), encoding="utf-8")


@pytest.fixture(scope="module")
def embedder() -> ChunkEmbedder:
    return ChunkEmbedder(EmbedderConfig())


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "ws"
    _write(root, FILES)
    store = IndexStore(tmp_path / "index.sqlite3")
    indexer = Indexer([root], store, workers=0)
    indexer.index_all()
    yield root, store, indexer
    store.close()


def test_embed_pending_gives_every_chunk_a_vector_once(repo, embedder):
    _, store, _ = repo
    total = store.vector_counts()[1]
    report = embed_pending(store, embedder)
    assert (report.embedded, report.reused, report.stopped) == (total, 0, False)
    assert store.vector_counts() == (total, total)
    assert store.vector_model() == embedder.model_id
    again = embed_pending(store, embedder)
    assert (again.embedded, again.reused, again.pruned) == (0, 0, 0)


def test_only_changed_chunks_are_embedded_again(repo, embedder):
    root, store, indexer = repo
    embed_pending(store, embedder)
    path = root / "text/shellwords.py"
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("Right-align text", "Left-pad text"), encoding="utf-8")
    assert indexer.update_paths([path]).parsed == 1
    report = embed_pending(store, embedder)
    # The file's two chunks were re-parsed; only the one whose head changed ran through the model,
    # and the old head's vector, now unused, is dropped.
    assert (report.embedded, report.reused, report.pruned) == (1, 1, 1)
    path.unlink()
    indexer.update_paths([path])
    assert embed_pending(store, embedder).pruned == 2  # both of its chunks
    done, total = store.vector_counts()
    assert done == total


def test_shared_cache_fills_a_fresh_index_without_the_model(repo, embedder, tmp_path):
    root, store, _ = repo
    cache = VectorCache(tmp_path / "cache" / "vectors.sqlite3")
    first = embed_pending(store, embedder, cache=cache)
    assert first.cached == 0 and first.embedded == store.vector_counts()[1]
    with IndexStore(tmp_path / "rebuilt.sqlite3") as rebuilt:
        Indexer([root], rebuilt, workers=0).index_all()
        second = embed_pending(rebuilt, embedder, cache=cache)
        assert (second.embedded, second.cached) == (0, first.embedded)
        assert rebuilt.vector_counts()[0] == first.embedded
    cache.close()
    # A damaged cache file costs recomputation, never an error.
    (tmp_path / "cache" / "vectors.sqlite3").write_bytes(b"not a database" * 100)
    for suffix in ("-wal", "-shm"):
        (tmp_path / "cache" / f"vectors.sqlite3{suffix}").unlink(missing_ok=True)
    broken = VectorCache(tmp_path / "cache" / "vectors.sqlite3")
    with IndexStore(tmp_path / "third.sqlite3") as third:
        Indexer([root], third, workers=0).index_all()
        assert embed_pending(third, embedder, cache=broken).embedded == first.embedded


def test_another_model_setting_replaces_the_vectors(repo, embedder):
    _, store, _ = repo
    embed_pending(store, embedder)
    other = ChunkEmbedder(EmbedderConfig(max_tokens=32))
    report = embed_pending(store, other)
    assert report.embedded == store.vector_counts()[1]
    assert store.vector_model() == other.model_id
    # A ranker for the first setting ignores vectors it did not make.
    assert SemanticRanker(embedder).hits(store, "random number", 5) == []


def test_embedding_stops_when_asked_and_resumes(repo, embedder):
    _, store, _ = repo
    calls = []
    report = embed_pending(store, embedder, step=2,
                           should_stop=lambda: bool(calls.append(1)) or len(calls) > 1)
    assert report.stopped and report.embedded == 2 and report.pruned == 0
    rest = embed_pending(store, embedder)
    assert rest.embedded == store.vector_counts()[1] - 2


def test_semantic_hits_and_fused_search_find_paraphrases(repo, embedder):
    _, store, _ = repo
    embed_pending(store, embedder)
    ranker = SemanticRanker(embedder)
    for query, symbol in PARAPHRASES:
        hits = ranker.hits(store, query, 3)
        assert hits[0].symbol == symbol, (query, [h.symbol for h in hits])
        assert hits[0].score >= hits[-1].score
        fused = search(store, query, 3, semantic=ranker)
        assert symbol in [h.symbol for h in fused], (query, [h.symbol for h in fused])
        assert search(store, query, 3, mode="semantic", semantic=ranker)[0].symbol == symbol
    # The paraphrases share no word with their answers: lexical search alone misses at least one.
    lexical_top = [[h.symbol for h in search(store, q, 1)] for q, _ in PARAPHRASES]
    assert any(top != [s] for top, (_, s) in zip(lexical_top, PARAPHRASES, strict=True)), lexical_top
    assert search(store, "anything", 3, mode="semantic") == []  # no ranker: no semantic list


def test_the_matrix_follows_the_index(repo, embedder):
    root, store, indexer = repo
    ranker = SemanticRanker(embedder)
    assert ranker.hits(store, "tape archive", 3) == []  # nothing embedded yet
    embed_pending(store, embedder)
    assert ranker.hits(store, "read members of a tape archive", 1)[0].symbol == "TarReader"
    (root / "io/archive.py").unlink()
    indexer.update_paths([root / "io/archive.py"])
    assert all(h.rel != "io/archive.py" for h in ranker.hits(store, "read members of a tape archive", 5))


def _wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def test_embedding_process_embeds_when_woken_and_stops(repo, tmp_path):
    root, store, indexer = repo
    process = EmbeddingProcess(store.path, EmbedderConfig(), cache_path=tmp_path / "vectors.sqlite3")
    process.start()
    try:
        process.wake()
        assert _wait_for(lambda: store.vector_counts()[0] == store.vector_counts()[1], 120)
        _write(root, {"stats/extra.py": "def harmonic_mean(values):\n    return len(values) / sum(values)\n"})
        indexer.update_paths([root / "stats/extra.py"])
        process.wake()
        assert _wait_for(lambda: store.vector_counts()[0] == store.vector_counts()[1], 60)
    finally:
        process.stop()
    assert not process.alive


def test_service_fuses_semantic_results_once_ready(tmp_path, monkeypatch):
    monkeypatch.setattr(service_module, "EMBED_START_DELAY_S", 0.0)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "ws"
    _write(root, FILES)
    service = IndexService([root], IndexConfig(watch=False), db_path=tmp_path / "index.sqlite3",
                           embeddings=True)
    try:
        service.start()
        assert service.wait_until_indexed(60)
        assert service.wait_until_semantic(120)
        assert _wait_for(lambda: service.status()["embedded"] == service.status()["chunks"], 120)
        hits = service.search("draw a normally distributed random number", 3)
        assert hits[0].symbol == "gauss"
    finally:
        service.stop()
    assert service.embedding is not None and not service.embedding.alive
    off = IndexService([root], IndexConfig(watch=False), db_path=tmp_path / "off.sqlite3", embeddings=False)
    try:
        assert off.ranker is None and not off.wait_until_semantic(0)
    finally:
        off.stop()


def test_the_agents_search_tool_fuses_the_ranker_where_the_index_has_vectors(repo, embedder):
    """`store_searcher` (what `squidcode agent` and `squidcode search` search with) stays lexical
    until the index holds vectors, then fuses the semantic ranker: the agent's `search` tool finds
    the paraphrased definitions first, where lexical search misses at least one."""
    from agent.sandbox import Workspace
    from agent.tools.code import SEARCH
    from agent.tools.registry import ToolContext
    from context.config import AgentConfig
    from context.index.semantic import store_searcher

    root, store, _ = repo

    def first(ctx, query) -> str:
        result = SEARCH.run(ctx, {"query": query, "k": 1})
        assert result.ok, result.output
        return result.output.splitlines()[0].split()[-1]  # "rel:start-end symbol"

    lexical = ToolContext(Workspace([root]), None, AgentConfig(), store)
    before = ToolContext(Workspace([root]), None, AgentConfig(), store, searcher=store_searcher(store))
    assert [first(before, q) for q, _ in PARAPHRASES] == [first(lexical, q) for q, _ in PARAPHRASES]
    embed_pending(store, embedder)
    fused = ToolContext(Workspace([root]), None, AgentConfig(), store, searcher=store_searcher(store))
    assert [first(fused, q) for q, _ in PARAPHRASES] == [s for _, s in PARAPHRASES]
    assert [first(lexical, q) for q, _ in PARAPHRASES] != [s for _, s in PARAPHRASES]
