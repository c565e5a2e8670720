"""Which reference documents a completion reads, and composing them for the request.

By definition (the server's selection, `CompletionReferences(symbols=...)`): the next line needs the
definitions of the names around the cursor that live in other files. The names used in the last
`NEAR_LINES` lines before the cursor (strings and comments left out, keywords and builtins too),
then the names the file imports but does not use yet (imported to be used, likely on the next
lines), are looked up in the index's symbols; each one defined elsewhere gives a short document:
its signature, its docstring's first lines, and for a class the headers of its methods (a few dozen
tokens, cheap to encode, and what a call needs). A name the index does not know is looked for in
the open files (unsaved definitions, an index not ready yet): open files are read for their
definitions, never composed whole: measured on real code (issue 22), whole open files left the
suggestion unchanged at 56 lines in 60 and cost 0.36 s per request, most of it decoding past their
hundreds of tokens (`bench/bench_squid_keystroke.py`: 0.5 s of decoding per keystroke after 1,034
tokens of them; 0.01 s after definitions).

No reference is composed when it cannot change the answer. A name is left out when:
  - the current file defines or binds it (def, class, assignment, parameter, loop variable): what
    the model needs of it is in the file, and a same-named definition elsewhere is another thing;
  - it is the word the cursor is in (still being typed: it is not a name yet);
  - it resolves only to definitions in the current file, or to none;
  - used bare (`name(`) it has only nested definitions (methods, class attributes): those are reached
    through an attribute (`.name(`);
  - reached through a module the file imports (`sys.stdin.read`, `utils.parse`), it has no
    definition in that module's file (none at all for a module outside the project);
  - it has more than `AMBIGUOUS` definitions elsewhere and no import of the current file says which
    one it is: a wrong definition cannot help;
  - it is a method of a class already chosen: the class's document lists its methods' headers.
When no name is left there are no references at all, and the prompt is the one Squid off serves
(and its window cache is the one off keeps).

Stable across keystrokes: the lines above the cursor do not change while a line is typed, and the
word under the cursor does not count, so the set changes only when a newly completed name needs a
definition. The documents are ordered by file and line, not by the order the names were met, so
the same set always composes into the same context (`SquidService.context_for` hands back the same
composition, whose cache the runtime recognises by identity and keeps its window after).

Without `symbols` (callers that hand their documents explicitly: benchmarks, tests): the other open
files whole, then chunks the repository index retrieves for the identifiers around the cursor. The
current file is never a reference: its text before the cursor is the query. Each document starts
with a `# path` line so the model can tell them apart.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import SquidcodeError
from .compose import ComposedContext
from .service import ReferenceDocument, SquidService

__all__ = [
    "CompletionReferences",
    "Definition",
    "definition_document",
    "file_document",
    "imported_definitions",
    "names_near_cursor",
    "no_symbols",
    "resolve_definitions",
    "retrieval_query",
    "unused_imports",
    "select_definitions",
    "select_references",
]

log = logging.getLogger(__name__)

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
_KEYWORDS = frozenset(
    "def class return import from self None True False for while with elif else pass lambda yield "
    "async await try except finally raise function const let var this new".split()
)
# A document is cut to this many characters before it is tokenized (bounded work on huge files).
_CHARS_PER_TOKEN_CEILING = 8


def retrieval_query(prefix_text: str, lines: int = 12, terms: int = 12) -> str:
    """The identifiers of the last `lines` lines before the cursor, nearest first, de-duplicated."""
    tail = prefix_text.splitlines()[-lines:]
    seen: dict[str, None] = {}
    for line in reversed(tail):
        for word in reversed(_IDENT.findall(line)):
            if word not in _KEYWORDS:
                seen.setdefault(word, None)
    return " ".join(list(seen)[:terms])


def _label(path: str, roots: list[Path]) -> str:
    for root in roots:
        try:
            return str(Path(path).relative_to(root))
        except ValueError:
            continue
    return Path(path).name


def file_document(path: str, text: str, max_tokens: int, roots: list[Path] = ()) -> ReferenceDocument:
    body = text[: max_tokens * _CHARS_PER_TOKEN_CEILING]
    return ReferenceDocument(f"# {_label(path, list(roots))}\n{body}\n", source=path)


def select_references(
    *,
    current_path: str | None,
    prefix_text: str,
    open_documents: Mapping[str, str],
    search: Callable[[str, int], list] | None,
    max_documents: int,
    max_tokens: int,
    roots: list[Path] = (),
) -> list[ReferenceDocument]:
    """Up to `max_documents` references: other open files first, then retrieved chunks."""
    chosen: list[ReferenceDocument] = []
    for path, text in open_documents.items():
        if len(chosen) >= max_documents:
            return chosen
        if path != current_path and text.strip():
            chosen.append(file_document(path, text, max_tokens, roots))
    query = retrieval_query(prefix_text)
    if search is None or not query or len(chosen) >= max_documents:
        return chosen
    try:
        hits = search(query, max_documents * 2)
    except (SquidcodeError, OSError) as exc:
        log.info("squid: retrieval for references failed (%s); going on without it", exc)
        return chosen
    taken = {doc.source for doc in chosen}
    for hit in hits:
        if len(chosen) >= max_documents:
            break
        if hit.path == current_path or hit.path in taken or not hit.text.strip():
            continue
        body = hit.text[: max_tokens * _CHARS_PER_TOKEN_CEILING]
        chosen.append(ReferenceDocument(f"# {hit.rel}:{hit.start_line}\n{body}\n", source=hit.path))
    return chosen


# -- by definition ------------------------------------------------------------------------------

# Lines before the cursor whose names count (the current line and the three above it).
NEAR_LINES = 4
# A name with more definitions than this in other files, none of them imported, is left out.
AMBIGUOUS = 2
# Lines of a definition's docstring kept, headers of a class's methods kept, characters per document.
DOC_LINES = 4
CLASS_METHODS = 12
DEFINITION_CHARS = 1600
_NAMES_LOOKED_UP = 24
_CLASS_KINDS = ("class", "struct", "interface", "trait")

_NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*|(?<=\.)[A-Za-z_]\w*|(?<=\.\s)[A-Za-z_]\w*")
# The dotted chain before a name (`a.b.` in `a.b.name`), and what comes before the chain.
_CHAIN = re.compile(r"((?:[A-Za-z_]\w*\s*\.\s*)*[A-Za-z_]\w*)?\s*\.\s*$")
_STRING_OR_COMMENT = re.compile(
    r"""[rRbBuUfF]{0,2}("[^"\\\n]*(?:\\.[^"\\\n]*)*"?|'[^'\\\n]*(?:\\.[^'\\\n]*)*'?)|#.*|//.*""")
# What binds a name, one line at a time (a file's lines are cached: a keystroke changes one of them).
_LINE_BINDINGS = (
    re.compile(r"^\s*(?:async\s+)?(?:def|class|function|func|fn|struct|enum|trait|type|interface)\s+"
               r"([A-Za-z_]\w*)"),
    re.compile(r"^\s*(?:const\s+|let\s+|var\s+|local\s+)?([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)"),
    re.compile(r"^\s*([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)+)\s*=(?!=)"),  # a, b = ...
    re.compile(r"\bfor\s+\(?([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\)?\s+in\b"),
    re.compile(r"\b(?:with|except)\b.*\bas\s+([A-Za-z_]\w*)"),
    re.compile(r"^\s*\*{0,2}([A-Za-z_]\w*)\s*(?::[^,=]*)?,\s*$"),  # a parameter on a line of its own
)
_PARAMETERS = re.compile(r"\b(?:def|function|fn|func)\s+\w*\s*\((.*)")
_PARAMETER = re.compile(r"(?:^|,)\s*[*&]{0,2}\s*([A-Za-z_]\w*)")
_LINE_CACHE_SIZE = 50_000
_IMPORT = re.compile(r"^\s*import\s+([\w.]+(?:\s+as\s+\w+)?(?:\s*,\s*[\w.]+(?:\s+as\s+\w+)?)*)", re.M)
_FROM_IMPORT = re.compile(r"^\s*from\s+([\w.]+)\s+import\s+(?:\(([^)]*)\)|([^\n(]+))", re.M)
_BUILTINS = frozenset(dir(__import__("builtins"))) | frozenset(
    "self cls super async await def class return import from for while with elif else pass lambda yield "
    "try except finally raise function const let var this new null undefined true false nil None True "
    "False and or not is in if del global nonlocal assert break continue match case local end then".split())


@dataclass(frozen=True)
class Definition:
    """Where a name the cursor's lines use is defined (an index symbol, or found in an open file)."""

    path: str
    rel: str
    name: str
    qualname: str
    kind: str
    start_line: int
    end_line: int


def names_near_cursor(prefix_text: str, lines: int = NEAR_LINES) -> list[tuple[str, str | None]]:
    """(name, what it is reached through) for the names of the last `lines` lines, nearest first:
    None for a bare name, else the root of its dotted chain (`_chain_root`). Strings, comments,
    keywords, builtins and the word the cursor is in are left out."""
    tail = prefix_text.splitlines()[-lines:] if prefix_text else []
    if tail and not prefix_text.endswith(("\n", "\r")):
        word = re.search(r"[A-Za-z0-9_]+$", tail[-1])
        if word is not None:  # still being typed
            tail[-1] = tail[-1][: word.start()]
    seen: dict[str, str | None] = {}
    for line in reversed(tail):
        code = _STRING_OR_COMMENT.sub(" ", line)
        found = []
        for match in _NAME.finditer(code):
            found.append((match.group(0), _chain_root(code[: match.start()])))
        for name, receiver in reversed(found):
            if len(name) < 2 or name in _BUILTINS:
                continue
            if name not in seen or (seen[name] is None and receiver is not None):
                seen[name] = receiver
    return list(seen.items())


def _chain_root(before: str) -> str | None:
    """What a name right after `before` is reached through: None when bare, else the first
    identifier of its dotted chain (`a` for `a.b.name`), or "" when the chain starts with a call,
    an index or a literal."""
    chain = _CHAIN.search(before)
    if chain is None:
        return None
    head = before[: chain.start()].rstrip()
    first = re.match(r"[A-Za-z_]\w*", chain.group(1) or "")
    if first is None or (head and head[-1] in ")]}\"'."):
        return ""
    return first.group(0)


def _line_bindings(line: str) -> frozenset[str]:
    bound: set[str] = set()
    for pattern in _LINE_BINDINGS:
        match = pattern.search(line)
        if match is not None:
            bound.update(part.strip() for part in match.group(1).split(","))
    match = _PARAMETERS.search(line)
    if match is not None:
        bound.update(_PARAMETER.findall(re.sub(r"[=:][^,]*", "", match.group(1).split(")", 1)[0])))
    return frozenset(bound)


_LINE_NAMES: dict[str, frozenset[str]] = {}


def bound_names(text: str) -> set[str]:
    """Names the file defines or binds itself: definitions, assignments, parameters, loop and `as`
    variables (not imports: an imported name is defined elsewhere)."""
    bound: set[str] = set()
    cache = _LINE_NAMES
    if len(cache) > _LINE_CACHE_SIZE:
        cache.clear()
    for line in text.splitlines():
        names = cache.get(line)
        if names is None:
            names = cache[line] = _line_bindings(line)
        if names:
            bound.update(names)
    return bound


def imported_from(text: str) -> dict[str, str]:
    """name -> module, for the file's imports (`_imports`); the last file's are kept."""
    return _file_names(text)[1]


def _imports(text: str) -> dict[str, str]:
    """name -> module, for the file's `from module import name` lines; a module the file imports
    whole (`import a.b`, `import a.b as c`) maps its name to itself (`a`, `c`)."""
    out: dict[str, str] = {}
    for match in _IMPORT.finditer(text):
        for part in match.group(1).split(","):
            pieces = part.split("#", 1)[0].split()
            if pieces:
                alias = pieces[2] if len(pieces) == 3 and pieces[1] == "as" else pieces[0].split(".")[0]
                out[alias] = pieces[0]
    for match in _FROM_IMPORT.finditer(text):
        for part in (match.group(2) or match.group(3)).split(","):
            pieces = part.split("#", 1)[0].split()
            if pieces and pieces[0].isidentifier():
                out[pieces[-1] if len(pieces) == 3 and pieces[1] == "as" else pieces[0]] = match.group(1)
    return out


# (text, its bound names and imports) of the last current file: a request composes two or three times.
_LAST_FILE: list[tuple] = [(None, None)]


def _file_names(text: str) -> tuple[set[str], dict[str, str]]:
    seen, names = _LAST_FILE[0]
    if seen != text:
        names = (bound_names(text), _imports(text))
        _LAST_FILE[0] = (text, names)
    return names


def _from_module(definition: Definition, module: str) -> bool:
    """Whether `definition`'s file is the module `module` (`pkg.mod`, `.mod`, `..pkg.mod`) names."""
    tail = [p for p in module.split(".") if p]
    if not tail:
        return False
    path = Path(definition.path)
    parts = list(path.parent.parts) + ([] if path.stem == "__init__" else [path.stem])
    return parts[-len(tail):] == tail


_HEADER = re.compile(r"^([ \t]*)(?:export\s+)?(?:async\s+)?(?:def|class|function)\s+([A-Za-z_]\w*)"
                     r"|^()(?:const\s+|let\s+|var\s+)?([A-Za-z_]\w*)\s*(?::[^=\n]*)?=(?!=)", re.M)


class _OpenFiles:
    """Per open file (by path and text): its lines and where each name is defined in it, computed
    once per version of the text, not per keystroke."""

    def __init__(self, size: int = 32):
        self.size = size
        self._cache: OrderedDict[str, tuple] = OrderedDict()
        self._lock = threading.Lock()

    def _entry(self, path: str, text: str) -> tuple:
        with self._lock:
            entry = self._cache.get(path)
            if entry is not None and (entry[0] is text or entry[0] == text):
                self._cache.move_to_end(path)
                return entry
        headers: dict[str, list[tuple[int, bool, str]]] = {}
        for match in _HEADER.finditer(text):
            nested = bool(match.group(1))
            name = match.group(2) or match.group(4)
            kind = "variable" if match.group(4) else ("method" if nested else "function")
            headers.setdefault(name, []).append((text.count("\n", 0, match.start()) + 1, nested, kind))
        entry = (text, text.splitlines(), headers)
        with self._lock:
            self._cache[path] = entry
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)
        return entry

    def lines(self, path: str, text: str) -> list[str]:
        return self._entry(path, text)[1]

    def definitions(self, path: str, text: str, name: str) -> list[tuple[int, bool, str]]:
        return self._entry(path, text)[2].get(name, [])


_OPEN_FILES = _OpenFiles()


def _open_file_definitions(name: str, open_documents: Mapping[str, str], current_path: str | None,
                           roots: list[Path]) -> list[Definition]:
    """`name`'s definitions found by their header in the open files (other than the current one)."""
    found = []
    for path, text in open_documents.items():
        if path == current_path:
            continue
        for line, nested, kind in _OPEN_FILES.definitions(path, text, name):
            found.append(Definition(path, _label(path, roots), name, f"?.{name}" if nested else name, kind,
                                    line, line + 200))
    return found


def _definition_rows(names: list[str], symbols, open_documents, current_path, roots) -> dict[str, list]:
    """name -> its definitions: the index's symbols, else the open files' headers."""
    by_name: dict[str, list[Definition]] = {name: [] for name in names}
    try:
        rows = symbols(names, len(names) * 8) if names else []
    except (SquidcodeError, OSError, sqlite3.Error) as exc:
        log.info("squid: symbol look-up for references failed (%s); using the open files", exc)
        rows = []
    for row in rows:
        if row.name in by_name:
            by_name[row.name].append(Definition(row.path, row.rel, row.name, row.qualname, row.kind,
                                                row.start_line, row.end_line))
    for name, found in by_name.items():
        if not found:
            found.extend(_open_file_definitions(name, open_documents, current_path, roots))
    return by_name


def resolve_definitions(names: list[tuple[str, str | None]], *, current_path: str | None, current_text: str,
                        symbols, open_documents: Mapping[str, str], roots: list[Path] = (),
                        limit: int = 4) -> list[Definition]:
    """One definition per name that can change the answer (module docstring: the rule), at most
    `limit`, the nearest names first; ordered by file and line."""
    bound, imports = _file_names(current_text)
    # A bare name the file binds is its own; so is `self.name` when the file defines `name`.
    wanted = [(n, receiver) for n, receiver in names
              if n in imports or n not in bound or receiver not in (None, "self", "cls", "this")]
    wanted = wanted[:_NAMES_LOOKED_UP]
    by_name = _definition_rows([n for n, _ in wanted], symbols, open_documents, current_path, list(roots))
    chosen: dict[tuple[str, int], Definition] = {}
    current = str(Path(current_path)) if current_path else None
    for name, receiver in wanted:
        if len(chosen) >= limit:
            break
        found = [d for d in by_name[name] if str(Path(d.path)) != current]
        # Bare, a name is a top-level definition; reached through a module the file imports, one of
        # that module (`utils.parse`, `package.Class`; none for `sys.stdin.read`); through anything
        # else, a method or attribute, or a top-level definition of the module the root names.
        if receiver is None:
            found = [d for d in found if "." not in d.qualname]
        elif receiver in imports:
            found = [d for d in found if receiver in Path(d.path).with_suffix("").parts]
        else:
            found = [d for d in found if "." in d.qualname
                     or (receiver and receiver in Path(d.path).with_suffix("").parts)]
        module = imports.get(name)
        preferred = [d for d in found if module and _from_module(d, module)]
        if not preferred and len(found) > AMBIGUOUS:
            continue
        for definition in preferred or found[:1]:
            chosen.setdefault((definition.path, definition.start_line), definition)
            break
    # A class's document lists its methods' headers: a method of a chosen class adds nothing.
    classes = {(d.path, d.qualname) for d in chosen.values() if d.kind in _CLASS_KINDS}
    kept = [d for d in chosen.values() if (d.path, d.qualname.rpartition(".")[0]) not in classes]
    return sorted(kept, key=lambda d: (d.rel, d.path, d.start_line))


def _header_end(lines: list[str], start: int, limit: int = 12) -> int:
    """Index of the line where the header starting at `lines[start]` ends (brackets closed)."""
    depth = 0
    for i in range(start, min(len(lines), start + limit)):
        code = _STRING_OR_COMMENT.sub("", lines[i])
        depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
        if depth <= 0 and not code.rstrip().endswith(("\\", ",")):
            return i
    return min(len(lines), start + limit) - 1


def _docstring(lines: list[str], after: int) -> list[str]:
    """The first `DOC_LINES` lines of the docstring right after line `after`, if there is one."""
    i = after + 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines) or not re.match(r'\s*[rRuU]?("""|\'\'\'|")', lines[i]):
        return []
    quote = re.match(r'\s*[rRuU]?("""|\'\'\'|")', lines[i]).group(1)
    out = []
    for j in range(i, min(len(lines), i + DOC_LINES)):
        out.append(lines[j])
        if lines[j].count(quote) >= (2 if j == i else 1):
            return out
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    return out + [f"{indent}...{quote}"]


def _comment_above(lines: list[str], start: int) -> list[str]:
    """The comment lines (`#`, `//`, `/** */`) just above line `start`, at most `DOC_LINES`."""
    i = start
    while i > 0 and start - i < DOC_LINES and re.match(r"\s*(#|//|/\*|\*)", lines[i - 1]):
        i -= 1
    return lines[i:start]


def _methods(lines: list[str], header_end: int, end: int) -> list[str]:
    """The headers of a class's methods (its first body level), at most `CLASS_METHODS`."""
    body_indent = None
    out = []
    for i in range(header_end + 1, min(end, len(lines))):
        line = lines[i]
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        body_indent = indent if body_indent is None else body_indent
        if indent == body_indent and re.match(r"\s*(async\s+)?def\s", line):
            last = _header_end(lines, i)
            out.append("\n".join(lines[i : last + 1]))
            if len(out) >= CLASS_METHODS:
                break
    return out


def definition_text(lines: list[str], definition: Definition) -> str | None:
    """The definition as a short document: its header (as written), the docstring's first lines (or
    the comment above it) and for a class its methods' headers; None when its line is not there."""
    start = definition.start_line - 1
    if not 0 <= start < len(lines) or definition.name not in "\n".join(lines[start : start + 3]):
        return None
    end = _header_end(lines, start)
    parts = _comment_above(lines, start) + lines[start : end + 1] + _docstring(lines, end)
    if definition.kind in _CLASS_KINDS:
        parts += _methods(lines, end, definition.end_line)
    text = "\n".join(parts)
    return text[:DEFINITION_CHARS]


class _FileLines:
    """Files' lines by (path, mtime, size): each keystroke reads the same few files."""

    def __init__(self, size: int = 64):
        self.size = size
        self._cache: OrderedDict[tuple, list[str]] = OrderedDict()
        self._lock = threading.Lock()

    def lines(self, path: str) -> list[str] | None:
        try:
            stat = os.stat(path)
        except OSError:
            return None
        key = (path, stat.st_mtime_ns, stat.st_size)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        try:
            lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return None
        with self._lock:
            self._cache[key] = lines
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)
        return lines


_FILES = _FileLines()


def definition_document(definition: Definition,
                        open_documents: Mapping[str, str]) -> ReferenceDocument | None:
    """A reference document for `definition`: `# rel:line`, then `definition_text` (the open
    document's text when the file is open in the editor, else the file on disk)."""
    text = open_documents.get(definition.path)
    lines = _OPEN_FILES.lines(definition.path, text) if text is not None else _FILES.lines(definition.path)
    if lines is None:
        return None
    body = definition_text(lines, definition)
    if body is None:
        return None
    return ReferenceDocument(f"# {definition.rel}:{definition.start_line}\n{body}\n", source=definition.path)


def unused_imports(text: str, prefix_text: str) -> list[str]:
    """Names the file imports by name (`from module import name`) and does not use yet, besides in
    the word being typed: the user imported them to use them, most likely on the lines to come."""
    word = re.search(r"[A-Za-z_]\w*$", prefix_text)
    typing = word.group(0) if word is not None else ""
    out = []
    for name, module in imported_from(text).items():
        # A substring count: a name inside a longer identifier counts as used (left out, not added).
        if module not in (name, "__future__") and text.count(name) - (typing == name) <= 1:
            out.append(name)
    return out


def select_definitions(*, current_path: str | None, prefix_text: str, current_text: str | None = None,
                       open_documents: Mapping[str, str], symbols, max_documents: int,
                       roots: list[Path] = ()) -> list[ReferenceDocument]:
    """Up to `max_documents` definitions of the names around the cursor, then of the names the file
    imports and does not use yet (module docstring)."""
    if max_documents <= 0:
        return []
    text = prefix_text if current_text is None else current_text
    names = names_near_cursor(prefix_text)
    near = {name for name, _ in names}
    names += [(name, None) for name in unused_imports(text, prefix_text) if name not in near]
    if not names:
        return []
    definitions = resolve_definitions(
        names, current_path=current_path, current_text=text, symbols=symbols, open_documents=open_documents,
        roots=list(roots), limit=max_documents)
    documents = [definition_document(d, open_documents) for d in definitions]
    return [d for d in documents if d is not None]


def imported_definitions(*, current_path: str | None, current_text: str, open_documents: Mapping[str, str],
                         symbols, roots: list[Path] = (), limit: int = 16) -> list[ReferenceDocument]:
    """The definitions of the names the file imports by name (`from module import name`), found
    in the project: what its lines will most likely need, worth encoding before they do."""
    _, imports = _file_names(current_text)
    names = [(name, None) for name, module in imports.items() if name != module.split(".")[0]]
    definitions = resolve_definitions(names, current_path=current_path, current_text=current_text,
                                      symbols=symbols, open_documents=open_documents, roots=list(roots),
                                      limit=limit)
    documents = [definition_document(d, open_documents) for d in definitions]
    return [d for d in documents if d is not None]


def no_symbols(names: list[str], limit: int) -> list:
    """A symbol look-up without an index: names are then found in the open files only."""
    return []


class CompletionReferences:
    """What a completion request hands to `agent.completion.complete`: compose its references
    (the ready ones; the rest are encoded in the background for later requests) and hold the
    background encoder off while the request runs.

    `symbols(names, limit)` (the index store's `symbols_named`, or `no_symbols`): references are the
    definitions of the names around the cursor; None: the open files whole, then retrieved chunks.
    `reader`: the runtime that continues a composition (`context.squid.reader.reading_runtime`);
    None: the service's own.
    """

    def __init__(self, service: SquidService, *, current_path: str | None,
                 open_documents: Mapping[str, str], search: Callable[[str, int], list] | None,
                 roots: list[Path] = (), symbols: Callable[[list[str], int], list] | None = None,
                 reader=None):
        self.service = service
        self.reader = reader
        self.current_path = current_path
        self.open_documents = dict(open_documents)
        self.search = search
        self.roots = list(roots)
        self.symbols = symbols

    def foreground(self):
        return self.service.foreground()

    def documents(self, prefix_text: str) -> list[ReferenceDocument]:
        config = self.service.config
        if self.symbols is not None:
            return select_definitions(
                current_path=self.current_path, prefix_text=prefix_text,
                current_text=self.open_documents.get(self.current_path) if self.current_path else None,
                open_documents=self.open_documents, symbols=self.symbols,
                max_documents=config.max_documents, roots=self.roots)
        return select_references(
            current_path=self.current_path, prefix_text=prefix_text, open_documents=self.open_documents,
            search=self.search, max_documents=config.max_documents, max_tokens=config.document_tokens,
            roots=self.roots,
        )

    def compose(self, prefix_text: str, *, wait: bool = False, should_pause=None) -> ComposedContext | None:
        """The ready references composed (the missing ones queued for the background encoder), or
        with `wait` every reference, the missing ones encoded here first (GenerationCancelled when
        `should_pause` turns true meanwhile: `SquidService.context_for`)."""
        documents = self.documents(prefix_text)
        if not documents:
            return None
        return self.service.context_for(documents, wait=wait, should_pause=should_pause)
