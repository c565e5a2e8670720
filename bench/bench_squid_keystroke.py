#!/usr/bin/env python
"""What Squid references cost per keystroke (issue 22, item 3): references on vs off, side by side.

A third-party package installed beside squidcode (`sqlite_utils` by default) is copied into a temp
workspace and indexed (`IndexService`, no watcher, no embeddings); the typed file and a few siblings
are "open in the editor". At `--sites` code lines spread over the typed file, the first `--chars`
characters of the line are retyped one keystroke at a time, each keystroke asking
`agent.completion.complete` for a completion, in-process, once with `CompletionReferences` (Squid on)
and once without (off); the order of on and off alternates from site to site. Before a site the
editor has idled: the whole window is warmed (`warm_window`) and the background encoder has
finished, so the site's keystrokes measure typing with the references already encoded. The first
keystroke at a site (a jump) is reported apart from the typing keystrokes after it.

Per keystroke: selection (choosing the documents: `compose` minus the service's `context_for`),
composition (`SquidService.context_for`), the private cache built from it (`new_cache`), the
runtime's check that its window holds that cache (`KVCache.holds_past`, plus `load_past` when it
did not), prompt tokens prefilled (prompt minus reused), prefill and decode time, and the total.

    python bench/bench_squid_keystroke.py [--package sqlite_utils] [--file db.py] [--sites 6]
        [--chars 10] [--open utils.py,migrations.py] [--cross-file] [--json FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import keyword
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def loadavg() -> float:
    return round(os.getloadavg()[0], 2)


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {loadavg()}] {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    data = sorted(values)
    if not data:
        return float("nan")
    pos = (len(data) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def copy_package(name: str, into: Path) -> Path:
    """The package's .py files (its sibling files included) copied under `into`/<name>."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"package {name} is not installed in this interpreter")
    source = Path(next(iter(spec.submodule_search_locations)))
    target = into / name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


def imported_names(text: str, package: str) -> set[str]:
    """Names the file imports from its own package (`from .x import a`, `from package.x import a`)."""

    names: set[str] = set()
    for match in re.finditer(rf"^from\s+(?:\.|{re.escape(package)})[\w.]*\s+import\s+(\([^)]*\)|[^\n]+)",
                             text, re.M):
        names.update(re.findall(r"\b([A-Za-z_]\w*)\b(?!\s+as\b)", match.group(1).replace("import", "")))
    return {name for name in names if not keyword.iskeyword(name)}


def typing_sites(text: str, sites: int, chars: int,
                 uses: set[str] | None = None) -> list[tuple[int, str, int]]:
    """(line start offset, line, column typing starts at) of code lines spread over the file, each
    long enough to type: a statement with a call or an assignment, outside docstrings and comments,
    typed from its indentation; with `uses`, lines that use one of those names, typed from just
    after the first of them (and its `(` or `.`): the arguments of a call to another file's function."""

    lines = text.split("\n")
    starts, offset, in_string = [], 0, False
    usable: list[tuple[int, int]] = []  # (line index, column)
    for i, line in enumerate(lines):
        starts.append(offset)
        offset += len(line) + 1
        stripped = line.strip()
        column = _typing_column(line, uses)
        if not in_string and i > 40 and column is not None and len(stripped) >= chars + 4 \
                and (uses is None or len(line) - column >= chars + 2) and stripped[0].isalpha() \
                and ("(" in stripped or " = " in stripped) and not stripped.startswith(("def ", "class ")):
            usable.append((i, column))
        if (line.count('"""') + line.count("'''")) % 2:
            in_string = not in_string
    picked = [usable[len(usable) * (k + 1) // (sites + 1)] for k in range(sites)]
    return [(starts[i], lines[i], column) for i, column in picked]


def _typing_column(line: str, uses: set[str] | None) -> int | None:
    """Where typing starts on `line`: its indentation, or after the first name of `uses` (and its
    `(` or `.`); None when `uses` is given and the line uses none of them."""
    if uses is None:
        return len(line) - len(line.lstrip()) if line.strip() else None
    for match in re.finditer(r"[A-Za-z_]\w*", line):
        if match.group(0) in uses:
            return match.end() + (line[match.end():match.end() + 1] in ("(", "."))
    return None


class Probe:
    """Wraps the functions a keystroke goes through, adding up their time per keystroke."""

    def __init__(self):
        self.times: dict[str, float] = {}
        self.results: list = []
        self._undo: list = []

    def wrap(self, owner, name: str, label: str, keep_result: bool = False) -> None:
        original = getattr(owner, name)
        probe = self

        def timed(*args, **kwargs):
            began = time.perf_counter()
            try:
                out = original(*args, **kwargs)
            finally:
                probe.times[label] = probe.times.get(label, 0.0) + time.perf_counter() - began
            if keep_result:
                probe.results.append(out)
            return out

        setattr(owner, name, timed)
        self._undo.append((owner, name, original))

    def reset(self) -> None:
        self.times, self.results = {}, []

    def restore(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)


@contextmanager
def probed(runtime, service):
    from context.decode import KVCache
    from context.squid.compose import ComposedContext

    probe = Probe()
    probe.wrap(runtime, "generate", "generate", keep_result=True)
    probe.wrap(service, "context_for", "compose")
    probe.wrap(ComposedContext, "new_cache", "new_cache")
    probe.wrap(KVCache, "holds_past", "holds_past")
    probe.wrap(KVCache, "load_past", "load_past")
    try:
        yield probe
    finally:
        probe.restore()


def keystroke(runtime, request, config, references, probe) -> dict:
    from agent.completion import complete

    probe.reset()
    began = time.perf_counter()
    completion = complete(runtime, request, config, references=references)
    total = time.perf_counter() - began
    t = probe.times
    first = probe.results[0] if probe.results else None
    reference_total = t.get("reference_total", 0.0)
    return {
        "total_s": total,
        "select_s": max(0.0, reference_total - t.get("compose", 0.0)),
        "compose_s": t.get("compose", 0.0),
        "new_cache_s": t.get("new_cache", 0.0),
        "holds_past_s": t.get("holds_past", 0.0) + t.get("load_past", 0.0),
        "past_loaded": t.get("load_past", 0.0) > 0,
        "prefill_tokens": sum(r.prompt_tokens - r.reused_tokens for r in probe.results),
        "prefill_s": sum(r.prefill_s for r in probe.results),
        "decode_s": sum(r.decode_s for r in probe.results),
        "new_tokens": first.new_tokens if first else 0,
        "reference_tokens": completion.reference_tokens if completion else None,
        "references": ([r.path for r in completion.prompt.references] if completion else None),
        "text": completion.text if completion else None,
    }


def references_as_served(cls, service, typed: str, opened: dict[str, str], index, root: Path):
    """The references the server hands a completion: by definition through the index's symbols
    where `CompletionReferences` takes them; before that, open files and index retrieval."""
    import inspect

    if "symbols" in inspect.signature(cls).parameters:
        return cls(service, current_path=typed, open_documents=opened, search=None, roots=[root],
                   symbols=index.store.symbols_named)
    return cls(service, current_path=typed, open_documents=opened, search=index.search, roots=[root])


class TimedReferences:
    """`CompletionReferences` with its whole `compose` timed (selection = that minus `context_for`)."""

    def __init__(self, inner, probe: Probe):
        self.inner, self.probe = inner, probe

    def foreground(self):
        return self.inner.foreground()

    def compose(self, prefix_text: str, *, wait: bool = False, **kwargs):
        began = time.perf_counter()
        try:
            return self.inner.compose(prefix_text, wait=wait, **kwargs)
        finally:
            self.probe.times["reference_total"] = (self.probe.times.get("reference_total", 0.0)
                                                   + time.perf_counter() - began)


def summarise(rows: list[dict]) -> dict:
    typing = [r for r in rows if not r["jump"]]
    jumps = [r for r in rows if r["jump"]]

    def med(key, part=typing):
        values = [float(r[key]) for r in part]
        return statistics.median(values) if values else float("nan")

    return {
        "typing_keystrokes": len(typing),
        "typing_p50_s": percentile([r["total_s"] for r in typing], 50),
        "typing_p95_s": percentile([r["total_s"] for r in typing], 95),
        "jump_median_s": med("total_s", jumps),
        "select_median_s": med("select_s"),
        "compose_median_s": med("compose_s"),
        "new_cache_median_s": med("new_cache_s"),
        "holds_past_median_s": med("holds_past_s"),
        "past_loaded_share": (sum(r["past_loaded"] for r in typing) / len(typing)) if typing else 0.0,
        "prefill_tokens_median": med("prefill_tokens"),
        "prefill_median_s": med("prefill_s"),
        "decode_median_s": med("decode_s"),
        "new_tokens_median": med("new_tokens"),
        "reference_tokens_median": statistics.median([r["reference_tokens"] or 0 for r in typing] or [0]),
        "referenced_keystrokes": sum(bool(r["references"]) for r in typing),
    }


def paired(rows: dict[str, list[dict]]) -> dict:
    """The same typing keystroke on and off, side by side: all of them, and those that Squid on
    composed references for (medians of the totals and of the per-keystroke difference)."""
    off = {(r["site"], r["typed"]): r for r in rows["off"] if not r["jump"]}
    pairs = [(off[(r["site"], r["typed"])], r) for r in rows["on"]
             if not r["jump"] and (r["site"], r["typed"]) in off]
    referenced = [(a, b) for a, b in pairs if b["references"]]

    def medians(part):
        if not part:
            return {"keystrokes": 0}
        return {"keystrokes": len(part), "off_p50_s": percentile([a["total_s"] for a, _ in part], 50),
                "on_p50_s": percentile([b["total_s"] for _, b in part], 50),
                "delta_median_s": statistics.median(b["total_s"] - a["total_s"] for a, b in part),
                "decode_delta_median_s": statistics.median(b["decode_s"] - a["decode_s"] for a, b in part),
                "overhead_median_s": statistics.median(b["select_s"] + b["compose_s"] + b["new_cache_s"]
                                                       + b["holds_past_s"] for _, b in part),
                "on_prefill_tokens_median": statistics.median(b["prefill_tokens"] for _, b in part),
                "on_reference_tokens_median": statistics.median(b["reference_tokens"] or 0 for _, b in part)}

    return {"all": medians(pairs), "with_references": medians(referenced)}


def indexed_workspace(tmp: Path, package_name: str, file: str, open_names: str):
    """`package_name` copied under `tmp`/ws and indexed (no watcher, no embeddings): the workspace
    root, the typed file and its text, the documents open in the editor (it and `open_names`,
    comma-separated siblings), and the started `IndexService`."""
    from context.config import IndexConfig
    from context.index.service import IndexService

    root = tmp / "ws"
    package = copy_package(package_name, root)
    typed = package / file
    text = typed.read_text()
    opened = {str(typed): text}
    for name in filter(None, open_names.split(",")):
        opened[str(package / name)] = (package / name).read_text()
    progress(f"indexing {package} ({len(list(package.glob('*.py')))} files)")
    index = IndexService([root], IndexConfig(watch=False, debounce_ms=0, embeddings=False),
                         db_path=tmp / "index.sqlite3")
    index.start()
    if not index.wait_until_indexed(300):
        raise SystemExit("the index did not finish")
    return root, typed, text, opened, index


def run(args) -> dict:
    from agent.completion import CompletionRequest, warm_window
    from context.config import CompletionConfig, ModelConfig, SquidCacheConfig, default_cache_dir
    from context.runtime import get_runtime
    from context.squid.references import CompletionReferences
    from context.squid.service import SquidService

    tmp = Path(tempfile.mkdtemp(prefix="bench-squid-keystroke-"))
    try:
        root, typed, text, opened, index = indexed_workspace(tmp, args.package, args.file, args.open)
        runtime = get_runtime(ModelConfig(), default_cache_dir())
        squid = SquidCacheConfig(cache_dir=None)
        service = SquidService(runtime, squid, None)
        config = CompletionConfig(debounce_ms=0)
        rows: dict[str, list[dict]] = {"off": [], "on": []}
        same = differ = 0
        with probed(runtime, service) as probe:
            inner = references_as_served(CompletionReferences, service, str(typed), opened, index, root)
            on = TimedReferences(inner, probe)
            uses = imported_names(text, args.package) if args.cross_file else None
            for site, (start, line, column) in enumerate(typing_sites(text, args.sites, args.chars, uses)):
                rest = text[start + len(line):]
                order = ("off", "on") if site % 2 == 0 else ("on", "off")
                texts: dict[str, list] = {}
                for mode in order:
                    references = on if mode == "on" else None
                    progress(f"site {site + 1}/{args.sites} ({mode}): {line.strip()[:60]!r}")
                    for typed_chars in range(1, args.chars + 1):
                        cursor = start + min(column + typed_chars, len(line))
                        request = CompletionRequest(text[:cursor] + rest, cursor, "python", path=str(typed))
                        if typed_chars == 1:  # the editor idled before the user typed here: the
                            # references it asked for are encoded, then the window is warmed after them
                            warm_window(runtime, request, config, references=references)
                            service.wait_idle(300)
                            warm_window(runtime, request, config, references=references)
                        row = keystroke(runtime, request, config, references, probe)
                        row.update(site=site, mode=mode, typed=typed_chars, jump=typed_chars == 1)
                        rows[mode].append(row)
                        texts.setdefault(mode, []).append(row["text"])
                for a, b in zip(texts["off"], texts["on"], strict=True):
                    same += a == b
                    differ += a != b
        service.stop()
        index.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    off, on = summarise(rows["off"]), summarise(rows["on"])
    return {
        "off": off, "on": on, "paired": paired(rows),
        "typing_p50_delta_s": on["typing_p50_s"] - off["typing_p50_s"],
        "typing_p50_ratio": on["typing_p50_s"] / off["typing_p50_s"],
        "same_suggestion": same, "different_suggestion": differ,
        "settings": {"package": args.package, "file": args.file, "open": args.open, "sites": args.sites,
                     "chars": args.chars, "max_documents": squid.max_documents,
                     "document_tokens": squid.document_tokens, "recompute_first": squid.recompute_first,
                     "keystroke_prefill_tokens": config.keystroke_prefill_tokens,
                     "prefix_tokens": config.prefix_tokens, "max_tokens": config.max_tokens},
        "rows": rows,
    }


def print_table(result: dict) -> None:
    off, on = result["off"], result["on"]
    print(f"{'per typing keystroke (median)':<32}{'off':>10}{'on':>10}{'on/off':>9}")
    for key in ("typing_p50_s", "typing_p95_s", "jump_median_s", "select_median_s", "compose_median_s",
                "new_cache_median_s", "holds_past_median_s", "past_loaded_share", "prefill_tokens_median",
                "prefill_median_s", "decode_median_s", "new_tokens_median", "reference_tokens_median",
                "referenced_keystrokes", "typing_keystrokes"):
        a, b = float(off[key]), float(on[key])
        ratio = f"{b / a:9.2f}" if a else f"{'-':>9}"
        print(f"{key:<32}{a:10.3f}{b:10.3f}{ratio}")
    for part, values in result["paired"].items():
        print(f"paired typing keystrokes, {part}: " + ", ".join(
            f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in values.items()))
    compared = result["same_suggestion"] + result["different_suggestion"]
    print(f"typing p50 on - off: {result['typing_p50_delta_s']:+.3f} s; same suggestion at "
          f"{result['same_suggestion']} of {compared} keystrokes")
    machine = result["machine"]
    print(f"cpu: {machine['cpu']} x{machine['cpus']}; "
          f"load {machine['load_before']} -> {machine['load_after']}")


def add_typing_arguments(parser: argparse.ArgumentParser, chars: int) -> None:
    """Where the typing happens (`indexed_workspace`, `typing_sites`): shared by the typing benches."""
    parser.add_argument("--package", default="sqlite_utils")
    parser.add_argument("--file", default="db.py", help="the typed file, inside the package")
    parser.add_argument("--open", default="utils.py,migrations.py", help="siblings open beside it")
    parser.add_argument("--sites", type=int, default=6)
    parser.add_argument("--chars", type=int, default=chars)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_typing_arguments(parser, chars=10)
    parser.add_argument("--cross-file", action="store_true",
                        help="type only lines that use a name the file imports from its package")
    parser.add_argument("--json", type=Path, help="write everything measured (every keystroke) here")
    args = parser.parse_args(argv)
    before = loadavg()
    result = run(args)
    result["machine"] = {"cpu": cpu_model(), "cpus": os.cpu_count(), "load_before": before,
                         "load_after": loadavg(), "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())}
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
