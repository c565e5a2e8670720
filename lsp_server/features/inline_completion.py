"""textDocument/inlineCompletion (LSP 3.18): ghost text from the model at the cursor."""

from __future__ import annotations

from lsprotocol import types

from agent.completion import Completion

from ..server import SquidServer
from .feedback_commands import accept_command, record_completion

__all__ = ["register", "to_lsp_inline_list"]


def to_lsp_inline_list(
    completion: Completion, position: types.Position, command: types.Command | None = None
) -> types.InlineCompletionList:
    item = types.InlineCompletionItem(
        insert_text=completion.text,
        range=types.Range(start=position, end=position),
        command=command,
    )
    return types.InlineCompletionList(items=[item])


def register(server: SquidServer) -> None:
    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(
        ls: SquidServer, params: types.InlineCompletionParams
    ) -> types.InlineCompletionList | None:
        completion = await ls.complete_at(params.text_document.uri, params.position)
        if completion is None:
            return None
        episode_id = record_completion(ls, params.text_document.uri, params.position, completion)
        return to_lsp_inline_list(completion, params.position, accept_command(episode_id, completion.text))
