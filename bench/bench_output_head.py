#!/usr/bin/env python
"""The two per-call savings behind the decode engine's defaults, measured side by side on one thread:

  1. the shortlist output head (`context.shortlist.ShortlistHead`) against the exact float32 output
     projection, for one row (a decode step) and 9 rows (a prompt-lookup verify pass);
  2. projection weights kept transposed in memory (as the runtime keeps them on the CPU) against
     the row-major layout transformers loads, over 30 of the model's 1536 x 576 matrices.

Medians of 5 repeats. Usage: python bench/bench_output_head.py [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def median_ms(call, repeats: int = 5, inner: int = 20) -> float:
    call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(inner):
            call()
        times.append((time.perf_counter() - started) / inner * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    import torch
    import torch.nn.functional as F

    from context.config import ModelConfig
    from context.runtime import get_runtime
    from context.shortlist import ShortlistHead

    torch.set_num_threads(1)
    runtime = get_runtime(ModelConfig()).load()
    weight = runtime.model.lm_head.weight.detach()
    head = ShortlistHead(weight)
    hidden = runtime.model.config.hidden_size
    result: dict = {"head": {}, "layout": {}}
    with torch.inference_mode():
        for rows in (1, 9):
            x = torch.randn(1, rows, hidden) * 3
            exact, shortlist = median_ms(lambda x=x: F.linear(x, weight)), median_ms(lambda x=x: head(x))
            result["head"][rows] = {"exact_ms": round(exact, 2), "shortlist_ms": round(shortlist, 2),
                                    "ratio": round(exact / shortlist, 2)}
        generator = torch.Generator().manual_seed(0)
        row_major = [torch.randn(1536, 576, generator=generator) for _ in range(30)]
        transposed = [w.t().contiguous().t() for w in row_major]  # same values, [in, out] in memory
        for rows in (1, 2, 9, 256):
            x = torch.randn(rows, 576)
            before = median_ms(lambda x=x: [F.linear(x, w) for w in row_major], inner=3)
            after = median_ms(lambda x=x: [F.linear(x, w) for w in transposed], inner=3)
            result["layout"][rows] = {"row_major_ms": round(before, 2), "transposed_ms": round(after, 2),
                                      "ratio": round(before / after, 2)}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
