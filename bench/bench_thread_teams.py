"""What an idle thread that once ran torch costs the model thread's decoding (`context.threads`).

In one process, rounds in alternating order, each arm decoding the same 32 tokens after the same
1,023-token window of real code (click's `core.py`, as installed in the venv), greedy:

- `alone`: no other thread has run torch;
- `idle torch thread`: another thread ran one matrix product and waits (what the server had: the
  event loop encoded Squid's shared prefix, the pre-encoder's thread lived on between jobs);
- `after the pre-encoder`: a `SquidService` encoded eight documents in the background and went idle
  (its thread ends when out of work).

Prints each arm's median tokens/s and its paired ratio to `alone` (a round's arms run back to back,
so the machine's load cancels in the ratio).

    python bench/bench_thread_teams.py [--rounds 8] [--json FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_foundation import cpu_info, loadavg  # noqa: E402

ARMS = ("alone", "idle torch thread", "after the pre-encoder")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--per-arm", type=int, default=4, help="generations per arm per round (median)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import torch

    from context.config import ModelConfig, SquidCacheConfig, default_cache_dir
    from context.runtime import get_runtime
    from context.squid.service import ReferenceDocument, SquidService

    runtime = get_runtime(ModelConfig(), default_cache_dir())
    package = Path(importlib.util.find_spec("click").origin).parent
    window = runtime.encode((package / "core.py").read_text()[:6000])[-1023:]
    documents = [ReferenceDocument((package / name).read_text()[part * 800:(part + 1) * 800],
                                   source=str(package / name))
                 for name in ("types.py", "utils.py") for part in range(4)]

    def decode() -> float:
        rates = [runtime.generate(window, max_new_tokens=32, temperature=0.0, stop=()).tokens_per_s
                 for _ in range(args.per_arm)]
        return statistics.median(rates)

    def idle_torch_thread() -> float:
        release = threading.Event()

        def ran_torch_then_waits():
            torch.randn(512, 512) @ torch.randn(512, 512)
            release.wait()

        thread = threading.Thread(target=ran_torch_then_waits)
        thread.start()
        time.sleep(0.3)
        try:
            return decode()
        finally:
            release.set()
            thread.join()

    def after_the_preencoder() -> float:
        service = SquidService(runtime, SquidCacheConfig(cache_dir=None), None)
        try:
            service.schedule(documents)
            if not service.wait_idle(300):
                raise SystemExit("the pre-encoder did not finish")
            time.sleep(0.3)
            return decode()
        finally:
            service.stop()

    run = {"alone": decode, "idle torch thread": idle_torch_thread,
           "after the pre-encoder": after_the_preencoder}
    decode()  # the compiled step and caches warm
    rates: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for number in range(args.rounds):
        order = ARMS if number % 2 == 0 else tuple(reversed(ARMS))
        for arm in order:
            rates[arm].append(run[arm]())
        print(f"round {number + 1}/{args.rounds}: " + ", ".join(f"{a} {rates[a][-1]:.0f}" for a in ARMS),
              file=sys.stderr, flush=True)
    result = {"cpu": cpu_info(), "load_average": loadavg(), "threads": torch.get_num_threads(),
              "rounds": args.rounds, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "arms": {}}
    print(f"{result['cpu']['model']} ({result['cpu']['cores']} cores), {result['threads']} torch threads, "
          f"{args.rounds} rounds, load average {result['load_average']}")
    print("| arm | median tok/s | paired ratio to alone |")
    print("|---|---|---|")
    for arm in ARMS:
        ratio = statistics.median(a / b for a, b in zip(rates[arm], rates["alone"], strict=True))
        result["arms"][arm] = {"median_tok_s": round(statistics.median(rates[arm]), 1),
                               "ratio_to_alone": round(ratio, 3), "rates": [round(r, 1) for r in rates[arm]]}
        print(f"| {arm} | {statistics.median(rates[arm]):.1f} | {ratio:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
