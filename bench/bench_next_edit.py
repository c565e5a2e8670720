"""Next-edit suggestions on real edit histories (issue 24): the deterministic path against the next
hunk a developer actually wrote.

Cases come from a public repository's commits: in a commit that changes several lines of one Python
file, each a one-line change, the first change is the edit made so far and the next one is what to
predict. The file as it was before the commit is opened in `context.next_edit.EditHistory`, the
first change applied as the editor would send it (the changed characters only), and `predict` is
asked at the end of it. Reported for all cases and for the rename/repeat cases (the next change is
the same substitution as the first, the kind the deterministic path is for):

  exact      the prediction changes the same characters to the same text as the next hunk
  exact within two
             exact, or (deterministic path) wrong and the place offered after it once the user waves
             it off (`squidcode/nextEdit`'s `dismissed`) is exact
  in commit  the prediction is one of the commit's one-line changes of that file (a right edit the
             developer made elsewhere than at the next hunk: they may skip a docstring, go back up)
  none       no prediction
  reversal   the prediction would put back what the first edit removed
  delta-chrF how close the predicted change is to the next hunk, 0-100, the measure Zed reports for
             edit prediction: character n-gram (1-6, whitespace ignored) counts added and removed
             by the prediction against those the hunk adds and removes, F-score with beta 2,
             averaged over n; 100 when both change nothing, 0 for no prediction
  latency    p50 / p95 of `predict`

The one-line changes of a case need not be neighbours in the commit: a change of several lines may
stand between them. "rename_or_repeat_adjacent" is the rename/repeat cases whose next change is the
commit's very next hunk of that file, the stricter reading of "the next hunk".

With `--model`, the model path (`context.next_edit_model`, the embedded model in this process)
alone on every case, and both (the model only where the deterministic path has nothing). With
`--references` also the model path with its related code ("model+refs"): the definitions of the
names around the cursor found in the repository's Python files as they were before the commit (as
the server finds them in open files before its index is ready), composed from Squid caches behind
the model path's prompt head, as the server composes them; their encoding happens before the clock
starts (the server encodes them in the background), so the latency is the composition's and the
prompt's.

With `--across-files`, renames carried to other files (`carried_rename`, `next_use_elsewhere`): in
each commit that renames a Python name in one file (a one-line change after which no use of the old
name is left there and the name is one other modules see), the developer's one-line changes of that
file are applied up to that rename, and then the next edits are followed as a user pressing Tab
would: each offered edit is applied when it is right, and the chain stops at the first wrong one or
when nothing is offered. The other files are the repository's Python files as they were before the
commit, those that hold the old name as a word in path order (as the server takes the files its
index says use the name). An offered edit is right when the line it makes is a line of that file
after the commit (in a file the commit changed). Reported: the edits offered (in the renamed file,
in other files), the share right, and the recall: of the lines the commit renamed in other files
(a removed line that becomes the added one with the old name replaced by the new), the share the
chain reached.

    python bench/bench_next_edit.py --git-dir /work/.mirror/pytoolz+toolz/repo [--commits 2000] \
        [--model [--references]] [--across-files]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from context.next_edit import (  # noqa: E402
    EditHistory,
    carried_rename,
    context_names,
    defines,
    next_repeat_elsewhere,
    next_use_elsewhere,
    predict,
    repeat_elsewhere,
    widened,
)
from context.next_edit_model import predict_with_model  # noqa: E402

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def git(git_dir: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], check=True, capture_output=True,
                          text=True, errors="replace").stdout


def one_line_changes(diff: str) -> dict[str, list[tuple[int, str, str]]]:
    """Per file: (line number in the old file, old line, new line) of each hunk that changes one
    line into one line."""
    out: dict[str, list[tuple[int, str, str]]] = {}
    path, lines = None, diff.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") else None
        match = _HUNK.match(line)
        if match and path and path.endswith(".py"):
            old_n = int(match.group(2) or 1)
            new_n = int(match.group(4) or 1)
            if old_n == 1 and new_n == 1 and i + 2 < len(lines):
                old, new = lines[i + 1], lines[i + 2]
                if old.startswith("-") and new.startswith("+"):
                    out.setdefault(path, []).append((int(match.group(1)), old[1:], new[1:]))
    return out


def adjacent(git_dir: Path, sha: str, path: str, first: int, second: int) -> bool:
    """Whether the commit changes nothing of `path` between its old lines `first` and `second`: no
    other hunk (a change of several lines, which the cases skip) stands between the two changes."""
    diff = git(git_dir, "show", "--format=", "-U0", sha, "--", path)
    return not any(first < int(match.group(1)) < second
                   for match in map(_HUNK.match, diff.splitlines()) if match)


def char_change(old: str, new: str) -> tuple[int, int, str]:
    """(start, end in `old`, replacement) of the one change that turns `old` into `new`."""
    prefix = 0
    while prefix < min(len(old), len(new)) and old[prefix] == new[prefix]:
        prefix += 1
    suffix = 0
    while suffix < min(len(old), len(new)) - prefix and old[-1 - suffix] == new[-1 - suffix]:
        suffix += 1
    return prefix, len(old) - suffix, new[prefix : len(new) - suffix]


def line_offset(text: str, line: int) -> int:
    """The offset where 1-based `line` starts."""
    offset = 0
    for _ in range(line - 1):
        offset = text.index("\n", offset) + 1
    return offset


def cases(git_dir: Path, commits: int):
    for sha in git(git_dir, "log", "--no-merges", f"-{commits}", "--format=%H").split():
        try:
            diff = git(git_dir, "show", "--format=", "-U0", sha)
        except subprocess.CalledProcessError:
            continue
        for path, changes in one_line_changes(diff).items():
            if len(changes) < 2:
                continue
            try:
                before = git(git_dir, "show", f"{sha}^:{path}")
            except subprocess.CalledProcessError:
                continue
            yield sha, path, before, changes[0], changes[1], changes


class RepositoryReferences:
    """The model path's related code for cases of one repository: the definitions of the names
    around the cursor in the repository's Python files at the commit's parent (read once a commit),
    encoded into Squid caches that follow the model path's prompt head."""

    def __init__(self, git_dir: Path, runtime):
        from context.config import SquidCacheConfig

        self.git_dir, self.runtime, self.config = git_dir, runtime, SquidCacheConfig()
        self.services: dict[str, object] = {}
        self.files: dict[str, dict[str, str]] = {}
        self.documents = 0

    def tree(self, sha: str) -> dict[str, str]:
        if sha not in self.files:
            names = git(self.git_dir, "ls-tree", "-r", "--name-only", f"{sha}^").split("\n")
            files = {}
            for name in names:
                if name.endswith(".py"):
                    try:
                        files[f"/repo/{name}"] = git(self.git_dir, "show", f"{sha}^:{name}")
                    except subprocess.CalledProcessError:
                        continue
            self.files = {sha: files}  # one commit at a time
        return self.files[sha]

    def for_case(self, sha: str, path: str, text: str):
        """compose(head, text before the cursor) for the case (`ComposeReferences`), its
        documents encoded on the first call (untimed: see `warm`)."""
        from context.next_edit_model import reference_block
        from context.squid.references import CompletionReferences, no_symbols
        from context.squid.service import ReferenceDocument, SquidService

        files = dict(self.tree(sha))
        files[f"/repo/{path}"] = text
        outer = self

        class Compose:
            wait = True

            def __call__(self, head: str, prefix_text: str):
                service = outer.services.get(head)
                if service is None:
                    service = outer.services[head] = SquidService(outer.runtime, outer.config, None,
                                                                  start_thread=False, prefix_text=head)
                selection = CompletionReferences(service, current_path=f"/repo/{path}", open_documents=files,
                                                 search=None, roots=[Path("/repo")], symbols=no_symbols)
                documents = [ReferenceDocument(reference_block(d.text), d.source)
                             for d in selection.documents(prefix_text)]
                context = service.context_for(documents, wait=self.wait) if documents else None
                if context is None:
                    return None
                if not self.wait:  # the timed call: what the model read
                    outer.documents += len(context.spans)
                decode = outer.runtime.decode
                return context, "".join(decode(list(context.token_ids[s:e])) for s, e in context.spans)

        return Compose()


def run_case(before: str, first, second, changes=(), mode: str = "deterministic", runtime=None,
             references=None) -> dict:
    """One case scored; `mode`: the deterministic path, the model path (`runtime`), or both (the
    model only where the deterministic path has nothing, as the server does); "model+refs": the
    model path with `references` (a `ComposeReferences`), encoded before the clock starts."""
    (line1, old1, new1), (line2, old2, new2) = first, second
    s1, e1, r1 = char_change(old1, new1)
    s2, e2, r2 = char_change(old2, new2)
    history = EditHistory()
    history.open("f.py", before)
    start1 = line_offset(before, line1) + s1
    history.change("f.py", start1, line_offset(before, line1) + e1, r1)
    after = history.text("f.py")
    shift = len(r1) - (e1 - s1)
    start2 = line_offset(before, line2) + s2 + (shift if line2 > line1 else 0)
    expected = (start2, start2 + (e2 - s2), r2)
    cursor = start1 + len(r1)
    if references is not None:  # encoded before the clock starts, as the server's background does
        from context.next_edit_model import prompt_parts

        head = prompt_parts(runtime.tokenizer, history.edits("f.py"), after, cursor)[0]
        references(head, after[:cursor])
        references.wait = False
    began = time.perf_counter()
    found = predict(history, "f.py", cursor) if mode not in ("model", "model+refs") else None
    if found is None and mode != "deterministic":
        found = predict_with_model(runtime, history.edits("f.py"), after, cursor, references=references)
    seconds = time.perf_counter() - began
    same_kind = (old1[s1:e1], r1) == (old2[s2:e2], r2)
    rename = _words(old1, new1) is not None and _words(old1, new1) == _words(old2, new2)
    # Exact: the document after the prediction is the document after the next hunk (the same
    # change may be spelled over other characters: `black` -> `deny` or `blacklist` -> `denylist`).
    want = after[: expected[0]] + expected[2] + after[expected[1]:]
    got = after[: found.start] + found.text + after[found.end:] if found else None
    made = {(o.strip(), n.strip()) for _, o, n in changes[1:]}
    in_commit = False
    if found:
        line_start = got.rfind("\n", 0, found.start) + 1
        line_end = got.find("\n", found.start + len(found.text))
        old_end = after.find("\n", found.end)
        old_line = after[line_start : len(after) if old_end < 0 else old_end]
        new_line = got[line_start : len(got) if line_end < 0 else line_end]
        in_commit = (old_line.strip(), new_line.strip()) in made
    edits = [expected] + ([(found.start, found.end, found.text)] if found else [])
    lo, hi = _window(after, edits)

    def cut(edit):  # the window of the document after `edit`
        start, end, text = edit
        return after[lo:start] + text + after[end:hi]
    chrf = delta_chrf(after[lo:hi], cut(expected), cut(edits[1]) if found else after[lo:hi])
    within_two = got == want
    if found is not None and not within_two and mode == "deterministic":
        # The user waves the wrong place off (`squidcode/nextEdit`'s `dismissed`): the place after it.
        again = predict(history, "f.py", cursor, [(found.start, found.end)])
        within_two = again is not None and after[: again.start] + again.text + after[again.end:] == want
    return {"exact": got == want, "exact_within_two": within_two, "in_commit": got == want or in_commit,
            "none": found is None,
            "seconds": seconds, "delta_chrf": chrf,
            "repeat_case": same_kind or rename,
            "reversal": bool(found) and found.text == old1[s1:e1] and after[found.start:found.end] == r1}


CHRF_ORDER, CHRF_BETA = 6, 2.0


def _ngram_delta(original: str, changed: str, n: int) -> Counter:
    """Character n-grams `changed` has more (positive) or fewer (negative) of than `original`."""
    def grams(text: str) -> Counter:
        text = "".join(text.split())
        return Counter(text[i : i + n] for i in range(len(text) - n + 1))
    delta = grams(changed)
    delta.subtract(grams(original))
    return Counter({gram: count for gram, count in delta.items() if count})


def delta_chrf(original: str, expected: str, actual: str) -> float:
    """delta-chrF of the change `original` -> `actual` against `original` -> `expected` (0-100)."""
    scores = []
    for n in range(1, CHRF_ORDER + 1):
        want, got = _ngram_delta(original, expected, n), _ngram_delta(original, actual, n)
        if not want and not got:
            scores.append(1.0)
            continue
        # Added and removed n-grams match only in the same direction.
        true = sum(min(abs(c), abs(got[g])) for g, c in want.items() if got[g] and (c > 0) == (got[g] > 0))
        precision = true / sum(abs(c) for c in got.values()) if got else 0.0
        recall = true / sum(abs(c) for c in want.values()) if want else 0.0
        if precision + recall == 0:
            scores.append(0.0)
            continue
        beta2 = CHRF_BETA ** 2
        scores.append((1 + beta2) * precision * recall / (beta2 * precision + recall))
    return 100.0 * sum(scores) / len(scores)


def _window(after: str, edits: list[tuple[int, int, str]], context: int = CHRF_ORDER) -> tuple[int, int]:
    """The part of `after` holding every edit (start, end, text) with `context` characters around."""
    return (max(0, min(e[0] for e in edits) - context), min(len(after), max(e[1] for e in edits) + context))


def _words(old: str, new: str):
    a, b = re.findall(r"\w+", old), re.findall(r"\w+", new)
    if len(a) != len(b):
        return None
    pairs = {(x, y) for x, y in zip(a, b, strict=True) if x != y}
    return pairs if len(pairs) == 1 else None


# -- renames carried to other files ----------------------------------------------------------------


def _renamed_lines(diff: str, path: str, old: str, new: str) -> int:
    """How many of `path`'s removed lines in `diff` come back as added lines with `old` renamed to
    `new` (as whole words): the lines the commit renamed in that file."""
    word = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(old) + r"(?![A-Za-z0-9_])")
    removed, added, inside = [], Counter(), False
    for line in diff.splitlines():
        if line.startswith("+++ "):
            inside = line == f"+++ b/{path}"
        elif inside and line.startswith("-") and not line.startswith("---"):
            removed.append(line[1:])
        elif inside and line.startswith("+"):
            added[line[1:]] += 1
    count = 0
    for line in removed:
        renamed = word.sub(new, line)
        if renamed != line and added[renamed] > 0:
            added[renamed] -= 1
            count += 1
    return count


def _line_at(text: str, offset: int) -> str:
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    return text[start : len(text) if end < 0 else end]


def across_files(git_dir: Path, commits: int, max_steps: int = 40) -> list[dict]:
    """One row per commit and renamed file whose rename other files take part in (the module
    docstring's `--across-files`)."""
    rows = []
    for sha in git(git_dir, "log", "--no-merges", f"-{commits}", "--format=%H").split():
        try:
            diff = git(git_dir, "show", "--format=", "-U0", sha)
        except subprocess.CalledProcessError:
            continue
        changed = one_line_changes(diff)
        touched = set(re.findall(r"^\+\+\+ b/(\S+\.py)$", diff, re.M))
        if len(touched) < 2 or not changed:
            continue
        try:
            listed = git(git_dir, "ls-tree", "-r", "--name-only", f"{sha}^").split("\n")
        except subprocess.CalledProcessError:
            continue
        tree = [name for name in listed if name.endswith(".py")]
        for path, changes in changed.items():
            row = _carried_case(git_dir, sha, diff, tree, touched, path, changes, max_steps)
            if row is not None:
                rows.append(row)
    return rows


def _carried_case(git_dir, sha, diff, tree, touched, path, changes, max_steps) -> dict | None:
    try:
        before = git(git_dir, "show", f"{sha}^:{path}")
    except subprocess.CalledProcessError:
        return None
    history, uri = EditHistory(), f"file:///repo/{path}"
    history.open(uri, before)
    rename = repeat = None
    for line, old, new in changes:  # the developer's edits, up to one other files take part in
        start, end, text = char_change(old, new)
        current = history.text(uri)
        at = line_offset(current, line)
        if current[at : at + len(old)] != old:
            return None
        history.change(uri, at + start, at + end, text)
        cursor = at + start + len(text)
        if predict(history, uri, cursor) is not None:
            continue
        rename = carried_rename(history, uri)
        repeat = repeat_elsewhere(history, uri) if rename is None else None
        if rename is not None or repeat is not None:
            break
    else:
        return None
    files = _CommitFiles(git_dir, sha, touched)
    if repeat is None:
        return _rename_chain(files, diff, tree, touched, path, history, uri, cursor, rename, max_steps)
    return _repeat_chain(files, tree, path, history, uri, cursor, repeat, max_steps)


class _CommitFiles:
    """A commit's files as they were before it (`text`) and the lines of those it changed after it
    (`after`: empty for a file it left alone), each read from git once."""

    def __init__(self, git_dir: Path, sha: str, touched: set[str]):
        self.git_dir, self.sha, self.touched = git_dir, sha, touched
        self._texts: dict[str, str] = {}
        self._after: dict[str, set[str]] = {}

    def text(self, name: str) -> str:
        if name not in self._texts:
            self._texts[name] = git(self.git_dir, "show", f"{self.sha}^:{name}")
        return self._texts[name]

    def after(self, name: str) -> set[str]:
        if name not in self._after:
            changed = name in self.touched
            self._after[name] = set(git(self.git_dir, "show", f"{self.sha}:{name}").splitlines()) if changed \
                else set()
        return self._after[name]


def _follow(files: _CommitFiles, history: EditHistory, uri: str, path: str, cursor: int,
            candidates: list[str], find, max_steps: int) -> dict:
    """The chain of next edits from `path`'s last edit, as a user pressing Tab: the file's own next
    edit, else `find(current uri, file names to try in order, opened)` -> (edit, file name) in
    another file (those the chain has been to first, as open documents, then `candidates`); each
    offer is applied while it is right (the line it makes is a line of that file after the commit)
    and the chain stops at the first wrong one."""
    opened = {path: uri}  # the files the chain has been to: open documents, searched first
    offered = right = right_elsewhere = elsewhere_offered = 0
    wrong = None  # the offer that ended the chain, when a wrong one did
    times, current_uri, current_path = [], uri, path
    for _ in range(max_steps):
        began = time.perf_counter()
        found, target = predict(history, current_uri, cursor), current_path
        if found is None:
            order = [n for n in opened if n != current_path] + [n for n in candidates if n not in opened]
            found, target = find(current_uri, order, opened)
        times.append(time.perf_counter() - began)
        if found is None:
            break
        if target not in opened:
            opened[target] = f"file:///repo/{target}"
            history.open(opened[target], files.text(target))
        text = history.text(opened[target])
        made = text[: found.start] + found.text + text[found.end :]
        line = _line_at(made, found.start)
        good = line in files.after(target) and line != _line_at(text, found.start)
        offered += 1
        elsewhere_offered += target != path
        if not good:
            wrong = {"path": target, "was": _line_at(text, found.start), "made": line}
            break
        right += 1
        right_elsewhere += target != path
        history.change(opened[target], found.start, found.end, found.text)
        current_uri, current_path, cursor = opened[target], target, found.start + len(found.text)
    return {"offered": offered, "right": right, "offered_elsewhere": elsewhere_offered,
            "right_elsewhere": right_elsewhere, "wrong": wrong,
            "p50_ms": round(1000 * statistics.median(times), 3) if times else 0.0}


def _first_in(order: list[str], history: EditHistory, opened: dict[str, str], files: _CommitFiles, place):
    """(the first edit `place(text, name)` finds in the files of `order`, that file), or (None, None)."""
    for name in order:
        text = history.text(opened[name]) if name in opened else files.text(name)
        found = place(text, name)
        if found is not None:
            return found, name
    return None, None


def _rename_chain(files, diff, tree, touched, path, history, uri, cursor, rename, max_steps) -> dict:
    word = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(rename.old) + r"(?![A-Za-z0-9_])")
    candidates = [name for name in tree if name != path and word.search(files.text(name))]
    project_defines = any(defines(files.text(name), rename.old) for name in candidates)  # what the index says
    wanted = sum(_renamed_lines(diff, name, rename.old, rename.new) for name in touched if name != path)

    def find(current_uri, order, opened):
        carried = carried_rename(history, current_uri)
        if carried is None or not (carried.at_definition or project_defines):
            return None, None
        carried = widened(carried, [(n, history.text(u)) for n, u in opened.items()])
        return _first_in(order, history, opened, files,
                         lambda text, name: next_use_elsewhere(carried, text, name))

    chain = _follow(files, history, uri, path, cursor, candidates, find, max_steps)
    return {"commit": files.sha[:10], "path": path, "kind": "rename", "old": rename.old, "new": rename.new,
            **chain, "wanted_elsewhere": wanted}


def _repeat_chain(files, tree, path, history, uri, cursor, repeat, max_steps) -> dict:
    """A repeat with no place left in its file, followed as a rename is: to the files (in path
    order) that hold the names around the change, as the server asks its index."""
    names = [re.compile(r"(?<![A-Za-z0-9_])" + re.escape(n) + r"(?![A-Za-z0-9_])")
             for n in context_names(repeat)[:3]]
    candidates = [name for name in tree if name != path and any(w.search(files.text(name)) for w in names)]

    def find(current_uri, order, opened):
        edit = repeat_elsewhere(history, current_uri)
        if edit is None:
            return None, None
        return _first_in(order, history, opened, files, lambda text, name: next_repeat_elsewhere(edit, text))

    chain = _follow(files, history, uri, path, cursor, candidates, find, max_steps)
    return {"commit": files.sha[:10], "path": path, "kind": "repeat", "old": repeat.old, "new": repeat.new,
            **chain, "wanted_elsewhere": 0}


def across_summary(rows: list[dict]) -> dict:
    offered = sum(r["offered"] for r in rows)
    elsewhere = sum(r["offered_elsewhere"] for r in rows)
    wanted = sum(r["wanted_elsewhere"] for r in rows)
    times = sorted(r["p50_ms"] for r in rows) or [0.0]
    return {"cases": len(rows), "offered": offered,
            "right": round(sum(r["right"] for r in rows) / max(offered, 1), 3),
            "offered_elsewhere": elsewhere,
            "right_elsewhere": round(sum(r["right_elsewhere"] for r in rows) / max(elsewhere, 1), 3),
            "lines_renamed_elsewhere": wanted,
            "recall_elsewhere": round(sum(min(r["right_elsewhere"], r["wanted_elsewhere"]) for r in rows)
                                      / max(wanted, 1), 3),
            "cases_with_other_files_renamed": sum(r["wanted_elsewhere"] > 0 for r in rows),
            "p50_ms": round(statistics.median(times), 3)}


def summary(rows: list[dict]) -> dict:
    n = max(len(rows), 1)
    times = sorted(r["seconds"] for r in rows) or [0.0]
    return {"cases": len(rows), "exact": round(sum(r["exact"] for r in rows) / n, 3),
            "exact_within_two": round(sum(r["exact_within_two"] for r in rows) / n, 3),
            "in_commit": round(sum(r["in_commit"] for r in rows) / n, 3),
            "none": round(sum(r["none"] for r in rows) / n, 3),
            "reversal": round(sum(r["reversal"] for r in rows) / n, 3),
            "delta_chrf": round(sum(r["delta_chrf"] for r in rows) / n, 1),
            "p50_ms": round(1000 * statistics.median(times), 3),
            "p95_ms": round(1000 * times[int(0.95 * (len(times) - 1))], 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--git-dir", type=Path, required=True)
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--model", action="store_true",
                        help="also the model path alone and both (the embedded model, in-process)")
    parser.add_argument("--references", action="store_true",
                        help="with --model: also the model path with its related code (model+refs)")
    parser.add_argument("--across-files", action="store_true",
                        help="also renames carried to other files (see the module docstring)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runtime, modes = None, ["deterministic"]
    if args.model:
        from context.config import ModelConfig
        from context.runtime import ModelRuntime

        runtime = ModelRuntime(ModelConfig(threads=args.threads)).load().prepare()
        modes += ["model", "both"] + (["model+refs"] if args.references else [])
    found = list(cases(args.git_dir, args.commits))
    next_hunk = [adjacent(args.git_dir, sha, path, first[0], second[0])
                 for sha, path, _, first, second, _ in found]
    repository = RepositoryReferences(args.git_dir, runtime) if args.references else None
    out, rows = {}, []
    for mode in modes:
        mode_rows = []
        for sha, path, before, first, second, changes in found:
            refs = repository.for_case(sha, path, before) if mode == "model+refs" else None
            row = run_case(before, first, second, changes, mode, runtime, refs)
            mode_rows.append(dict(row, commit=sha[:10], path=path, mode=mode))
        for row, is_next in zip(mode_rows, next_hunk, strict=True):
            row["adjacent"] = is_next
        rows += mode_rows
        key = (lambda name: name) if mode == "deterministic" else (lambda name, m=mode: f"{m}:{name}")
        out.update({key("all"): summary(mode_rows),
                    key("rename_or_repeat"): summary([r for r in mode_rows if r["repeat_case"]]),
                    key("rename_or_repeat_adjacent"): summary([r for r in mode_rows
                                                               if r["repeat_case"] and r["adjacent"]]),
                    key("other"): summary([r for r in mode_rows if not r["repeat_case"]])})
    if repository is not None:
        out["model+refs:documents_composed"] = repository.documents
    if args.across_files:
        carried = across_files(args.git_dir, args.commits)
        out["across_files"] = across_summary([r for r in carried if r["kind"] == "rename"])
        out["across_files_repeats"] = across_summary([r for r in carried if r["kind"] == "repeat"])
        rows += [dict(row, mode="across_files") for row in carried]
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"summary": out, "cases": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
