"""A few tokens through every layer on the CPU in one call (`cpu_decode.c`), for the lean engine:
decoding steps, prompt-lookup verify passes and short re-prefills.

`FusedDecodeStep.build(engine_like)` returns a step runner for a float32 Llama-style decoder on the
CPU, or None with the reason logged when it cannot run here (no C compiler, another dtype or device,
LoRA paths or quantized copies). The shared library is compiled on first use with the machine's C
compiler (`$CC`, else `cc`) into squidcode's cache, keyed by the source, the compiler and the flags;
a build that fails is not retried in the same process, and a cached file that does not load
is built again. The step reads the model's own weight
tensors and writes the caller's KV cache in place.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

__all__ = ["FusedDecodeStep", "library_path", "load_library", "reset"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_decode.c")
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-shared", "-fPIC", "-std=c11")
_WEIGHTS_PER_LAYER = ("attn_norm", "q", "k", "v", "o", "mlp_norm", "gate", "up", "down")

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_failure: str | None = None


def _cache_root() -> Path:
    root = os.environ.get("SQUIDCODE_KERNEL_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "squidcode" / "kernels"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC") or "cc")


def library_path(compiler: str) -> Path:
    """Where the library built by `compiler` from the current source lives."""
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode() + version.encode()).hexdigest()
    return _cache_root() / f"cpu_decode-{digest[:16]}.so"


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        staged = Path(tmp) / target.name
        proc = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(staged), "-lm"],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {proc.stderr.strip()[-2000:]}")
        os.replace(staged, target)  # atomic: a concurrent process sees the whole library or none


def reset() -> None:
    """Forget the loaded library and any failure, so the next `load_library` tries again."""
    global _library, _failure
    with _lock:
        _library = _failure = None


def load_library() -> ctypes.CDLL | None:
    """The compiled step (built now if needed), or None when this machine cannot build it."""
    global _library, _failure
    with _lock:
        if _library is not None or _failure is not None:
            return _library
        compiler = _compiler()
        if compiler is None:
            _failure = f"no C compiler ({os.environ.get('CC') or 'cc'}) on PATH"
        else:
            target = library_path(compiler)
            try:
                if not target.exists():
                    _build(compiler, target)
                try:
                    lib = ctypes.CDLL(str(target))
                except OSError as exc:  # a truncated or foreign file under our name: build it again
                    log.warning("rebuilding the fused decode step (%s did not load: %s)", target, exc)
                    _build(compiler, target)
                    lib = ctypes.CDLL(str(target))
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                _failure = f"cannot build the fused decode step: {exc}"
            else:
                i64p, f32p, c_int, c_float = (ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p,
                                              ctypes.c_int, ctypes.c_float)
                lib.squid_decode_step.restype = c_int
                lib.squid_decode_step.argtypes = [
                    i64p, c_int, c_int, c_int, c_int, c_int, c_int, c_float, c_float, c_int,
                    f32p, c_int, f32p, f32p, f32p, f32p, c_int, c_int, f32p, c_int,
                ]
                lib.squid_decode_scratch.restype = ctypes.c_int64
                lib.squid_decode_scratch.argtypes = [c_int] * 8
                _library = lib
        if _failure is not None:
            log.info("decoding without the fused CPU step: %s", _failure)
        return _library


class FusedDecodeStep:
    """Runs a few tokens through every decoder layer with `cpu_decode.c`."""

    def __init__(self, lib: ctypes.CDLL, layers: list[dict[str, torch.Tensor]], *, hidden: int, inter: int,
                 heads: int, kv_heads: int, head_dim: int, eps: float, scaling: float, transposed: bool,
                 cos: torch.Tensor, sin: torch.Tensor):
        self._lib = lib
        self._tensors = [layer[name] for layer in layers for name in _WEIGHTS_PER_LAYER]  # kept alive
        pointers = [t.data_ptr() for t in self._tensors]
        self._pointers = (ctypes.c_int64 * len(pointers))(*pointers)
        self.layers, self.hidden, self.inter = len(layers), hidden, inter
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.eps, self.scaling, self.transposed = eps, scaling, transposed
        self._cos, self._sin = cos, sin

    @classmethod
    def build(cls, layers: list[dict[str, torch.Tensor]], **shape) -> FusedDecodeStep | None:
        """A runner for these per-layer weights (`_WEIGHTS_PER_LAYER` names, the projections as
        [out, in] tensors), or None when they are not float32 CPU tensors in one of the two layouts."""
        tensors = [layer[name] for layer in layers for name in _WEIGHTS_PER_LAYER]
        if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in tensors):
            return None
        matrices = [layer[name] for layer in layers for name in _WEIGHTS_PER_LAYER if name.endswith(
            ("q", "k", "v", "o", "gate", "up", "down"))]
        if all(m.is_contiguous() for m in matrices):
            transposed = False
        elif all(m.t().is_contiguous() for m in matrices):
            transposed = True
        else:
            return None
        if not all(layer[n].is_contiguous() for layer in layers for n in ("attn_norm", "mlp_norm")):
            return None
        lib = load_library()
        if lib is None:
            return None
        return cls(lib, layers, transposed=transposed, **shape)

    def __call__(self, hidden: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, position: int,
                 threads: int | None = None) -> torch.Tensor:
        """`hidden` [T, hidden] (the tokens' embeddings, float32, contiguous) through every layer,
        in place; keys/values [layers, kv_heads, capacity, head_dim] get positions `position`..
        `position + T - 1`, and token t attends to every position up to its own."""
        capacity = keys.shape[2]
        tokens = hidden.shape[0] if hidden.dim() == 2 else 1
        if not (keys.is_contiguous() and values.is_contiguous() and hidden.is_contiguous()):
            raise ValueError("the fused step needs contiguous hidden states and KV cache")
        threads = threads or torch.get_num_threads()
        need = self._lib.squid_decode_scratch(tokens, self.hidden, self.inter, self.heads, self.kv_heads,
                                              self.head_dim, capacity, threads)
        scratch = torch.empty(need, dtype=torch.float32)  # per call: callers may run in two threads
        code = self._lib.squid_decode_step(
            self._pointers, self.layers, self.hidden, self.inter, self.heads, self.kv_heads, self.head_dim,
            self.eps, self.scaling, int(self.transposed), hidden.data_ptr(), tokens, self._cos.data_ptr(),
            self._sin.data_ptr(), keys.data_ptr(), values.data_ptr(), capacity, position,
            scratch.data_ptr(), threads,
        )
        if code != 0:
            raise ValueError(f"the fused step refused positions {position}..{position + tokens - 1} of a "
                             f"{capacity}-position cache")
        return hidden
