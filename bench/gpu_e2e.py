"""The learning loop on a CUDA GPU, for admins (run by bench/gpu_e2e.sh): one table.

1. Runtime on the GPU in bfloat16: time to first token on 1,000 tokens of real code, greedy decode
   tokens/s over 64 tokens (medians of 5), peak GPU memory.
2. The learning loop (`bench/learning_loop.py --device cuda`): the server and the trainer on the GPU
   in bfloat16, with the Triton kernels where the code uses them on CUDA (RoPE re-rotation when
   Squid composes, the selective log-softmax in training). Reported: the inline completion latency
   the simulated user saw, the training step time, the trainer's peak memory, the held-out keep rate.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def runtime_row() -> dict:
    import torch

    from context.config import ModelConfig
    from context.runtime import ModelRuntime

    runtime = ModelRuntime(ModelConfig(device="cuda", dtype="bfloat16")).load()
    code = (ROOT / "context" / "runtime.py").read_text()
    ids = runtime.encode(code)
    ttft, tps = [], []
    torch.cuda.reset_peak_memory_stats()
    for i in range(6):
        # Each run starts at another offset, so no prompt token is still cached from the last run.
        prompt = ids[i * 50: i * 50 + 1000]
        started = time.perf_counter()
        runtime.generate(prompt, max_new_tokens=1)
        ttft.append(time.perf_counter() - started)
        result = runtime.generate(prompt, max_new_tokens=64)
        tps.append(result.new_tokens / max(result.decode_s, 1e-9))
    return {"ttft_ms": statistics.median(ttft[1:]) * 1000, "decode_tok_s": statistics.median(tps[1:]),
            "gpu_peak_mib": torch.cuda.max_memory_allocated() / 2**20}


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "bench" / "results" / "gpu-e2e.json"
    row = runtime_row()
    # Printed at once: the learning loop below takes minutes and a lease can end during it.
    print("runtime:", json.dumps(row), flush=True)
    loop_out = out.with_name(out.stem + "-loop.json")
    subprocess.run([sys.executable, str(ROOT / "bench" / "learning_loop.py"), "--device", "cuda",
                    "--rounds", "1", "--steps", "10", "--no-agent", "--out", str(loop_out)], check=True)
    loop = json.loads(loop_out.read_text())
    (entry,) = loop["rounds"]
    latencies = [e["latency_s"] for h in loop["held_out"] for e in h["log"]]
    steps = entry["gate"].get("steps") or []
    report = {**row, "completion_p50_ms": statistics.median(latencies) * 1000,
              "train_step_s": statistics.median(s["seconds"] for s in steps) if steps else None,
              "trainer_peak_rss_mib": entry["train"]["peak_rss_mb"], "round": entry["train"]["state"],
              "held_out_keep": [h["keep_rate"] for h in loop["held_out"]]}
    out.write_text(json.dumps(report, indent=1))
    print("| measure | value |\n|---|---|")
    print(f"| time to first token, 1,000-token prompt | {report['ttft_ms']:.1f} ms |")
    print(f"| greedy decode | {report['decode_tok_s']:.0f} tokens/s |")
    print(f"| GPU memory, runtime peak | {report['gpu_peak_mib']:.0f} MiB |")
    print(f"| inline completion through the server, median | {report['completion_p50_ms']:.0f} ms |")
    if report["train_step_s"] is not None:
        print(f"| GRPO step (2 prompts x 4 samples, 32 tokens) | {report['train_step_s']:.2f} s |")
    print(f"| trainer peak RSS | {report['trainer_peak_rss_mib']:.0f} MiB |")
    print(f"| round | {report['round']}; held-out keep {report['held_out_keep']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
