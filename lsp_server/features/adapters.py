"""Hot swap of the trained adapter, and `squidcode.train.status`.

A watcher polls the promoted-adapter pointer the trainer writes; when it names another adapter the
swap runs on the model worker (so it queues behind a completion in progress, and applying takes
the runtime's generation lock), and no restart is needed. The command reports the trainer's status
file together with the adapter the running model uses.

With `feedback.team_adapter` on, a second loop asks the team's collector for its newest published
adapter every `feedback.team_adapter_interval_s` and installs and promotes one it does not have
(`feedback.team_adapters.pull_team_adapter`); the watcher above then swaps it in.
"""

from __future__ import annotations

import asyncio
import logging
import time

from lsprotocol import types

from context.errors import AdapterError, FeedbackUploadError
from feedback.team_adapters import pull_team_adapter
from feedback.train.adapters import AdapterRegistry, read_pointer, sync_runtime_adapter
from feedback.train.scheduler import spawn_background
from feedback.train.status import read_status, train_paths
from feedback.upload import collector_tls

from ..server import SquidServer

__all__ = ["POLL_S", "TRAIN_STATUS_COMMAND", "register", "start_adapter_watch", "train_status"]

log = logging.getLogger(__name__)

POLL_S = 1.0
PULL_TIMEOUT_S = 10.0
TRAIN_STATUS_COMMAND = "squidcode.train.status"


def train_status(ls: SquidServer) -> dict:
    paths = train_paths(ls.config)
    status = read_status(paths.status)
    return {
        "state": status.get("state"), "step": status.get("step"), "steps": status.get("steps"),
        "reward": status.get("reward"), "kl": status.get("kl"), "message": status.get("message"),
        "adapter": read_pointer(paths.adapters).get("current"),
        "loadedAdapter": ls.runtime.adapter_id if ls.runtime else None,
    }


async def _watch(ls: SquidServer) -> None:
    # A promoted adapter that did not load is not retried until the pointer changes.
    nothing_failed = object()
    failed: object = nothing_failed
    while not ls.stopping.is_set():
        await asyncio.sleep(POLL_S)
        runtime = ls.runtime
        if runtime is None or ls.stopping.is_set():
            continue
        root = train_paths(ls.config).adapters
        wanted = read_pointer(root).get("current")
        if wanted == runtime.adapter_id or wanted == failed:
            continue
        work = ls.run_model_work(sync_runtime_adapter, runtime, root)
        if work is None:
            return  # stopping
        try:
            changed = await work
        except AdapterError as exc:
            failed = wanted
            log.error("promoted adapter not applied: %s", exc)
            ls.window_show_message(types.ShowMessageParams(
                type=types.MessageType.Error, message=f"squidcode: {exc}; using the base model"))
            continue
        failed = nothing_failed
        if changed:
            log.info("now generating with adapter %s", runtime.adapter_id or "none (base model)")


async def _pull_team_adapters(ls: SquidServer) -> None:
    """Poll the team's collector for a newer published adapter while `feedback.team_adapter` is on."""
    warned, next_at = None, 0.0
    while not ls.stopping.is_set():
        await asyncio.sleep(POLL_S)
        feedback = ls.config.feedback
        if not (feedback.team_adapter and feedback.endpoint and feedback.token) or time.monotonic() < next_at:
            continue
        next_at = time.monotonic() + feedback.team_adapter_interval_s
        registry = AdapterRegistry(train_paths(ls.config).adapters)
        try:
            # A short timeout: a pull still in flight when the editor quits holds the exit that long.
            installed = await asyncio.to_thread(pull_team_adapter, feedback.endpoint, feedback.token,
                                                registry, PULL_TIMEOUT_S, collector_tls(feedback.ca_file))
        except (AdapterError, FeedbackUploadError) as exc:
            if str(exc) != warned:  # said once, not at every poll
                log.warning("team adapter: %s", exc)
                warned = str(exc)
            continue
        warned = None
        if installed:
            log.info("team adapter installed as %s", installed)


def start_adapter_watch(ls: SquidServer) -> None:
    """Start the pointer watcher once per server (called when the server is initialized), the team
    adapter poller, and the background trainer when the user turned it on (`train.enabled`)."""
    if getattr(ls, "_adapter_watch", None) is None:
        ls._adapter_watch = asyncio.ensure_future(_watch(ls))
        ls._team_adapter_pull = asyncio.ensure_future(_pull_team_adapters(ls))
    if ls.config.train.enabled:
        root = ls.workspace_roots[0] if ls.workspace_roots else None
        try:
            pid = spawn_background(config_root=root, paths=train_paths(ls.config))
        except OSError as exc:
            log.error("cannot start the background trainer: %s", exc)
        else:
            log.info("background trainer running (pid %d)", pid)


def register(server: SquidServer) -> None:
    @server.command(TRAIN_STATUS_COMMAND)
    async def status_command(ls: SquidServer, *args) -> dict:
        return train_status(ls)
