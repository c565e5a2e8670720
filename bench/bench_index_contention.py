#!/usr/bin/env python
"""Does background indexing delay completions? (issue 3: "never delays completion requests")

One `squidcode serve` per run, opened on a copy of the interpreter's standard library with a fresh
index database, so the server's first full index pass runs in the background. Inline completions
are requested, side by side in one session: while the pass runs, then after the index is ready.
Prints the medians and their ratio (during / after) over several runs.

Usage: python bench/bench_index_contention.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

REPO = Path(__file__).resolve().parent.parent
PROMPT = "def moving_average(values, window):\n    "


def server_command() -> list[str]:
    script = shutil.which("squidcode", path=str(Path(sys.executable).parent))
    return [script, "serve"] if script else [sys.executable, "-m", "lsp_server", "serve"]


def _client(events: dict) -> LanguageClient:
    client = LanguageClient("bench-contention", "1")

    @client.feature("squidcode/indexStatus")
    def on_status(params) -> None:
        if getattr(params, "state", None) == "ready":
            events["ready_at"] = time.perf_counter()

    @client.feature(types.WINDOW_LOG_MESSAGE)
    def on_log(params) -> None:
        return None

    return client


async def _complete(client: LanguageClient, uri: str) -> float:
    started = time.perf_counter()
    await client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=1, character=4),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked)))
    return time.perf_counter() - started


async def one_run(workspace: Path, cache: Path) -> dict:
    os.environ["XDG_CACHE_HOME"] = str(cache)
    events: dict = {}
    client = _client(events)
    await client.start_io(*server_command())
    started = time.perf_counter()
    await client.initialize_async(types.InitializeParams(
        capabilities=types.ClientCapabilities(), root_uri=workspace.as_uri(),
        initialization_options={"completion": {"max_tokens": 16, "debounce_ms": 0}}))
    client.initialized(types.InitializedParams())
    uri = (workspace / "bench_prompt.py").as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=uri, language_id="python", version=1, text=PROMPT)))
    await _complete(client, uri)  # waits for the model load; not counted
    during = []
    while "ready_at" not in events and len(during) < 8:
        during.append(await _complete(client, uri))
    while "ready_at" not in events and time.perf_counter() - started < 300:
        await asyncio.sleep(0.2)
    after = [await _complete(client, uri) for _ in range(max(3, len(during)))]
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return {"during": during, "after": after, "index_s": events.get("ready_at", 0) - started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    model_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "squidcode"
    print(f"load average before: {os.getloadavg()}")
    during, after = [], []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            workspace = Path(tmp) / "stdlib"
            stdlib = Path(sysconfig.get_paths()["stdlib"])
            shutil.copytree(stdlib, workspace, ignore=shutil.ignore_patterns("site-packages", "__pycache__"))
            (workspace / "bench_prompt.py").write_text(PROMPT)
            cache = Path(tmp) / "cache"
            # The model's converted copy is shared; only the index database starts empty.
            (cache / "squidcode").mkdir(parents=True)
            os.symlink(model_cache / "models", cache / "squidcode" / "models")
            result = asyncio.run(one_run(workspace, cache))
        during += result["during"]
        after += result["after"]
        print(f"run {run + 1}: index pass {result['index_s']:.1f}s; completions during "
              f"{[round(x, 2) for x in result['during']]}, after {[round(x, 2) for x in result['after']]}")
    if not during:
        print("the index finished before a completion could be measured during it")
        return 1
    med_during, med_after = statistics.median(during), statistics.median(after)
    print(f"completion median during indexing {med_during:.2f}s (n={len(during)}), "
          f"after {med_after:.2f}s (n={len(after)}): ratio {med_during / med_after:.2f}x")
    # The slowest request is where a blocked event loop or a GIL-bound background job shows.
    print(f"slowest completion: during {max(during):.2f}s, after {max(after):.2f}s "
          f"(ratio to the median after: {max(during) / med_after:.2f}x, {max(after) / med_after:.2f}x)")
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
