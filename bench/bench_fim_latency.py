"""What the text after the cursor costs a completion: the product's prompt against the taught
fill-in-the-middle format (`context.fim.TAUGHT_TEMPLATE`, as served while an adapter trained in it is
applied), side by side on a real file.

    python bench/bench_fim_latency.py --package click --file core.py --positions 12 --threads 2

At each position (a statement's start, the cursor at its indentation, the statement removed, the
rest of the file below): the first request there (the window not cached) and then three keystrokes
typing the statement's first characters, each asked again; the two prompts alternate at every
position. Prints the medians of each and their ratio. No Squid references (what they cost is
`bench_squid_keystroke.py`'s).
"""

from __future__ import annotations

import argparse
import importlib
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="click")
    parser.add_argument("--file", default="core.py")
    parser.add_argument("--positions", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    from agent.completion import CompletionRequest, complete
    from context.config import CompletionConfig, ModelConfig
    from context.fim import TAUGHT_TEMPLATE
    from context.runtime import ModelRuntime
    from feedback.train.repo_tasks import statement_positions

    path = Path(importlib.import_module(args.package).__file__).parent / args.file
    text = path.read_text(encoding="utf-8")
    runtime = ModelRuntime(ModelConfig(threads=args.threads)).load()
    modes = {"prefix": CompletionConfig(fim="off"), "fim": CompletionConfig(fim=TAUGHT_TEMPLATE)}
    lines = text.splitlines(keepends=True)
    positions = [p for p in statement_positions(text, 1) if p.start > 100 and len(lines[p.start].strip()) > 6]
    positions = random.Random(0).sample(positions, min(args.positions, len(positions)))
    times: dict[str, dict[str, list[float]]] = {m: {"first": [], "keystroke": []} for m in modes}
    complete(runtime, CompletionRequest(text[:2000], 2000, "python", str(path)), modes["prefix"])  # warm-up
    for n, pos in enumerate(positions):
        before = "".join(lines[: pos.start]) + pos.indent
        after = "\n" + "".join(lines[pos.end:])
        typed = lines[pos.start][len(pos.indent):]
        order = list(modes) if n % 2 == 0 else list(reversed(modes))
        for mode in order:
            config = replace(modes[mode], max_tokens=24)
            runtime.forget_prefix()
            for k in range(4):
                prefix = before + typed[:k]
                request = CompletionRequest(prefix + after, len(prefix), "python", str(path))
                began = time.perf_counter()
                complete(runtime, request, config)
                times[mode]["first" if k == 0 else "keystroke"].append(time.perf_counter() - began)
        print(f"position {n + 1}/{len(positions)} (line {pos.start + 1})", flush=True)
    med = {m: {k: statistics.median(v) for k, v in t.items()} for m, t in times.items()}
    print(f"{args.package}/{args.file}, {len(positions)} positions, {args.threads} threads")
    for kind in ("first", "keystroke"):
        print(f"  {kind}: prefix {med['prefix'][kind]:.3f} s, fim {med['fim'][kind]:.3f} s, "
              f"ratio {med['fim'][kind] / med['prefix'][kind]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
