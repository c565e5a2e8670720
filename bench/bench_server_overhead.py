#!/usr/bin/env python
"""What the server adds to a completion: `squidcode serve` over LSP against the same `complete()`
in this process, interleaved on the same positions.

Two measurements of a server and of an in-process runtime taken minutes apart differ by as much as
the machine's drift (on a 2-core virtual machine the same command gave p50 0.335 and 0.382 s ten
minutes apart), so here both are alive at once and take turns: at each position, a few requests
to the server, then the same number in process, for `--rounds` rounds; each side idles while the
other works. Both sides answer from a warm window (the position asked once and warmed first), as a
repeated keystroke is answered: what differs is the LSP round trip, the server's handler, its
threads and its process.

Positions: next-line positions of a package installed in this venv (`click` by default) drawn as
`bench/bench_completion.py` draws them; Squid's references off on both sides (the in-process
`complete()` has no index).

    python bench/bench_server_overhead.py [--package click] [--positions 2] [--seeds 0,1]
        [--rounds 3] [--per-turn 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import bench_completion as bc  # noqa: E402
from bench.bench_foundation import cpu_info, loadavg  # noqa: E402


def request_for(position: bc.Position, text: str, workspace: Path):
    from agent.completion import CompletionRequest

    lines = text.split("\n")
    offset = sum(len(line) + 1 for line in lines[: position.line]) + position.column
    return CompletionRequest(text, offset, "python", str(workspace / position.path))


async def measure(args, data: Path) -> dict:
    from lsprotocol import types

    from agent.completion import complete, warm_window
    from context.config import CompletionConfig, ModelConfig, default_cache_dir
    from context.runtime import get_runtime
    from lsp_server.demo import start_server

    workspace = data / f"ws-{args.package}"
    files = bc.copy_package(args.package, workspace)
    for path, text in files.items():
        bc._SOURCES[(args.package, path)] = text
    positions = bc._positions_for(args.package, files, args.positions, args.seeds, ["next_line"])
    index_states: list[dict] = []
    client = bc._client(index_states)
    await start_server(client, data / "server.log")
    model = ThreadPoolExecutor(1)  # the in-process model's own thread, as the server has one

    def in_process(fn, *fn_args):
        return model.submit(fn, *fn_args).result()

    rows = []
    try:
        await client.initialize_async(types.InitializeParams(
            process_id=os.getpid(), root_uri=workspace.as_uri(), capabilities=types.ClientCapabilities(),
            workspace_folders=[types.WorkspaceFolder(uri=workspace.as_uri(), name=workspace.name)],
            initialization_options=bc.server_settings("refs_off", data)))
        client.initialized(types.InitializedParams())
        await bc._wait_index(index_states)
        await bc._warm_up(client, workspace)
        runtime = in_process(lambda: get_runtime(ModelConfig(), default_cache_dir()).prepare())
        config = CompletionConfig(debounce_ms=0)
        for position in positions:
            uri = (workspace / position.path).as_uri()
            text = bc.editor_text(files[position.path], position)
            client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
                uri=uri, language_id="python", version=1, text=text)))
            request = request_for(position, text, workspace)
            await bc._ask(client, uri, position)
            await bc._wait_idle(client._server.pid, bc.IDLE_MAX_S)
            in_process(complete, runtime, request, config)
            in_process(warm_window, runtime, request, config)
            for round_ in range(args.rounds):
                for _ in range(args.per_turn):
                    _, latency = await bc._ask(client, uri, position)
                    rows.append({"position": position.key, "side": "server", "round": round_,
                                 "latency_s": latency})
                for _ in range(args.per_turn):
                    began = time.perf_counter()
                    in_process(complete, runtime, request, config)
                    rows.append({"position": position.key, "side": "in_process", "round": round_,
                                 "latency_s": time.perf_counter() - began})
            client.text_document_did_close(types.DidCloseTextDocumentParams(
                text_document=types.TextDocumentIdentifier(uri=uri)))
            mine = [r for r in rows if r["position"] == position.key]
            served = statistics.median(r["latency_s"] for r in mine if r["side"] == "server")
            local = statistics.median(r["latency_s"] for r in mine if r["side"] == "in_process")
            print(f"[{time.strftime('%H:%M:%S')}] {position.key}: server {served:.3f} s, "
                  f"in process {local:.3f} s", file=sys.stderr, flush=True)
        await client.shutdown_async(None)
        client.exit(None)
    finally:
        await client.stop()
        model.shutdown()
    return {"rows": rows, "summary": summarise(rows)}


def summarise(rows: list[dict]) -> dict:
    """Medians per side, and the median over positions of the server's median minus the in-process one."""
    sides = {side: [r["latency_s"] for r in rows if r["side"] == side] for side in ("server", "in_process")}
    differences = []
    for key in dict.fromkeys(r["position"] for r in rows):
        mine = [r for r in rows if r["position"] == key]
        server = [r["latency_s"] for r in mine if r["side"] == "server"]
        local = [r["latency_s"] for r in mine if r["side"] == "in_process"]
        if server and local:
            differences.append(statistics.median(server) - statistics.median(local))
    return {"server_p50_s": statistics.median(sides["server"]) if sides["server"] else None,
            "in_process_p50_s": statistics.median(sides["in_process"]) if sides["in_process"] else None,
            "server_minus_in_process_s": statistics.median(differences) if differences else None,
            "positions": len(differences), "requests_per_side": len(sides["server"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="click")
    parser.add_argument("--positions", type=int, default=2, help="next-line positions per seed")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-turn", type=int, default=3,
                        help="requests a side makes before the other's turn")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    before = loadavg()
    with tempfile.TemporaryDirectory(prefix="bench-server-overhead-") as tmp:
        result = asyncio.run(measure(args, Path(tmp)))
    result["machine"] = {"cpu": cpu_info(), "load_before": before, "load_after": loadavg(),
                         "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())}
    summary = result["summary"]
    print(f"p50 over LSP {summary['server_p50_s']:.3f} s, in process {summary['in_process_p50_s']:.3f} s; "
          f"server minus in process (median over {summary['positions']} positions): "
          f"{summary['server_minus_in_process_s']:+.3f} s; cpu {result['machine']['cpu']['model']} "
          f"x{result['machine']['cpu']['cores']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
