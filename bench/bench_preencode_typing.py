#!/usr/bin/env python
"""Squid's references while a user types in bursts, right after opening a file (issue 22 item 3).

The pre-encoder works while no request holds the model. A user typing leaves it the gaps between
keystrokes: short ones within a word, longer ones while thinking. Before 35125dd a request that
paused an encode threw its chunks away, so a document needed one gap as long as its whole encode
(2.3 s for 512 tokens on two cores); now a paused encode goes on from where it stopped, in the
background and in the idle-time warm alike. This bench types the same lines with the same gaps
both ways, side by side, and reports how soon the references reach a completion, how much encoding
was thrown away, and what the keystrokes cost.

A third-party package (`sqlite_utils` by default) is copied into a temporary workspace and indexed
(no watcher, no embeddings); at `--sites` lines spread over the typed file (lines that use a name
the file imports from its package), the user has just opened the file (a fresh Squid service: no
document encoded, memory tier only) and types `--chars` characters, one completion
(`agent.completion.complete` with `CompletionReferences`, as the server makes them) per keystroke,
then the next keystroke after a gap drawn with the site's seed: 0.15-0.35 s, or with probability
`--pause-share` a pause of 0.8-2.0 s. After a keystroke answered from a shortened window or with
newer references deferred, the window is warmed during the gap, as the server does, and gives way
when the next keystroke comes (`context.foreground`). Both modes see the same gaps; their order
alternates by site.

- product: a paused encode goes on;
- restart: a paused encode starts over (the behaviour before; `SquidService._encoding` overridden).

    python bench/bench_preencode_typing.py [--package sqlite_utils] [--file db.py] [--sites 6]
        [--chars 24] [--seed 0] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.bench_foundation import cpu_info, loadavg, percentile  # noqa: E402
from bench.bench_squid_keystroke import (  # noqa: E402
    add_typing_arguments,
    imported_names,
    indexed_workspace,
    references_as_served,
    typing_sites,
)

MODES = ("product", "restart")


def gaps(seed: int, count: int, pause_share: float) -> list[float]:
    """Seconds after each keystroke before the next: typing within a word, or a pause to think."""
    rng = random.Random(seed)
    return [rng.uniform(0.8, 2.0) if rng.random() < pause_share else rng.uniform(0.15, 0.35)
            for _ in range(count)]


def service_for(mode: str, runtime, config):
    """A fresh service; `restart` drops a paused encode's work, as the service did before."""
    from context.squid.encode import DocumentEncoding
    from context.squid.service import SquidService

    class RestartingService(SquidService):
        thrown_away = 0

        def _encoding(self, prefix, ids, key, source):
            with self._cond:
                partial = self._partial.pop(key, None)
            if partial is not None:
                self.thrown_away += partial.done
            return DocumentEncoding(self.runtime, prefix, ids, key, source=source)

    return (RestartingService if mode == "restart" else SquidService)(runtime, config, None)


class IdleWarm:
    """The server's idle-time warm of the completion window, on a thread, until the next keystroke."""

    def __init__(self):
        self.thread: threading.Thread | None = None

    def start(self, runtime, request, config, references) -> None:
        from agent.completion import warm_window

        self.thread = threading.Thread(target=warm_window, args=(runtime, request, config, references),
                                       daemon=True)
        self.thread.start()

    def give_way(self) -> None:
        """Called inside the keystroke's `foreground()`: the warm stops at its next chunk."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None


def type_site(runtime, service, index, root: Path, typed: Path, opened: dict[str, str], text: str,
              site: tuple[int, str, int], chars: int, site_gaps: list[float]) -> list[dict]:
    from agent.completion import CompletionRequest, complete
    from context.config import CompletionConfig
    from context.foreground import foreground
    from context.squid.references import CompletionReferences

    start, line, column = site
    rest = text[start + len(line):]
    references = references_as_served(CompletionReferences, service, str(typed), opened, index, root)
    config = CompletionConfig(debounce_ms=0)
    rows, began, warm = [], time.perf_counter(), IdleWarm()
    for typed_chars in range(1, chars + 1):
        cursor = start + min(column + typed_chars, len(line))
        request = CompletionRequest(text[:cursor] + rest, cursor, "python", path=str(typed))
        asked = time.perf_counter()
        with foreground():
            warm.give_way()
            completion = complete(runtime, request, config, references=references)
        rows.append({"keystroke": typed_chars, "at_s": round(asked - began, 3),
                     "latency_s": round(time.perf_counter() - asked, 3),
                     "reference_tokens": completion.reference_tokens if completion else 0,
                     "references": len(completion.prompt.references) if completion else 0,
                     "dropped_tokens": completion.dropped_tokens if completion else 0})
        if completion is None or completion.dropped_tokens:
            warm.start(runtime, request, config, references)
        time.sleep(site_gaps[typed_chars - 1])
    with foreground():
        warm.give_way()
    return rows


def summarise(sites: list[dict]) -> dict:
    rows = [row for site in sites for row in site["rows"]]
    firsts = [next((r for r in site["rows"] if r["reference_tokens"]), None) for site in sites]
    reached = [r for r in firsts if r is not None]
    return {
        "keystrokes": len(rows),
        "with_references": sum(bool(r["reference_tokens"]) for r in rows),
        "sites_reached": len(reached),
        "first_referenced_keystroke_median": statistics.median(r["keystroke"] for r in reached)
        if reached else None,
        "first_referenced_s_median": statistics.median(r["at_s"] for r in reached) if reached else None,
        "reference_tokens_median": statistics.median(r["reference_tokens"] for r in rows),
        "latency_p50_s": percentile([r["latency_s"] for r in rows], 50),
        "latency_p95_s": percentile([r["latency_s"] for r in rows], 95),
        "typing_p95_s": percentile([r["latency_s"] for r in rows if r["keystroke"] > 1], 95),
        "typing_max_s": max((r["latency_s"] for r in rows if r["keystroke"] > 1), default=0.0),
        "shortened_windows": sum(bool(r.get("dropped_tokens")) for r in rows if r["keystroke"] > 1),
        "documents_encoded": sum(site["encoded"] for site in sites),
        "tokens_resumed": sum(site["resumed_tokens"] for site in sites),
        "tokens_thrown_away": sum(site["thrown_away"] for site in sites),
    }


def run(args) -> dict:
    from context.config import ModelConfig, SquidCacheConfig, default_cache_dir
    from context.runtime import get_runtime

    tmp = Path(tempfile.mkdtemp(prefix="bench-preencode-typing-"))
    try:
        root, typed, text, opened, index = indexed_workspace(tmp, args.package, args.file, args.open)
        runtime = get_runtime(ModelConfig(), default_cache_dir())
        squid = SquidCacheConfig(cache_dir=None)
        sites = typing_sites(text, args.sites, args.chars, imported_names(text, args.package))
        results: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for number, site in enumerate(sites):
            site_gaps = gaps(args.seed * 1000 + number, args.chars, args.pause_share)
            for mode in MODES if number % 2 == 0 else tuple(reversed(MODES)):
                service = service_for(mode, runtime, squid)
                runtime.forget_prefix()  # the file was just opened: nothing of it is prefilled
                try:
                    rows = type_site(runtime, service, index, root, typed, opened, text, site, args.chars,
                                     site_gaps)
                    stats = service.stats()
                    results[mode].append({"site": number, "line": site[1].strip(), "rows": rows,
                                          "encoded": stats["encoded"],
                                          "resumed_tokens": stats["resumed_tokens"],
                                          "thrown_away": getattr(service, "thrown_away", 0)})
                finally:
                    service.stop()
                first = next((r["keystroke"] for r in rows if r["reference_tokens"]), None)
                print(f"[{time.strftime('%H:%M:%S')}] site {number + 1}/{len(sites)} {mode}: references "
                      f"first at keystroke {first}, {sum(bool(r['reference_tokens']) for r in rows)} of "
                      f"{len(rows)} with them", file=sys.stderr, flush=True)
        index.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"summary": {mode: summarise(results[mode]) for mode in MODES}, "sites": results,
            "settings": {"package": args.package, "file": args.file, "open": args.open, "sites": args.sites,
                         "chars": args.chars, "seed": args.seed, "pause_share": args.pause_share,
                         "max_documents": squid.max_documents, "document_tokens": squid.document_tokens}}


def print_table(result: dict) -> None:
    summary = result["summary"]
    print(f"{'':<36}" + "".join(f"{mode:>12}" for mode in MODES))
    for key in summary[MODES[0]]:
        cells = [summary[mode][key] for mode in MODES]
        print(f"{key:<36}" + "".join(f"{c:>12.3f}" if isinstance(c, float) else f"{c!s:>12}" for c in cells))
    machine = result["machine"]
    print(f"cpu: {machine['cpu']['model']} x{machine['cpu']['cores']}; load {machine['load_before']} -> "
          f"{machine['load_after']}; {machine['date']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_typing_arguments(parser, chars=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pause-share", type=float, default=0.2,
                        help="the share of gaps that are pauses to think (0.8-2.0 s)")
    parser.add_argument("--json", type=Path, help="write every keystroke here")
    args = parser.parse_args(argv)
    before = loadavg()
    result = run(args)
    result["machine"] = {"cpu": cpu_info(), "load_before": before, "load_after": loadavg(),
                         "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())}
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
