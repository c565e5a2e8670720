"""textDocument/completion: the same model suggestion as one completion item, for clients that
have no inline completion. The item replaces the word before the cursor so clients that filter by
that word keep it."""

from __future__ import annotations

import re

from lsprotocol import types

from agent.completion import Completion

from ..positions import offset_at, utf16_len
from ..server import SquidServer

__all__ = ["register", "to_lsp_completion_list"]

_WORD_BEFORE = re.compile(r"[\w$]*$")


def to_lsp_completion_list(
    completion: Completion, line_prefix: str, position: types.Position
) -> types.CompletionList:
    word = _WORD_BEFORE.search(line_prefix).group(0)
    start = types.Position(line=position.line, character=position.character - utf16_len(word))
    first_line = completion.text.split("\n", 1)[0].strip() or completion.text.strip()
    item = types.CompletionItem(
        label=(word + first_line)[:80],
        kind=types.CompletionItemKind.Text,
        detail="squidcode",
        filter_text=word + completion.text,
        text_edit=types.TextEdit(
            range=types.Range(start=start, end=position), new_text=word + completion.text
        ),
        insert_text_format=types.InsertTextFormat.PlainText,
        sort_text="0",
    )
    # Incomplete: the next keystroke asks again rather than filtering a stale suggestion.
    return types.CompletionList(is_incomplete=True, items=[item])


def register(server: SquidServer) -> None:
    @server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions())
    async def completion(
        ls: SquidServer, params: types.CompletionParams
    ) -> types.CompletionList | None:
        opened = ls.open_document_text(params.text_document.uri)
        if opened is None:
            return None
        text = opened[0]
        offset = offset_at(text, params.position)
        line_prefix = text[text.rfind("\n", 0, offset) + 1 : offset]
        result = await ls.complete_at(params.text_document.uri, params.position)
        if result is None:
            return None
        return to_lsp_completion_list(result, line_prefix, params.position)
