"""Search the repository index: BM25 over chunks, symbol lookup, and their rank fusion.

`search(store, query, k, mode=...)` answers "where is X defined" and "code that does Y" questions:

- "bm25": the query, stripped of question words and stop words and with base forms of inflected
  words added (the FTS index has no stemmer), against the chunks' full-text index;
- "symbols": definitions named by the query: identifiers as typed, split at snake_case / CamelCase
  boundaries, adjacent words joined ("line wrapper" -> LineWrapper, also through synonyms:
  "delete tree" -> rmtree), and prefix look-ups of plain words scored by how many of the name's
  parts the query spells; ranked by match quality, specificity (a name defined in many files says
  less, unless another query word names the file), kind and size;
- "fused" (default): weighted reciprocal rank fusion of four lists: BM25; BM25 with a few synonyms
  per word from a small programming vocabulary; that synonym pool re-ranked by its "heads" (the
  definition's name, signature and docstring: the IDF-weighted share of query words, or their
  synonyms, found there); and the symbol list (weighted up for "where is X defined" questions);
  with a `semantic` ranker (the optional embeddings extra, `context.index.semantic`) a fifth list:
  the chunks whose embedded heads are closest to the query;
- "semantic": that list alone.

Hits are de-duplicated (one per definition, never two near-identical line ranges of a file) and
carry the symbol they cover and a 1-based inclusive line range; a fused hit whose chunk also holds
code merged in before the definition is narrowed to the definition's own lines.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from .types import SearchHit

__all__ = [
    "MODES",
    "RRF_K",
    "QueryTerms",
    "analyse_query",
    "is_test_path",
    "light_stem",
    "search",
    "split_identifier",
    "synonyms",
    "word_forms",
]

MODES = ("bm25", "symbols", "semantic", "fused")
RRF_K = 10

# A long query is cut here: enough for any real question, bounded work for pasted junk.
_MAX_TERMS = 24
_MAX_QUERY_CHARS = 2000
_MAX_TOKEN_CHARS = 80
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_CAMEL_SPLIT = re.compile(r"[A-Z]+(?=[A-Z][a-z0-9])|[A-Z]?[a-z0-9]+|[A-Z]+")

_STOP_WORDS = frozenset(
    """a an the of to in on for from by with and or not is are was were be been being it its this
    that these those as at into onto which what where when who whom whose why how do does did doing
    done i me my we our you your can could should would will shall may might must there here some
    any all each every than then so such one ones get gets given use uses used using via about
    also just only very whether if""".split()
)
# Words that say what kind of answer is wanted rather than what the code is about.
_QUESTION_WORDS = frozenset(
    """defined define defines definition definitions declared declaration declare implemented
    implementation implements implement located locate location code show shows""".split()
)
_DEFINITION_WORDS = frozenset("""where defined define defines definition declared declaration""".split())
_KIND_WORDS = {
    "class": "class",
    "classes": "class",
    "function": "function",
    "functions": "function",
    "method": "method",
    "methods": "method",
    "def": "function",
    "struct": "struct",
    "interface": "interface",
    "trait": "trait",
    "variable": "variable",
    "constant": "variable",
}
_KIND_WEIGHT = {
    "class": 1.0,
    "function": 1.0,
    "struct": 1.0,
    "interface": 1.0,
    "trait": 1.0,
    "enum": 1.0,
    "method": 0.9,
    "type": 0.9,
}
_INFLECTIONS = (
    ("ies", ("y",)),
    ("ing", ("", "e")),
    ("ied", ("y",)),
    ("ed", ("", "e")),
    ("ly", ("",)),
    ("est", ("", "e")),
    ("es", ("", "e")),
    ("s", ("",)),
)
_SUFFIXES = (
    ("sses", "ss"),
    ("ies", "y"),
    ("ingly", ""),
    ("edly", ""),
    ("ing", ""),
    ("est", ""),
    ("ed", ""),
    ("ly", ""),
    ("er", ""),
    ("es", ""),
    ("s", ""),
)
# The BM25 pool the head ranker re-orders, and how much of a chunk counts as its head.
_POOL = 500
_HEAD_LINES = 12
_HEAD_SEARCH = 40
_HEAD_WEIGHT = 1.0
_SYNONYM_BM25_WEIGHT = 1.0
_POOL_PRIOR = 0.1
_NAME_WEIGHT = 0.5
# Prefix look-ups for plain words (guess -> guess_type), and the weakest name match kept.
_PREFIX_MIN = 4
_PREFIX_WORDS = 8
_PREFIX_LIMIT = 60
_MIN_SYMBOL_QUALITY = 0.9
_PATH_WORD_BONUS = 1.0
_QUALNAME_WORD_BONUS = 0.5
# Reciprocal rank fusion weights of the symbol list, by what the query looks like.
_SYMBOL_WEIGHT_DEFINITION = 2.0
_SYMBOL_WEIGHT_IDENTIFIER = 1.0
_SYMBOL_WEIGHT_PLAIN = 0.6
# Reciprocal rank fusion weight of the semantic list (tuned on the dev split only).
_SEMANTIC_WEIGHT = 2.5
_FTS_SYNONYMS = 3
_JOIN_SYNONYMS = 4
# General programming vocabulary, one group per line: the words a question uses and the ones code
# abbreviates or names otherwise. Query words match any word of their groups.
_SYNONYM_GROUPS = """
delete remove rm del unlink erase purge
directory dir folder tree
copy cp clone duplicate dup
move mv rename
create make mk new
list ls listing
permission perm mode chmod
owner chown
executable exe binary program
command cmd
find search locate lookup which
random rand randomly
reorder shuffle permute
similar similarity ratio close
escape quote backslash
wildcard glob fnmatch pattern
regex re regexp pattern
temporary temp tmp
configuration config cfg conf settings
argument arg args parameter param
message msg
error err exception exc
string str text
number num int integer
dictionary dict mapping
length len size
initialize init setup
compare cmp diff
difference diff delta
calculate compute calc
serialize dump dumps encode marshal
deserialize load loads decode unmarshal
write save store
display show print render
epoch timestamp
maximum max largest biggest greatest
minimum min smallest least lowest
check validate verify
address addr
connection conn connect
request req
response resp reply
header hdr
buffer buf
character char chr
source src
destination dst dest target
document doc
object obj instance
function func fn callable
variable var
value val
previous prev
current cur curr
index idx
password passwd pwd
user usr
environment env environ
process proc
execute exec run spawn
recursive recursively recurse
iterate iter traverse visit walk
insert add append push
lock mutex
compress deflate pack
decompress inflate unpack extract
hash digest checksum
encoding codec charset
token tok
statement stmt
expression expr
attribute attr
utility util utils
terminal tty console
memoize cache memo
delay timer later after
"""
_TEST_PARTS = frozenset({"test", "tests", "testing", "idle_test", "__tests__", "spec", "specs"})


@dataclass
class QueryTerms:
    """What the query analysis keeps of a free-text query."""

    words: list[str] = field(default_factory=list)  # content words and identifiers, in order
    identifiers: list[str] = field(default_factory=list)  # tokens that look like code (as typed)
    kind_hint: str | None = None  # "class" / "function" / ... when the query names one
    wants_definition: bool = False  # "where is X defined", "definition of X", or just a name or two


def _is_identifier_like(token: str) -> bool:
    """Typed as code: an underscore, a dot, a capital after a lower-case letter (not an acronym such
    as CSV), or a digit after letters."""
    if "_" in token.strip("_") or "." in token:
        return True
    if token.isupper():
        return False
    return any(c.isupper() for c in token[1:]) or (token[0].isalpha() and any(c.isdigit() for c in token))


def split_identifier(token: str) -> list[str]:
    """`parse_known_args` -> parse, known, args; `HTTPConnection` -> http, connection."""
    parts: list[str] = []
    for piece in re.split(r"[_.]+", token):
        parts.extend(p.lower() for p in _CAMEL_SPLIT.findall(piece))
    return [p for p in parts if p]


def analyse_query(query: str) -> QueryTerms:
    """Strip question words and stop words; keep identifiers exactly as typed."""
    terms = QueryTerms()
    for token in _TOKEN.findall(query[:_MAX_QUERY_CHARS]):
        if len(token) > _MAX_TOKEN_CHARS:
            continue
        lower = token.lower()
        if lower in _DEFINITION_WORDS:
            terms.wants_definition = True
        if lower in _KIND_WORDS:
            terms.kind_hint = terms.kind_hint or _KIND_WORDS[lower]
            terms.wants_definition = True
            continue
        if _is_identifier_like(token):
            terms.identifiers.append(token)
        elif lower in _STOP_WORDS or lower in _QUESTION_WORDS:
            continue
        if token not in terms.words:
            terms.words.append(token)
        if len(terms.words) >= _MAX_TERMS:
            break
    if len(terms.words) <= 2 and terms.identifiers:
        terms.wants_definition = True
    return terms


def light_stem(word: str) -> str:
    """A crude suffix stripper, the same for query and code words: names, naming -> nam."""
    w = word.lower()
    for suffix, repl in _SUFFIXES:
        if w.endswith(suffix) and len(w) - len(suffix) + len(repl) >= 3:
            w = w[: len(w) - len(suffix)] + repl
            break
    if len(w) > 3 and w[-1] == w[-2] and w[-1] not in "lsz":
        w = w[:-1]  # biggest -> bigg -> big
    if len(w) > 3 and w.endswith("e"):
        w = w[:-1]
    return w


def _stems(text: str) -> set[str]:
    """Stems of every word and identifier part of `text`, and of whole identifiers."""
    out: set[str] = set()
    for token in _TOKEN.findall(text):
        if len(token) <= _MAX_TOKEN_CHARS:
            out.update(_token_stems(token))
    return out


@functools.lru_cache(maxsize=65536)
def _token_stems(token: str) -> tuple[str, ...]:
    parts = split_identifier(token)
    stems = [light_stem(p) for p in parts]
    if len(parts) > 1:
        stems.append("".join(parts))
    return tuple(stems)


def word_forms(word: str) -> list[str]:
    """Plausible base forms of an inflected English word: names -> name, matching -> match, matche."""
    w = word.lower()
    forms: list[str] = []
    for suffix, endings in _INFLECTIONS:
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            base = w[: len(w) - len(suffix)]
            forms.extend(base + e for e in endings)
            break
    return [f for f in dict.fromkeys(forms) if f != w]


def _query_stems(terms: QueryTerms) -> set[str]:
    return {s for s in _stems(" ".join(terms.words)) if s not in _STOP_WORDS and len(s) >= 2}


@functools.cache
def _synonyms() -> dict[str, tuple[str, ...]]:
    """word -> the other words of its groups, in the order written."""
    table: dict[str, list[str]] = {}
    for line in _SYNONYM_GROUPS.strip().splitlines():
        group = line.split()
        for word in group:
            table.setdefault(word, []).extend(w for w in group if w != word and w not in table[word])
    return {word: tuple(others) for word, others in table.items()}


def synonyms(word: str) -> tuple[str, ...]:
    """Other words code uses for `word` (its base form's, for an inflected word)."""
    table = _synonyms()
    w = word.lower()
    for form in (w, *word_forms(w)):
        if form in table:
            return table[form]
    return ()


def _term_groups(terms: QueryTerms) -> dict[str, frozenset[str]]:
    """Query stem -> the stems that count as it: itself and its synonyms' stems."""
    groups: dict[str, frozenset[str]] = {}
    for word in terms.words:
        for stem in _token_stems(word) if len(word) <= _MAX_TOKEN_CHARS else ():
            if stem in _STOP_WORDS or len(stem) < 2:
                continue
            extra = () if _is_identifier_like(word) else synonyms(word)
            groups[stem] = groups.get(stem, frozenset()) | {stem} | {light_stem(w) for w in extra}
    return groups


def _joined_stems(terms: QueryTerms) -> set[str]:
    """Adjacent plain words written as one identifier part: "zip file" -> zipfil (is_zipfile)."""
    plain = [w.lower() for w in terms.words if not _is_identifier_like(w)]
    return {light_stem(a + b) for a, b in zip(plain, plain[1:], strict=False)}


def search(store, query: str, k: int = 10, *, mode: str = "fused", semantic=None) -> list[SearchHit]:
    """The best `k` hits for `query`, best first. Never raises for odd query text. `semantic`: a
    `SemanticRanker` to fuse in (lexical ranking alone without it, or while nothing is embedded)."""
    if mode not in MODES:
        raise ValueError(f"unknown search mode {mode!r}; expected one of {', '.join(MODES)}")
    if k <= 0:
        return []
    terms = analyse_query(query or "")
    if not terms.words:
        return []
    depth = max(k * 4, 40)
    meaning = _semantic_hits(semantic, store, query, depth)
    if mode == "semantic":
        return _dedupe(meaning, k)
    if mode == "symbols":
        return _dedupe(_symbol_hits(store, terms, depth), k)
    if mode == "bm25":
        return _dedupe(_bm25_hits(store, terms, depth), k)
    pool = _bm25_hits(store, terms, _POOL, with_synonyms=True)
    # Without synonyms for any word the pool came from the same query: its top is the BM25 list.
    same = _fts_text(terms, with_synonyms=True) == _fts_text(terms)
    bm25 = pool[:depth] if same else _bm25_hits(store, terms, depth)
    lists = [
        (1.0, bm25, False),
        (_SYNONYM_BM25_WEIGHT, pool[:depth], False),
        (_HEAD_WEIGHT, _head_ranked(pool, terms)[:depth], False),
        (_symbol_weight(terms), _symbol_hits(store, terms, depth), True),
    ]
    if meaning:
        lists.append((_SEMANTIC_WEIGHT, meaning, False))
    return _dedupe(_promote_dotted(_fuse(lists), terms), k)


def _semantic_hits(semantic, store, query: str, limit: int) -> list[SearchHit]:
    if semantic is None:
        return []
    return semantic.hits(store, query[:_MAX_QUERY_CHARS], limit)


def _promote_dotted(hits: list[SearchHit], terms: QueryTerms) -> list[SearchHit]:
    """A typed dotted name (`LineWrapper.wrap`) is unambiguous: definitions ending with it go first,
    ahead of a chunk of the whole class that merely contains them."""
    dotted = [i.lower() for i in terms.identifiers if "." in i]
    if not dotted:
        return hits

    def exact(hit: SearchHit) -> bool:
        name = (hit.symbol or "").lower()
        return any(name == d or name.endswith("." + d) for d in dotted)

    return [h for h in hits if exact(h)] + [h for h in hits if not exact(h)]


# --- BM25 -----------------------------------------------------------------------------------------


def _fts_text(terms: QueryTerms, with_synonyms: bool = False) -> str:
    """The words, each followed by its base forms (a poor man's stemming for an index without one),
    and for the candidate pool by a few synonyms."""
    out: list[str] = []
    for word in terms.words:
        out.append(word)
        if not _is_identifier_like(word):
            out.extend(f for f in word_forms(word) if f not in out)
            if with_synonyms:
                out.extend(w for w in synonyms(word)[:_FTS_SYNONYMS] if w not in out)
    return " ".join(out)


def _bm25_hits(store, terms: QueryTerms, limit: int, with_synonyms: bool = False) -> list[SearchHit]:
    rows = store.fts_chunks(_fts_text(terms, with_synonyms), limit)
    return [
        SearchHit(
            path=r.path,
            rel=r.rel,
            start_line=r.start_line,
            end_line=r.end_line,
            symbol=r.symbol,
            score=float(r.score),
            text=r.text,
        )
        for r in rows
    ]


# --- heads: the BM25 pool re-ranked by what its definitions say about themselves -------------------


def _head(hit: SearchHit) -> str:
    """The definition's own first lines (signature, docstring), skipping code merged in before it."""
    lines = hit.text.splitlines()
    if hit.symbol:
        name = hit.symbol.rsplit(".", 1)[-1]
        start = next((i for i, line in enumerate(lines[:_HEAD_SEARCH]) if name in line), 0)
        lines = lines[start:]
    return "\n".join(lines[:_HEAD_LINES])


def _head_ranked(pool: list[SearchHit], terms: QueryTerms) -> list[SearchHit]:
    """Pool hits ordered by the IDF-weighted share of query words (or their synonyms) in their head
    and name, plus adjacent query words found joined ("zip file" in `is_zipfile`)."""
    groups = _term_groups(terms)
    if not pool or not groups:
        return []
    for joined in _joined_stems(terms) - groups.keys():
        groups[joined] = frozenset({joined})
    query = _query_stems(terms)
    single = [t for t in groups if t in query]
    matched = [_matched_terms(_head_stems(_head(h)), groups) for h in pool]
    df = {t: sum(t in m for m in matched) for t in groups}
    idf = {t: math.log(1.0 + len(pool) / (1.0 + df[t])) for t in groups}
    total = sum(idf[t] for t in single) or 1.0
    scored = []
    for rank, (hit, head) in enumerate(zip(pool, matched, strict=True)):
        name = _matched_terms(_stems(hit.symbol.rsplit(".", 1)[-1]), groups) if hit.symbol else set()
        score = (sum(idf[t] for t in head) + _NAME_WEIGHT * sum(idf[t] for t in name)) / total
        score += _POOL_PRIOR * (1.0 - rank / len(pool))
        scored.append((-score, rank, hit))
    scored.sort(key=lambda item: (item[0], item[1]))
    return [_with_score(hit, -neg) for neg, _, hit in scored]


@functools.lru_cache(maxsize=32768)
def _head_stems(head: str) -> frozenset[str]:
    """Heads recur from query to query; their stems are worth keeping."""
    return frozenset(_stems(head))


def _matched_terms(stems: set[str] | frozenset[str], groups: dict[str, frozenset[str]]) -> set[str]:
    return {t for t, group in groups.items() if not group.isdisjoint(stems)}


# --- symbols --------------------------------------------------------------------------------------


def _candidate_names(terms: QueryTerms) -> dict[str, float]:
    """name (lower case) -> match quality: typed identifiers beat joined words beat single words."""
    quality: dict[str, float] = {}

    def offer(name: str, q: float) -> None:
        key = name.lower()
        if key and q > quality.get(key, 0.0):
            quality[key] = q

    for ident in terms.identifiers:
        offer(ident.split(".")[-1], 3.0)
        parts = split_identifier(ident)
        if len(parts) > 1:
            offer("".join(parts), 2.5)
            offer("_".join(parts), 2.5)
    plain = [w.lower() for w in terms.words if w not in terms.identifiers]
    for n in (3, 2):
        for i in range(len(plain) - n + 1):
            gram = plain[i : i + n]
            offer("".join(gram), 1.8 + 0.1 * n)
            offer("_".join(gram), 1.8 + 0.1 * n)
    for a, b in zip(plain, plain[1:], strict=False):
        for x in synonyms(a)[:_JOIN_SYNONYMS] + (a,):
            for y in synonyms(b)[:_JOIN_SYNONYMS] + (b,):
                if (x, y) != (a, b):
                    offer(x + y, 1.7)
                    offer(x + "_" + y, 1.7)
    for w in plain:
        if len(w) >= 3:
            offer(w, 1.0 if len(plain) > 1 else 2.0)
    return quality


def _context_words(terms: QueryTerms, identifiers_only: bool = False) -> set[str]:
    words: set[str] = set()
    for w in terms.words:
        if _is_identifier_like(w):
            words.update(split_identifier(w))
        elif not identifiers_only:
            words.add(w.lower())
    return {w for w in words if len(w) >= 3}


def is_test_path(rel: str) -> bool:
    """Whether the workspace-relative path `rel` is a test file (by its folder or its name)."""
    parts = rel.lower().split("/")
    name = parts[-1]
    return bool(_TEST_PARTS.intersection(parts[:-1])) or name.startswith("test_") or name.endswith("_test.py")


def _part_quality(name: str, query: set[str]) -> float:
    """How well the query's words spell the name: share of the name's parts, share of the query."""
    parts = {light_stem(p) for p in split_identifier(name)}
    matched = len(parts & query)
    if not matched or not parts:
        return 0.0
    return 3.0 * (matched / len(parts)) * (0.5 + 0.5 * matched / len(query))


def _symbol_score(
    row, quality: float, per_name: int, terms: QueryTerms, context: tuple[set[str], set[str]]
) -> float:
    """How good a definition is as an answer: match quality, specificity, kind, size and context."""
    own = set(split_identifier(row.name))
    # "subprocess run": another query word naming the module is strong evidence (and settles which
    # of the many `run`s is meant); so is a typed identifier naming the enclosing class
    # ("TopologicalSorter static_order").
    words, typed = context
    in_path = (words - own) & set(re.split(r"[/._\-]+", row.rel.lower()))
    in_qualname = (typed - own - in_path) & set(split_identifier(row.qualname))
    score = quality / (1.0 + math.log2(1 if in_path else per_name))
    score *= 1.0 + _PATH_WORD_BONUS * len(in_path)
    score *= 1.0 + _QUALNAME_WORD_BONUS * len(in_qualname)
    score *= _KIND_WEIGHT.get(row.kind, 0.7)
    if terms.kind_hint and row.kind == terms.kind_hint:
        score *= 1.3
    dotted = [i for i in terms.identifiers if "." in i]
    if any(row.qualname.lower().endswith(d.lower()) for d in dotted):
        score *= 1.5
    # Among same-named definitions the substantial one is the likelier answer.
    score *= 1.0 + 0.05 * math.log2(1 + max(0, row.end_line - row.start_line))
    if row.name.startswith("_") and not any(i.startswith("_") for i in terms.identifiers):
        score *= 0.9
    if is_test_path(row.rel):
        score *= 0.8
    return score


def _symbol_rows(store, terms: QueryTerms, quality: dict[str, float], limit: int) -> list:
    # The store keeps its input order when it truncates: best-quality names first.
    names = sorted(quality, key=lambda name: (-quality[name], name))
    rows = list(store.symbols_named(names, limit * 5)) if names else []
    plain = [w for w in terms.words if not _is_identifier_like(w) and len(w) >= _PREFIX_MIN]
    for word in plain[:_PREFIX_WORDS]:
        rows.extend(store.symbols_prefix(light_stem(word), _PREFIX_LIMIT))
    unique = {}
    for r in rows:
        unique.setdefault((r.path, r.qualname, r.start_line), r)
    return list(unique.values())


def _symbol_hits(store, terms: QueryTerms, limit: int) -> list[SearchHit]:
    quality = _candidate_names(terms)
    query = _query_stems(terms)
    rows = _symbol_rows(store, terms, quality, limit)
    per_name: dict[str, int] = {}
    for r in rows:
        per_name[r.name.lower()] = per_name.get(r.name.lower(), 0) + 1
    context = (_context_words(terms), _context_words(terms, identifiers_only=True))
    scored = []
    for r in rows:
        q = max(quality.get(r.name.lower(), 0.0), _part_quality(r.name, query) if query else 0.0)
        if q >= _MIN_SYMBOL_QUALITY:
            scored.append((_symbol_score(r, q, per_name.get(r.name.lower(), 1), terms, context), r))
    scored.sort(key=lambda sr: (-sr[0], sr[1].rel, sr[1].start_line))
    return [
        SearchHit(
            path=r.path,
            rel=r.rel,
            start_line=r.start_line,
            end_line=r.end_line,
            symbol=r.qualname,
            score=s,
            text=r.signature,
        )
        for s, r in scored[:limit]
    ]


# --- fusion and de-duplication --------------------------------------------------------------------


def _symbol_weight(terms: QueryTerms) -> float:
    """Trust name lookup most for "where is X defined", less for plain-word questions."""
    if terms.wants_definition:
        return _SYMBOL_WEIGHT_DEFINITION
    return _SYMBOL_WEIGHT_IDENTIFIER if terms.identifiers else _SYMBOL_WEIGHT_PLAIN


def _key(hit: SearchHit) -> tuple:
    """One entry per definition: a chunk and a symbol hit for the same definition fuse."""
    if hit.symbol:
        return (hit.path, hit.symbol)
    return (hit.path, hit.start_line, hit.end_line)


def _fuse(lists: Iterable[tuple[float, list[SearchHit], bool]]) -> list[SearchHit]:
    """Weighted reciprocal rank fusion; one hit per definition, shown as precisely as known."""
    scores: dict[tuple, float] = {}
    chunks: dict[tuple, SearchHit] = {}
    symbols: dict[tuple, SearchHit] = {}
    for weight, hits, from_symbols in lists:
        seen: set[tuple] = set()
        for rank, hit in enumerate(hits, start=1):
            key = _key(hit)
            if key in seen:
                continue
            seen.add(key)
            scores[key] = scores.get(key, 0.0) + weight / (RRF_K + rank)
            (symbols if from_symbols else chunks).setdefault(key, hit)
    merged = {key: _merge(chunks.get(key), symbols.get(key)) for key in scores}
    order = sorted(scores, key=lambda key: (-scores[key], merged[key].rel, merged[key].start_line))
    return [_with_score(merged[key], scores[key]) for key in order]


def _merge(chunk: SearchHit | None, symbol: SearchHit | None) -> SearchHit:
    """A chunk (it has the code) narrowed to the definition's own lines when a symbol hit knows them:
    chunks also carry the comments and small neighbours merged in before a definition."""
    if chunk is None or symbol is None:
        return chunk or symbol
    if not chunk.start_line <= symbol.start_line <= symbol.end_line <= chunk.end_line:
        return chunk
    lines = chunk.text.split("\n")
    if len(lines) != chunk.end_line - chunk.start_line + 1:
        return chunk  # the chunk's text was cut short: keep it as it is
    first = symbol.start_line - chunk.start_line
    text = "\n".join(lines[first : symbol.end_line - chunk.start_line + 1])
    return SearchHit(
        path=chunk.path,
        rel=chunk.rel,
        start_line=symbol.start_line,
        end_line=symbol.end_line,
        symbol=chunk.symbol,
        score=chunk.score,
        text=text,
    )


def _with_score(hit: SearchHit, score: float) -> SearchHit:
    return dataclasses.replace(hit, score=score)


def _same_region(a: SearchHit, b: SearchHit) -> bool:
    """Overlapping ranges that share at least half of each: the same code, shown twice.

    A class and one of its methods overlap too, but the method is a different (smaller) answer.
    """
    if a.path != b.path:
        return False
    overlap = min(a.end_line, b.end_line) - max(a.start_line, b.start_line) + 1
    if overlap <= 0:
        return False
    len_a = a.end_line - a.start_line + 1
    len_b = b.end_line - b.start_line + 1
    return overlap * 2 >= len_a and overlap * 2 >= len_b


def _dedupe(hits: list[SearchHit], k: int) -> list[SearchHit]:
    kept: list[SearchHit] = []
    keys: set[tuple] = set()
    for hit in hits:
        key = _key(hit)
        if key in keys or any(_same_region(hit, other) for other in kept):
            continue
        keys.add(key)
        kept.append(hit)
        if len(kept) >= k:
            break
    return kept
