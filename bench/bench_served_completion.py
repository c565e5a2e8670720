"""A team's completion server under load (issue 23): 1, 4 and 8 simulated editors typing against
one llama.cpp server over loopback, against the local runtime on the same model, in one run.

    python bench/bench_served_completion.py [--keystrokes 30] [--editors 1,4,8] [--threads 2]
    # a team's GPU box: llama-server with every layer on the GPU; the local runtime stays on the CPU
    python bench/bench_served_completion.py --gpu-layers 99 --threads 2

The model is the embedded SmolLM2-135M-Instruct GGUF for both: the local runtime (this process,
`agent.completion.complete`, the product's path) and llama.cpp's C++ server (built by
`.ci/install-llama-server.sh`) asked through the product's served path
(`agent.completion.complete_served`, `completion.backend = "openai"`: SmolLM2 has no FIM tokens,
so no `/infill`). Each editor types real code a character at a time, in its own file (modules of
the standard library, code nobody here wrote), and asks for a completion after every keystroke,
waiting for the answer before the next one (a fast typist whose editor never cancels: the worst
case for the server). Latency is the request's wall time. Prompt-cache reuse is the share of the
prompt tokens the server took from its cache (its `timings.cache_n`).

Then cancellation: a long request is cancelled 0.3 s in, and the server's `/slots` is polled until
no slot is processing; the time from the cancel to that is how fast the server stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.completion import CompletionRequest, complete, complete_served  # noqa: E402
from agent.completion_server import CompletionServer, HoleRequest  # noqa: E402
from bench.bench_foundation import cpu_info  # noqa: E402
from context.config import CompletionConfig, ModelConfig  # noqa: E402
from context.runtime import ModelRuntime, locate_embedded_gguf  # noqa: E402
from tests.e2e.test_completion_server import LLAMA_SERVER, _free_port  # noqa: E402

# Files the editors type in: one each, a stretch of a function body from the middle.
SOURCES = ("json/decoder.py", "csv.py", "textwrap.py", "shlex.py", "fractions.py", "statistics.py",
           "difflib.py", "argparse.py")


def typing_positions(path: Path, keystrokes: int) -> list[tuple[str, int]]:
    """(text, cursor) after each keystroke of typing `keystrokes` characters of the file's code,
    starting at the first indented line past its middle."""
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    start_line = next(i for i in range(len(lines) // 2, len(lines))
                      if lines[i].startswith("        ") and len(lines[i].strip()) > 20)
    line = lines[start_line]
    start = sum(len(before) for before in lines[:start_line]) + len(line) - len(line.lstrip())
    # The document as the developer has it: what they have typed so far, then the rest of the file.
    return [(text[: start + k] + text[start + len(text[start:start + keystrokes]):], start + k)
            for k in range(1, keystrokes + 1)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def start_server(threads: int, slots: int, log_path: Path,
                 gpu_layers: int = 0) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    log = log_path.open("w")
    # -ngl: layers offloaded to a GPU, for a llama-server built with CUDA (0 on a CPU build).
    offload = ["-ngl", str(gpu_layers)] if gpu_layers else []
    proc = subprocess.Popen(
        [str(LLAMA_SERVER), "-m", str(locate_embedded_gguf()), "--host", "127.0.0.1", "--port", str(port),
         "-t", str(threads), "-np", str(slots), "-c", str(2048 * slots), "--metrics", *offload],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/health", timeout=2).is_success:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"llama-server did not start: {log_path.read_text()[-1500:]}")


# The server's own counters (`--metrics`, Prometheus text), read before and after each run: how
# its time went, and how many slots each of its decoding calls served.
COUNTERS = ("prompt_tokens_total", "prompt_seconds_total", "tokens_predicted_total",
            "tokens_predicted_seconds_total", "n_decode_total")


def server_counters(url: str) -> dict[str, float]:
    values = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("llamacpp:") and name[9:] in COUNTERS:
            values[name[9:]] = float(value)
    return values


def server_share(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict:
    """What the server did during a run of `wall_s` seconds: its decoding calls, the wall time per
    call, the tokens each call carried, and its summed prompt and generation seconds (per request,
    so overlapping requests count each)."""
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in COUNTERS}
    calls = max(delta["n_decode_total"], 1.0)
    return {"decode_calls": int(delta["n_decode_total"]), "wall_ms_per_decode": 1000 * wall_s / calls,
            "tokens_per_decode": (delta["prompt_tokens_total"] + delta["tokens_predicted_total"]) / calls,
            "prompt_s": delta["prompt_seconds_total"], "predicted_s": delta["tokens_predicted_seconds_total"],
            "wall_s": wall_s}


def run_local(runtime: ModelRuntime, config: CompletionConfig, positions) -> list[float]:
    times = []
    for text, offset in positions:
        began = time.perf_counter()
        complete(runtime, CompletionRequest(text, offset, "python"), config)
        times.append(time.perf_counter() - began)
    return times


async def run_editors(config: CompletionConfig, editors: list[list[tuple[str, int]]]) -> dict:
    server = CompletionServer(config)
    times: list[float] = []
    prompt = cached = 0

    async def editor(positions) -> None:
        nonlocal prompt, cached
        for text, offset in positions:
            began = time.perf_counter()
            request = CompletionRequest(text, offset, "python")
            answer = await complete_served(server, request, config, lambda: False)
            times.append(time.perf_counter() - began)
            if answer is not None:
                prompt += answer.prompt_tokens
                cached += answer.cached_tokens

    try:
        await asyncio.gather(*(editor(p) for p in editors))
    finally:
        await server.aclose()
    return summarize(times, prompt, cached)


def summarize(times: list[float], prompt: int, cached: int) -> dict:
    return {"p50": percentile(times, 0.5), "p95": percentile(times, 0.95), "requests": len(times),
            "cache_reuse": cached / prompt if prompt else 0.0, "times": times, "prompt": prompt,
            "cached": cached}


def _editor_process(config: CompletionConfig, positions, barrier, results) -> None:
    """One editor in a process of its own, as each developer's server is: its file read once, then,
    when every editor is ready, its keystrokes."""
    asyncio.run(run_editors(config, [positions[:1]]))
    barrier.wait()
    results.put(asyncio.run(run_editors(config, [positions])))


def run_editor_processes(config: CompletionConfig, editors: list[list[tuple[str, int]]]) -> dict:
    """`run_editors` with each editor in its own process (so that no editor waits on another's Python),
    all starting together."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # this process holds torch's threads: no fork
    barrier, results = context.Barrier(len(editors)), context.Queue()
    processes = [context.Process(target=_editor_process, args=(config, positions, barrier, results))
                 for positions in editors]
    for process in processes:
        process.start()
    try:
        rows = [results.get(timeout=900) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    return summarize([t for row in rows for t in row["times"]], sum(r["prompt"] for r in rows),
                     sum(r["cached"] for r in rows))


async def cancel_stop_times(url: str, config: CompletionConfig, tries: int) -> list[float]:
    """Seconds from closing a long request's stream to the server having no slot processing."""
    server = CompletionServer(config)
    out = []
    try:
        for i in range(tries):
            began = time.monotonic()
            hole = HoleRequest(f"# try {i}\ndef main():\n", "", max_tokens=1500, stop=())
            await server.complete(hole, lambda began=began: time.monotonic() - began > 0.3)
            closed = time.monotonic()
            async with httpx.AsyncClient() as client:
                while any(s.get("is_processing") for s in (await client.get(f"{url}/slots")).json()):
                    await asyncio.sleep(0.002)
            out.append(time.monotonic() - closed)
    finally:
        await server.aclose()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keystrokes", type=int, default=30)
    parser.add_argument("--editors", default="1,4,8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cancel-tries", type=int, default=5)
    parser.add_argument("--local-device", default="cpu",
                        help="where the local runtime runs, comma-separated for several (cpu,cuda); the "
                             "ratios are against the first")
    parser.add_argument("--editor-processes", action="store_true",
                        help="each editor in its own process (as each developer's server is), not all "
                             "in this one's event loop")
    parser.add_argument("--gpu-layers", type=int, default=0,
                        help="llama-server's -ngl: layers on the GPU (needs a CUDA build of llama-server)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    counts = [int(n) for n in args.editors.split(",")]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [typing_positions(stdlib / name, args.keystrokes) for name in SOURCES[: max(counts)]]
    config = CompletionConfig(debounce_ms=0)
    result = {"cpu": cpu_info(), "gpu": gpu_name(), "server_gpu_layers": args.gpu_layers,
              "editor_processes": args.editor_processes,
              "keystrokes": args.keystrokes, "threads": args.threads, "date": time.strftime("%Y-%m-%d %H:%M")}

    result["locals"] = {}
    for device in args.local_device.split(","):
        runtime = ModelRuntime(ModelConfig(threads=args.threads, device=device)).load().prepare()
        run_local(runtime, config, files[0][:3])  # warm: the engine compiled, the first window read
        local = run_local(runtime, config, files[0])
        result["locals"][runtime.device] = {"p50": percentile(local, 0.5), "p95": percentile(local, 0.95),
                                            "requests": len(local)}
        del runtime
    # The ratios are against the first device named (the editor's own machine: its CPU by default).
    result["local"] = next(iter(result["locals"].values()))

    with tempfile.TemporaryDirectory(prefix="squid-bench-served-") as tmp:
        proc, url = start_server(args.threads, max(counts), Path(tmp) / "server.log", args.gpu_layers)
        try:
            served = CompletionConfig(debounce_ms=0, backend="openai", server_url=f"{url}/v1", fim="off",
                                      server_timeout_s=120.0)
            result["served"] = {}
            for n in counts:
                if args.editor_processes:
                    before, began = server_counters(url), time.perf_counter()
                    result["served"][n] = run_editor_processes(served, files[:n])
                else:
                    # As for the local runtime, each editor's file is read once before the clock
                    # runs (a file opened once costs a whole prefill, on either side).
                    asyncio.run(run_editors(served, [positions[:1] for positions in files[:n]]))
                    before, began = server_counters(url), time.perf_counter()
                    result["served"][n] = asyncio.run(run_editors(served, files[:n]))
                result["served"][n]["server"] = server_share(before, server_counters(url),
                                                             time.perf_counter() - began)
            result["cancel_stop_s"] = asyncio.run(cancel_stop_times(
                url, replace_backend(served, url), args.cancel_tries))
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    print(json.dumps(result, indent=1))
    print(markdown(result))
    out = args.out or REPO / "bench" / "results" / f"served-completion-{time.strftime('%Y-%m-%d-%H%M')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"results: {out}")
    return 0


def gpu_name() -> str | None:
    """The first GPU's name as nvidia-smi gives it, or None on a machine without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else None


def replace_backend(config: CompletionConfig, url: str) -> CompletionConfig:
    """The same server asked through `/v1/completions` with the cancel test's long budget."""
    from dataclasses import replace

    return replace(config, server_url=f"{url}/v1", max_tokens=1500)


def markdown(result: dict) -> str:
    local = result["local"]
    rows = ["| editors | backend | requests | p50 | p95 | p50 / local p50 | prompt cache reuse |",
            "|---|---|---|---|---|---|---|"]
    for device, row in result.get("locals", {"cpu": local}).items():
        rows.append(f"| 1 | local runtime ({device}) | {row['requests']} | {row['p50']:.3f} s | "
                    f"{row['p95']:.3f} s | {row['p50'] / local['p50']:.2f} | - |")
    server = "llama-server (GPU)" if result.get("server_gpu_layers") else "llama-server"
    for n, row in result["served"].items():
        rows.append(f"| {n} | {server} | {row['requests']} | {row['p50']:.3f} s | {row['p95']:.3f} s | "
                    f"{row['p50'] / local['p50']:.2f} | {row['cache_reuse']:.0%} |")
    rows.append("")
    rows.append("| editors | server decoding calls | wall ms per call | tokens per call | prompt s | "
                "generation s |")
    rows.append("|---|---|---|---|---|---|")
    for n, row in result["served"].items():
        if "server" in row:
            share = row["server"]
            rows.append(f"| {n} | {share['decode_calls']} | {share['wall_ms_per_decode']:.1f} | "
                        f"{share['tokens_per_decode']:.1f} | {share['prompt_s']:.2f} | "
                        f"{share['predicted_s']:.2f} |")
    one = result["served"][min(result["served"])]
    worst = result["served"][max(result["served"])]
    stops = result["cancel_stop_s"]
    rows.append("")
    rows.append(f"p95 at {max(result['served'])} editors / p95 at {min(result['served'])}: "
                f"{worst['p95'] / one['p95']:.2f}x; a cancelled request stopped on the server in "
                f"{1000 * statistics.median(stops):.0f} ms (median of {len(stops)}, "
                f"max {1000 * max(stops):.0f} ms)")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
