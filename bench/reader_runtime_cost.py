"""What `squid.reader` costs beside the base runtime: resident memory of the reading runtime (a copy of
the projections the reader adapts, merged), the time to build it and its decode engine, and how each
runtime runs a decoding step and is tuned, in one process.

    python bench/reader_runtime_cost.py --reader DIR [--threads N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reader", type=Path, required=True, help="a Squid reader's folder")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import psutil
    import torch

    from context.config import ModelConfig
    from context.runtime import ModelRuntime
    from context.squid.reader import reading_runtime

    torch.set_num_threads(args.threads)
    process = psutil.Process()
    base = ModelRuntime(ModelConfig()).load().prepare()
    base.generate("def main():\n", max_new_tokens=4)
    before = process.memory_info().rss
    started = time.perf_counter()
    reading = reading_runtime(base, args.reader)
    merged_s = time.perf_counter() - started
    reading.prepare()
    reading.generate("def main():\n", max_new_tokens=4)
    ready_s = time.perf_counter() - started
    result = {
        "rss_base_mib": round(before / 2**20),
        "rss_added_mib": round((process.memory_info().rss - before) / 2**20),
        "copy_and_merge_s": round(merged_s, 2), "ready_s": round(ready_s, 2),
        "base_steps": base.describe_steps(), "reader_steps": reading.describe_steps(),
        "base_settings": str(base.settings), "reader_settings": str(reading.settings),
        "same_tuning_key": base.tuning_key() == reading.tuning_key(),
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
