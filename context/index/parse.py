"""Parse one file's text into definitions, references and retrievable chunks.

Languages with a grammar wheel (Python, JavaScript, TypeScript/TSX, Go, Rust, Lua) are parsed with
tree-sitter. One query per language runs over the tree once and captures both the definitions
(`@def.<kind>`, or `@scope.<kind>` for scopes that only name their members, like a Rust `impl`) and
the references (`@ref`): a single pass in C is several times cheaper than one pass per purpose or
walking the nodes from Python.

Chunks follow the definitions: a top-level definition is one chunk; a large class-like definition
(class, struct, trait, interface, impl, module) is split into its header and its members; anything
over `MAX_CHUNK_LINES` becomes overlapping line windows that keep the symbol; runs of small pieces
(imports, module code, tiny definitions) are merged up to `MERGE_LINES`. Files without a grammar, or
whose parse yields nothing, get plain line windows. Chunk text is bounded in characters as well, so
a file that is one enormous line costs a bounded amount of work.

TSX goes through a helper process (`GUARDED_LANGUAGES`): its grammar loops forever on some inputs
(tree-sitter-typescript#323) and the binding has no timeout, so a stuck parse is killed and the file
gets line windows.

Everything here is a module-level function over plain values, so a process pool can run it.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import itemgetter

import tree_sitter
import tree_sitter_go
import tree_sitter_javascript
import tree_sitter_lua
import tree_sitter_python
import tree_sitter_rust
import tree_sitter_typescript

from .types import Chunk, ParsedFile, Reference, Symbol

__all__ = [
    "GUARDED_LANGUAGES",
    "LANGUAGE_BY_SUFFIX",
    "MAX_CHUNK_LINES",
    "MERGE_LINES",
    "WINDOW_LINES",
    "WINDOW_OVERLAP",
    "language_for",
    "parse_source",
]

LANGUAGE_BY_SUFFIX = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
    ".lua": "lua",
}

MAX_CHUNK_LINES = 80  # a definition longer than this is split into windows
WINDOW_LINES = 40
WINDOW_OVERLAP = 5
MERGE_LINES = 40  # small neighbours are merged up to this many lines
SMALL_DEF_LINES = 5  # definitions shorter than this are merged with their neighbours
SMALL_CONTAINER_LINES = 40  # a class this short stays one chunk; longer ones split at members
ATTACH_MAX_LINES = 10  # comments/attributes directly above a definition join its chunk
MAX_CHUNK_CHARS = 16_000
MAX_SLICES_PER_LINE = 16  # an enormous line is indexed up to MAX_CHUNK_CHARS * this characters
MAX_PARSE_CHARS = 2_000_000  # beyond this, no grammar: windows only (parse and capture time grow with size)
# Grammars seen to loop forever on some inputs (tree-sitter-typescript#323: `<a {{b:>c:d(e f)` in TSX);
# they run in a helper process that is killed after GUARD_TIMEOUT_S (+ a little per character).
GUARDED_LANGUAGES = frozenset({"tsx"})
GUARD_TIMEOUT_S = 10.0
GUARD_SECONDS_PER_MILLION_CHARS = 5.0
MAX_DEFINITIONS = 20_000  # per file; a data file of 600k assignments is not 600k symbols
MAX_NAME_CHARS = 100
MAX_SIGNATURE_CHARS = 200

_CONTAINER_KINDS = frozenset({"class", "struct", "enum", "trait", "interface", "impl", "module"})
_METHOD_OWNERS = _CONTAINER_KINDS - {"module"}
_FUNCTION_VALUES = frozenset(
    {
        "arrow_function",
        "function_expression",
        "function",
        "generator_function",
        "generator_function_expression",
    }
)
_WHITESPACE = re.compile(r"\s+")
_HAS_WORD = re.compile(r"\w")

_JS_REFS = """
(call_expression function: (identifier) @ref)
(member_expression property: (property_identifier) @ref)
(new_expression constructor: (identifier) @ref)
"""
_JS_DEFS = """
(function_declaration) @def.function
(generator_function_declaration) @def.function
(class_declaration) @def.class
(method_definition) @def.method
(program (lexical_declaration (variable_declarator) @def.variable))
(program (variable_declaration (variable_declarator) @def.variable))
(program (export_statement declaration: (lexical_declaration (variable_declarator) @def.variable)))
(program (export_statement declaration: (variable_declaration (variable_declarator) @def.variable)))
"""
_TS_EXTRA = """
(function_signature) @def.function
(abstract_class_declaration) @def.class
(method_signature) @def.method
(abstract_method_signature) @def.method
(interface_declaration) @def.interface
(type_alias_declaration) @def.type
(enum_declaration) @def.enum
(internal_module) @def.module
(type_identifier) @ref
(extends_clause value: (identifier) @ref)
"""
_JSX_REFS = """
(jsx_opening_element name: (identifier) @ref)
(jsx_self_closing_element name: (identifier) @ref)
"""

_QUERIES = {
    "python": """
(function_definition) @def.function
(class_definition) @def.class
(module (expression_statement (assignment left: (identifier))) @def.variable)
(call function: (identifier) @ref)
(attribute attribute: (identifier) @ref)
(type (identifier) @ref)
(generic_type (identifier) @ref)
(decorator (identifier) @ref)
(class_definition superclasses: (argument_list (identifier) @ref))
""",
    "javascript": _JS_DEFS + _JS_REFS + _JSX_REFS + "(class_heritage (identifier) @ref)",
    "typescript": _JS_DEFS + _JS_REFS + _TS_EXTRA,
    "tsx": _JS_DEFS + _JS_REFS + _TS_EXTRA + _JSX_REFS,
    "go": """
(function_declaration) @def.function
(method_declaration) @def.method
(type_spec) @def.type
(type_alias) @def.type
(source_file (var_declaration (var_spec) @def.variable))
(source_file (var_declaration (var_spec_list (var_spec) @def.variable)))
(source_file (const_declaration (const_spec) @def.variable))
(call_expression function: (identifier) @ref)
(selector_expression field: (field_identifier) @ref)
(type_identifier) @ref
""",
    "rust": """
(function_item) @def.function
(function_signature_item) @def.function
(struct_item) @def.struct
(union_item) @def.struct
(enum_item) @def.enum
(trait_item) @def.trait
(type_item) @def.type
(mod_item body: (declaration_list)) @def.module
(const_item) @def.variable
(static_item) @def.variable
(macro_definition) @def.macro
(impl_item) @scope.impl
(call_expression function: (identifier) @ref)
(call_expression function: (scoped_identifier name: (identifier) @ref))
(field_expression field: (field_identifier) @ref)
(macro_invocation macro: (identifier) @ref)
(type_identifier) @ref
""",
    "lua": """
(function_declaration) @def.function
(assignment_statement (expression_list value: (function_definition))) @def.function
(function_call name: (identifier) @ref)
(dot_index_expression field: (identifier) @ref)
(method_index_expression method: (identifier) @ref)
""",
}

_GRAMMARS: dict[str, Callable[[], object]] = {
    "python": tree_sitter_python.language,
    "javascript": tree_sitter_javascript.language,
    "typescript": tree_sitter_typescript.language_typescript,
    "tsx": tree_sitter_typescript.language_tsx,
    "go": tree_sitter_go.language,
    "rust": tree_sitter_rust.language,
    "lua": tree_sitter_lua.language,
}

log = logging.getLogger(__name__)

# Parsers and query cursors keep state, so each thread gets its own.
_per_thread = threading.local()


def language_for(rel_path: str) -> str | None:
    """The grammar name for a path, by its extension; None when there is no grammar for it."""
    dot = rel_path.rfind(".")
    if dot < 0 or "/" in rel_path[dot:]:
        return None
    return LANGUAGE_BY_SUFFIX.get(rel_path[dot:].lower())


def _tools(language: str) -> tuple[tree_sitter.Parser, tree_sitter.Query]:
    cache = getattr(_per_thread, "tools", None)
    if cache is None:
        cache = _per_thread.tools = {}
    tools = cache.get(language)
    if tools is None:
        grammar = tree_sitter.Language(_GRAMMARS[language]())
        tools = cache[language] = (
            tree_sitter.Parser(grammar),
            tree_sitter.Query(grammar, _QUERIES[language]),
        )
    return tools


@dataclass(eq=False)
class _Def:
    """A definition (or a naming scope such as a Rust impl) found in the tree."""

    name: str
    kind: str
    start_byte: int  # the definition node itself: decides nesting
    end_byte: int
    start_line: int  # its span (with decorators / `export`): decides lines and chunks
    end_line: int
    signature: str
    name_start: int  # byte offset of the defining identifier, never reported as a reference
    prefix: str = ""  # qualifier written in the name itself, e.g. `M` in Lua's `function M.f()`
    emit: bool = True  # False for scopes that only qualify their members
    qualname: str = ""
    children: list[_Def] = field(default_factory=list)


def parse_source(text: str, rel_path: str) -> ParsedFile:
    """Symbols, references and chunks of one file's text; never raises on odd input."""
    language = language_for(rel_path)
    if not text or text.isspace():
        return ParsedFile(language=language)
    if language is None or len(text) > MAX_PARSE_CHARS:
        return _windows_only(text, language)
    if language in GUARDED_LANGUAGES:
        return _guarded_parse(text, rel_path, language)
    return _parse_with_grammar(text, language)


def _parse_with_grammar(text: str, language: str) -> ParsedFile:
    lines = _split_lines(text)
    source = text.encode("utf-8", "surrogatepass")
    parser, query = _tools(language)
    tree = parser.parse(source)
    captures = tree_sitter.QueryCursor(query).captures(tree.root_node)
    defs = _collect_defs(captures, source)
    top_level = _nest(defs)
    symbols = [
        Symbol(d.name, d.qualname, d.kind, d.start_line, d.end_line, d.signature) for d in defs if d.emit
    ]
    references = _collect_references(captures.get("ref", ()), source, {d.name_start for d in defs})
    chunks = _chunk_region(lines, 1, len(lines), top_level, None)
    if not chunks:
        chunks = _window_chunks(lines, 1, len(lines), None, "window")
    return ParsedFile(language=language, chunks=chunks, symbols=symbols, references=references)


def _windows_only(text: str, language: str | None) -> ParsedFile:
    lines = _split_lines(text)
    return ParsedFile(language=language, chunks=_window_chunks(lines, 1, len(lines), None, "window"))


def _split_lines(text: str) -> list[str]:
    # "\n" only, as tree-sitter counts rows (str.splitlines also splits on \r, \x0c, \u2028...).
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return lines


# ---------------------------------------------------------------- guarded grammars


def _guarded_parse(text: str, rel_path: str, language: str) -> ParsedFile:
    timeout = GUARD_TIMEOUT_S + GUARD_SECONDS_PER_MILLION_CHARS * len(text) / 1_000_000
    parsed = _guard.parse(text, rel_path, timeout)
    return parsed if parsed is not None else _windows_only(text, language)


class _ParseGuard:
    """A helper process that parses for grammars known to loop forever on some inputs.

    The binding offers no timeout or cancellation, and a stuck parse would hold a CPU and whatever
    lock its caller holds; a helper process can be killed. One helper per process, started on first
    use (about 0.1 s) and again after it was killed; requests are serialised.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner_pid = 0
        self._process: multiprocessing.process.BaseProcess | None = None
        self._connection: multiprocessing.connection.Connection | None = None

    def parse(self, text: str, rel_path: str, timeout: float) -> ParsedFile | None:
        """The helper's ParsedFile, or None when it could not run or took longer than `timeout`."""
        with self._lock:
            connection = self._running()
            if connection is None:
                return None
            try:
                connection.send((text, rel_path))
                if connection.poll(timeout):
                    return connection.recv()
                log.warning("parsing %s did not finish in %.0fs; indexed as plain lines", rel_path, timeout)
            except (OSError, EOFError, pickle.PickleError) as error:
                log.warning("the parse helper failed on %s (%s); indexed as plain lines", rel_path, error)
            self._stop()
            return None

    def _running(self) -> multiprocessing.connection.Connection | None:
        if self._owner_pid != os.getpid():
            self._process = self._connection = None  # inherited through fork: not ours to use
            self._owner_pid = os.getpid()
        if self._process is not None and self._process.is_alive():
            return self._connection
        self._stop()
        if multiprocessing.current_process().daemon:
            log.warning(
                "cannot start a parse helper from a daemon process; guarded grammars give plain lines"
            )
            return None
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        process = context.Process(
            target=_serve_parses, args=(theirs,), name="squidcode-parse-guard", daemon=True
        )
        try:
            process.start()
        except OSError as error:
            log.warning("cannot start a parse helper (%s); guarded grammars give plain lines", error)
            return None
        finally:
            theirs.close()
        self._process, self._connection = process, ours
        return ours

    def _stop(self) -> None:
        if self._connection is not None:
            self._connection.close()
        if self._process is not None:
            self._process.kill()
            self._process.join(timeout=5)
        self._process = self._connection = None


def _serve_parses(connection: multiprocessing.connection.Connection) -> None:
    """The helper process: parse what the parent sends until it hangs up."""
    while True:
        try:
            text, rel_path = connection.recv()
        except EOFError:
            return
        connection.send(_parse_with_grammar(text, language_for(rel_path) or ""))


_guard = _ParseGuard()


# ---------------------------------------------------------------- definitions


def _collect_defs(captures: dict, source: bytes) -> list[_Def]:
    captured = [
        (node.start_byte, capture, node)
        for capture, nodes in captures.items()
        if capture != "ref"
        for node in nodes
    ]
    if len(captured) > MAX_DEFINITIONS:
        captured.sort(key=itemgetter(0))
        del captured[MAX_DEFINITIONS:]
    defs = []
    for _, capture, node in captured:
        role, kind = capture.split(".", 1)
        found = _describe(kind, node, source)
        if found is not None:
            found.emit = role == "def"
            defs.append(found)
    defs.sort(key=lambda d: (d.start_byte, -d.end_byte))
    return defs


def _describe(kind: str, node: tree_sitter.Node, source: bytes) -> _Def | None:
    """Name, kind and span of one captured definition node; None when it has no usable name."""
    describe = _DESCRIBERS.get(node.type, _describe_named)
    found = describe(node, kind)
    if found is None:
        return None
    name_node, kind, span, body, prefix = found
    name = _collapse(_node_text(name_node, source))[:MAX_NAME_CHARS]
    if not name:
        return None
    start_line, end_line = _line_range(span)
    return _Def(
        name=name,
        kind=kind,
        start_byte=node.start_byte,
        end_byte=node.end_byte,
        start_line=start_line,
        end_line=end_line,
        signature=_signature(source, span, node, body),
        name_start=name_node.start_byte,
        prefix=_collapse(prefix)[:MAX_NAME_CHARS],
    )


# (name node, kind, span node, body node, prefix) or None
_Description = tuple[tree_sitter.Node, str, tree_sitter.Node, "tree_sitter.Node | None", str] | None


def _describe_named(node: tree_sitter.Node, kind: str) -> _Description:
    name = node.child_by_field_name("name")
    if name is None:
        return None
    name, kind, prefix = _lua_name(name, kind)
    return name, kind, _outer_span(node), node.child_by_field_name("body"), prefix


def _describe_python_assignment(node: tree_sitter.Node, kind: str) -> _Description:
    assignment = node.named_children[0]
    return assignment.child_by_field_name("left"), kind, node, None, ""


def _describe_js_declarator(node: tree_sitter.Node, kind: str) -> _Description:
    name = node.child_by_field_name("name")
    if name is None or name.type != "identifier":
        return None  # destructuring: `const {a, b} = ...` names no single symbol
    value = node.child_by_field_name("value")
    body = None
    if value is not None and value.type in _FUNCTION_VALUES:
        kind, body = "function", value.child_by_field_name("body")
    elif value is not None and value.type == "class":
        kind, body = "class", value.child_by_field_name("body")
    return name, kind, _outer_span(node.parent), body, ""


def _describe_go_method(node: tree_sitter.Node, kind: str) -> _Description:
    name = node.child_by_field_name("name")
    if name is None:
        return None
    return name, kind, node, node.child_by_field_name("body"), _go_receiver_type(node)


def _go_receiver_type(node: tree_sitter.Node) -> str:
    receiver = node.child_by_field_name("receiver")
    params = receiver.named_children if receiver is not None else []
    type_node = params[0].child_by_field_name("type") if params else None
    while type_node is not None and type_node.type in ("pointer_type", "generic_type", "parenthesized_type"):
        inner = type_node.child_by_field_name("type")
        type_node = inner if inner is not None else (type_node.named_children or [None])[0]
    return type_node.text.decode("utf-8", "replace") if type_node is not None else ""


def _describe_go_type(node: tree_sitter.Node, kind: str) -> _Description:
    name = node.child_by_field_name("name")
    if name is None:
        return None
    shape = node.child_by_field_name("type")
    if node.type == "type_spec" and shape is not None:
        kind = {"struct_type": "struct", "interface_type": "interface"}.get(shape.type, "type")
    return name, kind, _single_spec_span(node), None, ""


def _describe_go_value(node: tree_sitter.Node, kind: str) -> _Description:
    name = node.child_by_field_name("name")
    if name is None:
        return None
    return name, kind, _single_spec_span(node), None, ""


def _single_spec_span(spec: tree_sitter.Node) -> tree_sitter.Node:
    """A lone spec spans its whole declaration (`type X struct` rather than `X struct`)."""
    parent = spec.parent
    if parent is not None and parent.type.endswith("_declaration") and parent.named_child_count == 1:
        return parent
    return spec


def _describe_rust_impl(node: tree_sitter.Node, kind: str) -> _Description:
    type_node = node.child_by_field_name("type")
    while type_node is not None and type_node.type in ("generic_type", "scoped_type_identifier"):
        inner = type_node.child_by_field_name("type") or type_node.child_by_field_name("name")
        if inner is None:
            break
        type_node = inner
    if type_node is None:
        return None
    return type_node, kind, node, node.child_by_field_name("body"), ""


def _describe_lua_assignment(node: tree_sitter.Node, kind: str) -> _Description:
    targets = node.named_children[0] if node.named_child_count else None
    values = node.named_children[-1] if node.named_child_count > 1 else None
    if targets is None or values is None or not targets.named_child_count or not values.named_child_count:
        return None
    name, kind, prefix = _lua_name(targets.named_children[0], kind)
    span = node.parent if node.parent is not None and node.parent.type == "variable_declaration" else node
    return name, kind, span, values.named_children[0].child_by_field_name("body"), prefix


def _lua_name(name: tree_sitter.Node, kind: str) -> tuple[tree_sitter.Node, str, str]:
    """Lua names its functions `M.f` / `M:f`: the bare name, the kind, and `M` as a qualifier."""
    if name.type == "dot_index_expression":
        table, field_name = name.child_by_field_name("table"), name.child_by_field_name("field")
        if table is not None and field_name is not None:
            return field_name, kind, table.text.decode("utf-8", "replace")
    if name.type == "method_index_expression":
        table, method = name.child_by_field_name("table"), name.child_by_field_name("method")
        if table is not None and method is not None:
            return method, "method", table.text.decode("utf-8", "replace")
    return name, kind, ""


_DESCRIBERS: dict[str, Callable[[tree_sitter.Node, str], _Description]] = {
    "expression_statement": _describe_python_assignment,
    "variable_declarator": _describe_js_declarator,
    "method_declaration": _describe_go_method,
    "type_spec": _describe_go_type,
    "type_alias": _describe_go_type,
    "var_spec": _describe_go_value,
    "const_spec": _describe_go_value,
    "impl_item": _describe_rust_impl,
    "assignment_statement": _describe_lua_assignment,
}


def _outer_span(node: tree_sitter.Node) -> tree_sitter.Node:
    """Decorators and `export` belong to the definition they wrap."""
    parent = node.parent
    if parent is not None and parent.type in ("decorated_definition", "export_statement"):
        return parent
    return node


def _line_range(node: tree_sitter.Node) -> tuple[int, int]:
    start_row, (end_row, end_column) = node.start_point[0], node.end_point
    if end_column == 0 and end_row > start_row:
        end_row -= 1  # a node that ends at a line start does not occupy that line
    return start_row + 1, end_row + 1


def _signature(
    source: bytes, span: tree_sitter.Node, node: tree_sitter.Node, body: tree_sitter.Node | None
) -> str:
    """The header as written, up to the body (or up to `{` / the line end when there is none)."""
    start = node.start_byte if span.type == "decorated_definition" else span.start_byte
    if body is not None and body.start_byte > start:
        header = source[start : min(body.start_byte, start + 4 * MAX_SIGNATURE_CHARS)]
    else:
        first_line = source[start : min(span.end_byte, start + 4 * MAX_SIGNATURE_CHARS)].split(b"\n", 1)[0]
        header = first_line.split(b"{", 1)[0] if body is None and b"{" in first_line else first_line
    return _collapse(header.decode("utf-8", "replace")).rstrip("{ ")[:MAX_SIGNATURE_CHARS]


def _node_text(node: tree_sitter.Node, source: bytes) -> str:
    return source[node.start_byte : node.end_byte].decode("utf-8", "replace")


def _collapse(text: str) -> str:
    return _WHITESPACE.sub(" ", text).strip()


def _nest(defs: list[_Def]) -> list[_Def]:
    """Attach each definition to the innermost one enclosing it; fix kinds and qualnames.

    `defs` is sorted by (start, -end), so an enclosing definition always comes first.
    """
    top_level: list[_Def] = []
    stack: list[_Def] = []
    for d in defs:
        while stack and stack[-1].end_byte <= d.start_byte:
            stack.pop()
        parent = stack[-1] if stack else None
        if parent is not None and d.kind == "function" and parent.kind in _METHOD_OWNERS:
            d.kind = "method"
        parts = [parent.qualname] if parent is not None else []
        d.qualname = ".".join([*parts, d.prefix, d.name] if d.prefix else [*parts, d.name])
        (parent.children if parent is not None else top_level).append(d)
        stack.append(d)
    return top_level


def _collect_references(
    nodes: Iterable[tree_sitter.Node], source: bytes, defining: set[int]
) -> list[Reference]:
    """Each (name, line) once, in source order; the defining identifiers are left out."""
    first_seen: dict[tuple[bytes, int], int] = {}
    for node in nodes:
        start = node.start_byte
        if start not in defining:
            first_seen.setdefault((source[start : node.end_byte], node.start_point[0]), start)
    ordered = sorted(first_seen.items(), key=itemgetter(1))
    return [Reference(name.decode("utf-8", "replace"), row + 1) for (name, row), _ in ordered]


# ---------------------------------------------------------------- chunks


@dataclass(eq=False)
class _Piece:
    """A run of lines: one definition, or the code between definitions."""

    start: int
    end: int
    definition: _Def | None = None
    symbol: str | None = None  # set for definitions and for the header of a split container

    @property
    def size(self) -> int:
        return self.end - self.start + 1


def _chunk_region(
    lines: list[str], start: int, end: int, defs: list[_Def], symbol: str | None
) -> list[Chunk]:
    pieces = _pieces(lines, start, end, defs)
    _attach_leading_lines(lines, pieces)
    return _chunks_from_pieces(lines, pieces, symbol)


def _pieces(lines: list[str], start: int, end: int, defs: list[_Def]) -> list[_Piece]:
    pieces: list[_Piece] = []
    cursor = start
    for d in defs:
        first, last = max(d.start_line, cursor), min(d.end_line, end)
        if last < first:
            continue  # shares its only line with the previous definition
        if first > cursor:
            _add_gap(lines, pieces, cursor, first - 1)
        pieces.append(_Piece(first, last, d, d.qualname))
        cursor = last + 1
    if cursor <= end:
        _add_gap(lines, pieces, cursor, end)
    return pieces


def _add_gap(lines: list[str], pieces: list[_Piece], start: int, end: int) -> None:
    while start <= end and not lines[start - 1].strip():
        start += 1
    while end >= start and not lines[end - 1].strip():
        end -= 1
    if start > end:
        return
    if pieces and not any(_HAS_WORD.search(line) for line in lines[start - 1 : end]):
        pieces[-1].end = end  # closing brackets belong to what they close
        return
    pieces.append(_Piece(start, end))


def _attach_leading_lines(lines: list[str], pieces: list[_Piece]) -> None:
    """Comments, attributes and headers written directly above a definition join its chunk."""
    for index in range(len(pieces) - 1, 0, -1):
        gap, definition = pieces[index - 1], pieces[index]
        if gap.definition is not None or definition.definition is None or gap.end + 1 != definition.start:
            continue
        first = gap.end
        while first > gap.start and lines[first - 2].strip() and gap.end - first + 1 < ATTACH_MAX_LINES:
            first -= 1
        if first > gap.start and lines[first - 2].strip():
            continue  # the paragraph is longer than ATTACH_MAX_LINES: code, not a comment
        definition.start = first
        gap.end = first - 1
        if gap.end < gap.start:
            del pieces[index - 1]


def _chunks_from_pieces(lines: list[str], pieces: list[_Piece], symbol: str | None) -> list[Chunk]:
    chunks: list[Chunk] = []
    buffer: list[_Piece] = []

    def flush() -> None:
        if not buffer:
            return
        first_symbol = next((p.symbol for p in buffer if p.symbol), symbol)
        kind = "definition" if len(buffer) == 1 and buffer[0].symbol else "merged"
        chunks.extend(_bounded_chunks(lines, buffer[0].start, buffer[-1].end, first_symbol, kind))
        buffer.clear()

    for piece in pieces:
        if piece.symbol is not None and piece.size >= SMALL_DEF_LINES:
            if buffer and _fits_before(buffer, piece):
                piece.start = buffer[0].start  # a line or two of setup reads best with what follows it
                buffer.clear()
            flush()
            chunks.extend(_definition_chunks(lines, piece))
        elif piece.size > MERGE_LINES:
            flush()
            chunks.extend(_window_chunks(lines, piece.start, piece.end, symbol, "merged"))
        else:
            if buffer and piece.end - buffer[0].start + 1 > MERGE_LINES:
                flush()
            buffer.append(piece)
    flush()
    return chunks


def _fits_before(buffer: list[_Piece], piece: _Piece) -> bool:
    """Whether a few lines of setup (not a definition of their own) can lead the next definition."""
    first = buffer[0].start
    return (
        buffer[-1].end - first + 1 < SMALL_DEF_LINES
        and all(
            p.symbol is None or (p.definition is not None and p.definition.kind == "variable") for p in buffer
        )
        and piece.start - buffer[-1].end <= 2
        and piece.end - first + 1 <= MAX_CHUNK_LINES
    )


def _definition_chunks(lines: list[str], piece: _Piece) -> list[Chunk]:
    d = piece.definition
    if d is not None and d.children and d.kind in _CONTAINER_KINDS and piece.size > SMALL_CONTAINER_LINES:
        return _container_chunks(lines, piece, d)
    if piece.size > MAX_CHUNK_LINES:
        return _window_chunks(lines, piece.start, piece.end, piece.symbol, "definition")
    return _bounded_chunks(lines, piece.start, piece.end, piece.symbol, "definition")


def _container_chunks(lines: list[str], piece: _Piece, container: _Def) -> list[Chunk]:
    """A large class-like definition: its header, then its members (Class.method)."""
    pieces = _pieces(lines, piece.start, piece.end, container.children)
    _attach_leading_lines(lines, pieces)
    if pieces and pieces[0].definition is None and pieces[0].start == piece.start:
        pieces[0].symbol = container.qualname
    return _chunks_from_pieces(lines, pieces, container.qualname)


def _window_chunks(lines: list[str], start: int, end: int, symbol: str | None, kind: str) -> list[Chunk]:
    chunks: list[Chunk] = []
    first = start
    while True:
        last = min(first + WINDOW_LINES - 1, end)
        chunks.extend(_bounded_chunks(lines, first, last, symbol, kind))
        if last >= end:
            return chunks
        first += WINDOW_LINES - WINDOW_OVERLAP


def _bounded_chunks(lines: list[str], start: int, end: int, symbol: str | None, kind: str) -> list[Chunk]:
    """One chunk for lines start..end, or several when that text exceeds MAX_CHUNK_CHARS."""
    text = "\n".join(lines[start - 1 : end])
    if len(text) <= MAX_CHUNK_CHARS:
        return [Chunk(start, end, text, symbol, kind)]
    chunks: list[Chunk] = []
    first, size = start, 0
    for number in range(start, end + 1):
        line = lines[number - 1]
        if size and size + len(line) + 1 > MAX_CHUNK_CHARS:
            chunks.append(Chunk(first, number - 1, "\n".join(lines[first - 1 : number - 1]), symbol, kind))
            first, size = number, 0
        if len(line) > MAX_CHUNK_CHARS:
            chunks.extend(_line_slices(line, number, symbol, kind))
            first, size = number + 1, 0
            continue
        size += len(line) + 1
    if first <= end:
        chunks.append(Chunk(first, end, "\n".join(lines[first - 1 : end]), symbol, kind))
    return chunks


def _line_slices(line: str, number: int, symbol: str | None, kind: str) -> list[Chunk]:
    """An enormous line (minified code, data): the first MAX_SLICES_PER_LINE slices of it."""
    limit = min(len(line), MAX_CHUNK_CHARS * MAX_SLICES_PER_LINE)
    return [
        Chunk(number, number, line[offset : offset + MAX_CHUNK_CHARS], symbol, kind)
        for offset in range(0, limit, MAX_CHUNK_CHARS)
    ]
