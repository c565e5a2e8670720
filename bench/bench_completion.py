"""Inline completion on real code, in the style of CrossCodeEval and RepoBench.

    python bench/bench_completion.py                       # quick: 3 packages x 3 kinds x 2 positions, 1 seed
    python bench/bench_completion.py --positions 2 --seeds 0,1      # docs/benchmarks.md's run, ~40 min
    python bench/bench_completion.py --positions 10 --seeds 0,1     # the full run, ~3 h on 2 loaded cores

Third-party packages installed in this venv (default: click, jinja2, requests) are copied into a
temporary git workspace each. In every file of a package, positions of three kinds are drawn with a
seed:

- next_line: the cursor at the start of a line, after its indentation; the line is to be written.
- mid_line: the cursor right after an opening token (`(`, `=`, `.`) of a line; the rest of the line
  is to be written.
- cross_file: as next_line, on a line that uses, for the first time in its file, a name imported
  from another module of the package (an AST scan): the import is in the prefix, the definition is
  not (CrossCodeEval's cross-file subset).

The editor's buffer is the file with the target text removed: the text after the cursor's line
stays, as an editor sends it. Four configurations answer each position:

- product: `squidcode serve` with its defaults (debounce 0), asked over LSP as an editor would
  (`textDocument/inlineCompletion`); the same request is repeated once the server has gone idle
  (at least 1.5 s, at most 12 s later: `--idle-max`), so that the background work the first one
  started (the full prompt window, Squid's reference documents) has had time to finish.
- refs_off: the same with Squid's references off (`squid.enabled = false`).
- reader (with `--reader DIR`): the product with a Squid reader (`squid.reader = DIR`, `squidcode train
  reader`): the text after each composition read by a copy of the model with the reader merged in.
- raw: the model alone, in this process (`context.runtime.ModelRuntime`): plain greedy generation
  from the text before the cursor (the product's window: its last 1,024 tokens), first line taken.
- llama: llama.cpp's server (llama-cpp-python, built by `.ci/install-llama-server.sh`) on the same
  GGUF file, its completions endpoint with the same text at temperature 0; skipped when not built.

Metrics of the first line of each answer (for next_line and cross_file, its first non-blank line),
against the reference line, both stripped of surrounding whitespace:
offered (a non-blank first line), exact match, edit similarity (1 - Levenshtein distance / longer
length, as RepoBench and CodeXGLUE report it), identifier exact match (the ordered list of
identifiers, Python keywords left out, equal to the reference's: CrossCodeEval's ID-EM) and
identifier F1, and latency p50/p95 (over LSP for the server configurations: first request and
repeated request apart). A position where nothing was offered scores 0. The server configurations
are scored on the repeated request; the first request's scores are in the JSON too. What a server
configuration costs over refs_off is also given position by position: the median of the paired
latency differences.

Results: bench/results/completion-DATE.json, with every answer and the list of positions where the
raw model's first line was usable (exact, or edit similarity >= 0.7) and the product offered nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import io
import json
import keyword
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tokenize
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KINDS = ("next_line", "mid_line", "cross_file")
CONFIGS = ("product", "reader", "refs_off", "raw", "llama")
SERVER_CONFIGS = ("product", "reader", "refs_off")
DEFAULT_PACKAGES = ("click", "jinja2", "requests")
OPENING_TOKENS = ("(", "=", ".")
PREFIX_TOKENS = 1024  # completion.prefix_tokens' default: the raw model and llama.cpp read the same window
MAX_NEW_TOKENS = 32  # completion.max_tokens' default
REPEAT_AFTER_S = 1.5
IDLE_CPU, IDLE_SAMPLE_S, IDLE_MAX_S = 0.15, 0.5, 12.0
USABLE_SIMILARITY = 0.7
MIN_LINE_CHARS = 6
MIN_PREFIX_LINES = 8
REQUEST_TIMEOUT_S = 300.0
LLAMA_SERVER_DIR = Path(
    os.environ.get("SQUIDCODE_LLAMA_SERVER_DIR", Path.home() / ".cache" / "squidcode" / "llama-server"))


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- positions ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Position:
    """A cursor in a file of a package, and the text an editor user would type there."""

    package: str
    path: str  # relative to the package's workspace
    line: int  # 0-based
    column: int  # characters before the cursor on its line
    kind: str
    seed: int
    reference: str  # the rest of the line after the cursor, as the file has it

    @property
    def key(self) -> str:
        return f"{self.package}/{self.path}:{self.line + 1}:{self.column}:{self.kind}:s{self.seed}"


def editor_text(source: str, position: Position) -> str:
    """The buffer an editor holds at `position`: the file with the rest of the cursor's line removed."""
    lines = source.split("\n")
    lines[position.line] = lines[position.line][: position.column]
    return "\n".join(lines)


def prefix_at(source: str, position: Position) -> str:
    lines = source.split("\n")
    return "\n".join(lines[: position.line] + [lines[position.line][: position.column]])


@dataclass
class _FileTokens:
    single_lines: list[int] = field(default_factory=list)  # 0-based rows holding a whole logical line
    openers: dict[int, list[int]] = field(default_factory=dict)  # row -> columns just after an opener


def _scan_tokens(source: str) -> _FileTokens:
    """Rows that hold one whole logical line of code (no docstring, comment or import), and the
    opening tokens on them."""
    scanned = _FileTokens()
    logical: list[tokenize.TokenInfo] = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT,
                              tokenize.ENCODING):
                continue
            if token.type != tokenize.NEWLINE:
                logical.append(token)
                continue
            _keep_logical_line(logical, scanned)
            logical = []
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    return scanned


def _keep_logical_line(tokens: list[tokenize.TokenInfo], scanned: _FileTokens) -> None:
    if not tokens or tokens[0].start[0] != tokens[-1].end[0]:
        return  # empty, or spread over several rows
    first = tokens[0]
    if first.type == tokenize.STRING or first.string in ("import", "from"):
        return
    row = first.start[0] - 1
    scanned.single_lines.append(row)
    scanned.openers[row] = [t.end[1] for t in tokens[:-1]
                            if t.type == tokenize.OP and t.string in OPENING_TOKENS]


def sibling_import_names(source: str, package: str) -> set[str]:
    """Names this module imports from other modules of `package` (relative or absolute imports)."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level > 0 or (node.module or "").split(".")[0] == package:
                names.update(alias.asname or alias.name for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == package and alias.name != package:
                    names.add(alias.asname or alias.name.split(".")[0])
    return names


def first_use_rows(source: str, names: set[str]) -> set[int]:
    """0-based rows where one of `names` is read for the first time in the file (imports aside)."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    first: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in names and isinstance(node.ctx, ast.Load):
            first[node.id] = min(first.get(node.id, node.lineno), node.lineno)
    return {row - 1 for row in first.values()}


def candidates(source: str, package: str, kind: str) -> list[tuple[int, int]]:
    """(row, column) of every position of `kind` in one file, in file order."""
    lines = source.split("\n")
    scanned = _scan_tokens(source)
    cross = first_use_rows(source, sibling_import_names(source, package))
    found = []
    for row in scanned.single_lines:
        text = lines[row]
        if row < MIN_PREFIX_LINES or len(text.strip()) < MIN_LINE_CHARS:
            continue
        indent = len(text) - len(text.lstrip())
        if kind == "cross_file" and row in cross:
            found.append((row, indent))
        elif kind == "next_line" and row not in cross:
            found.append((row, indent))
        elif kind == "mid_line" and row not in cross:
            found.extend((row, col) for col in scanned.openers.get(row, []) if text[col:].strip())
    return found


def select_positions(files: dict[str, str], package: str, kind: str, count: int, seed: int) -> list[Position]:
    """`count` positions of `kind` drawn with `seed` over the package's files (at most one per line)."""
    by_line: dict[tuple[str, int], list[int]] = {}
    for path in sorted(files):
        for row, column in candidates(files[path], package, kind):
            by_line.setdefault((path, row), []).append(column)
    rng = random.Random(f"{seed}:{package}:{kind}")  # str seeds hash with sha512: stable across runs
    keys = sorted(by_line)
    chosen = sorted(rng.sample(keys, min(count, len(keys))))
    positions = []
    for path, row in chosen:
        column = rng.choice(by_line[(path, row)])
        reference = files[path].split("\n")[row][column:]
        positions.append(Position(package, path, row, column, kind, seed, reference))
    return positions


# -- metrics ------------------------------------------------------------------------------------

def first_line(text: str | None, kind: str) -> str:
    """The line an answer is scored by: for mid_line the rest of the cursor's line, otherwise the
    first non-blank line (an answer that starts with a line break is not an answer for mid_line)."""
    if not text:
        return ""
    lines = text.replace("\r\n", "\n").split("\n")
    if kind == "mid_line":
        return lines[0].strip()
    return next((line.strip() for line in lines if line.strip()), "")


def levenshtein(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def edit_similarity(prediction: str, reference: str) -> float:
    """1 - Levenshtein distance / the longer length (1.0 for two empty strings)."""
    longest = max(len(prediction), len(reference))
    return 1.0 if longest == 0 else 1.0 - levenshtein(prediction, reference) / longest


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STRING = re.compile(r"""(?:[rbuf]{0,2})("[^"\\]*(?:\\.[^"\\]*)*"|'[^'\\]*(?:\\.[^'\\]*)*')""", re.I)


def identifiers(line: str) -> list[str]:
    """The identifiers of a line in order: string literals and Python keywords left out."""
    code = _STRING.sub(" ", line).split("#", 1)[0]
    return [name for name in _IDENTIFIER.findall(code) if not keyword.iskeyword(name)]


def identifier_f1(prediction: list[str], reference: list[str]) -> float:
    if not prediction or not reference:
        return float(prediction == reference)
    common = sum(min(prediction.count(n), reference.count(n)) for n in set(prediction))
    if common == 0:
        return 0.0
    precision, recall = common / len(prediction), common / len(reference)
    return 2 * precision * recall / (precision + recall)


def score(answer: str | None, position: Position) -> dict:
    """The metrics of one answer at one position (nothing offered scores 0 everywhere)."""
    predicted = first_line(answer, position.kind)
    reference = position.reference.strip()
    if not predicted:
        return {"offered": False, "exact": False, "similarity": 0.0, "id_exact": False, "id_f1": 0.0,
                "first_line": ""}
    ids_p, ids_r = identifiers(predicted), identifiers(reference)
    return {"offered": True, "exact": predicted == reference,
            "similarity": round(edit_similarity(predicted, reference), 4),
            "id_exact": ids_p == ids_r, "id_f1": round(identifier_f1(ids_p, ids_r), 4),
            "first_line": predicted}


def usable(scores: dict) -> bool:
    return scores["offered"] and (scores["exact"] or scores["similarity"] >= USABLE_SIMILARITY)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def aggregate(rows: list[dict], score_key: str = "scores") -> dict:
    """Offered / exact / identifier-exact rates, mean similarity and identifier F1, latency p50/p95."""
    if not rows:
        return {"n": 0}
    scored = [r[score_key] for r in rows if r.get(score_key) is not None]
    n = len(scored)
    out = {
        "n": n,
        "offered": sum(s["offered"] for s in scored) / max(1, n),
        "exact": sum(s["exact"] for s in scored) / max(1, n),
        "similarity": sum(s["similarity"] for s in scored) / max(1, n),
        "id_exact": sum(s["id_exact"] for s in scored) / max(1, n),
        "id_f1": sum(s["id_f1"] for s in scored) / max(1, n),
    }
    for name in ("latency_s", "first_latency_s"):
        values = [r[name] for r in rows if r.get(name) is not None]
        if values:
            out[f"{name}_p50"] = percentile(values, 50)
            out[f"{name}_p95"] = percentile(values, 95)
    return out


# -- workspaces ---------------------------------------------------------------------------------

def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{name} is not an installed package with modules")
    return Path(next(iter(spec.submodule_search_locations)))


def copy_package(name: str, dest: Path) -> dict[str, str]:
    """The package's Python files copied into `dest/name` and committed; {relative path: text}."""
    target = dest / name
    shutil.copytree(package_dir(name), target, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(git + ["add", "-A"], cwd=dest, check=True)
    subprocess.run(git + ["commit", "-q", "-m", f"{name} as installed"], cwd=dest, check=True)
    return {str(p.relative_to(dest)): p.read_text(encoding="utf-8") for p in sorted(target.rglob("*.py"))}


# -- the server over LSP ------------------------------------------------------------------------

def server_settings(config: str, data: Path, reader: Path | None = None) -> dict:
    """initializationOptions: the product's defaults, no debounce, every file it writes under `data`;
    `reader` for the reader configuration."""
    settings = {"completion": {"debounce_ms": 0}, "feedback": {"db_path": str(data / "feedback.db")},
                "squid": {"cache_dir": str(data / "squid")}}
    if config == "refs_off":
        settings["squid"]["enabled"] = False
    if config == "reader":
        if reader is None:
            raise ValueError("the reader configuration needs --reader DIR")
        settings["squid"]["reader"] = str(reader)
    return settings


def _client(index_states: list[dict]):
    from lsprotocol import types
    from pygls.lsp.client import LanguageClient

    client = LanguageClient("bench-completion", "1")

    @client.feature(types.WINDOW_WORK_DONE_PROGRESS_CREATE)
    def on_progress_create(params):
        return None

    @client.feature(types.PROGRESS)
    def on_progress(params):
        return None

    @client.feature("squidcode/indexStatus")
    def on_index_status(params):
        index_states.append({"state": getattr(params, "state", None),
                             "files": getattr(params, "files", None)})

    @client.feature("squidcode/status")
    def on_status(params):
        return None

    @client.feature(types.WINDOW_LOG_MESSAGE)
    def on_log(params):
        return None

    @client.feature(types.WINDOW_SHOW_MESSAGE)
    def on_show(params):
        print(f"[server] {params.message}", file=sys.stderr)

    return client


async def _wait_index(index_states: list[dict], timeout: float = 300.0) -> float:
    started = time.perf_counter()
    while not any(s["state"] in ("ready", "failed") for s in index_states):
        if time.perf_counter() - started > timeout:
            raise SystemExit(f"the index was not ready after {timeout:.0f} s")
        await asyncio.sleep(0.2)
    return time.perf_counter() - started


async def _ask(client, uri: str, position: Position) -> tuple[str | None, float]:
    from lsprotocol import types

    asked = time.perf_counter()
    result = await asyncio.wait_for(client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=position.line, character=_utf16(position)),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked))),
        REQUEST_TIMEOUT_S)
    latency = time.perf_counter() - asked
    items = result.items if isinstance(result, types.InlineCompletionList) else (result or [])
    text = items[0].insert_text if items else None
    return (text if isinstance(text, str) else getattr(text, "value", None)), latency


_SOURCES: dict[tuple[str, str], str] = {}


def _utf16(position: Position) -> int:
    line = _SOURCES[(position.package, position.path)].split("\n")[position.line][: position.column]
    return len(line.encode("utf-16-le")) // 2


async def run_server(config: str, workspace: Path, positions: list[Position], data: Path,
                     idle_max_s: float = IDLE_MAX_S, reader: Path | None = None) -> list[dict]:
    """One `squidcode serve` on `workspace`; each position opened, asked twice, closed."""
    from lsprotocol import types

    from lsp_server.demo import start_server

    index_states: list[dict] = []
    client = _client(index_states)
    data.mkdir(parents=True, exist_ok=True)
    await start_server(client, data / "server.log")
    rows = []
    try:
        await client.initialize_async(types.InitializeParams(
            process_id=os.getpid(), root_uri=workspace.as_uri(), capabilities=types.ClientCapabilities(),
            workspace_folders=[types.WorkspaceFolder(uri=workspace.as_uri(), name=workspace.name)],
            initialization_options=server_settings(config, data, reader)))
        client.initialized(types.InitializedParams())
        index_s = await _wait_index(index_states)
        _say(f"  {config}: index {index_states[-1]['state']} in {index_s:.1f} s")
        await _warm_up(client, workspace)
        for number, position in enumerate(positions, 1):
            rows.append(await _server_position(client, workspace, position, idle_max_s))
            if number % 10 == 0:
                _say(f"  {config}: {number}/{len(positions)}")
        await client.shutdown_async(None)
        client.exit(None)
    finally:
        await client.stop()
    return rows


def server_log_counts(log_path: Path) -> dict:
    """What the server's log says it did: completions answered with Squid references, and documents
    encoded (the client cannot see either)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return {}
    return {"with_references": text.count("reference documents composed"),
            "documents_encoded": len(re.findall(r"squid: encoded ", text)),
            "windows_warmed": text.count("warmed a "),
            "reader_ready": text.count("compositions are read through the reader"),
            "reader_not_used": text.count("is not used (")}


async def _wait_idle(pid: int, most_s: float) -> float:
    """Seconds waited before the repeated request: at least REPEAT_AFTER_S, then until the server
    process is idle (the background work the first request started, the full prompt window and
    Squid's reference documents, is done: under IDLE_CPU of one core over IDLE_SAMPLE_S), at most
    `most_s`. The server has no idle signal over LSP; its CPU time stands in for one."""
    import psutil

    started = time.perf_counter()
    await asyncio.sleep(REPEAT_AFTER_S)
    try:
        process = psutil.Process(pid)
        while time.perf_counter() - started < most_s:
            before = sum(process.cpu_times()[:2])
            await asyncio.sleep(IDLE_SAMPLE_S)
            if (sum(process.cpu_times()[:2]) - before) / IDLE_SAMPLE_S < IDLE_CPU:
                break
    except psutil.Error:
        pass
    return round(time.perf_counter() - started, 2)


async def _warm_up(client, workspace: Path) -> None:
    """One unscored request first: the model loads, and its compiled step is built, before any is timed."""
    from lsprotocol import types

    uri = (workspace / "bench_warm_up.py").as_uri()
    text = "import os\n\n\ndef main():\n    "
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=uri, language_id="python", version=1, text=text)))
    await asyncio.wait_for(client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=4, character=4),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked))),
        REQUEST_TIMEOUT_S)
    client.text_document_did_close(types.DidCloseTextDocumentParams(
        text_document=types.TextDocumentIdentifier(uri=uri)))


async def _server_position(client, workspace: Path, position: Position, idle_max_s: float) -> dict:
    from lsprotocol import types

    uri = (workspace / position.path).as_uri()
    text = editor_text(_SOURCES[(position.package, position.path)], position)
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=uri, language_id="python", version=1, text=text)))
    try:
        first, first_latency = await _ask(client, uri, position)
        waited = await _wait_idle(client._server.pid, idle_max_s)
        again, latency = await _ask(client, uri, position)
    finally:
        client.text_document_did_close(types.DidCloseTextDocumentParams(
            text_document=types.TextDocumentIdentifier(uri=uri)))
    return {"position": position.key, "answer": again, "latency_s": round(latency, 3), "waited_s": waited,
            "first_answer": first, "first_latency_s": round(first_latency, 3),
            "scores": score(again, position), "first_scores": score(first, position)}


# -- the raw model and llama.cpp ----------------------------------------------------------------

def _stops(kind: str) -> tuple[str, ...]:
    """Mid-line, the first line break ends the answer; otherwise the whole budget is generated and
    its first non-blank line scored (a model at an indentation often writes a line break first)."""
    return ("\n",) if kind == "mid_line" else ()


def run_raw(positions: list[Position], runtime) -> list[dict]:
    from context.prompt_record import window_ids

    rows = []
    for position in positions:
        started = time.perf_counter()
        ids = window_ids(runtime.encode, prefix_at(_SOURCES[(position.package, position.path)], position),
                         PREFIX_TOKENS)
        answer = runtime.generate(ids, max_new_tokens=MAX_NEW_TOKENS, stop=_stops(position.kind),
                                  temperature=0.0).text
        rows.append({"position": position.key, "answer": answer,
                     "latency_s": round(time.perf_counter() - started, 3), "scores": score(answer, position)})
    return rows


class LlamaServer:
    """llama-cpp-python's server on the embedded GGUF, on a free loopback port."""

    def __init__(self, log_path: Path, threads: int, n_ctx: int = 2048):
        from context.runtime import locate_embedded_gguf

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.log = log_path.open("w")
        self.proc = subprocess.Popen(
            [str(LLAMA_SERVER_DIR / "bin" / "python"), "-m", "llama_cpp.server", "--model",
             str(locate_embedded_gguf()), "--host", "127.0.0.1", "--port", str(self.port),
             "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", str(n_ctx)],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.url = f"{self.base_url}/completions"

    @staticmethod
    def available() -> bool:
        return (LLAMA_SERVER_DIR / "bin" / "python").exists()

    def wait_ready(self, timeout: float = 120.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/v1/models", timeout=2).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"llama.cpp server did not start (see {self.log.name})")

    def complete(self, prompt: str, stop: tuple[str, ...]) -> str:
        import httpx

        body = {"prompt": prompt, "max_tokens": MAX_NEW_TOKENS, "temperature": 0.0, "top_k": 1,
                "repeat_penalty": 1.0, "stop": list(stop)}
        response = httpx.post(self.url, json=body, timeout=REQUEST_TIMEOUT_S)
        response.raise_for_status()
        return response.json()["choices"][0]["text"]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def run_llama(positions: list[Position], server: LlamaServer, runtime) -> list[dict]:
    from context.prompt_record import window_ids

    rows = []
    for position in positions:
        started = time.perf_counter()
        prefix = prefix_at(_SOURCES[(position.package, position.path)], position)
        # The same window as the raw model's, as text: llama.cpp tokenizes it again.
        answer = server.complete(runtime.decode(window_ids(runtime.encode, prefix, PREFIX_TOKENS)),
                                 _stops(position.kind))
        rows.append({"position": position.key, "answer": answer,
                     "latency_s": round(time.perf_counter() - started, 3), "scores": score(answer, position)})
    return rows


# -- the report ---------------------------------------------------------------------------------

def _fmt(value, kind: str) -> str:
    if value is None:
        return ""
    return f"{value:.0%}" if kind == "pct" else f"{value:.2f}"


def table(results: dict, positions: dict[str, Position], select: Callable[[Position], bool],
          configs: Iterable[str]) -> str:
    """One markdown table: a row per configuration over the positions `select` keeps."""
    head = ("| config | n | offered | exact | edit sim | ID-EM | ID-F1 | p50 s | p95 s | first p50 s | "
            "first p95 s | first-request exact |")
    rows = [head, "|" + "---|" * 12]
    for config in configs:
        chosen = [r for r in results.get(config, []) if select(positions[r["position"]])]
        if not chosen:
            continue
        a = aggregate(chosen)
        f = aggregate(chosen, "first_scores") if "first_scores" in chosen[0] else {}
        rows.append(
            f"| {config} | {a['n']} | {_fmt(a['offered'], 'pct')} | {_fmt(a['exact'], 'pct')} | "
            f"{_fmt(a['similarity'], 'num')} | {_fmt(a['id_exact'], 'pct')} | {_fmt(a['id_f1'], 'num')} | "
            f"{_fmt(a.get('latency_s_p50'), 's')} | {_fmt(a.get('latency_s_p95'), 's')} | "
            f"{_fmt(a.get('first_latency_s_p50'), 's')} | {_fmt(a.get('first_latency_s_p95'), 's')} | "
            f"{_fmt(f.get('exact'), 'pct')} |")
    return "\n".join(rows)


def seed_spread(results: dict, positions: dict[str, Position], seeds: list[int], configs: Iterable[str],
                select: Callable[[Position], bool]) -> str:
    """Exact match and edit similarity per configuration: mean over seeds, and min-max."""
    rows = ["| config | exact: mean (min-max) | edit sim: mean (min-max) |", "|---|---|---|"]
    for config in configs:
        per_seed = []
        for seed in seeds:
            chosen = [r for r in results.get(config, [])
                      if positions[r["position"]].seed == seed and select(positions[r["position"]])]
            if chosen:
                per_seed.append(aggregate(chosen))
        if not per_seed:
            continue
        exact = [a["exact"] for a in per_seed]
        sim = [a["similarity"] for a in per_seed]
        rows.append(f"| {config} | {statistics.mean(exact):.0%} ({min(exact):.0%}-{max(exact):.0%}) | "
                    f"{statistics.mean(sim):.2f} ({min(sim):.2f}-{max(sim):.2f}) |")
    return "\n".join(rows)


def paired(results: dict, positions: dict[str, Position], config: str, against: str,
           select: Callable[[Position], bool]) -> str:
    """`config` against `against` position by position: first lines made exact and lost, similarity
    raised and lowered, and the mean change (what a small sample's two rates hide)."""
    theirs = {r["position"]: r["scores"] for r in results.get(against, [])
              if select(positions[r["position"]])}
    pairs = [(r["scores"], theirs[r["position"]]) for r in results.get(config, [])
             if r["position"] in theirs]
    if not pairs:
        return f"{config} against {against}: no common positions"
    gained = sum(a["exact"] and not b["exact"] for a, b in pairs)
    lost = sum(b["exact"] and not a["exact"] for a, b in pairs)
    up = sum(a["similarity"] > b["similarity"] + 1e-9 for a, b in pairs)
    down = sum(a["similarity"] < b["similarity"] - 1e-9 for a, b in pairs)
    change = statistics.mean(a["similarity"] - b["similarity"] for a, b in pairs)
    return (f"{config} against {against} ({len(pairs)} positions): exact gained {gained}, lost {lost}; "
            f"similarity up at {up}, down at {down}, mean change {change:+.3f}")


def paired_latency(results: dict, positions: dict[str, Position], config: str, against: str,
                   select: Callable[[Position], bool]) -> str:
    """What `config` costs over `against` at the same positions: the median of the paired latency
    differences, repeated request and first request (the machine's load drifts less within a pair
    than between two runs' percentiles)."""
    theirs = {r["position"]: r for r in results.get(against, []) if select(positions[r["position"]])}
    pairs = [(r, theirs[r["position"]]) for r in results.get(config, []) if r["position"] in theirs]
    if not pairs:
        return f"{config} against {against}: no common positions"
    repeated = statistics.median(a["latency_s"] - b["latency_s"] for a, b in pairs)
    first = statistics.median(a["first_latency_s"] - b["first_latency_s"] for a, b in pairs)
    return (f"{config} minus {against} ({len(pairs)} positions), median of paired differences: "
            f"repeated request {repeated:+.3f} s, first request {first:+.3f} s")


def usable_not_offered(results: dict, positions: dict[str, Position]) -> list[dict]:
    """Positions where the raw model's first line was usable and a server configuration offered nothing."""
    raw = {r["position"]: r for r in results.get("raw", [])}
    found = []
    for config in SERVER_CONFIGS:
        for row in results.get(config, []):
            base = raw.get(row["position"])
            if base is None or not usable(base["scores"]) or row["scores"]["offered"]:
                continue
            position = positions[row["position"]]
            found.append({"config": config, "position": row["position"], "kind": position.kind,
                          "raw_first_line": base["scores"]["first_line"],
                          "reference": position.reference.strip(),
                          "raw_exact": base["scores"]["exact"],
                          "first_request_offered": row["first_scores"]["offered"],
                          "first_answer": row["first_answer"]})
    return found


def report_markdown(results: dict, positions: dict[str, Position], seeds: list[int], packages: list[str],
                    configs: list[str]) -> str:
    in_file = lambda p: p.kind != "cross_file"  # noqa: E731
    parts = ["In-file positions (next_line + mid_line):", table(results, positions, in_file, configs)]
    for kind in KINDS:
        parts += [f"\n{kind}:", table(results, positions, lambda p, k=kind: p.kind == k, configs)]
    for package in packages:
        parts += [f"\n{package} (in-file):",
                  table(results, positions, lambda p, pk=package: p.package == pk and in_file(p), configs)]
    if len(seeds) > 1:
        parts += ["\nAcross seeds, in-file:", seed_spread(results, positions, seeds, configs, in_file),
                  "\nAcross seeds, cross_file:",
                  seed_spread(results, positions, seeds, configs, lambda p: p.kind == "cross_file")]
    if "reader" in configs and "product" in configs:
        parts += ["\nThe reader against the product, position by position:",
                  "- in-file: " + paired(results, positions, "reader", "product", in_file),
                  "- cross_file: " + paired(results, positions, "reader", "product",
                                            lambda p: p.kind == "cross_file")]
    for config in (c for c in SERVER_CONFIGS if c != "refs_off" and c in configs and "refs_off" in configs):
        parts += [f"\nWhat {config} costs over refs_off, position by position:",
                  "- in-file: " + paired_latency(results, positions, config, "refs_off", in_file),
                  "- cross_file: " + paired_latency(results, positions, config, "refs_off",
                                                    lambda p: p.kind == "cross_file")]
    lost = usable_not_offered(results, positions)
    parts.append(f"\nThe raw model's first line usable (exact, or edit similarity >= {USABLE_SIMILARITY}), "
                 f"the server offering nothing: {len(lost)}")
    parts += [f"- {e['config']} {e['position']}: raw `{e['raw_first_line']}`, reference `{e['reference']}`"
              f"{', offered on the first request' if e['first_request_offered'] else ''}" for e in lost]
    return "\n".join(parts)


def render(path: Path) -> str:
    """The markdown of a results file written earlier (`--report`)."""
    report = json.loads(path.read_text())
    positions = {k: Position(**v) for k, v in report["positions"].items()}
    seeds = sorted({p.seed for p in positions.values()})
    packages = list(dict.fromkeys(p.package for p in positions.values()))
    configs = [c for c in CONFIGS if report["results"].get(c)]
    return report_markdown(report["results"], positions, seeds, packages, configs)


# -- main ---------------------------------------------------------------------------------------

def _positions_for(package: str, files: dict[str, str], count: int, seeds: list[int],
                   kinds: Iterable[str] = KINDS) -> list[Position]:
    chosen = []
    for seed in seeds:
        for kind in kinds:
            chosen += select_positions(files, package, kind, count, seed)
    return chosen


def _runtime():
    from context.config import ModelConfig
    from context.runtime import ModelRuntime

    return ModelRuntime(ModelConfig()).load()


def run(args, data: Path, save: Callable[[dict], None] = lambda partial: None) -> dict:
    all_positions: dict[str, Position] = {}
    results: dict[str, list[dict]] = {config: [] for config in args.configs}
    logs: dict[str, dict] = {}
    notes: list[str] = []
    runtime = _runtime() if {"raw", "llama"} & set(args.configs) else None
    llama = None
    if "llama" in args.configs:
        if LlamaServer.available():
            llama = LlamaServer(data / "llama.log", args.llama_threads)
            llama.wait_ready()
        else:
            notes.append(f"llama: no llama.cpp server in {LLAMA_SERVER_DIR} "
                         "(run .ci/install-llama-server.sh); column skipped")
            _say(notes[-1])
    try:
        for package in args.packages:
            workspace = data / f"ws-{package}"
            files = copy_package(package, workspace)
            for path, text in files.items():
                _SOURCES[(package, path)] = text
            positions = _positions_for(package, files, args.positions, args.seeds, args.kinds)
            all_positions.update({p.key: p for p in positions})
            _say(f"{package}: {len(files)} files, {len(positions)} positions")
            for config in args.configs:
                started = time.perf_counter()
                if config in SERVER_CONFIGS:
                    folder = data / f"{package}-{config}"
                    rows = asyncio.run(run_server(config, workspace, positions, folder, args.idle_max,
                                                  args.reader))
                    logs[f"{package}/{config}"] = server_log_counts(folder / "server.log")
                    _say(f"  {config}: server log {logs[f'{package}/{config}']}")
                elif config == "raw":
                    rows = run_raw(positions, runtime)
                elif llama is not None:
                    rows = run_llama(positions, llama, runtime)
                else:
                    continue
                results[config] += rows
                save({"positions": {k: asdict(p) for k, p in all_positions.items()}, "results": results,
                      "server_logs": logs, "notes": notes, "partial": f"up to {package} {config}"})
                a = aggregate(rows)
                _say(f"  {config}: {time.perf_counter() - started:.0f} s; exact {a['exact']:.0%}, "
                     f"edit sim {a['similarity']:.2f}, offered {a['offered']:.0%}")
    finally:
        if llama is not None:
            llama.close()
    return {"positions": {k: asdict(p) for k, p in all_positions.items()}, "results": results,
            "server_logs": logs, "notes": notes}


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packages", default=",".join(DEFAULT_PACKAGES),
                        help="installed third-party packages, comma-separated")
    parser.add_argument("--positions", type=int, default=2, help="positions per kind, per package, per seed")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (different position samples)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"a subset of {','.join(KINDS)}")
    parser.add_argument("--configs", help=f"a subset of {','.join(CONFIGS)} (default: all; reader only "
                                          "with --reader)")
    parser.add_argument("--reader", type=Path, help="a Squid reader's folder, for the reader configuration")
    parser.add_argument("--llama-threads", type=int, default=1,
                        help="llama.cpp threads (they spin at barriers: more than the free cores collapse)")
    parser.add_argument("--out", type=Path, help="JSON results (default bench/results/completion-DATE.json)")
    parser.add_argument("--idle-max", type=float, default=IDLE_MAX_S,
                        help="most seconds to wait for the server to go idle before the repeated request")
    parser.add_argument("--keep-data", action="store_true", help="keep the workspaces and server logs")
    parser.add_argument("--report", type=Path, help="print the tables of a results file, run nothing")
    args = parser.parse_args(argv)
    args.packages = [p for p in args.packages.split(",") if p]
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    args.kinds = [k for k in args.kinds.split(",") if k]
    if set(args.kinds) - set(KINDS):
        parser.error(f"unknown kinds: {', '.join(sorted(set(args.kinds) - set(KINDS)))}")
    args.configs = ([c for c in args.configs.split(",") if c] if args.configs
                    else [c for c in CONFIGS if c != "reader" or args.reader])
    unknown = set(args.configs) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configs: {', '.join(sorted(unknown))}")
    if "reader" in args.configs and args.reader is None:
        parser.error("the reader configuration needs --reader DIR")
    return args


def _code_version() -> str:
    """The commit the product code came from, and whether its files differed from it."""
    import lsp_server

    tree = Path(lsp_server.__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "lsp_server", "agent", "context",
                                "feedback", "kernels"], cwd=tree, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return f"{tree} (not a git checkout)"
    return f"{head}{' + uncommitted changes' if dirty.strip() else ''} ({tree})"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.report:
        print(render(args.report))
        return 0
    data = Path(tempfile.mkdtemp(prefix="squidcode-bench-completion-"))
    started = time.perf_counter()
    load_before = os.getloadavg()
    _say(f"completion on real code: {', '.join(args.packages)}; {args.positions} positions per kind per "
         f"package per seed, seeds {args.seeds}; configs {', '.join(args.configs)}; data in {data}")
    out = args.out or ROOT / "bench" / "results" / f"completion-{time.strftime('%Y-%m-%d')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        report = run(args, data, lambda partial: out.write_text(json.dumps(partial, indent=1)))
    finally:
        if not args.keep_data:
            shutil.rmtree(data, ignore_errors=True)
    positions = {k: Position(**v) for k, v in report["positions"].items()}
    report["usable_not_offered"] = usable_not_offered(report["results"], positions)
    report.update(
        packages=args.packages, seeds=args.seeds, configs=args.configs, positions_per_kind=args.positions,
        idle_max_s=args.idle_max, seconds=round(time.perf_counter() - started, 1),
        load_average=[load_before, os.getloadavg()],
        code=_code_version(), cpu=_cpu_model(),
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        command="python bench/bench_completion.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    markdown = report_markdown(report["results"], positions, args.seeds, args.packages, args.configs)
    report["markdown"] = markdown
    print("\n" + markdown)
    out.write_text(json.dumps(report, indent=1))
    print(f"results: {out}; {report['seconds'] / 60:.1f} min in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
