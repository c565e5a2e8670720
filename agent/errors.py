"""The agent's errors, all under the project's one hierarchy (`context.errors.SquidcodeError`)."""

from context.errors import SquidcodeError

__all__ = [
    "AgentError",
    "SandboxError",
    "ToolError",
    "BackendError",
    "BackendAuthError",
    "BackendConnectionError",
    "BackendTimeoutError",
    "MemoryStoreError",
    "AgentCancelled",
    "LanguageServerError",
    "LanguageServerTimeout",
]


class AgentError(SquidcodeError):
    """The agent could not run or finish an episode."""


class SandboxError(AgentError):
    """A tool asked for something outside the sandbox (a path outside the workspace, a command)."""


class ToolError(AgentError):
    """A tool could not do what it was asked; the message is shown to the model."""


class BackendError(AgentError):
    """The model backend failed or answered something unusable."""


class BackendAuthError(BackendError):
    """The model backend refused the credentials (HTTP 401/403)."""


class BackendConnectionError(BackendError):
    """The model backend cannot be reached."""


class BackendTimeoutError(BackendError):
    """The model backend did not answer in time."""


class MemoryStoreError(AgentError):
    """The agent's note store could not be read or written."""


class AgentCancelled(AgentError):
    """The episode was cancelled by its caller."""


class LanguageServerError(AgentError):
    """A language server the agent queries is missing, stopped, or refused a request."""


class LanguageServerTimeout(LanguageServerError):
    """A language server did not answer within its timeout."""
