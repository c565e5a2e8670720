#!/usr/bin/env python
"""False positives and speed of secret redaction (`feedback.redact`) on real, secret-free code.

Runs `redact` over every .py file of the interpreter's standard library (`sysconfig.get_paths()
["stdlib"]`, site-packages excluded) and reports: files, lines, lines changed by redaction and
their share, redactions per kind, throughput in MB/s (UTF-8 bytes), and a seeded sample of changed
lines (before and after) so a person can judge them. The standard library's own tests are counted
apart: they hold test fixtures (`password = "secret"`, digests, base64 vectors) that are fair game
for a redactor, while the rest of the library is code that names secrets without holding them.

Usage: python bench/bench_redact.py [--sample N] [--seed N] [--json] [--root DIR]
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import random
import sys
import sysconfig
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from feedback.redact import RULES_VERSION, redact  # noqa: E402


@dataclass
class Tally:
    """What redaction did to one group of files."""

    files: int = 0
    lines: int = 0
    megabytes: float = 0.0
    seconds: float = 0.0
    changed_lines: int = 0
    changed_files: int = 0
    kinds: Counter = field(default_factory=Counter)

    @property
    def changed_share(self) -> float:
        return self.changed_lines / self.lines if self.lines else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.megabytes / self.seconds if self.seconds else 0.0


def python_files(root: Path) -> list[Path]:
    files = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in ("site-packages", "__pycache__"))
        files += [Path(directory) / n for n in sorted(names) if n.endswith(".py")]
    return files


def is_test_file(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).parts
    return any(p in ("test", "tests", "idle_test") for p in parts[:-1]) or parts[-1].startswith("test_")


def changed_lines(before: str, after: str) -> list[tuple[int, str, str]]:
    """(line number, original lines, redacted lines) for each changed stretch of lines."""
    old, new = before.splitlines(), after.splitlines()
    stretches = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag != "equal":
            stretches.append((i1 + 1, "\n".join(old[i1:i2]), "\n".join(new[j1:j2])))
    return stretches


def run(root: Path) -> tuple[dict[str, Tally], list[dict]]:
    tallies = {"all": Tally(), "library": Tally(), "tests": Tally()}
    changes: list[dict] = []
    for path in python_files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a few test fixtures are deliberately not UTF-8
        started = time.perf_counter()
        result = redact(text)
        seconds = time.perf_counter() - started
        group = "tests" if is_test_file(path, root) else "library"
        stretches = changed_lines(text, result.text) if result.text != text else []
        for name in ("all", group):
            tally = tallies[name]
            tally.files += 1
            tally.lines += text.count("\n") + (not text.endswith("\n"))
            tally.megabytes += len(text.encode("utf-8", "surrogatepass")) / 1e6
            tally.seconds += seconds
            tally.kinds.update(result.kinds)
            tally.changed_lines += sum(before.count("\n") + 1 for _, before, _ in stretches)
            tally.changed_files += bool(stretches)
        for line, before, after in stretches:
            changes.append(
                {
                    "file": str(path.relative_to(root)),
                    "line": line,
                    "group": group,
                    "before": before,
                    "after": after,
                }
            )
    return tallies, changes


def sample(changes: list[dict], size: int, seed: int) -> list[dict]:
    """A seeded sample, library lines first: they are the ones that should not change."""
    rng = random.Random(seed)
    library = [c for c in changes if c["group"] == "library"]
    tests = [c for c in changes if c["group"] == "tests"]
    picked = rng.sample(library, min(len(library), size))
    picked += rng.sample(tests, min(len(tests), max(0, size - len(picked))))
    return picked


def clip(text: str, width: int = 150) -> str:
    text = text.replace("\t", " ")
    lines = [line.strip() for line in text.splitlines()] or [""]
    shown = lines[0] if len(lines) == 1 else f"{lines[0]} ... (+{len(lines) - 1} lines)"
    return shown if len(shown) <= width else shown[: width - 3] + "..."


def report(root: Path, tallies: dict[str, Tally], changes: list[dict], size: int, seed: int) -> None:
    print(f"redact over the standard library: {root} (rules version {RULES_VERSION})")
    print(
        f"{'group':<8} {'files':>6} {'lines':>9} {'MB':>7} {'changed lines':>14} {'share':>8} "
        f"{'files changed':>14} {'MB/s':>6}"
    )
    for name, tally in tallies.items():
        print(
            f"{name:<8} {tally.files:>6} {tally.lines:>9} {tally.megabytes:>7.1f} {tally.changed_lines:>14} "
            f"{tally.changed_share:>8.4%} {tally.changed_files:>14} {tally.mb_per_s:>6.2f}"
        )
    print("\nredactions per kind (library / tests):")
    kinds = tallies["all"].kinds
    for kind, count in kinds.most_common():
        print(
            f"  {kind:<22} {count:>6}   ({tallies['library'].kinds[kind]} / {tallies['tests'].kinds[kind]})"
        )
    picked = sample(changes, size, seed)
    print(f"\nsample of {len(picked)} changed stretches (seed {seed}; library first):")
    for change in picked:
        print(f"  {change['file']}:{change['line']} [{change['group']}]")
        print(f"    - {clip(change['before'])}")
        print(f"    + {clip(change['after'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    parser.add_argument("--sample", type=int, default=40, help="changed stretches to list")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = parser.parse_args()
    tallies, changes = run(args.root)
    if args.json:
        groups = {
            name: {
                **asdict(t),
                "kinds": dict(t.kinds),
                "changed_share": t.changed_share,
                "mb_per_s": t.mb_per_s,
            }
            for name, t in tallies.items()
        }
        print(
            json.dumps(
                {
                    "root": str(args.root),
                    "rules_version": RULES_VERSION,
                    "groups": groups,
                    "sample": sample(changes, args.sample, args.seed),
                },
                indent=1,
            )
        )
    else:
        report(args.root, tallies, changes, args.sample, args.seed)


if __name__ == "__main__":
    main()
