"""squidcode as a language server *client*: the agent asks the workspace's real language servers
(basedpyright, ruff, and configured ones such as gopls) for diagnostics, definitions, references,
hovers, symbols and renames, with its own unsaved and proposed edits sent as open documents.

`jsonrpc` frames the messages, `client` runs one server, `servers` keeps a workspace's servers
(lazy start, restart after a crash, degraded with a note), `queries` turns answers into records,
`specs` says which servers exist and where their commands are.
"""

from .client import LanguageServerClient
from .positions import apply_text_edits, path_to_uri, uri_to_path
from .queries import (
    DocumentSymbol,
    Location,
    LspDiagnostic,
    definition,
    document_symbols,
    file_diagnostics,
    hover,
    introduced_errors,
    lsp_position,
    references,
    rename_edit,
)
from .servers import LanguageServers, close_shared_language_servers, shared_language_servers
from .specs import (
    KNOWN_COMMANDS,
    PYTHON_SERVERS,
    TY,
    TYPE_CHECKERS,
    ServerFound,
    ServerSpec,
    find_servers,
    python_servers,
    server_specs,
)

__all__ = [
    "LanguageServerClient",
    "LanguageServers",
    "shared_language_servers",
    "close_shared_language_servers",
    "ServerSpec",
    "ServerFound",
    "PYTHON_SERVERS",
    "TY",
    "TYPE_CHECKERS",
    "python_servers",
    "KNOWN_COMMANDS",
    "server_specs",
    "find_servers",
    "LspDiagnostic",
    "Location",
    "DocumentSymbol",
    "file_diagnostics",
    "introduced_errors",
    "definition",
    "references",
    "hover",
    "document_symbols",
    "rename_edit",
    "lsp_position",
    "apply_text_edits",
    "path_to_uri",
    "uri_to_path",
]
