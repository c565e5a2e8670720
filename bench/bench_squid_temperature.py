#!/usr/bin/env python
"""Squid quality with APE's two factors on the composed documents (issue 4, quality goal 2).

Independently encoded documents never attended to each other, so a query over their composition
attends to them differently than it would after a full prefill. APE (Yang et al., 2025) corrects
the query's attention over parallel-encoded contexts with two factors:

- a temperature T: dividing a cached key by T divides every logit a later token computes against
  it by T, so the composed documents' keys (not the shared prefix's) are scaled by 1/T after
  composition, with no change to any attention code;
- a share S of attention: log(S) is added to the later tokens' attention logits on the composed
  documents, which multiplies the documents' share of each softmax by S against the prefix and the
  query. That needs the attention itself: here an additive 4-D mask, which transformers hands to
  its attention as it is.

Nothing else is recomputed, so the time to first token is the recovery's own. Measured exactly as
`squidcode bench squid` measures quality (the same documents, queries, 32-token teacher-forced
continuations of the full prefill and the same seed): top-1 agreement and mean KL against full
prefill, per factor, for each recovery named. This is an experiment, not a product setting: a
factor chosen here is fitted to these queries, so run it again with another `--seed` (other
documents and queries) to see whether it holds.

Usage: python bench/bench_squid_temperature.py [--docs 8] [--doc-tokens 512] [--queries 20]
       [--temperatures 1,0.95,0.9,0.85,0.8] [--shares 1] [--recoveries none,first32]
       [--seed 0] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--doc-tokens", type=int, default=512)
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--temperatures", default="1,0.95,0.9,0.85,0.8")
    parser.add_argument("--shares", default="1", help="APE's share factors S (1 = none)")
    parser.add_argument("--recoveries", default="none,first32",
                        help="none, firstK, lastK or wWsS (window, sinks), joined by +, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    import torch

    from context.config import ModelConfig
    from context.runtime import get_runtime
    from context.squid.bench import BenchSettings, _Bench

    torch.set_num_threads(args.threads)
    runtime = get_runtime(ModelConfig(threads=args.threads))
    settings = BenchSettings(docs=args.docs, doc_tokens=args.doc_tokens, queries=args.queries, runs=1,
                             seed=args.seed)
    temperatures = [float(t) for t in args.temperatures.split(",")]
    shares = [float(x) for x in args.shares.split(",")]
    recoveries = [_recovery(name) for name in args.recoveries.split(",")]

    class FactorBench(_Bench):
        def _variant_context(self, make, docs, ref_kv):
            if not isinstance(make, tuple):
                return super()._variant_context(make, docs, ref_kv)
            recovery, temperature, _ = make
            keys, values = super()._variant_context(recovery, docs, ref_kv)
            if temperature != 1:
                keys = keys.clone()
                keys[:, :, self.prefix.length :] /= temperature  # the documents, not the shared prefix
            return keys, values

        def _attention_mask(self, make, length, start):
            share = make[2] if isinstance(make, tuple) else 1.0
            if share == 1:
                return None
            mask = torch.zeros(1, 1, length, start + length)
            mask[..., self.prefix.length : start] = math.log(share)  # the documents' columns
            future = torch.arange(start + length)[None, :] > (start + torch.arange(length))[:, None]
            mask[0, 0][future] = float("-inf")
            return mask

    started = time.time()
    with tempfile.TemporaryDirectory(prefix="squid-temperature-") as tmp, torch.inference_mode():
        bench = FactorBench(runtime, settings, Path(tmp))
        variants = [(f"{recovery.name}_T{t:g}" + (f"_S{x:g}" if x != 1 else ""), (recovery, t, x))
                    for recovery in recoveries for t in temperatures for x in shares]
        quality = bench.quality(variants)
    result = {"docs": args.docs, "doc_tokens": args.doc_tokens, "queries": args.queries, "seed": args.seed,
              "seconds": round(time.time() - started, 1),
              "variants": {name: {k: round(v, 4) if isinstance(v, float) else v for k, v in q.items()}
                           for name, q in quality.items()}}
    if args.json:
        print(json.dumps(result))
    else:
        for name, q in result["variants"].items():
            print(f"{name:28s} agreement {q['top1_agreement']:.4f}  KL {q['mean_kl']:.4f}")
    return 0


def _recovery(name: str):
    """A `Recovery` from its name: none, first32, last512, first16+last512 or first32+last512+w1024s16
    (a 1,024-position window with 16 sinks per document)."""
    from context.squid.compose import Recovery

    first = last = window = sinks = 0
    for part in name.split("+"):
        if part.startswith("first"):
            first = int(part[5:])
        elif part.startswith("last"):
            last = int(part[4:])
        elif part.startswith("w"):
            window, sinks = (int(x) for x in part[1:].split("s"))
        elif part != "none":
            raise SystemExit(f"unknown recovery {part!r}: none, firstK, lastK, wWsS, joined by +")
    return Recovery(first_k=first, last_k=last, window=window, sinks=sinks)


if __name__ == "__main__":
    raise SystemExit(main())
