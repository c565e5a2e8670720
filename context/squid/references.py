"""Which reference documents a completion reads, and composing them for the request.

Candidates, best first: the other files open in the editor (the start of each), then chunks the
repository index retrieves for the identifiers around the cursor. The current file is never a
reference: its text before the cursor is the query. Each document starts with a `# path` line so
the model can tell them apart.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from ..errors import SquidcodeError
from .compose import ComposedContext
from .service import ReferenceDocument, SquidService

__all__ = ["CompletionReferences", "file_document", "retrieval_query", "select_references"]

log = logging.getLogger(__name__)

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
_KEYWORDS = frozenset(
    "def class return import from self None True False for while with elif else pass lambda yield "
    "async await try except finally raise function const let var this new".split()
)
# A document is cut to this many characters before it is tokenized (bounded work on huge files).
_CHARS_PER_TOKEN_CEILING = 8


def retrieval_query(prefix_text: str, lines: int = 12, terms: int = 12) -> str:
    """The identifiers of the last `lines` lines before the cursor, nearest first, de-duplicated."""
    tail = prefix_text.splitlines()[-lines:]
    seen: dict[str, None] = {}
    for line in reversed(tail):
        for word in reversed(_IDENT.findall(line)):
            if word not in _KEYWORDS:
                seen.setdefault(word, None)
    return " ".join(list(seen)[:terms])


def _label(path: str, roots: list[Path]) -> str:
    for root in roots:
        try:
            return str(Path(path).relative_to(root))
        except ValueError:
            continue
    return Path(path).name


def file_document(path: str, text: str, max_tokens: int, roots: list[Path] = ()) -> ReferenceDocument:
    body = text[: max_tokens * _CHARS_PER_TOKEN_CEILING]
    return ReferenceDocument(f"# {_label(path, list(roots))}\n{body}\n", source=path)


def select_references(
    *,
    current_path: str | None,
    prefix_text: str,
    open_documents: Mapping[str, str],
    search: Callable[[str, int], list] | None,
    max_documents: int,
    max_tokens: int,
    roots: list[Path] = (),
) -> list[ReferenceDocument]:
    """Up to `max_documents` references: other open files first, then retrieved chunks."""
    chosen: list[ReferenceDocument] = []
    for path, text in open_documents.items():
        if len(chosen) >= max_documents:
            return chosen
        if path != current_path and text.strip():
            chosen.append(file_document(path, text, max_tokens, roots))
    query = retrieval_query(prefix_text)
    if search is None or not query or len(chosen) >= max_documents:
        return chosen
    try:
        hits = search(query, max_documents * 2)
    except (SquidcodeError, OSError) as exc:
        log.info("squid: retrieval for references failed (%s); going on without it", exc)
        return chosen
    taken = {doc.source for doc in chosen}
    for hit in hits:
        if len(chosen) >= max_documents:
            break
        if hit.path == current_path or hit.path in taken or not hit.text.strip():
            continue
        body = hit.text[: max_tokens * _CHARS_PER_TOKEN_CEILING]
        chosen.append(ReferenceDocument(f"# {hit.rel}:{hit.start_line}\n{body}\n", source=hit.path))
    return chosen


class CompletionReferences:
    """What a completion request hands to `agent.completion.complete`: compose its references
    (the ready ones; the rest are encoded in the background for later requests) and hold the
    background encoder off while the request runs."""

    def __init__(self, service: SquidService, *, current_path: str | None,
                 open_documents: Mapping[str, str], search: Callable[[str, int], list] | None,
                 roots: list[Path] = ()):
        self.service = service
        self.current_path = current_path
        self.open_documents = dict(open_documents)
        self.search = search
        self.roots = list(roots)

    def foreground(self):
        return self.service.foreground()

    def compose(self, prefix_text: str) -> ComposedContext | None:
        config = self.service.config
        documents = select_references(
            current_path=self.current_path, prefix_text=prefix_text, open_documents=self.open_documents,
            search=self.search, max_documents=config.max_documents, max_tokens=config.document_tokens,
            roots=self.roots,
        )
        if not documents:
            return None
        return self.service.context_for(documents)
