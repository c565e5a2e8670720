"""A function body begun on real code: what a user is offered when the model opens a docstring the
token budget cannot hold, before and after such a docstring is offered as its summary, closed.

    python bench/docstring_summaries.py [--packages click jinja2 requests] [--per-package 20] [--seed 0]
        [--out JSON] | --table JSON

Positions: the start of the body of functions that have a docstring and code after it
(`simulated_user.find_spots`: the cursor on the body's first line, after its indentation; the
body removed, the rest of the file after the cursor) in third-party packages installed in this
venv, code nobody here wrote, drawn with a seed. Each is asked through the product's completion
path in this process (`agent.completion.complete`, the default `CompletionConfig`: 32 tokens and 32
more to finish what a suggestion opened, greedy) on the embedded model. From the same answer, both
rules: before, an unclosed docstring was cut back to what closes (nothing: the docstring opens the
suggestion); now it is offered as its first paragraph, closed (`context.boundary._docstring_summary`),
when that paragraph is complete.

Per rule: positions offered something; per docstring summary offered, the edit similarity of its
first line of text to the real docstring's first line, and whether the file parses with it inserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench_completion import edit_similarity  # noqa: E402
from simulated_user import find_spots, parses  # noqa: E402


def positions(packages: list[str], per_package: int, seed: int) -> list[tuple[str, object]]:
    chosen = []
    for package in packages:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"{package} is not an installed package here")
        root = Path(next(iter(spec.submodule_search_locations)))
        spots = []
        for path in sorted(root.rglob("*.py")):
            spots += [(package, spot) for spot in find_spots(path.read_text(errors="replace"),
                                                             str(path.relative_to(root.parent)))]
        random.Random(seed).shuffle(spots)
        chosen += spots[:per_package]
    return chosen


def summary_text(suggestion: str) -> str:
    """The first line of text of a docstring suggestion, its quotes taken off."""
    body = suggestion.strip()
    for quote in ('"""', "'''"):
        body = body.lstrip("rRuU").removeprefix(quote)
        body = body.split(quote, 1)[0]
    return next((line.strip() for line in body.split("\n") if line.strip()), "")


def run(args) -> dict:
    from agent.completion import CompletionRequest, complete
    from context import boundary
    from context.config import CompletionConfig, ModelConfig
    from context.runtime import get_runtime

    runtime = get_runtime(ModelConfig())
    summaries: list[str] = []
    original = boundary._docstring_summary

    def recording(*a, **k):
        text = original(*a, **k)
        summaries.append(text)
        return text

    boundary._docstring_summary = recording
    rows = []
    started = time.perf_counter()
    for package, spot in positions(args.packages, args.per_package, args.seed):
        summaries.clear()
        request = CompletionRequest(spot.text, len(spot.before), "python", spot.path)
        clock = time.perf_counter()
        answer = complete(runtime, request, CompletionConfig())
        now = answer.text if answer is not None else ""
        from_summary = bool(summaries and summaries[-1] and now == summaries[-1])
        row = {"package": package, "spot": f"{spot.path}:{spot.name}", "now": now,
               "before": "" if from_summary else now, "summary": from_summary,
               "real": spot.summary, "latency_s": round(time.perf_counter() - clock, 3)}
        if from_summary:
            row["similarity"] = round(edit_similarity(summary_text(now), spot.summary), 3)
            row["parses"] = parses(spot.before + now + spot.after)
        rows.append(row)
        print(f"{row['spot']}: {'summary' if from_summary else 'offered' if now else 'nothing'} "
              f"{now[:70]!r}", file=sys.stderr, flush=True)
    boundary._docstring_summary = original
    return {"rows": rows, "seconds": round(time.perf_counter() - started, 1), "args": vars(args)}


def _opens_docstring(text: str) -> bool:
    return text.lstrip().lstrip("rRuU").startswith(('"""', "'''"))


def table(result: dict) -> str:
    """Per package: offered before and now; the docstring summaries (the difference), their first
    line's edit similarity (ES) to the real docstring's first line and how many parse in the file;
    beside them, the docstrings the model finished within its tokens (offered by both rules)."""
    rows = result["rows"]
    out = ["| package | positions | offered before | offered now | docstring summaries: n, median ES, "
           "parse | finished docstrings: n, median ES |", "|---|---|---|---|---|---|"]

    def median(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}" if values else "-"

    for package in [*dict.fromkeys(r["package"] for r in rows), "all"]:
        part = [r for r in rows if package in ("all", r["package"])]
        made = [r for r in part if r["summary"]]
        finished = [edit_similarity(summary_text(r["now"]), r["real"]) for r in part
                    if not r["summary"] and _opens_docstring(r["now"])]
        out.append(f"| {package} | {len(part)} | {sum(bool(r['before']) for r in part)} | "
                   f"{sum(bool(r['now']) for r in part)} | {len(made)}, "
                   f"{median([r['similarity'] for r in made])}, "
                   f"{sum(r['parses'] for r in made)}/{len(made)} | "
                   f"{len(finished)}, {median(finished)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packages", nargs="+", default=["click", "jinja2", "requests"])
    parser.add_argument("--per-package", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table", type=Path, metavar="JSON", help="only print the table of a saved run")
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return 0
    result = run(args)
    print(table(result))
    print(f"{result['seconds']} s")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
