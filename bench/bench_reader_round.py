"""The workspace's Squid reader as the background trainer makes it (`train.reader_sets`), on a real package.

    python bench/bench_reader_round.py --package rich --sets 40 --threads 2
    python bench/bench_reader_round.py --package rich --sets 40 --squid-seeds 0,1   # and `bench squid`

A package installed in this venv is copied into a temporary git workspace; `reader_round.run_reader_round`
runs there exactly as the scheduler runs it (the index's Python files, a quarter held out by path,
distilled, gated on the held-out files' KL from full prefill, kept or not), and the round's figures and
machine time are printed. With `--squid-seeds`, `squidcode bench squid --reader-only` then measures the
kept reader on the held-out files alone (documents and queries the reader never read): top-1 agreement
with full prefill and time to first token, with and without the reader, for each seed's draw.
Results: bench/results/reader-round-DATE.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_completion import copy_package  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="rich")
    parser.add_argument("--sets", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--squid-seeds", default="",
                        help="seeds of `bench squid --reader-only` on the held-out files")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import torch

    from context.config import SquidConfig, TrainConfig
    from context.runtime import get_runtime
    from feedback.train.reader_round import run_reader_round, split_documents
    from feedback.train.service import indexed_python
    from feedback.train.squid_reader import ReaderSettings, workspace_documents
    from feedback.train.status import train_paths

    torch.set_num_threads(args.threads)
    out: dict = {"package": args.package, "sets": args.sets, "threads": args.threads}
    with tempfile.TemporaryDirectory(prefix="squidcode-reader-round-") as tmp:
        root = Path(tmp) / "ws"
        copy_package(args.package, root)
        config = SquidConfig(train=TrainConfig(dir=str(Path(tmp) / "train"), nice=0, reader_sets=args.sets))
        paths = train_paths(config)
        runtime = get_runtime(config.model, config.resolved_cache_dir())
        started = time.perf_counter()
        result = run_reader_round(config, paths=paths, should_stop=lambda: False, roots=[root],
                                  runtime=runtime)
        out["round"] = {**result.__dict__, "wall_s": time.perf_counter() - started}
        print(f"{args.package}: {result.state} in {out['round']['wall_s'] / 60:.1f} min: {result.message}",
              flush=True)
        settings = ReaderSettings(sets=args.sets)
        documents = workspace_documents(runtime, [Path(p) for p in indexed_python([root])],
                                        min_tokens=2 * settings.doc_tokens, limit=settings.files,
                                        seed=settings.seed)
        train, held = split_documents(documents, [root])
        out["documents"], out["held_out"] = len(documents), [str(Path(n).relative_to(root)) for n, _ in held]
        out["squid"] = {}
        reader = paths.root / "reader"
        if args.squid_seeds and result.state == "promoted":
            folder = Path(tmp) / "held-out"
            folder.mkdir()
            for name, _ in held:  # flat: `bench squid --source` reads every Python file under it
                shutil.copy(name, folder / str(Path(name).relative_to(root)).replace("/", "__"))
            for seed in args.squid_seeds.split(","):
                proc = subprocess.run(
                    [sys.executable, "-m", "lsp_server", "bench", "squid", "--source", str(folder),
                     "--reader", str(reader), "--reader-only", "--threads", str(args.threads), "--seed", seed,
                     "--json"],
                    capture_output=True, text=True, cwd=tmp, check=True)
                out["squid"][seed] = json.loads(proc.stdout.strip().splitlines()[-1])
                for variant in out["squid"][seed].get("variants", []):
                    print(f"  seed {seed} {variant['name']}: {variant['speedup_vs_full']}x, top-1 "
                          f"{variant['top1_agreement']:.3f}, KL {variant['mean_kl']:.4f}", flush=True)
    meta = {"argv": sys.argv, "cpu": platform.processor(), "cores": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d")}
    path = args.out or REPO / "bench" / "results" / f"reader-round-{time.strftime('%Y-%m-%d-%H%M')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, **out}, indent=1))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
