"""parse_source on real grammars: exact symbols (kinds, qualnames, lines) and references per language,
chunking (class split at methods, long definitions windowed, small neighbours merged), error
tolerance, enormous input, and a smoke run over the running interpreter's standard library."""

from __future__ import annotations

import multiprocessing
import pickle
import random
import sysconfig
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import pytest

from context.index import parse
from context.index.parse import (
    MAX_CHUNK_CHARS,
    MAX_CHUNK_LINES,
    WINDOW_LINES,
    WINDOW_OVERLAP,
    language_for,
    parse_source,
)
from context.index.types import Chunk, ParsedFile

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def symbols_of(parsed: ParsedFile) -> list[tuple[str, str, int, int]]:
    return [(s.qualname, s.kind, s.start_line, s.end_line) for s in parsed.symbols]


def references_of(parsed: ParsedFile) -> set[tuple[str, int]]:
    return {(r.name, r.line) for r in parsed.references}


def covered_lines(chunks: list[Chunk]) -> set[int]:
    return {line for chunk in chunks for line in range(chunk.start_line, chunk.end_line + 1)}


def assert_chunk_texts_match(text: str, chunks: list[Chunk]) -> None:
    lines = text.split("\n")
    for chunk in chunks:
        assert chunk.text == "\n".join(lines[chunk.start_line - 1 : chunk.end_line]), chunk


@pytest.mark.parametrize(
    ("path", "language"),
    [
        ("a.py", "python"),
        ("stubs/a.pyi", "python"),
        ("web/app.js", "javascript"),
        ("m.mjs", "javascript"),
        ("c.cjs", "javascript"),
        ("View.JSX", "javascript"),
        ("x.ts", "typescript"),
        ("x.tsx", "tsx"),
        ("main.go", "go"),
        ("lib.rs", "rust"),
        ("init.lua", "lua"),
        ("README.md", None),
        ("Makefile", None),
        ("dir.py/file", None),
    ],
)
def test_language_by_extension(path, language):
    assert language_for(path) == language


PYTHON = '''"""Module doc."""
import os
from typing import List

LIMIT = 10


def load(path: str) -> List[Entry]:
    """Read entries."""
    data = os.path.join(path, "x")
    return parse_entries(data)


class Store(Base):
    """A store."""

    def get(self, key):
        return self.items.get(key)

    @property
    def size(self) -> int:
        return len(self.items)
'''


def test_python_symbols_references_and_signatures():
    parsed = parse_source(PYTHON, "pkg/store.py")
    assert parsed.language == "python"
    assert symbols_of(parsed) == [
        ("LIMIT", "variable", 5, 5),
        ("load", "function", 8, 11),
        ("Store", "class", 14, 22),
        ("Store.get", "method", 17, 18),
        ("Store.size", "method", 20, 22),
    ]
    signatures = {s.qualname: s.signature for s in parsed.symbols}
    assert signatures["load"] == "def load(path: str) -> List[Entry]:"
    assert signatures["Store"] == "class Store(Base):"
    assert signatures["Store.size"] == "def size(self) -> int:"  # decorators are not the header
    assert signatures["LIMIT"] == "LIMIT = 10"
    references = references_of(parsed)
    assert {("List", 8), ("Entry", 8), ("join", 10), ("path", 10), ("parse_entries", 11)} <= references
    assert {("Base", 14), ("get", 18), ("items", 18), ("property", 20), ("len", 22)} <= references
    assert not {("load", 8), ("Store", 14), ("size", 21)} & references  # defining names
    assert_chunk_texts_match(PYTHON, parsed.chunks)


JAVASCRIPT = """import { helper } from './util.js';

export function render(items, opts = {}) {
  const out = helper(items).map(format);
  return out.join('\\n');
}

export default class Widget extends Base {
  constructor(el) {
    super(el);
    this.el = el;
  }

  mount() {
    this.el.appendChild(render([]));
  }
}

const LIMIT = 3, toUpper = (s) => s.toUpperCase();
let counter = 0;
"""


def test_javascript_symbols_and_references():
    parsed = parse_source(JAVASCRIPT, "src/widget.js")
    assert parsed.language == "javascript"
    assert symbols_of(parsed) == [
        ("render", "function", 3, 6),
        ("Widget", "class", 8, 17),
        ("Widget.constructor", "method", 9, 12),
        ("Widget.mount", "method", 14, 16),
        ("LIMIT", "variable", 19, 19),
        ("toUpper", "function", 19, 19),
        ("counter", "variable", 20, 20),
    ]
    signatures = {s.qualname: s.signature for s in parsed.symbols}
    assert signatures["render"] == "export function render(items, opts = {})"
    assert signatures["Widget"] == "export default class Widget extends Base"
    references = references_of(parsed)
    assert {("helper", 4), ("map", 4), ("join", 5), ("Base", 8), ("el", 11)} <= references
    assert {("appendChild", 15), ("render", 15), ("toUpperCase", 19)} <= references
    assert ("render", 3) not in references


TYPESCRIPT = """export interface Shape {
  area(): number;
  readonly name: string;
}

export type Pair<T> = [T, T];

export enum Color {
  Red,
  Green,
}

export class Circle implements Shape {
  readonly name = "circle";
  constructor(private radius: number) {}
  area(): number {
    return Math.PI * square(this.radius);
  }
}

export const unit = (c: Circle): Pair<Circle> => [c, c];
"""


def test_typescript_symbols_and_references():
    parsed = parse_source(TYPESCRIPT, "shapes.ts")
    assert parsed.language == "typescript"
    assert symbols_of(parsed) == [
        ("Shape", "interface", 1, 4),
        ("Shape.area", "method", 2, 2),
        ("Pair", "type", 6, 6),
        ("Color", "enum", 8, 11),
        ("Circle", "class", 13, 19),
        ("Circle.constructor", "method", 15, 15),
        ("Circle.area", "method", 16, 18),
        ("unit", "function", 21, 21),
    ]
    signatures = {s.qualname: s.signature for s in parsed.symbols}
    assert signatures["unit"] == "export const unit = (c: Circle): Pair<Circle> =>"
    assert signatures["Circle.area"] == "area(): number"
    references = references_of(parsed)
    assert {
        ("Shape", 13),
        ("PI", 17),
        ("square", 17),
        ("radius", 17),
        ("Circle", 21),
        ("Pair", 21),
    } <= references
    assert ("Shape", 1) not in references and ("Circle", 13) not in references


def test_tsx_component_and_jsx_references():
    source = "export function App(props: Props) {\n  return <Button onClick={() => go(props)} />;\n}\n"
    parsed = parse_source(source, "App.tsx")
    assert parsed.language == "tsx"
    assert symbols_of(parsed) == [("App", "function", 1, 3)]
    assert {("Props", 1), ("Button", 2), ("go", 2)} <= references_of(parsed)


GO = """package geo

import "fmt"

// Point is a place.
type Point struct {
	X, Y int
}

type Shape interface {
	Area() float64
}

var ErrEmpty = fmt.Errorf("empty")

func (p *Point) Move(dx int) Point {
	fmt.Println(p.X)
	return shift(*p, dx)
}

func NewPoint(x, y int) *Point {
	return &Point{X: x, Y: y}
}
"""


def test_go_symbols_and_references():
    parsed = parse_source(GO, "geo/point.go")
    assert parsed.language == "go"
    assert symbols_of(parsed) == [
        ("Point", "struct", 6, 8),
        ("Shape", "interface", 10, 12),
        ("ErrEmpty", "variable", 14, 14),
        ("Point.Move", "method", 16, 19),
        ("NewPoint", "function", 21, 23),
    ]
    signatures = {s.qualname: s.signature for s in parsed.symbols}
    assert signatures["Point.Move"] == "func (p *Point) Move(dx int) Point"
    assert signatures["Point"] == "type Point struct"
    references = references_of(parsed)
    assert {
        ("Errorf", 14),
        ("Point", 16),
        ("Println", 17),
        ("X", 17),
        ("shift", 18),
        ("Point", 22),
    } <= references
    assert ("Point", 6) not in references


RUST = """use std::fmt;

/// A point in the plane.
#[derive(Debug, Clone)]
pub struct Point {
    pub x: i64,
}

pub enum Shape {
    Dot(Point),
}

pub trait Area {
    fn area(&self) -> f64;
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}", self.x)
    }
}

impl Point {
    pub fn new(x: i64) -> Self {
        Point { x: clamp(x).max(ORIGIN) }
    }
}

const ORIGIN: i64 = 0;
"""


def test_rust_symbols_and_references():
    parsed = parse_source(RUST, "src/point.rs")
    assert parsed.language == "rust"
    assert symbols_of(parsed) == [
        ("Point", "struct", 5, 7),
        ("Shape", "enum", 9, 11),
        ("Area", "trait", 13, 15),
        ("Area.area", "method", 14, 14),
        ("Point.fmt", "method", 18, 20),
        ("Point.new", "method", 24, 26),
        ("ORIGIN", "variable", 29, 29),
    ]
    signatures = {s.qualname: s.signature for s in parsed.symbols}
    assert signatures["Point.fmt"] == "fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result"
    assert signatures["Point"] == "pub struct Point"
    references = references_of(parsed)
    assert {("Point", 10), ("Formatter", 18), ("write", 19), ("clamp", 25), ("max", 25)} <= references
    assert ("Point", 5) not in references
    # The doc comment and the derive attribute travel with the struct.
    assert any(c.symbol == "Point" and c.start_line <= 3 and c.end_line >= 7 for c in parsed.chunks)


LUA = """local M = {}

function M.load(path)
  local f = io.open(path)
  return decode(f:read("a"))
end

function M:save()
  self:flush()
end

local function helper(x)
  return x + 1
end

M.reset = function() M.cache = {} end

return M
"""


def test_lua_symbols_and_references():
    parsed = parse_source(LUA, "mod.lua")
    assert parsed.language == "lua"
    assert symbols_of(parsed) == [
        ("M.load", "function", 3, 6),
        ("M.save", "method", 8, 10),
        ("helper", "function", 12, 14),
        ("M.reset", "function", 16, 16),
    ]
    assert {s.name for s in parsed.symbols} == {"load", "save", "helper", "reset"}
    references = references_of(parsed)
    assert {("open", 4), ("decode", 5), ("read", 5), ("flush", 9), ("cache", 16)} <= references
    assert ("load", 3) not in references


def python_class(methods: int, body_lines: int) -> str:
    parts = ["class Engine:", '    """Runs things."""', "", "    limit = 3", ""]
    for index in range(methods):
        parts.append(f"    def step{index}(self, value):")
        parts += [f"        value = value + {line}" for line in range(body_lines)]
        parts += ["        return value", ""]
    return "\n".join(parts) + "\n"


def test_large_class_is_split_into_methods():
    source = python_class(methods=6, body_lines=8)  # 65 lines: over the one-chunk size for classes
    parsed = parse_source(source, "engine.py")
    by_symbol = {chunk.symbol: chunk for chunk in parsed.chunks}
    assert list(by_symbol) == ["Engine"] + [f"Engine.step{index}" for index in range(6)]
    assert by_symbol["Engine"].start_line == 1 and "limit = 3" in by_symbol["Engine"].text
    step2 = next(s for s in parsed.symbols if s.qualname == "Engine.step2")
    assert (by_symbol["Engine.step2"].start_line, by_symbol["Engine.step2"].end_line) == (
        step2.start_line,
        step2.end_line,
    )
    assert all(chunk.kind == "definition" for chunk in parsed.chunks)
    assert_chunk_texts_match(source, parsed.chunks)


def test_small_class_stays_one_chunk():
    source = python_class(methods=2, body_lines=3)
    parsed = parse_source(source, "engine.py")
    assert [(c.symbol, c.kind, c.start_line, c.end_line) for c in parsed.chunks] == [
        ("Engine", "definition", 1, 16)
    ]


def test_long_function_is_windowed_with_its_symbol():
    body = [f"    total += step({index})" for index in range(198)]
    source = "\n".join(["def crunch(step):", *body, "    return total"]) + "\n"
    parsed = parse_source(source, "crunch.py")
    assert symbols_of(parsed) == [("crunch", "function", 1, 200)]
    chunks = parsed.chunks
    assert len(chunks) == 6
    assert {c.symbol for c in chunks} == {"crunch"} and {c.kind for c in chunks} == {"definition"}
    assert chunks[0].start_line == 1 and chunks[-1].end_line == 200
    for before, after in zip(chunks, chunks[1:], strict=False):
        assert after.start_line == before.end_line - WINDOW_OVERLAP + 1
    assert all(c.end_line - c.start_line + 1 <= WINDOW_LINES for c in chunks)
    assert_chunk_texts_match(source, chunks)


def test_small_neighbours_are_merged():
    source = "\n".join(
        [
            "import os",
            "import sys",
            "",
            "def one():",
            "    return 1",
            "",
            "def two():",
            "    return 2",
            "",
            "CONSTANT = one() + two()",
            "",
        ]
    )
    parsed = parse_source(source, "small.py")
    assert [(c.start_line, c.end_line, c.symbol, c.kind) for c in parsed.chunks] == [(1, 10, "one", "merged")]


def test_merging_stops_at_the_merge_size():
    functions = [f"def f{index}():\n    return {index}\n" for index in range(40)]
    source = "\n".join(functions)  # 40 two-line functions, 3 lines apart
    parsed = parse_source(source, "many.py")
    assert len(parsed.symbols) == 40
    assert [(c.start_line, c.end_line, c.symbol, c.kind) for c in parsed.chunks] == [
        (1, 38, "f0", "merged"),
        (40, 77, "f13", "merged"),
        (79, 116, "f26", "merged"),
        (118, 119, "f39", "definition"),
    ]


BROKEN_MIDDLES = {
    "garbage line": ["$$$ @@@ ???"],
    "bad parameter list": ["def broken(:", "    pass"],
    "unclosed string": ["def broken():", "    return 'abc"],
}


@pytest.mark.parametrize("middle", BROKEN_MIDDLES.values(), ids=BROKEN_MIDDLES.keys())
def test_syntax_errors_keep_the_good_definitions(middle):
    before = ["def good_one(a):", "    return a", ""]
    after = ["", "class Fine:", "    def method(self):", "        return good_one(1)", ""]
    source = "\n".join(before + middle + after)
    parsed = parse_source(source, "broken.py")
    fine = len(before) + len(middle) + 2
    good = [(q, k, a, b) for q, k, a, b in symbols_of(parsed) if q != "broken"]
    assert good == [
        ("good_one", "function", 1, 2),
        ("Fine", "class", fine, fine + 2),
        ("Fine.method", "method", fine + 1, fine + 2),
    ]
    assert ("good_one", fine + 2) in references_of(parsed)
    non_blank = {n for n, line in enumerate(source.split("\n"), 1) if line.strip()}
    assert covered_lines(parsed.chunks) >= non_blank


def test_javascript_syntax_error_keeps_the_good_definitions():
    source = "function first() { return 1; }\nconst = ;\nfunction second() { return first(); }\n"
    parsed = parse_source(source, "broken.js")
    assert [(q, k) for q, k, _, _ in symbols_of(parsed)] == [("first", "function"), ("second", "function")]


def test_text_without_grammar_gets_line_windows():
    source = "\n".join(f"line {index}" for index in range(1, 101)) + "\n"
    parsed = parse_source(source, "notes.txt")
    assert parsed.language is None and parsed.symbols == [] and parsed.references == []
    assert [(c.start_line, c.end_line, c.kind, c.symbol) for c in parsed.chunks] == [
        (1, 40, "window", None),
        (36, 75, "window", None),
        (71, 100, "window", None),
    ]
    assert parsed.chunks[0].text.startswith("line 1\nline 2\n") and parsed.chunks[-1].text.endswith(
        "line 100"
    )


def test_module_code_without_definitions_is_merged():
    source = "import sys\n\nprint(sys.argv)\n"
    parsed = parse_source(source, "script.py")
    assert parsed.symbols == []
    assert [(c.start_line, c.end_line, c.kind) for c in parsed.chunks] == [(1, 3, "merged")]
    assert ("argv", 3) in references_of(parsed)


@pytest.mark.parametrize("text", ["", "\n\n   \n"])
def test_empty_files_yield_no_chunks(text):
    assert parse_source(text, "empty.py") == ParsedFile(language="python")
    assert parse_source(text, "empty.txt") == ParsedFile(language=None)


@pytest.mark.parametrize("name", ["huge.py", "huge.js", "huge.txt"])
def test_five_megabyte_single_line_returns_quickly(name):
    text = "x" * 5_000_000
    started = time.monotonic()
    parsed = parse_source(text, name)
    assert time.monotonic() - started < 3.0
    assert parsed.chunks, "an enormous line is still indexed (its beginning), not skipped"
    assert all(c.start_line == 1 and c.end_line == 1 for c in parsed.chunks)
    assert all(len(c.text) <= MAX_CHUNK_CHARS for c in parsed.chunks)
    assert parsed.chunks[0].text == "x" * MAX_CHUNK_CHARS


def test_enormous_line_inside_parsed_code_is_bounded():
    blob = "DATA = '" + "ab" * 200_000 + "'"
    source = f"def before():\n    return 1\n\n{blob}\n\ndef after():\n    return 2\n"
    parsed = parse_source(source, "blob.py")
    assert [s.qualname for s in parsed.symbols] == ["before", "DATA", "after"]
    assert all(len(c.text) <= MAX_CHUNK_CHARS for c in parsed.chunks)
    assert covered_lines(parsed.chunks) >= {1, 2, 4, 6, 7}


def test_definition_sizes_stay_bounded_on_real_code():
    source = (STDLIB / "argparse.py").read_text(encoding="utf-8")
    parsed = parse_source(source, "argparse.py")
    for chunk in parsed.chunks:
        assert chunk.end_line - chunk.start_line + 1 <= MAX_CHUNK_LINES
    non_blank = {n for n, line in enumerate(source.split("\n"), 1) if line.strip()}
    assert non_blank <= covered_lines(parsed.chunks)
    assert_chunk_texts_match(source, parsed.chunks)


def stdlib_sample(count: int) -> list[Path]:
    wanted = [STDLIB / "urllib" / "parse.py", STDLIB / "json" / "decoder.py"]
    others = sorted(p for p in STDLIB.glob("*.py") if p not in wanted)
    return wanted + others[: count - len(wanted)]


def test_stdlib_smoke():
    paths = stdlib_sample(100)
    assert len(paths) == 100
    results = {}
    for path in paths:
        text = path.read_text(encoding="utf-8", errors="replace")
        parsed = parse_source(text, path.relative_to(STDLIB).as_posix())
        line_count = len(text.split("\n"))
        assert all(1 <= c.start_line <= c.end_line <= line_count for c in parsed.chunks), path
        assert all(1 <= s.start_line <= s.end_line <= line_count for s in parsed.symbols), path
        results[path.relative_to(STDLIB).as_posix()] = parsed
    urlparse_symbols = {s.qualname: s for s in results["urllib/parse.py"].symbols}
    assert urlparse_symbols["urlsplit"].kind == "function"
    assert urlparse_symbols["urlsplit"].signature.startswith("def urlsplit(url, scheme=''")
    decoder = {s.qualname: s.kind for s in results["json/decoder.py"].symbols}
    assert decoder["JSONDecoder"] == "class" and decoder["JSONDecoder.decode"] == "method"
    decoder_chunks = {c.symbol for c in results["json/decoder.py"].chunks}
    assert {"JSONDecoder", "JSONDecoder.decode", "JSONDecoder.raw_decode"} <= decoder_chunks
    assert sum(len(parsed.symbols) for parsed in results.values()) > 3000


def test_parse_runs_in_threads_and_processes():
    tsx = "export function App(props: Props) {\n  return <Button onClick={() => go(props)} />;\n}\n"
    sources = [(PYTHON, "a.py"), (GO, "b.go"), (RUST, "c.rs"), (LUA, "d.lua"), (tsx, "e.tsx")]
    expected = [parse_source(text, rel) for text, rel in sources]
    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(parse_source, *zip(*sources, strict=True))) == expected
    spawn = multiprocessing.get_context("spawn")  # as the indexer's pool
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        assert list(pool.map(parse_source, *zip(*sources, strict=True))) == expected
    assert pickle.loads(pickle.dumps(expected)) == expected


TSX_LOOP = "<a {{b:>c:d(e f)\n"  # tree-sitter-typescript#323: the TSX grammar never returns on this


def test_tsx_parse_that_never_ends_is_abandoned(monkeypatch):
    monkeypatch.setattr(parse, "GUARD_TIMEOUT_S", 1.5)
    started = time.monotonic()
    parsed = parse_source(TSX_LOOP, "Broken.tsx")
    assert time.monotonic() - started < 10.0
    assert parsed == ParsedFile(language="tsx", chunks=[Chunk(1, 1, TSX_LOOP.rstrip("\n"), None, "window")])
    assert not [p for p in multiprocessing.active_children() if p.name == "squidcode-parse-guard"]
    # The helper comes back for the next file.
    after = parse_source("export const one = () => <b>1</b>;\n", "One.tsx")
    assert symbols_of(after) == [("one", "function", 1, 1)]


def random_text(rng: random.Random) -> str:
    alphabet = "def class fn func function local end(){}[]<>/:;=,.\n \t'\"`ab\\#*-!@$?é\ud800"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 800)))


def test_random_input_never_raises(monkeypatch):
    monkeypatch.setattr(parse, "GUARD_TIMEOUT_S", 1.0)
    rng = random.Random(20240611)
    for _ in range(80):
        text = random_text(rng)
        line_count = len(text.split("\n"))
        for rel in ("f.py", "f.js", "f.ts", "f.tsx", "f.go", "f.rs", "f.lua", "f.txt"):
            parsed = parse_source(text, rel)
            assert all(1 <= c.start_line <= c.end_line <= line_count for c in parsed.chunks), rel
            assert all(1 <= s.start_line <= s.end_line <= line_count for s in parsed.symbols), rel
            assert bool(parsed.chunks) == bool(text.strip()), rel
