"""Wiring one agent run from configuration: the backend, the memory, the index; used by the CLI,
the language server and the benchmark alike."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from context.config import AgentConfig, SquidCacheConfig, SquidConfig

from .backends import Backend, LocalBackend, OpenAIBackend
from .errors import AgentError, MemoryStoreError
from .memory import MemoryStore, default_memory_path

__all__ = ["make_backend", "open_memory", "served_model", "squid_settings", "with_overrides"]

log = logging.getLogger(__name__)


def with_overrides(
    config: AgentConfig, backend: str | None = None, model: str | None = None, k: int | None = None
) -> AgentConfig:
    """`config` with the command line's (or the request's) choices applied."""
    changes = {}
    if backend:
        if backend not in ("local", "openai"):
            raise AgentError(f"unknown backend {backend!r}: use local or openai")
        changes["backend"] = backend
    if model:
        changes["model"] = model
    if k is not None:
        if not 1 <= k <= 16:
            raise AgentError(f"k must be between 1 and 16, got {k}")
        changes["k"] = k
    return replace(config, **changes)


def make_backend(agent: AgentConfig, load_runtime: Callable[[], object],
                 squid: SquidCacheConfig | None = None, squid_disk: Path | None = None) -> Backend:
    """The configured backend; `load_runtime` is only called for the local one, which composes its
    documents through Squid with `squid` (and its disk tier `squid_disk`) when given."""
    if agent.backend == "openai":
        if not agent.model:
            # Editors set only the server's URL; a server that serves one model names it itself.
            agent = replace(agent, model=served_model(agent))
        return OpenAIBackend.from_config(agent)
    return LocalBackend(load_runtime(), squid=squid, squid_disk=squid_disk)


def squid_settings(config: SquidConfig) -> tuple[SquidCacheConfig | None, Path | None]:
    """The local agent's Squid settings and disk tier, or (None, None) with `squid.enabled` off."""
    squid = config.squid
    if not squid.enabled:
        return None, None
    disk = Path(squid.cache_dir).expanduser() if squid.cache_dir else config.resolved_cache_dir() / "squid"
    return squid, disk


def served_model(agent: AgentConfig) -> str:
    """The first model an OpenAI-compatible server lists at `GET {base_url}/models`."""
    import os

    import httpx

    key = os.environ.get(agent.api_key_env) if agent.api_key_env else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = f"{agent.base_url.rstrip('/')}/models"
    try:
        response = httpx.get(url, headers=headers, timeout=min(agent.request_timeout_s, 10.0))
        response.raise_for_status()
        models = [m["id"] for m in response.json().get("data", []) if isinstance(m, dict) and m.get("id")]
    except (httpx.HTTPError, ValueError, AttributeError, TypeError) as exc:
        raise AgentError(
            f"agent.model names no model and {url} did not list one ({exc}); set agent.model"
        ) from exc
    if not models:
        raise AgentError(f"agent.model names no model and {url} lists none; set agent.model")
    log.info("agent: using %s, the model %s serves", models[0], agent.base_url)
    return models[0]


def open_memory(config: SquidConfig, root: Path) -> MemoryStore | None:
    """The workspace's note store (conventions rescanned, stale notes forgotten); None when turned off
    or unavailable (the agent works without it)."""
    if not config.agent.memory:
        return None
    try:
        memory = MemoryStore(default_memory_path(config.resolved_cache_dir()), str(root))
        memory.forget_stale(config.agent.memory_stale_days)
        memory.scan_conventions(root)
        return memory
    except MemoryStoreError as exc:
        log.warning("agent memory unavailable: %s", exc)
        return None
