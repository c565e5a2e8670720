"""A token-budgeted map of the repository: the files that matter most to a focus file, with the
signatures of their most-used definitions.

The graph has an edge from file A to file B for every name A references that B defines (there is
no import resolution: names are matched as written). How much a reference says is weighed: its
weight is split between the n files defining the name (1/n, and a tenth of that beyond 5 files),
repeated references count with a square root, a plain short name (`doc`, `end`: as likely a local
variable) counts a tenth of a snake_case, CamelCase or long one, and a name B defines only as a
method or attribute counts a quarter (`x.name` could be anything's). Files are ranked with personalised
PageRank (power iteration, plain dicts), the personalisation mass sitting on the focus file and on
the files that define the given `names`. A definition's own score is the rank its file receives
through edges naming it. Output, for the best files until `token_budget` is reached:

    urllib/parse.py:
      class SplitResult(_SplitResultBase, _NetlocResultMixinStr) (line 367)
      def urlsplit(url, scheme='', allow_fragments=True) (line 453)

The focus file itself is not listed (its text is already in the prompt). Output is deterministic.

Speed: the graph is built once per index generation (`IndexStore.generation()`) and turned into
arrays; PageRank is a numpy power iteration over them (`np.bincount` per step), the definition
scores one vectorised pass over the named edges, and both are kept per (focus, names) for the
generation, as are rendered maps per budget and token counter. Rendering counts each file's block
once and the whole map once at the end (trimming the last lines if a tokenizer counts the joined text
higher than its parts).
"""

from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

__all__ = ["DAMPING", "default_token_counter", "rank_files", "render_repo_map"]

DAMPING = 0.85
_MAX_ITERATIONS = 100
_TOLERANCE = 1e-10
_MAX_DEFS_PER_FILE = 12
_MAX_SIGNATURE_CHARS = 120
# A definition named in `names` is listed before the file's other definitions.
_NAMED_BOOST = 10.0
# A name defined in more files than this says little about which one a reference means.
_COMMON_DEFINERS = 5
_COMMON_FACTOR = 0.1
_MEMBER_FACTOR = 0.25
_PLAIN_NAME_FACTOR = 0.1
_SPECIFIC_LENGTH = 8
# "def f(x):  # a trailing comment" -> "def f(x)"
_TRAILING_COMMENT = re.compile(r":\s*#[^'\"]*$")


def default_token_counter(text: str) -> int:
    """A cheap estimate: about four characters per token."""
    return (len(text) + 3) // 4


# Rankings (per focus and names) and rendered maps kept per graph.
_RANK_CACHE_SIZE = 64
_RENDER_CACHE_SIZE = 64
# A background graph build offers to pause every this many rows (~2 ms of work).
_PAUSE_ROWS = 2048


@dataclass
class _Graph:
    rel: dict[str, str]  # path -> rel
    defs: dict[str, list]  # path -> SymbolRows, in line order
    edges: dict[str, dict[str, float]]  # A -> {B: weight}
    named_edges: dict[tuple[str, str], dict[str, float]]  # (A, B) -> {name: weight}
    arrays: _Arrays | None = None
    ranks: OrderedDict = field(default_factory=OrderedDict)  # (focus, names) -> _Ranking
    renders: OrderedDict = field(default_factory=OrderedDict)  # (focus, names, budget, counter) -> str
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class _Arrays:
    """The graph as index arrays, for numpy power iteration."""

    nodes: list[str]  # sorted paths
    index: dict[str, int]
    src: np.ndarray  # [edges] source node of each edge
    dst: np.ndarray  # [edges]
    share: np.ndarray  # [edges] weight / the source's total out-weight
    dangling: np.ndarray  # [nodes] bool: no out-edges
    named_src: np.ndarray  # [named edges] source node of each (src, dst, name) triple
    named_share: np.ndarray  # [named edges] weight / the source's out-weight
    named_key: np.ndarray  # [named edges] index into `def_keys`
    def_keys: list[tuple[str, str]]  # (dst path, name)


@dataclass(frozen=True)
class _Ranking:
    ranked: list[tuple[str, float]]
    focus_node: str | None
    scores: dict[tuple[str, str], float]


def _specific(name: str) -> bool:
    """A name that hardly means anything but a definition: snake_case, CamelCase, or long."""
    core = name.strip("_")
    if "_" in core or len(core) >= _SPECIFIC_LENGTH:
        return True
    return any(c.isupper() for c in core) and not core.isupper()


def _edge_weight(count: int, definers: dict[str, bool], name: str, dst: str) -> float:
    """How much `count` references to `name` say about the file `dst` that defines it."""
    weight = math.sqrt(count) / len(definers)
    if not _specific(name):
        weight *= _PLAIN_NAME_FACTOR  # doc, end, value: as likely a local variable as this definition
    if len(definers) > _COMMON_DEFINERS:
        weight *= _COMMON_FACTOR  # split, get, run: defined all over, meant anywhere
    if not definers[dst]:
        weight *= _MEMBER_FACTOR  # only a method or attribute there: `x.name` could be anything's
    return weight


def _build_graph(store, pause: Callable[[], object] | None = None) -> _Graph:
    """The definition/reference graph; `pause` (a background caller's) runs every few thousand rows."""
    pause = pause or (lambda: None)
    rel: dict[str, str] = {}
    defs: dict[str, list] = defaultdict(list)
    # name -> {path: defined at the top level of that file (not only as a member)}
    definers: dict[str, dict[str, bool]] = defaultdict(dict)
    for i, row in enumerate(store.all_symbols()):
        if i % _PAUSE_ROWS == 0:
            pause()
        rel[row.path] = row.rel
        defs[row.path].append(row)
        top = "." not in row.qualname
        definers[row.name][row.path] = definers[row.name].get(row.path, False) or top
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for i, (path, name, _line) in enumerate(store.all_references()):
        if i % _PAUSE_ROWS == 0:
            pause()
        if name in definers and not (name.startswith("__") and name.endswith("__")):
            counts[(path, name)] += 1
    edges: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    named: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for (src, name), count in sorted(counts.items()):
        targets = definers[name]
        # A file that defines the name itself most likely means its own definition.
        if src in targets:
            continue
        for dst in sorted(targets):
            weight = _edge_weight(count, targets, name, dst)
            edges[src][dst] += weight
            named[(src, dst)][name] += weight
    for path in defs:
        defs[path].sort(key=lambda r: (r.start_line, r.qualname))
    return _Graph(
        rel=rel,
        defs=dict(defs),
        edges={a: dict(b) for a, b in edges.items()},
        named_edges={k: dict(v) for k, v in named.items()},
    )


def _arrays(graph: _Graph) -> _Arrays:
    nodes = sorted(set(graph.rel) | set(graph.edges))
    index = {n: i for i, n in enumerate(nodes)}
    out_weight = {a: sum(t.values()) for a, t in graph.edges.items()}
    triples = [(index[a], index[b], w / out_weight[a]) for a, t in graph.edges.items() for b, w in t.items()]
    src, dst, share = (np.array(col, dtype=dtype) for col, dtype in
                       zip(zip(*triples, strict=True) if triples else ((), (), ()),
                           (np.int64, np.int64, np.float64), strict=True))
    dangling = np.array([not out_weight.get(n) for n in nodes], dtype=bool)
    def_keys: dict[tuple[str, str], int] = {}
    named = [(index[a], w / out_weight[a], def_keys.setdefault((b, name), len(def_keys)))
             for (a, b), by_name in graph.named_edges.items() for name, w in by_name.items()]
    named_src, named_share, named_key = (np.array(col, dtype=dtype) for col, dtype in
                                         zip(zip(*named, strict=True) if named else ((), (), ()),
                                             (np.int64, np.float64, np.int64), strict=True))
    return _Arrays(nodes, index, src, dst, share, dangling, named_src, named_share, named_key, list(def_keys))


def _pagerank(arrays: _Arrays, personal: dict[str, float]) -> np.ndarray:
    """Personalised PageRank by power iteration; dangling files hand their rank to `personal`."""
    n = len(arrays.nodes)
    p = np.zeros(n)
    for node, weight in personal.items():
        p[arrays.index[node]] += weight
    if p.sum() <= 0:
        p[:] = 1.0
    p /= p.sum()
    rank = p.copy()
    for _ in range(_MAX_ITERATIONS):
        dangling = rank[arrays.dangling].sum()
        new = (1.0 - DAMPING + DAMPING * dangling) * p
        new += DAMPING * np.bincount(arrays.dst, weights=rank[arrays.src] * arrays.share, minlength=n)
        delta = np.abs(new - rank).sum()
        rank = new
        if delta < _TOLERANCE:
            break
    return rank


def _resolve_focus(graph: _Graph, nodes: list[str], focus: str | None) -> str | None:
    """The node for `focus`, given as an absolute path or a path relative to its root."""
    if not focus:
        return None
    if focus in graph.defs or focus in graph.edges:
        return focus
    wanted = focus.replace("\\", "/").removeprefix("./")
    by_rel = [n for n in nodes if graph.rel.get(n) == wanted]
    # A file that only references names has no rel on record; its absolute path ends with it.
    by_suffix = [n for n in nodes if n.replace("\\", "/").endswith("/" + wanted)]
    candidates = by_rel or by_suffix
    return candidates[0] if candidates else None


# The graph costs ~1 s to build on the standard library; it is kept per database until the index
# changes. Keyed by the database file, holding (generation, graph).
_GRAPH_CACHE: dict[str, tuple[tuple, _Graph]] = {}
_GRAPH_CACHE_LOCK = threading.Lock()


def _graph_for(store, pause: Callable[[], object] | None = None) -> _Graph:
    key, generation = str(store.path), store.generation()
    with _GRAPH_CACHE_LOCK:
        cached = _GRAPH_CACHE.get(key)
        if cached is not None and cached[0] == generation:
            return cached[1]
    graph = _build_graph(store, pause)
    with _GRAPH_CACHE_LOCK:
        _GRAPH_CACHE[key] = (generation, graph)
    return graph


def rank_files(store, focus: str | None = None, names: Iterable[str] = (), *,
               pause: Callable[[], object] | None = None) -> list[tuple[str, float]]:
    """(path, rank) of every file with definitions or references, best first (focus included).

    `pause`: for a background caller, called now and then while the graph is built (it holds the
    GIL for seconds on a large index), e.g. `context.foreground.pause_for_foreground`."""
    graph = _graph_for(store, pause)
    if pause is not None:
        pause()
    return _ranking(graph, focus, frozenset(names)).ranked


def _ranking(graph: _Graph, focus: str | None, names: frozenset[str]) -> _Ranking:
    """The ranking for (focus, names), computed once per graph."""
    key = (focus, names)
    with graph.lock:
        if graph.arrays is None:
            graph.arrays = _arrays(graph)
        cached = graph.ranks.get(key)
        if cached is not None:
            graph.ranks.move_to_end(key)
            return cached
    arrays = graph.arrays
    focus_node = _resolve_focus(graph, arrays.nodes, focus)
    personal: dict[str, float] = {}
    if focus_node is not None:
        personal[focus_node] = 1.0
    if names:
        for path, rows in graph.defs.items():
            if any(r.name in names for r in rows):
                personal[path] = personal.get(path, 0.0) + 1.0
    rank = _pagerank(arrays, personal)
    order = sorted(range(len(arrays.nodes)),
                   key=lambda i: (-rank[i], graph.rel.get(arrays.nodes[i], arrays.nodes[i])))
    ranked = [(arrays.nodes[i], float(rank[i])) for i in order]
    result = _Ranking(ranked, focus_node, _definition_scores(arrays, rank))
    with graph.lock:
        graph.ranks[key] = result
        while len(graph.ranks) > _RANK_CACHE_SIZE:
            graph.ranks.popitem(last=False)
    return result


def _definition_scores(arrays: _Arrays, rank: np.ndarray) -> dict[tuple[str, str], float]:
    """(path, name) -> the rank that flows into the file through references to that name."""
    if not arrays.def_keys:
        return {}
    totals = np.bincount(arrays.named_key, weights=rank[arrays.named_src] * arrays.named_share,
                         minlength=len(arrays.def_keys))
    return dict(zip(arrays.def_keys, totals.tolist(), strict=True))


def _one_line(signature: str) -> str:
    text = _TRAILING_COMMENT.sub("", " ".join(signature.split())).removesuffix(":").rstrip()
    if len(text) > _MAX_SIGNATURE_CHARS:
        text = text[: _MAX_SIGNATURE_CHARS - 3] + "..."
    return text


def _file_lines(rows: list, scores: dict, path: str, names: set[str]) -> list[str]:
    """The file's definitions worth listing, most used first, then shown in line order."""

    def score(row) -> float:
        s = scores.get((path, row.name), 0.0)
        return s * _NAMED_BOOST if row.name in names else s

    wanted = [r for r in rows if r.kind != "variable" or score(r) > 0 or r.name in names]
    best = sorted(wanted, key=lambda r: (-score(r), r.qualname.count("."), r.start_line))
    chosen = sorted(best[:_MAX_DEFS_PER_FILE], key=lambda r: (r.start_line, r.qualname))
    return [
        "  " * (1 + r.qualname.count(".")) + f"{_one_line(r.signature or r.qualname)} (line {r.start_line})"
        for r in chosen
    ]


def _block(header: str, lines: list[str], count: int) -> str:
    return header + "\n" + "\n".join(lines[:count]) + "\n"


def _fit(header: str, lines: list[str], room: int, count: Callable[[str], int]) -> tuple[str, int] | None:
    """The block with the most of the file's lines (at least one) within `room` tokens, and how many
    lines it holds."""
    whole = _block(header, lines, len(lines))
    if count(whole) <= room:
        return whole, len(lines)
    lo, hi, best = 1, len(lines) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        block = _block(header, lines, mid)
        if count(block) <= room:
            best, lo = (block, mid), mid + 1
        else:
            hi = mid - 1
    return best


def render_repo_map(
    store,
    focus: str | None = None,
    names: Iterable[str] = (),
    token_budget: int = 1024,
    count_tokens: Callable[[str], int] = default_token_counter,
) -> str:
    """The repository map for `focus` and `names`, at most `token_budget` tokens by `count_tokens`."""
    if token_budget <= 0:
        return ""
    wanted = frozenset(names)
    graph = _graph_for(store)
    key = (focus, wanted, token_budget, count_tokens)
    with graph.lock:
        cached = graph.renders.get(key)
        if cached is not None:
            graph.renders.move_to_end(key)
            return cached
    text = _render(graph, _ranking(graph, focus, wanted), wanted, token_budget, count_tokens)
    with graph.lock:
        graph.renders[key] = text
        while len(graph.renders) > _RENDER_CACHE_SIZE:
            graph.renders.popitem(last=False)
    return text


def _render(graph: _Graph, ranking: _Ranking, wanted: frozenset[str], budget: int,
            count: Callable[[str], int]) -> str:
    parts: list[str] = []
    used = 0
    for path, _rank in ranking.ranked:
        rows = graph.defs.get(path)
        if path == ranking.focus_node or not rows:
            continue
        lines = _file_lines(rows, ranking.scores, path, wanted)
        if not lines:
            continue
        fitted = _fit(f"{graph.rel[path]}:", lines, budget - used, count)
        if fitted is None:
            break
        parts.append(fitted[0])
        used += count(fitted[0])
        if fitted[1] < len(lines):
            break  # the file only fit cut short: the budget is spent
    return _trim("".join(parts), budget, count)


def _trim(text: str, budget: int, count: Callable[[str], int]) -> str:
    """Drop whole lines from the end while the joined text counts over the budget (a tokenizer may
    count it higher than the sum of its blocks); never leaves a file header without a line."""
    while text and count(text) > budget:
        lines = text.splitlines(keepends=True)[:-1]
        while lines and not lines[-1].startswith("  "):
            lines.pop()  # a header whose lines were all dropped
        text = "".join(lines)
    return text
