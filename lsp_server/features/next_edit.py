"""`squidcode/nextEdit`: the edit the developer is about to make, from the edits they just made.

The server keeps each open document's recent edits in memory (`context.next_edit.EditHistory`, fed
by didOpen / didChange / didClose through the document listeners; never stored) and answers with
the deterministic path's prediction: the last edit's rename or repeat, carried to where it applies
next (docs/protocol.md); a rename with no use left in its file goes on in the next other file that
takes part, and so does a repeat with no place left (`elsewhere`: the open documents, then the
files the index says use the names; the answer's `textDocument` is then that file's); or with
`completion.next_edit_model` the model path's, which reads the edits, the region around the cursor
and the definitions a completion there would read (Squid caches composed in front of its prompt).
With feedback recording on, each offered edit is a `next_edit` episode whose accept command
(`squidcode.completion.accept`) starts following the edited region to the same keep/revert
checkpoints as a completion. `line_edit` is the same prediction for `textDocument/inlineCompletion`
when it lies on the cursor's line (`features.inline_completion`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.uris import from_fs_path, to_fs_path

from context.errors import GenerationCancelled
from context.foreground import foreground
from context.next_edit import (
    EditHistory,
    Prediction,
    carried_rename,
    context_names,
    defines,
    next_repeat_elsewhere,
    next_use_elsewhere,
    predict,
    repeat_elsewhere,
    widened,
)
from context.next_edit_model import predict_with_model

from ..positions import offset_at, position_at
from ..server import SquidServer
from ..squid_context import next_edit_references
from .feedback_commands import accept_command, model_id_of

__all__ = ["COPILOT_INLINE_EDIT", "NEXT_EDIT", "copilot_inline_edit", "line_edit", "next_edit",
           "record_offer", "register"]

log = logging.getLogger(__name__)

NEXT_EDIT = "squidcode/nextEdit"
# The request shape an existing Neovim next-edit client uses (copilot-lsp): `{edits: [{range, text,
# textDocument, command}]}`.
COPILOT_INLINE_EDIT = "textDocument/copilotInlineEdit"


def _field(params: Any, name: str, default: Any = None) -> Any:
    if isinstance(params, dict):
        return params.get(name, default)
    return getattr(params, name, default)


def on_document(ls: SquidServer, method: str, params) -> None:
    history: EditHistory = ls.edit_history
    uri = params.text_document.uri
    if method == types.TEXT_DOCUMENT_DID_OPEN:
        history.open(uri, params.text_document.text)
    elif method == types.TEXT_DOCUMENT_DID_CLOSE:
        history.close(uri)
    elif method == types.TEXT_DOCUMENT_DID_CHANGE:
        if history.text(uri) is None:
            opened = ls.open_document_text(uri)
            if opened is not None:
                history.open(uri, opened[0])  # opened before we listened: edits from here on
            return
        for change in params.content_changes:
            rng = getattr(change, "range", None)
            current = history.text(uri) or ""
            if rng is None:
                history.change(uri, None, None, change.text)
            else:
                history.change(uri, offset_at(current, rng.start), offset_at(current, rng.end), change.text)
        opened = ls.open_document_text(uri)
        if opened is not None and opened[0] != history.text(uri):
            log.warning("next edit: %s out of step with the editor; following it from here", uri)
            history.open(uri, opened[0])


async def _model_path(ls: SquidServer, uri: str, text: str, cursor: int) -> Prediction | None:
    """The model path's edit at `cursor` of `text`, debounced and cancelled as completions are: a
    newer next-edit request for the document, `$/cancelRequest` or the server stopping ends it
    between tokens; None as well when the document changed meanwhile."""
    key = f"next-edit:{uri}"  # beside the document's completions: neither cancels the other
    pending = ls.supersede.begin(key)
    try:
        await asyncio.sleep(ls.config.completion.debounce_ms / 1000)
        if not ls.supersede.is_current(key, pending) or ls.stopping.is_set():
            return None
        runtime = await ls.model_ready()  # loaded as for a completion, if nothing asked for it yet
        if runtime is None or ls.edit_history.text(uri) != text or not ls.supersede.is_current(key, pending):
            return None
        # The edits and text as they are now; the history goes on changing while the model works.
        edits = ls.edit_history.edits(uri)

        def stop() -> bool:
            return pending.cancelled.is_set() or ls.stopping.is_set()

        with foreground():  # background work (indexing, the repo map) pauses, as for a completion
            work = ls.run_model_work(_predict_with_model, ls, uri, runtime, edits, text, cursor, stop)
            found = await work if work is not None else None
        return found if ls.edit_history.text(uri) == text and not stop() else None
    except asyncio.CancelledError:
        pending.cancelled.set()
        raise
    finally:
        ls.supersede.finish(key, pending)


def _predict_with_model(ls, uri: str, runtime, edits, text: str, cursor: int, stop) -> Prediction | None:
    """The model path on the model's thread, with the related code a completion here would read
    (Squid caches, made on this thread as a completion's are; none with squid.enabled off), their
    background encoders held off meanwhile."""
    references = next_edit_references(ls, uri, runtime)
    try:
        with references.foreground() if references is not None else contextlib.nullcontext():
            return predict_with_model(runtime, edits, text, cursor, stop, references)
    except GenerationCancelled:
        return None


# Files read, at most, looking for the next one a rename goes on in (each read once, cut at the index's
# file size limit).
ELSEWHERE_FILES = 200


def elsewhere(ls: SquidServer, uri: str, passed: frozenset[str] = frozenset()
              ) -> tuple[str, str, int | None, Prediction] | None:
    """The edit just made in `uri` carried to the next other file it applies in: (that file's uri,
    its text, its version when open, the edit); None when there is none. A rename other modules see
    (`context.next_edit.carried_rename`) goes to the files that import the name or define it; a
    repeat with no place left in its file (`repeat_elsewhere`) to the same text between the same
    neighbours in a file of the same kind. Open documents first (as the editor holds them), then, by
    path, the workspace files the index says use (or define) the names. A rename of an imported
    name goes on only when the project defines it (an open file or the index). Not in the files of
    `passed` (uris whose offer the user waved off). Runs off the event loop (it reads files)."""
    here = to_fs_path(uri)
    documents = [(other, to_fs_path(other) or other, document)
                 for other, document in list(ls.workspace.text_documents.items())]
    rename = carried_rename(ls.edit_history, uri)
    repeat = repeat_elsewhere(ls.edit_history, uri) if rename is None else None
    if rename is None and repeat is None:
        return None
    service = ls.index_service
    paths, defining = set(), set()
    if rename is not None:
        # The open files that hold the new name (where the developer has been renaming) say which
        # modules it comes from: a rename carried on from a file that imports it reaches their importers.
        rename = widened(rename, [(path, document.source) for _, path, document in documents])
        names = [rename.old]
    else:
        names = context_names(repeat)[:3]  # the call or attribute the change sits in, nearest first
    if service is not None:
        try:
            for name in names:
                paths.update(service.store.paths_referencing(name, ELSEWHERE_FILES))
            if rename is not None:  # and where it is defined (a use renamed first: the way back)
                pair = (rename.old, rename.new)
                defining = {row.path for row in service.store.symbols_named(list(pair), ELSEWHERE_FILES)
                            if row.name in pair}
        except Exception as exc:  # noqa: BLE001 - an unreadable index costs the suggestion, not the request
            log.warning("next edit: the index could not say which files use %s: %s", names, exc)
    if rename is not None and not rename.at_definition and not defining and not any(
            defines(document.source, name) for _, path, document in documents
            if path.endswith((".py", ".pyi")) for name in (rename.old, rename.new)):
        return None  # an imported name the project does not define (`typing.Dict`): not its rename
    kind = (".py", ".pyi") if rename is not None else (Path(here or uri).suffix or "\0",)

    def find(text: str, path: str) -> Prediction | None:
        if rename is not None:
            return next_use_elsewhere(rename, text, path)
        return next_repeat_elsewhere(repeat, text)

    open_paths = set()
    for other, path, document in documents:
        open_paths.add(path)
        if other == uri or path == here or not path.endswith(kind) or other in passed:
            continue
        found = find(document.source, path)
        if found is not None:
            return other, document.source, document.version, found
    limit = service.config.max_file_bytes if service is not None else 0
    roots = [root.resolve() for root in ls.workspace_roots]
    for path in sorted(paths | defining):
        if path in open_paths or path == here or not path.endswith(kind) or from_fs_path(path) in passed:
            continue
        if not any(Path(path).resolve().is_relative_to(root) for root in roots):
            continue  # made a link out of the workspace since it was indexed: never read, never edited
        try:
            with open(path, "rb") as handle:
                data = handle.read(limit + 1)
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # gone, unreadable or not text since it was indexed
        if len(data) > limit or "\0" in text:
            continue
        found = find(text, path)
        if found is not None:
            return from_fs_path(path), text, None, found
    return None


def _dismissed(params: Any, uri: str, text: str) -> tuple[list[tuple[int, int]], frozenset[str]]:
    """The places of a request's `dismissed` (`Location`s offered before and waved off): spans of
    `text` (the document `uri`), and the other documents named. Malformed entries are left out."""
    spans, others = [], set()
    for place in _field(params, "dismissed") or ():
        where, rng = _field(place, "uri"), _field(place, "range")
        if not isinstance(where, str):
            continue
        if where != uri:
            others.add(where)
            continue
        try:
            start, end = (types.Position(int(_field(_field(rng, key), "line")), int(_field(_field(rng, key),
                                                                                         "character")))
                          for key in ("start", "end"))
        except (TypeError, ValueError):
            continue
        spans.append((offset_at(text, start), offset_at(text, end)))
    return spans, frozenset(others)


async def next_edit(ls: SquidServer, params: Any) -> dict:
    """The answer to `squidcode/nextEdit` for `{textDocument: {uri, version?}, position,
    dismissed?}`: the deterministic path's edit, else with `completion.next_edit_model` the model
    path's; not at a place of `dismissed` (the one after it instead), nor in another file named there."""
    document = _field(params, "textDocument") or _field(params, "text_document")
    position = _field(params, "position")
    uri = _field(document, "uri")
    text = ls.edit_history.text(uri) if uri else None
    if text is None or position is None:
        return {"edits": []}
    cursor = offset_at(text, types.Position(int(_field(position, "line", 0)),
                                            int(_field(position, "character", 0))))
    version = _field(document, "version")
    dismissed, passed = _dismissed(params, uri, text)
    if (dismissed or passed) and ls.feedback is not None:
        ls.feedback.dismiss_shown(uri, "next_edit", "waved off")  # the one shown, as the user said
    found = predict(ls.edit_history, uri, cursor, dismissed)
    if found is None:
        other = await asyncio.to_thread(elsewhere, ls, uri, passed)
        if other is not None:
            uri, text, version, found = other
    if found is None and ls.config.completion.next_edit_model and ls.edit_history.edits(uri):
        found = await _model_path(ls, uri, text, cursor)
        if found is not None and any(start < found.end and found.start < end or start == found.start
                                     for start, end in dismissed):
            found = None  # the model's rewrite lands on a place waved off
    if found is None:
        return {"edits": []}
    start, end = position_at(text, found.start), position_at(text, found.end)
    command = accept_command(record_offer(ls, uri, text, found), found.text)
    return {"edits": [{
        "range": {"start": {"line": start.line, "character": start.character},
                  "end": {"line": end.line, "character": end.character}},
        "newText": found.text, "kind": found.kind,
        "textDocument": {"uri": uri, "version": version},
        "command": {"title": command.title, "command": command.command, "arguments": command.arguments},
    }]}


def line_edit(ls: SquidServer, uri: str, position: types.Position) -> tuple[str, Prediction] | None:
    """The document's text and the deterministic path's next edit on the cursor's line (an inline
    completion item can replace text there), the first from the line's start; else None."""
    text = ls.edit_history.text(uri)
    if text is None:
        return None
    # From the line's start: an occurrence left of the cursor is this line's edit too.
    found = predict(ls.edit_history, uri, offset_at(text, types.Position(position.line, 0)))
    if found is None or "\n" in found.text or position_at(text, found.start).line != position.line:
        return None
    return (text, found) if position_at(text, found.end).line == position.line else None


def record_offer(ls: SquidServer, uri: str, text: str, found: Prediction) -> str | None:
    """Record the edit offered on `text` as a `next_edit` episode; its id, or None (recording off,
    or failed: the edit is offered all the same)."""
    recorder = ls.feedback
    if recorder is None:
        return None
    opened = ls.open_document_text(uri)
    start = position_at(text, found.start)
    extra, prompt = {"next_edit_kind": found.kind}, ""
    if found.answer is not None:
        # What the model read and wrote: the trainer prompts it the same way and scores its rewrites
        # against the region as the developer kept it (`feedback.train.store_source`).
        answer = found.answer
        prompt = answer.prompt
        # (the region in two parts around the replaced text: redaction may change their lengths)
        extra |= {"region_before": text[answer.start:found.start], "region_after": text[found.end:answer.end],
                  "rewrite": answer.rewrite}
    try:
        return recorder.record_completion_episode(
            uri=uri, position=(start.line, start.character), output=found.text, prompt_text=prompt,
            model_id=model_id_of(ls) if found.kind == "model" else "squidcode.next_edit.deterministic",
            adapter_id=getattr(ls.runtime, "adapter_id", None) if found.kind == "model" else None,
            language=opened[1] if opened else None, kind="next_edit", replaces=text[found.start:found.end],
            extra=extra)
    except Exception:  # noqa: BLE001 - feedback must never cost the user a suggestion
        log.exception("feedback: could not record a next-edit suggestion")
        return None


async def copilot_inline_edit(ls: SquidServer, params: Any) -> dict:
    """`next_edit` in the shape of `textDocument/copilotInlineEdit` (its accept command included), in
    the asking document only: that client shows an edit in the buffer it asked from, so one in
    another file (a rename carried on) would be drawn at the wrong place."""
    document = _field(params, "textDocument") or _field(params, "text_document")
    uri = _field(document, "uri")
    edits = [e for e in (await next_edit(ls, params))["edits"] if e["textDocument"]["uri"] == uri]
    return {"edits": [{"range": e["range"], "text": e["newText"], "textDocument": e["textDocument"],
                       "command": e["command"]} for e in edits]}


def register(server: SquidServer) -> None:
    server.document_listeners.append(lambda method, params: on_document(server, method, params))

    @server.feature(NEXT_EDIT)
    async def next_edit_request(ls: SquidServer, params: Any) -> dict:
        return await next_edit(ls, params)

    @server.feature(COPILOT_INLINE_EDIT)
    async def copilot_inline_edit_request(ls: SquidServer, params: Any) -> dict:
        return await copilot_inline_edit(ls, params)
