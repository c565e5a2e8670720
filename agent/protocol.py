"""The fenced-block text protocol that small local models use to call tools.

A model without native tool calls answers with one fenced block:

    ```tool
    {"tool": "read_file", "args": {"path": "calc.py"}}
    ```

    ```edit calc.py
    <<<<<<< SEARCH
    return a - b
    =======
    return a + b
    >>>>>>> REPLACE
    ```

    ```done
    ```

`parse_action` turns the text into a `ToolCall`, a `Done`, or a `ParseFailure` whose message is what
the model is re-prompted with. The parser is lenient where small models are predictably sloppy: a
```json block holding a tool call, SEARCH/REPLACE markers in a ```python block or with no fence
(the path is then the file the request is about), marker lines with more or fewer than seven signs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ToolCall",
    "Done",
    "ParseFailure",
    "Action",
    "parse_action",
    "parse_edit_blocks",
    "TEXT_PROTOCOL",
    "render_tool_call",
]

_FENCE = re.compile(r"```[ \t]*([\w-]*)[ \t]*([^\n`]*)\n(.*?)(?:```|\Z)", re.S)
_BLOCK = re.compile(
    r"^[ \t]*<{5,9}[ \t]*SEARCH[ \t]*\n(.*?)^[ \t]*={5,9}[ \t]*\n(.*?)^[ \t]*>{5,9}[ \t]*REPLACE[ \t]*$",
    re.S | re.M,
)
_DEFINITION = re.compile(r"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+\w+", re.M)
_CODE_KINDS = ("", "edit", "python", "py", "python3")
MAX_ACTION_CHARS = 100_000


@dataclass(frozen=True)
class ToolCall:
    name: str
    args: dict[str, Any]
    call_id: str | None = None  # set by native tool-call backends


@dataclass(frozen=True)
class Done:
    message: str = ""


@dataclass(frozen=True)
class ParseFailure:
    message: str
    raw: str = field(default="", repr=False)


Action = ToolCall | Done | ParseFailure

PATH_PLACEHOLDER = "PATH"  # the file's place in the edit block's example below
# The example is real code changed in one place: with placeholder text there ("the new lines"), the
# small model wrote the placeholder as its replacement.
TEXT_PROTOCOL = """Answer with exactly one fenced block, nothing else.
To change a file, quote the exact lines to replace, then the same lines as they must read
(PATH is the file's path):
```edit PATH
<<<<<<< SEARCH
    if count > limit:
        return None
=======
    if count >= limit:
        return None
>>>>>>> REPLACE
```
To use a tool instead, give its name and JSON arguments:
```tool
{"tool": "NAME", "args": {...}}
```
When the task is finished, answer:
```done
```"""


def parse_edit_blocks(body: str) -> list[dict[str, str]]:
    return [
        {"search": _strip_one_newline(s), "replace": _strip_one_newline(r)} for s, r in _BLOCK.findall(body)
    ]


def _strip_one_newline(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text


def _tool_from_json(body: str) -> Action:
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        return ParseFailure(
            f"the tool block is not valid JSON ({exc.msg} at line {exc.lineno}); "
            'write {"tool": "NAME", "args": {...}}',
            body,
        )
    if not isinstance(value, dict) or not isinstance(value.get("tool") or value.get("name"), str):
        return ParseFailure('a tool block must hold {"tool": "NAME", "args": {...}}', body)
    args = value.get("args", value.get("arguments", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ParseFailure("the tool's args must be a JSON object", body)
    if not isinstance(args, dict):
        return ParseFailure("the tool's args must be a JSON object", body)
    return ToolCall(value.get("tool") or value.get("name"), args)


def parse_action(text: str, default_path: str | None = None) -> Action:
    """The first action in a model's answer; `default_path` is used for edit blocks that name no file."""
    if not isinstance(text, str) or not text.strip():
        return ParseFailure("the answer was empty", text if isinstance(text, str) else "")
    text = text[:MAX_ACTION_CHARS]
    for kind, info, body in _FENCE.findall(text):
        kind = kind.lower()
        if kind == "done":
            return Done(body.strip())
        if kind == "tool" or (kind == "json" and re.search(r"\"(tool|name)\"\s*:", body)):
            return _tool_from_json(body)
        blocks = parse_edit_blocks(body)
        path = info.strip()
        # The instructions' own placeholder copied as written (small models do): the file asked about.
        path = default_path if path in ("", PATH_PLACEHOLDER) else path
        if blocks or kind == "edit":
            if not path:
                return ParseFailure("the edit block names no file: write ```edit PATH", body)
            if blocks:
                return ToolCall("edit", {"path": path, "blocks": blocks})
        if kind in _CODE_KINDS and path and _DEFINITION.search(body):
            # Whole definitions, the form small models write unasked: they replace their namesakes.
            return ToolCall("edit", {"path": path, "code": body})
        if kind == "edit":
            return ParseFailure("the edit block has no <<<<<<< SEARCH / ======= / >>>>>>> REPLACE part", body)
    blocks = parse_edit_blocks(text)
    if blocks and default_path:
        return ToolCall("edit", {"path": default_path, "blocks": blocks})
    return ParseFailure("no fenced ```edit, ```tool or ```done block found", text)


def render_tool_call(call: ToolCall) -> str:
    """How a call is written back into a text transcript (the model's own turn, normalised)."""
    if call.name == "edit" and isinstance(call.args.get("blocks"), list):
        parts = [f"```edit {call.args.get('path', '')}"]
        for block in call.args["blocks"]:
            parts += [
                "<<<<<<< SEARCH",
                block.get("search", ""),
                "=======",
                block.get("replace", ""),
                ">>>>>>> REPLACE",
            ]
        return "\n".join(parts + ["```"])
    if call.name == "edit" and isinstance(call.args.get("code"), str):
        return f"```edit {call.args.get('path', '')}\n{call.args['code'].rstrip()}\n```"
    return "```tool\n" + json.dumps({"tool": call.name, "args": call.args}) + "\n```"
