"""`pr_history`: the commits and merged pull requests that shaped a range of lines.

From git alone: `git log -L` (or `--follow -p` for a whole file) gives the commits with their
messages and trimmed diffs, `git blame --porcelain` who last wrote each line, and the first merge
commit after each commit names the pull request that brought it in. When the user names a token
variable (`agent.forge_token_env`) and it is set, the pull requests' titles, descriptions and review
comments come from the GitHub or GitLab API through httpx. Nothing is sent anywhere otherwise.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

import httpx

from ..errors import ToolError
from ..sandbox import run_command, trim_middle
from .registry import Tool, ToolContext, ToolResult

__all__ = ["PR_HISTORY", "Commit", "line_history", "pull_request_numbers", "ForgeClient", "forge_for_remote"]

MAX_COMMITS = 5
DIFF_LINES = 30
_PR_PATTERNS = (
    re.compile(r"Merge pull request #(\d+)"),
    re.compile(r"\(#(\d+)\)\s*$", re.M),
    re.compile(r"See merge request [\w./-]*!(\d+)"),
)


@dataclass
class Commit:
    sha: str
    date: str
    author: str
    subject: str
    body: str
    diff: str
    pull_requests: list[int] = field(default_factory=list)


def _git(ctx: ToolContext, *args: str) -> str:
    result = run_command(
        ["git", *args],
        ctx.workspace.root,
        timeout_s=ctx.config.tool_timeout_s,
        max_output_bytes=ctx.config.max_output_bytes,
    )
    if result.timed_out:
        raise ToolError(f"git {args[0]} did not finish within {ctx.config.tool_timeout_s:.0f} s")
    if result.returncode != 0:
        raise ToolError(f"git {args[0]} failed: {result.output.strip()[:300]}")
    return result.output


def _trim_diff(diff: str) -> str:
    lines = [ln for ln in diff.strip("\n").splitlines() if not ln.startswith(("index ", "diff --git"))]
    if len(lines) > DIFF_LINES:
        lines = lines[:DIFF_LINES] + [f"[... {len(lines) - DIFF_LINES} more diff lines]"]
    return "\n".join(lines)


def pull_request_numbers(message: str) -> list[int]:
    found = []
    for pattern in _PR_PATTERNS:
        found += [int(n) for n in pattern.findall(message)]
    return list(dict.fromkeys(found))


def line_history(ctx: ToolContext, rel: str, start: int | None, end: int | None) -> list[Commit]:
    fmt = "--format=%x00%H%x1f%ad%x1f%an%x1f%s%x1f%b%x1f"
    if start is not None:
        out = _git(ctx, "log", f"-L{start},{end or start}:{rel}", fmt, "--date=short", f"-n{MAX_COMMITS}")
    else:
        out = _git(ctx, "log", "--follow", "-p", fmt, "--date=short", f"-n{MAX_COMMITS}", "--", rel)
    commits = []
    for record in out.split("\0")[1:]:
        parts = record.split("\x1f")
        if len(parts) < 6:
            continue
        sha, date, author, subject, body, diff = parts[:6]
        commits.append(Commit(sha, date, author, subject, body.strip(), _trim_diff(diff)))
    for commit in commits:
        commit.pull_requests = pull_request_numbers(f"{commit.subject}\n{commit.body}")
        merge = _merge_of(ctx, commit.sha)
        if merge:
            commit.pull_requests += [n for n in pull_request_numbers(merge) if n not in commit.pull_requests]
    return commits


def _merge_of(ctx: ToolContext, sha: str) -> str:
    """The message of the first merge commit that brought `sha` into HEAD ('' when none)."""
    out = _git(ctx, "log", "--merges", "--ancestry-path", "--reverse", "--format=%s%n%b%x00", f"{sha}..HEAD")
    return out.split("\0", 1)[0].strip()


def _blame(ctx: ToolContext, rel: str, start: int, end: int) -> str:
    out = _git(ctx, "blame", "--porcelain", f"-L{start},{end}", "--", rel)
    counts: dict[str, int] = {}
    summaries: dict[str, str] = {}
    authors: dict[str, str] = {}
    current = None
    for line in out.splitlines():
        head = line.split(" ")
        if len(head) >= 3 and re.fullmatch(r"[0-9a-f]{40}", head[0]):
            current = head[0]
            counts[current] = counts.get(current, 0) + (int(head[3]) if len(head) > 3 else 0)
        elif current and line.startswith("summary "):
            summaries[current] = line[8:]
        elif current and line.startswith("author "):
            authors[current] = line[7:]
    return "\n".join(
        f"  {sha[:10]} {authors.get(sha, '?')}: {summaries.get(sha, '')} ({n} lines)"
        for sha, n in sorted(counts.items(), key=lambda kv: -kv[1])
    )


class ForgeClient:
    """Pull request titles, descriptions and review comments from GitHub or GitLab."""

    def __init__(self, api_url: str, project: str, token: str, kind: str, timeout_s: float = 10.0):
        self.api_url = api_url.rstrip("/")
        self.project = project
        self.kind = kind  # "github" | "gitlab"
        header = {"Authorization": f"Bearer {token}"} if kind == "github" else {"PRIVATE-TOKEN": token}
        self._client = httpx.Client(headers={**header, "User-Agent": "squidcode"}, timeout=timeout_s)

    def _get(self, path: str):
        try:
            response = self._client.get(f"{self.api_url}{path}")
        except httpx.HTTPError as exc:
            raise ToolError(f"cannot reach {self.api_url}: {exc}") from exc
        if response.status_code in (401, 403):
            raise ToolError(f"{self.api_url} refused the token (HTTP {response.status_code})")
        if response.status_code >= 400:
            raise ToolError(f"{self.api_url}{path}: HTTP {response.status_code}")
        try:
            return response.json()
        except ValueError as exc:
            raise ToolError(f"{self.api_url}{path} did not answer JSON") from exc

    def pull_request(self, number: int) -> str:
        if self.kind == "github":
            base = f"/repos/{self.project}/pulls/{number}"
            pr, comments = self._get(base), self._get(f"{base}/comments")
            title, body = pr.get("title", ""), pr.get("body") or ""
        else:
            base = f"/projects/{quote(self.project, safe='')}/merge_requests/{number}"
            pr, comments = self._get(base), self._get(f"{base}/notes")
            title, body = pr.get("title", ""), pr.get("description") or ""
        notes = [
            f"    - {c.get('path', '') + ': ' if c.get('path') else ''}{(c.get('body') or '')[:300]}"
            for c in (comments if isinstance(comments, list) else [])[:8]
        ]
        return f"  PR #{number}: {title}\n    {trim_middle(body, 600)}" + (
            "\n" + "\n".join(notes) if notes else ""
        )

    def close(self) -> None:
        self._client.close()


def forge_for_remote(ctx: ToolContext) -> ForgeClient | None:
    """A forge client when the user configured a token variable that is set; else None."""
    name = ctx.config.forge_token_env
    token = os.environ.get(name, "") if name else ""
    if not token:
        return None
    try:
        url = _git(ctx, "remote", "get-url", "origin").strip()
    except ToolError:
        return None
    # git@host:owner/repo.git and https://host/owner/repo.git
    match = re.match(r"^(?:[\w.-]+@)?([\w.-]+):(?!//)(.+?)(?:\.git)?$", url)
    host, project = (
        (match.group(1), match.group(2))
        if match
        else (urlsplit(url).hostname or "", urlsplit(url).path.strip("/").removesuffix(".git"))
    )
    api = ctx.config.forge_api_url
    kind = "gitlab" if "gitlab" in host or api.rstrip("/").endswith("/api/v4") else "github"
    if not api:
        api = "https://api.github.com" if kind == "github" else f"https://{host}/api/v4"
    return ForgeClient(api, project, token, kind, ctx.config.tool_timeout_s)


def pr_history(ctx: ToolContext, args: dict) -> ToolResult:
    path = ctx.workspace.resolve(args["path"])
    rel = ctx.workspace.rel(path)
    start, end = args.get("start"), args.get("end")
    if start is not None and (start < 1 or (end is not None and end < start)):
        raise ToolError("start must be >= 1 and end >= start")
    commits = line_history(ctx, rel, start, end)
    if not commits:
        return ToolResult(True, f"no history for {rel} (not committed yet?)", {"commits": 0})
    parts = [
        f"{c.sha[:10]} {c.date} {c.author}: {c.subject}"
        + (f" (PR {', '.join('#' + str(n) for n in c.pull_requests)})" if c.pull_requests else "")
        + (f"\n  {trim_middle(c.body, 400)}" if c.body else "")
        + f"\n{c.diff}"
        for c in commits
    ]
    if start is not None:
        parts.append("last written by:\n" + _blame(ctx, rel, start, end or start))
    forge = forge_for_remote(ctx)
    if forge is not None:
        try:
            numbers = list(dict.fromkeys(n for c in commits for n in c.pull_requests))[:3]
            parts += [forge.pull_request(n) for n in numbers]
        except ToolError as exc:
            parts.append(f"(pull request details unavailable: {exc})")
        finally:
            forge.close()
    return ToolResult(True, "\n\n".join(parts), {"commits": len(commits)})


PR_HISTORY = Tool(
    "pr_history",
    "The commits and pull requests that shaped a file or a range of its lines: why the code is so.",
    {
        "type": "object",
        "properties": {"path": {"type": "string"}, "start": {"type": "integer"}, "end": {"type": "integer"}},
        "required": ["path"],
    },
    pr_history,
)
