"""What the agent's model reads first: instructions, the tool list, the repo map and documents.

Documents are chosen here (the target window first, then retrieved chunks from other files within a
character budget); how they are put in front of the model is the backend's business
(`agent.backends.build_local_prompt` for the local runtime).
"""

from __future__ import annotations

import json
from pathlib import Path

from context.index.repomap import render_repo_map
from context.index.retrieval import search

from .backends import Document
from .protocol import TEXT_PROTOCOL
from .tools.registry import ToolRegistry

__all__ = ["system_prompt", "select_documents", "repo_map_for", "first_message", "TARGET_WINDOW"]

TARGET_WINDOW = 60  # lines each side of the selection shown up front
_CHARS_PER_TOKEN = 3.5

_INSTRUCTIONS = """You are a careful software engineer working in a repository.
Read the code you are given, change as little as needed, and keep the project's style.
Every edit is checked by the parser, the linter and the tests; a rejected edit leaves the file unchanged."""


def _tool_lines(registry: ToolRegistry) -> str:
    lines = []
    for name in registry.names():
        tool = registry.get(name)
        params = ", ".join(tool.parameters.get("properties", {}))
        lines.append(f"- {name}({params}): {tool.description}")
    return "\n".join(lines)


def system_prompt(registry: ToolRegistry, native_tools: bool, notes: list[str] = ()) -> str:
    parts = [_INSTRUCTIONS]
    if native_tools:
        parts.append("Use the tools to read, search, edit and test. Answer without a tool call when done.")
    else:
        parts.append(f"Tools:\n{_tool_lines(registry)}\n\n{TEXT_PROTOCOL}")
    if notes:
        parts.append("Notes about this project:\n" + "\n".join(f"- {n}" for n in notes))
    return "\n\n".join(parts)


def _window(text: str, line_range: tuple[int, int] | None) -> tuple[str, int]:
    lines = text.splitlines()
    if line_range is None or len(lines) <= 2 * TARGET_WINDOW:
        return "\n".join(lines[: 4 * TARGET_WINDOW]), 1
    start = max(1, line_range[0] - TARGET_WINDOW)
    end = min(len(lines), line_range[1] + TARGET_WINDOW)
    return "\n".join(lines[start - 1 : end]), start


def select_documents(
    overlay,
    workspace,
    store,
    instruction: str,
    target: Path | None,
    line_range: tuple[int, int] | None,
    token_budget: int,
) -> list[Document]:
    """The target file's window, then retrieved chunks of other files, within `token_budget`."""
    budget = int(token_budget * _CHARS_PER_TOKEN)
    docs: list[Document] = []
    if target is not None:
        text, start = _window(overlay.read(target), line_range)
        docs.append(Document(workspace.rel(target), text[:budget], start))
        budget -= len(docs[0].text)
    if store is None or budget <= 200:
        return docs
    seen = {str(target)} if target else set()
    for hit in search(store, instruction, 6):
        if hit.path in seen or len(hit.text) > budget:
            continue
        seen.add(hit.path)
        docs.append(Document(hit.rel, hit.text, hit.start_line))
        budget -= len(hit.text)
    return docs


def repo_map_for(store, target: Path | None, token_budget: int) -> str:
    if store is None or token_budget <= 0:
        return ""
    return render_repo_map(store, focus=str(target) if target else None, token_budget=token_budget)


def first_message(
    instruction: str, rel: str | None, line_range: tuple[int, int] | None, pretest: str | None
) -> str:
    parts = [f"Task: {instruction.strip()}"]
    if rel:
        where = f" (lines {line_range[0]}-{line_range[1]})" if line_range else ""
        parts.append(f"The file concerned is {rel}{where}.")
    if pretest:
        parts.append(f"The tests currently report:\n{pretest}")
    return "\n".join(parts)


def tool_call_message(call_id: str, name: str, args: dict) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        ],
    }
