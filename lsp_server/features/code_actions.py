"""textDocument/codeAction: "squidcode: fix this" on a diagnostic, "squidcode: ask…" on a selection.

Both carry the command `squidcode.agent.run`. "fix this" names the diagnostic in its instruction;
"ask…" leaves the instruction empty for the editor client to ask the user for it before running.
"""

from __future__ import annotations

from lsprotocol import types
from lsprotocol.converters import get_converter

from ..server import SquidServer
from .agent_command import AGENT_RUN

__all__ = ["register", "code_actions_for", "FIX_TITLE", "ASK_TITLE"]

FIX_TITLE = "squidcode: fix this"
ASK_TITLE = "squidcode: ask…"
MAX_FIXES = 3


def _arguments(instruction: str, uri: str, range_: types.Range, converter) -> list:
    return [{"instruction": instruction, "uri": uri, "range": converter.unstructure(range_)}]


def code_actions_for(params: types.CodeActionParams, converter) -> list[types.CodeAction]:
    uri = params.text_document.uri
    actions = []
    only = params.context.only
    if not only or any(k.startswith("quickfix") for k in only):
        for diagnostic in params.context.diagnostics[:MAX_FIXES]:
            line = diagnostic.range.start.line + 1
            instruction = f"Fix this problem at line {line}: {diagnostic.message}"
            if diagnostic.source:
                instruction += f" (reported by {diagnostic.source})"
            actions.append(
                types.CodeAction(
                    title=FIX_TITLE,
                    kind=types.CodeActionKind.QuickFix,
                    diagnostics=[diagnostic],
                    command=types.Command(
                        title=FIX_TITLE,
                        command=AGENT_RUN,
                        arguments=_arguments(instruction, uri, diagnostic.range, converter),
                    ),
                )
            )
    selection = params.range
    has_selection = selection.start != selection.end
    if has_selection and (not only or any(k.startswith("refactor") for k in only)):
        actions.append(
            types.CodeAction(
                title=ASK_TITLE,
                kind=types.CodeActionKind.RefactorRewrite,
                command=types.Command(
                    title=ASK_TITLE, command=AGENT_RUN, arguments=_arguments("", uri, selection, converter)
                ),
            )
        )
    return actions


def register(server: SquidServer) -> None:
    @server.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(
            code_action_kinds=[types.CodeActionKind.QuickFix, types.CodeActionKind.RefactorRewrite]
        ),
    )
    def code_action(ls: SquidServer, params: types.CodeActionParams) -> list[types.CodeAction] | None:
        if not ls.config.agent.enabled:
            return None
        return code_actions_for(params, get_converter()) or None
