#!/usr/bin/env python
"""Runtime speed (issue 10): the lean engine next to transformers `generate()` and llama.cpp.

Measured in one run, interleaved, medians over `--runs`:
  1. prefill and decode speed on ~1,000 tokens of real code (`fixtures/foundation_prefix.txt`)
     and 64 greedy tokens: the runtime (float32, int8 and int4 weights; float32 again with the
     exact output projection instead of the shortlist head, with the projections in the
     row-major layout transformers loads, with the fused step reading float32 weights instead of
     their exact 4-bit codes, and with torch steps instead of the fused
     `kernels/cpu_decode.c` step), transformers `generate()` on
     the same torch model, and llama.cpp (llama-cpp-python, in its own venv, on the same GGUF file
     the runtime converts) in a worker process;
  2. keystroke-to-completion latency while typing through a real ~1,000-line file (the
     standard library's `ftplib.py`, 981 lines): at sites spread over the file a line is retyped
     character by character and each keystroke asks `agent.completion.complete` for a 24-token
     completion, as the editor does, with `--references` other standard-library files open and
     their Squid caches warm (the completion continues from their composed cache); the first
     keystroke at a site prefills at most `completion.keystroke_prefill_tokens`, and after each
     site the idle editor's background warm of the whole window and one more keystroke are
     measured apart;
  3. prompt-lookup speculative decoding against plain decoding on agent-style edits of real code
     (the output must be identical);
  4. the quality of int8, int4 and bfloat16 weights against float32 (top-1 agreement, KL) on real code.

Usage: python bench/runtime.py [--json] [--runs N] [--threads N] [--quick] [--save FILE]
       [--llama-python /tmp/llamavenv/bin/python] [--weights none|int8|int4] [--references N]
       [--keystroke-threads N] [--tune auto|off] [--edits stdlib|repo@REV] [--lookup-only]
       [--march LEVEL]

The settings `model.tune` chooses per machine (the draft length, the keystroke prefill budget,
`context.tuning`) are measured first (or read from this machine's cache) and apply unless `--tune
off`; `--threads` is set explicitly, so the tuner's thread count is only reported.

`--json` prints exactly {"prefill_tok_s", "decode_tok_s", "keystroke_p50_s", "keystroke_p95_s",
"speculative_speedup", "vs_llama_cpp", "vs_generate", "cpu", "tuned"} for the configuration
`--weights` names; `--save` writes everything measured (both weight formats, load averages,
settings, what was measured for the tuning).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.bench_foundation import cpu_info  # noqa: E402

PREFIX_FIXTURE = Path(__file__).resolve().parent / "fixtures" / "foundation_prefix.txt"
NEW_TOKENS = 64
WEIGHTS = ("none", "int8", "int4")  # the runtime's `model.quantize` settings
KEYSTROKE_TOKENS = 24
TYPED_FILE = Path(sysconfig.get_paths()["stdlib"]) / "ftplib.py"
# Open beside it while typing, so their Squid caches are the completion's references (warm).
REFERENCE_FILES = ("socket.py", "ssl.py", "netrc.py", "shlex.py")
# Agent-style edits: a function of the standard library (code that stays the same from run to run
# and from one day to the next), to be rewritten with one name changed.
EDIT_SOURCES = [
    ("textwrap.py", "def dedent(", ("margin", "indent")),
    ("shutil.py", "def which(", ("cmd", "command")),
    ("posixpath.py", "def relpath(", ("start", "base")),
    ("glob.py", "def _iglob(", ("dironly", "dirs_only")),
]
# Until Dec 4 2026 the edits were functions of squidcode's own code, which changed under them: the
# prompt-lookup figures of docs/benchmarks.md before then were measured on these, as they were at
# the commit of each run (`--edits repo@REV` measures them again as they were at REV).
REPO_EDIT_SOURCES = [
    ("context/boundary.py", "def cursor_context(", ("offset", "cursor")),
    ("context/index/store.py", "    def _connect(", ("conn", "connection")),
    ("context/config.py", "def _check_value(", ("value", "raw")),
    ("context/index/walk.py", "def walk_roots(", ("roots", "folders")),
]

LLAMA_WORKER = r"""
import json, sys, time
from llama_cpp import Llama
args = json.loads(sys.argv[1])
llm = Llama(model_path=args["gguf"], n_ctx=2048, n_threads=args["threads"],
            n_threads_batch=args["threads"], n_batch=512, verbose=False)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    ids = llm.tokenize(req["text"].encode(), add_bos=False, special=False)
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    t1 = time.perf_counter()
    out = []
    while True:
        token = llm.sample(top_k=1, temp=0.0)
        out.append(token)
        if len(out) >= req["new_tokens"]:
            break
        llm.eval([token])
    t2 = time.perf_counter()
    print(json.dumps({"prompt_tokens": len(ids), "prefill_s": t1 - t0, "decode_s": t2 - t1,
                      "new_tokens": len(out)}), flush=True)
"""


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def percentile(values: list[float], q: float) -> float:
    data = sorted(values)
    pos = (len(data) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {loadavg()[0]}] {message}", file=sys.stderr, flush=True)


def runtime_for(weights: str, threads: int, tune: str = "auto", **settings):
    """A runtime with its own engine (sharing the loaded weights) for one weight format."""
    from context.config import ModelConfig
    from context.runtime import get_runtime

    base = get_runtime(ModelConfig(threads=threads, tune=tune))
    return base.sharing_weights(dataclasses.replace(base.config, quantize=weights, **settings))


def row_major_runtime(threads: int, tune: str):
    """The float32 runtime on a copy of the model whose projections keep the row-major layout
    transformers loads (the runtime stores them transposed on the CPU), to show what that buys."""
    import torch

    clone = runtime_for("none", threads, tune)
    clone.model = copy.deepcopy(clone.model)
    with torch.no_grad():
        for parameter in clone.model.parameters():
            parameter.data = parameter.data.contiguous()
    return clone


# -- 1. prefill / decode --------------------------------------------------------------------------


def measure_ours(runtime, ids: list[int]) -> dict:
    runtime.config = dataclasses.replace(runtime.config, draft_tokens=0)
    runtime.forget_prefix()
    result = runtime.generate(ids, max_new_tokens=NEW_TOKENS)
    return {"prefill_s": result.prefill_s, "prefill_tok_s": len(ids) / result.prefill_s,
            "decode_tok_s": result.tokens_per_s, "new_tokens": result.new_tokens, "text": result.text}


def measure_generate(runtime, ids: list[int]) -> dict:
    import torch

    tensor = torch.tensor([ids])
    with torch.inference_mode():
        started = time.perf_counter()
        runtime.model.generate(tensor, max_new_tokens=1, do_sample=False, pad_token_id=2)
        first = time.perf_counter() - started
        started = time.perf_counter()
        out = runtime.model.generate(tensor, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                     do_sample=False, pad_token_id=2)
        total = time.perf_counter() - started
    new = out.shape[1] - len(ids)
    return {"prefill_s": first, "prefill_tok_s": len(ids) / first,
            "decode_tok_s": (new - 1) / (total - first), "new_tokens": new,
            "text": runtime.decode(out[0, len(ids) :].tolist())}


class LlamaCppWorker:
    """llama-cpp-python in its own interpreter (it is installed for the benchmark only)."""

    def __init__(self, python: str, gguf: Path, threads: int):
        self.proc = subprocess.Popen(
            [python, "-c", LLAMA_WORKER, json.dumps({"gguf": str(gguf), "threads": threads})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        ready = self.proc.stdout.readline()
        if not ready:
            raise RuntimeError(f"llama.cpp worker did not start (exit {self.proc.wait()})")

    def measure(self, text: str) -> dict:
        self.proc.stdin.write(json.dumps({"text": text, "new_tokens": NEW_TOKENS}) + "\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        out["prefill_tok_s"] = out["prompt_tokens"] / out["prefill_s"]
        out["decode_tok_s"] = (out["new_tokens"] - 1) / out["decode_s"]
        return out

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


# -- 2. keystrokes --------------------------------------------------------------------------------


def typing_sites(text: str, sites: int, chars: int) -> list[tuple[int, str]]:
    """(line start offset, line) for code lines spread over the file, each long enough to type."""
    lines = text.split("\n")
    starts, offset = [], 0
    for line in lines:
        starts.append(offset)
        offset += len(line) + 1
    picked = []
    for k in range(sites):
        index = len(lines) * (k + 1) // (sites + 1)
        while index < len(lines) and len(lines[index].strip()) < chars + 4:
            index += 1
        picked.append((starts[index], lines[index]))
    return picked


def warm_references(runtime, count: int):
    """`CompletionReferences` over `count` standard-library files open beside the typed one, every
    document already encoded (memory tiers only), as the server has them once they were open a while."""
    from context.config import SquidCacheConfig
    from context.squid.references import CompletionReferences, file_document
    from context.squid.service import SquidService

    if count <= 0:
        return None
    config = SquidCacheConfig()
    service = SquidService(runtime, config, None, start_thread=False)
    opened = {str(TYPED_FILE.parent / name): (TYPED_FILE.parent / name).read_text()
              for name in REFERENCE_FILES[:count]}
    service.context_for([file_document(path, text, config.document_tokens) for path, text in opened.items()],
                        wait=True)
    return CompletionReferences(service, current_path=str(TYPED_FILE), open_documents=opened, search=None)


def measure_keystrokes(runtime, sites: int, chars: int, references: int = 0) -> dict:
    """Retype `chars` characters at each of `sites` places, a completion per keystroke, back to back
    (no idle time, so the server's background warm of the whole window never runs); then, after
    each site, the warm as an idle editor gets it and one more keystroke, reported apart."""
    from agent.completion import CompletionRequest, complete, warm_window
    from context.config import CompletionConfig

    text = TYPED_FILE.read_text()
    config = CompletionConfig(max_tokens=KEYSTROKE_TOKENS, debounce_ms=0)
    refs = warm_references(runtime, references)
    latencies, jumps, offered, reference_tokens = [], [], 0, set()
    windows, warms, paused, paused_windows = [], [], [], []
    runtime.forget_prefix()
    for start, line in typing_sites(text, sites, chars):
        indent = len(line) - len(line.lstrip())
        rest = text[start + len(line) :]
        for typed in range(1, chars + 2):
            cursor = start + indent + min(typed, chars)
            document = text[:cursor] + rest  # the line being retyped, up to the cursor
            request = CompletionRequest(document, cursor, "python", path=str(TYPED_FILE))
            if typed > chars:  # the editor idles: the whole window is prefilled, then one keystroke
                began = time.perf_counter()
                warm_window(runtime, request, config, references=refs)
                warms.append(time.perf_counter() - began)
            began = time.perf_counter()
            completion = complete(runtime, request, config, references=refs)
            elapsed = time.perf_counter() - began
            window = None if completion is None else completion.prompt_tokens
            if typed > chars:
                paused.append(elapsed)
                paused_windows.append(window)
                continue
            (jumps if typed == 1 else latencies).append(elapsed)
            windows.append(window)
            offered += completion is not None
            if completion is not None:
                reference_tokens.add(completion.reference_tokens)
    everything = latencies + jumps
    return {"keystrokes": len(everything), "p50_s": percentile(everything, 50),
            "p95_s": percentile(everything, 95), "typing_p50_s": percentile(latencies, 50),
            "typing_p95_s": percentile(latencies, 95), "jump_median_s": statistics.median(jumps),
            "jump_max_s": max(jumps), "window_tokens_median": statistics.median(w for w in windows if w),
            "after_pause": {"warm_median_s": statistics.median(warms),
                            "keystroke_median_s": statistics.median(paused),
                            "window_tokens": paused_windows},
            "offered": offered, "file": str(TYPED_FILE), "sites": sites, "chars_per_site": chars,
            "references": references, "reference_tokens": sorted(reference_tokens),
            "keystroke_prefill_tokens": runtime.settings.keystroke_prefill_tokens,
            "prefix_tokens": config.prefix_tokens}


# -- 3. prompt lookup -----------------------------------------------------------------------------


def edit_source(path: str, edits: str) -> str:
    """The text of an edit's source file: the standard library's (`edits` "stdlib"), or squidcode's
    own as it was at a git revision ("repo@REV")."""
    if edits == "stdlib":
        return (Path(sysconfig.get_paths()["stdlib"]) / path).read_text()
    revision = edits.removeprefix("repo@")
    return subprocess.run(["git", "show", f"{revision}:{path}"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout


def edit_prompts(runtime, edits: str = "stdlib") -> list[tuple[str, str]]:
    """(kind, prompt): rewrites of real code, answered up to their first rewritten line.

    "rename" asks for the function with one name changed; "copy" for the function again (an edit
    whose change lies further down: everything before it is a copy).
    """
    prompts = []
    for path, start, (old, new) in EDIT_SOURCES if edits == "stdlib" else REPO_EDIT_SOURCES:
        text = edit_source(path, edits)
        at = text.index(start)
        body = text[at : text.rfind("\n", at, at + 1200)]  # whole lines, ~1,200 characters
        renamed = re.sub(rf"\b{old}\b", new, body)
        original = f"# Original code:\n{body}\n\n"
        heading = f"# The same code, with `{old}` renamed to `{new}`:"
        prompts.append(("rename", f"{original}{heading}\n{renamed.split(chr(10), 1)[0]}\n"))
        prompts.append(("copy", f"{original}# The same code again:\n{body.split(chr(10), 1)[0]}\n"))
    return prompts


def measure_speculative(runtime, new_tokens: int, edits: str = "stdlib") -> dict:
    """Plain decoding (no drafts) against the runtime's prompt lookup as it runs by default (the
    draft length tuned for this machine, or the untuned default)."""
    rows = []
    speed_config = runtime.config
    for kind, prompt in edit_prompts(runtime, edits):
        ids = runtime.encode(prompt)
        timings = {}
        for drafts in (0, None):
            runtime.config = dataclasses.replace(speed_config, draft_tokens=drafts)
            runtime.forget_prefix()
            timings[drafts] = runtime.generate(ids, max_new_tokens=new_tokens)
        plain, drafted = timings[0], timings[None]
        rows.append({"kind": kind, "prompt_tokens": len(ids), "new_tokens": plain.new_tokens,
                     "plain_decode_s": plain.decode_s, "drafted_decode_s": drafted.decode_s,
                     "speedup": plain.decode_s / drafted.decode_s, "identical": plain.text == drafted.text,
                     "accepted": drafted.accepted_tokens, "drafted": drafted.drafted_tokens})
    runtime.config = speed_config

    def speedup(kinds):
        picked = [r for r in rows if r["kind"] in kinds]
        return sum(r["plain_decode_s"] for r in picked) / sum(r["drafted_decode_s"] for r in picked)

    return {"edits": rows, "speedup": speedup(("rename", "copy")), "rename_speedup": speedup(("rename",)),
            "copy_speedup": speedup(("copy",)), "identical": all(r["identical"] for r in rows),
            "draft_tokens": runtime.settings.draft_tokens, "sources": edits}


# -- 4. quality -----------------------------------------------------------------------------------


def measure_quality(runtime, positions: int) -> dict:
    import torch

    from context.decode import DecodeEngine
    from context.quant import int4_linear, int8_linear, logit_agreement

    reference = DecodeEngine(runtime.model)
    bf16_model = copy.deepcopy(runtime.model).to(torch.bfloat16)
    candidates = {
        "int8": DecodeEngine(runtime.model, int8_linear, quantize_head=False),  # what quantize="int8" runs
        "int8_head_too": DecodeEngine(runtime.model, int8_linear),
        "int4": DecodeEngine(runtime.model, int4_linear, quantize_head=False),
        "bfloat16": DecodeEngine(bf16_model),
    }
    texts = [PREFIX_FIXTURE, TYPED_FILE, REPO / "context/index/store.py"]
    texts = [path.read_text() for path in texts]
    out = {}
    for name, engine in candidates.items():
        reports = [logit_agreement(reference, engine, runtime.encode(t)[:positions]) for t in texts]
        total = sum(r.positions for r in reports)
        out[name] = {
            "positions": total,
            "top1_agreement": sum(r.top1_agreement * r.positions for r in reports) / total,
            "mean_kl": sum(r.mean_kl * r.positions for r in reports) / total,
            "max_kl": max(r.max_kl for r in reports),
        }
    return out


# -- the run --------------------------------------------------------------------------------------


def tuning_record(runtime) -> dict:
    """What the runtime measured on this CPU (measured now unless cached) and the settings it
    runs with: the tuned ones, those `--threads` sets, or with `--tune off` the fixed defaults."""
    from context.config import CompletionConfig
    from context.tuning import describe

    started = time.perf_counter()
    runtime.prepare()
    if runtime.costs is None and runtime.config.tune == "auto":
        runtime.prepare(retune=True)  # a busy machine is measured at no start: measure it now
    settings = runtime.settings
    return {"tune": runtime.config.tune, "prepare_s": round(time.perf_counter() - started, 2),
            "settings": dataclasses.asdict(settings),
            "costs": runtime.costs.to_json() if runtime.costs is not None else None,
            "described": describe(runtime.costs, runtime.config, CompletionConfig())}



def median_of(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def summarise(engine_rows, generate_rows, llama_rows) -> dict:
    ours = {"prefill_tok_s": median_of(engine_rows, "prefill_tok_s"),
            "decode_tok_s": median_of(engine_rows, "decode_tok_s")}

    def versus(rows):
        if not rows:
            return None
        prefill, decode = median_of(rows, "prefill_tok_s"), median_of(rows, "decode_tok_s")
        return {"prefill_tok_s": round(prefill, 1), "decode_tok_s": round(decode, 2),
                "prefill_ratio": round(ours["prefill_tok_s"] / prefill, 2),
                "decode_ratio": round(ours["decode_tok_s"] / decode, 2)}

    return ours | {"vs_generate": versus(generate_rows), "vs_llama_cpp": versus(llama_rows)}


def _versus(peer: dict | None) -> str:
    """The decode ratio against a peer, and its own speed, for the summary table."""
    if not peer:
        return "-"
    return f"{peer['decode_ratio']}x ({peer['decode_tok_s']} tok/s)"


def lookup_only(args, record: dict) -> int:
    """`--lookup-only`: prompt lookup against plain decoding, `--runs` times, on the default weights."""
    runtime = runtime_for("none", args.threads, args.tune)
    record["tuning"] = tuning_record(runtime)
    runtime.config = dataclasses.replace(runtime.config, draft_tokens=None)  # as tuned, or the default
    runs = []
    for run in range(args.runs):
        progress(f"prompt lookup {run + 1}/{args.runs} ({args.edits})")
        runs.append(measure_speculative(runtime, 48 if args.quick else 128, args.edits))
    record |= {"lookup_runs": runs, "load_after": loadavg()}
    speedups = [r["speedup"] for r in runs]
    result = {"speedup_median": round(statistics.median(speedups), 2),
              "speedups": [round(x, 2) for x in speedups],
              "rename": round(statistics.median(r["rename_speedup"] for r in runs), 2),
              "copy": round(statistics.median(r["copy_speedup"] for r in runs), 2),
              "identical": all(r["identical"] for r in runs), "edits": args.edits,
              "draft_tokens": runs[0]["draft_tokens"]}
    if args.save:
        Path(args.save).write_text(json.dumps(record | {"result": result}, indent=2, default=str))
    print(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch / llama.cpp threads (all phases)")
    parser.add_argument("--keystroke-threads", type=int,
                        help="model.threads while typing (0 = the server's default); default --threads")
    parser.add_argument("--weights", choices=WEIGHTS, default="none",
                        help="the weight format whose figures --json prints")
    parser.add_argument("--llama-python", default="/tmp/llamavenv/bin/python")
    parser.add_argument("--detail", nargs="+", choices=WEIGHTS, default=["none", "int4"],
                        help="weight formats measured for keystrokes and prompt lookup")
    parser.add_argument("--sites", type=int, default=5)
    parser.add_argument("--chars", type=int, default=12)
    parser.add_argument("--references", type=int, default=2, choices=range(0, len(REFERENCE_FILES) + 1),
                        help="files open beside the typed one, their Squid caches warm (0 = none)")
    parser.add_argument("--quick", action="store_true", help="1 run, 2 typing sites, short edits")
    parser.add_argument("--tune", choices=("auto", "off"), default="auto",
                        help="model.tune: the per-machine settings (auto), or the fixed defaults (off)")
    parser.add_argument("--edits", default="stdlib",
                        help="prompt lookup's edits: functions of the standard library (stdlib), or of "
                             "squidcode's own code as at a git revision (repo@REV: the edits of runs "
                             "before Dec 4 2026)")
    parser.add_argument("--lookup-only", action="store_true",
                        help="measure prompt lookup alone (the default weights), nothing else")
    parser.add_argument("--march",
                        help="build the fused step for this -march level instead of the CPU's own "
                             "(x86-64-v3: the AVX2 code, measured on an AVX-512 machine; pair it with a "
                             "llama.cpp built for the same level in --llama-python)")
    parser.add_argument("--save")
    args = parser.parse_args(argv)
    if args.edits != "stdlib" and not args.edits.startswith("repo@"):
        parser.error("--edits is stdlib or repo@REV")
    if args.weights not in args.detail:
        args.detail.append(args.weights)
    if args.quick:
        args.runs, args.sites, args.chars = 1, 2, 8
    import torch

    from context.runtime import locate_embedded_gguf

    torch.set_num_threads(args.threads)
    if args.march:
        from kernels import cpu_decode

        cpu_decode.FLAGS = tuple(f"-march={args.march}" if flag == "-march=native" else flag
                                 for flag in cpu_decode.FLAGS)
    record: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "load_before": loadavg(),
                    "threads": args.threads, "keystroke_threads": args.keystroke_threads,
                    "nproc": os.cpu_count(), "torch": torch.__version__, "cpu": cpu_info(),
                    "march": args.march or "native"}
    if args.lookup_only:
        return lookup_only(args, record)
    record["tuning"] = tuning_record(runtime_for("none", args.threads, args.tune))
    runtimes = {w: runtime_for(w, args.threads, args.tune) for w in WEIGHTS}
    # The float32 engine again with an exact output projection, with row-major weights, with the
    # fused step multiplying its 4-bit codes in float32 where the CPU could in integers, reading
    # the float32 tensors instead of their exact 4-bit codes, and with torch's per-operation steps
    # instead of the fused one, to show what each buys.
    variants = {"exact_head": runtime_for("none", args.threads, args.tune, shortlist_head=False),
                "float_products": runtime_for("none", args.threads, args.tune, fused_integer=False),
                "fused_float32": runtime_for("none", args.threads, args.tune, fused_q4=False),
                "row_major": row_major_runtime(args.threads, args.tune),
                "torch_step": runtime_for("none", args.threads, args.tune, fused_step=False)}
    text = PREFIX_FIXTURE.read_text()
    ids = runtimes["none"].encode(text)
    record["prompt_tokens"] = len(ids)
    llama = None
    if Path(args.llama_python).exists():
        try:
            llama = LlamaCppWorker(args.llama_python, locate_embedded_gguf(), args.threads)
        except (OSError, RuntimeError) as exc:
            record["llama_cpp_error"] = str(exc)
    else:
        record["llama_cpp_error"] = f"{args.llama_python} not found (pip install llama-cpp-python there)"
    rows: dict[str, list[dict]] = {name: [] for name in (*WEIGHTS, *variants, "generate", "llama_cpp")}
    runtimes["none"].generate(ids[:64], max_new_tokens=2)  # touch the memory-mapped weights
    for run in range(args.runs):
        progress(f"speed run {run + 1}/{args.runs}")
        for weights, runtime in runtimes.items():
            rows[weights].append(measure_ours(runtime, ids))
        for name, runtime in variants.items():
            rows[name].append(measure_ours(runtime, ids))
        # transformers as it loads the model (row-major weights)
        rows["generate"].append(measure_generate(variants["row_major"], ids))
        if llama is not None:
            rows["llama_cpp"].append(llama.measure(text))
    if llama is not None:
        llama.close()
    record["speed_rows"] = rows
    record["steps"] = {name: runtime.describe_steps() for name, runtime in (("none", runtimes["none"]),
                                                                           *variants.items())}
    record["greedy_equal_to_generate"] = all(
        len({row["text"] for row in same_run}) == 1
        for same_run in zip(rows["none"], rows["generate"], *(rows[v] for v in variants), strict=True)
    )
    for weights in args.detail:
        runtime = runtimes[weights]
        runtime.config = dataclasses.replace(runtime.config, draft_tokens=None)  # as tuned, or the default
        progress(f"keystrokes ({weights})")
        speed_config = runtime.config
        if args.keystroke_threads is not None:
            # As the server runs: prefill on `threads` (0 = every core unless the machine is busy),
            # decode on `decode_threads`.
            runtime.config = dataclasses.replace(speed_config, threads=args.keystroke_threads)
            torch.set_num_threads(args.keystroke_threads or os.cpu_count())
        record[f"keystrokes_{weights}"] = measure_keystrokes(runtime, args.sites, args.chars, args.references)
        runtime.config = speed_config
        torch.set_num_threads(args.threads)
        progress(f"prompt lookup ({weights})")
        record[f"speculative_{weights}"] = measure_speculative(runtime, 48 if args.quick else 128, args.edits)
    progress("quality")
    record["quality"] = measure_quality(runtimes["none"], 256 if args.quick else 512)
    record["load_after"] = loadavg()
    for weights in (*WEIGHTS, *variants):
        record[f"summary_{weights}"] = summarise(rows[weights], rows["generate"], rows["llama_cpp"])
    chosen = record[f"summary_{args.weights}"]
    keys = record[f"keystrokes_{args.weights}"]
    result = {
        "prefill_tok_s": round(chosen["prefill_tok_s"], 1),
        "decode_tok_s": round(chosen["decode_tok_s"], 2),
        "keystroke_p50_s": round(keys["p50_s"], 3),
        "keystroke_p95_s": round(keys["p95_s"], 3),
        "speculative_speedup": round(record[f"speculative_{args.weights}"]["speedup"], 2),
        "vs_llama_cpp": chosen["vs_llama_cpp"],
        "vs_generate": chosen["vs_generate"],
    }
    if args.save:
        Path(args.save).write_text(json.dumps(record | {"result": result}, indent=2, default=str))
    cpu, tuned = record["cpu"], record["tuning"]["settings"]
    print(f"| CPU | cores | flags | built for | tuned (draft / keystroke budget) | keystroke p50 / p95 s "
          f"| prompt lookup | decode vs llama.cpp |\n|---|---|---|---|---|---|---|---|\n| {cpu['model']} | "
          f"{cpu['cores']} | {' '.join(cpu['flags'])} | {record['march']} | "
          f"{record['tuning']['tune']}: {tuned['draft_tokens']} / "
          f"{tuned['keystroke_prefill_tokens']} | "
          f"{result['keystroke_p50_s']} / {result['keystroke_p95_s']} | "
          f"{result['speculative_speedup']}x | {_versus(result['vs_llama_cpp'])} |", file=sys.stderr)
    result["cpu"] = cpu | {"march": record["march"]}
    result["tuned"] = record["tuning"]["settings"] | {"tune": record["tuning"]["tune"]}
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(record | {"result": result}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
