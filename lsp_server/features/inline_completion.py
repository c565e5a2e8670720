"""textDocument/inlineCompletion (LSP 3.18): ghost text from the model at the cursor, or the next edit
when one is predicted on the cursor's line.

The next edit (`features.next_edit.line_edit`, the deterministic path: the user's last rename or
repeated change, carried to where it applies next) comes first: it is cheap, it follows from what the
user just did, and it can replace text anywhere on the line, which the completion never does (it
only writes at the cursor). When there is one, it is the answer, as an item with a `range`, after
the same debounce as a completion and without waiting on the model; otherwise the model completes
at the cursor as before.
"""

from __future__ import annotations

import asyncio

from lsprotocol import types

from agent.completion import Completion
from context.next_edit import Prediction

from ..positions import offset_at, position_at
from ..server import SquidServer
from .feedback_commands import accept_command, record_completion
from .next_edit import line_edit, record_offer

__all__ = ["register", "to_lsp_inline_list", "to_lsp_next_edit_list"]


def to_lsp_inline_list(
    completion: Completion, position: types.Position, command: types.Command | None = None
) -> types.InlineCompletionList:
    item = types.InlineCompletionItem(
        insert_text=completion.text,
        range=types.Range(start=position, end=position),
        command=command,
    )
    return types.InlineCompletionList(items=[item])


def to_lsp_next_edit_list(
    text: str, cursor: int, found: Prediction, command: types.Command | None = None
) -> types.InlineCompletionList:
    """The next edit as one item whose range spans the edit and the cursor: clients show an item
    whose range holds the cursor, and replacing the wider span gives the same document."""
    start, end = min(found.start, cursor), max(found.end, cursor)
    item = types.InlineCompletionItem(
        insert_text=text[start:found.start] + found.text + text[found.end:end],
        range=types.Range(start=position_at(text, start), end=position_at(text, end)),
        command=command,
    )
    return types.InlineCompletionList(items=[item])


async def _offer_next_edit(ls: SquidServer, uri: str, position: types.Position, text: str,
                           prediction: Prediction) -> types.InlineCompletionList | None:
    """The next edit predicted on `text` as an inline completion list, or None when the document
    changed during the debounce (the newer keystroke's request answers)."""
    await asyncio.sleep(ls.config.completion.debounce_ms / 1000)
    if ls.edit_history.text(uri) != text:
        return None
    command = accept_command(record_offer(ls, uri, text, prediction), prediction.text)
    return to_lsp_next_edit_list(text, offset_at(text, position), prediction, command)


def register(server: SquidServer) -> None:
    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(
        ls: SquidServer, params: types.InlineCompletionParams
    ) -> types.InlineCompletionList | None:
        uri = params.text_document.uri
        found = line_edit(ls, uri, params.position) if ls.config.completion.enabled else None
        if found is not None and not ls.stopping.is_set():
            return await _offer_next_edit(ls, uri, params.position, *found)
        completion = await ls.complete_at(uri, params.position)
        if completion is None:
            return None
        episode_id = record_completion(ls, uri, params.position, completion)
        return to_lsp_inline_list(completion, params.position, accept_command(episode_id, completion.text))
