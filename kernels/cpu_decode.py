"""A few tokens through every layer on the CPU in one call (`cpu_decode.c`), for the lean engine:
decoding steps, prompt-lookup verify passes and short re-prefills.

`FusedDecodeStep.build(engine_like)` returns a step runner for a float32 Llama-style decoder on the
CPU, or None when it cannot run here (no C compiler, another dtype or device, LoRA paths or
quantized copies): the engine then decodes with its torch steps. The shared library is compiled on
first use with the machine's C compiler (`$CC`, else `cc`) into squidcode's cache, keyed by the
source, the flags, the compiler's version and the CPU (`-march=native` code from one machine can
die of an illegal instruction on another that shares the home directory). No compiler, a missing
source file or a failed build is logged once as a warning and not retried in the same process; a
cached file that does not load is built again. The step reads the model's own weight
tensors and writes the caller's KV cache in place.

Where every projection's weights are exactly `offset + step * q` in groups of 32 inputs with q in
0..15 (the GGUF Q4_1 scheme: the embedded model's float32 weights were dequantized from it),
`build(..., q4=True)` packs them into 4-bit codes (`pack_q4`, with float16 steps and offsets, as
GGUF stores them) and the step reads those: the same weights, a sixth of the bytes per token.
Packing is checked value by value and remembered per weight tensor (and its version), so engines
built again on the same model do not pack again. On a CPU with AVX-512 VNNI or AVX2 the codes meet the
activations in integer products, each activation rounded to 15 bits (`activation_bits`): the top
token is the float32 model's but at near ties, a decoding step about a fifth faster.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path

import torch

__all__ = ["FusedDecodeStep", "FusedHead", "cache_root", "compiler", "cpu_identity", "library_path",
           "load_library", "loaded_library", "pack_q4", "pack_q8", "prune_stale", "reset",
           "unavailable_reason"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_decode.c")
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-ffp-contract=fast", "-fopenmp", "-shared",
         "-fPIC", "-std=c11")
_WEIGHTS_PER_LAYER = ("attn_norm", "q", "k", "v", "o", "mlp_norm", "gate", "up", "down")
_PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")
LAYOUT_ROWS, LAYOUT_TRANSPOSED, LAYOUT_Q4, LAYOUT_INTEGER = 0, 1, 2, 4  # as in cpu_decode.c
Q4_GROUP = 32

# (id(weight tensor), scheme) -> (a weak reference to it, its version when packed, the packing); an
# entry goes when its tensor does (tensors compare by value, so a WeakKeyDictionary cannot hold them)
_packed: dict[tuple[int, str], tuple[weakref.ref, int, tuple | None]] = {}
_packed_lock = threading.Lock()


def _forget(key: tuple[int, str], ref: weakref.ref) -> None:
    with _packed_lock:
        if key in _packed and _packed[key][0] is ref:
            del _packed[key]


def _remembered(weight: torch.Tensor, scheme: str, pack):
    key = (id(weight), scheme)
    with _packed_lock:
        known = _packed.get(key)
        if known is not None and known[0]() is weight and known[1] == weight._version:
            return known[2]
    packed = pack(weight.detach())
    with _packed_lock:
        _packed[key] = (weakref.ref(weight, lambda ref: _forget(key, ref)), weight._version, packed)
    return packed


def pack_q4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(codes uint8 [out, in / 2], steps [out, in / 32], offsets [out, in / 32], both float16) that
    give back `weight` [out, in] exactly as offset + step * q, or None where some value is not on its
    group's 16-step grid or a step or offset is not a float16 (weights that were never 4-bit)."""
    return _remembered(weight, "q4", _pack_q4)


def pack_q8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(codes int8 [out, in], steps [out, in / 32] float16) that give back `weight` [out, in] exactly
    as step * q with q in -127..127 (GGUF Q8_0), or None where that is not exact."""
    return _remembered(weight, "q8", _pack_q8)


def _pack_q8(weight: torch.Tensor):
    out, inputs = weight.shape
    if weight.dtype != torch.float32 or inputs % Q4_GROUP:
        return None
    groups = weight.contiguous().view(out, inputs // Q4_GROUP, Q4_GROUP)
    step = groups.abs().amax(-1, keepdim=True) / 127
    codes = torch.round(groups / step.clamp(min=torch.finfo(torch.float32).tiny)).clamp(-127, 127)
    if not torch.equal(codes * step, groups) or not _is_half(step):
        return None
    return codes.to(torch.int8).reshape(out, inputs).contiguous(), step.half().reshape(out, -1).contiguous()


def _pack_q4(weight: torch.Tensor):
    out, inputs = weight.shape
    if weight.dtype != torch.float32 or inputs % Q4_GROUP:
        return None
    groups = weight.contiguous().view(out, inputs // Q4_GROUP, Q4_GROUP)
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    step = (high - low) / 15
    codes = torch.round((groups - low) / step.clamp(min=torch.finfo(torch.float32).tiny)).clamp(0, 15)
    if not torch.equal(low + codes * step, groups):  # step * q is exact in float32, the sum rounds once
        return None
    if not (_is_half(step) and _is_half(low)):
        return None
    codes = codes.to(torch.uint8)
    half = Q4_GROUP // 2
    packed = (codes[..., :half] | (codes[..., half:] << 4)).reshape(out, inputs // 2).contiguous()
    return packed, step.half().reshape(out, -1).contiguous(), low.half().reshape(out, -1).contiguous()


def _is_half(values: torch.Tensor) -> bool:
    """Every value is a float16 exactly (GGUF's scales are; recovered ones from other weights may not be)."""
    return bool(torch.equal(values.half().float(), values))

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_library_file: Path | None = None
_failure: str | None = None


def cache_root() -> Path:
    """Where built libraries (and the runtime's per-machine tuning, `context.tuning`) are cached:
    `$SQUIDCODE_KERNEL_CACHE`, else squidcode's cache folder."""
    root = os.environ.get("SQUIDCODE_KERNEL_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "squidcode" / "kernels"


def compiler() -> str | None:
    """The C compiler the step is built with (`$CC`, else `cc`), or None when it is not on PATH."""
    return shutil.which(os.environ.get("CC") or "cc")


# /proc/cpuinfo fields that decide which instructions `-march=native` may emit: x86 names the
# model and its flags, ARM its implementer, part and features.
_CPUINFO_FIELDS = ("model name", "flags", "cpu implementer", "cpu part", "features")


def cpu_identity() -> str:
    """What `-march=native` compiles for: the CPU's model and instruction-set flags."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:  # not Linux
        text = ""
    first = text.split("\n\n", 1)[0]  # every processor of a machine is alike; the first is enough
    fields = []
    for line in first.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() in _CPUINFO_FIELDS:
            fields.append(f"{name.strip().lower()}={value.strip()}")
    if not fields:
        fields = [f"processor={platform.processor()}"]
    return "; ".join([f"machine={platform.machine()}", *fields])


def library_path(compiler: str) -> Path:
    """Where the library built by `compiler` from the current source for this CPU lives.

    Raises OSError when the source is missing (an installation without `cpu_decode.c`)."""
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    parts = [SOURCE.read_bytes(), " ".join(FLAGS).encode(), version.encode(), cpu_identity().encode()]
    key = b"\0".join(parts)
    return cache_root() / f"cpu_decode-{hashlib.sha256(key).hexdigest()[:16]}.so"


STALE_S = 30 * 86400  # a built library nobody loaded for this long is removed at the next build


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        staged = Path(tmp) / target.name
        proc = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(staged), "-lm"],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {proc.stderr.strip()[-2000:]}")
        os.replace(staged, target)  # atomic: a concurrent process sees the whole library or none
    prune_stale(target)


# What is cached here: built libraries, and the costs `context.tuning` measured with one of them.
_CACHED = ("cpu_decode-*.so", "tuning-*.json")


def prune_stale(keep: Path, now: float | None = None) -> list[Path]:
    """Remove the libraries and tuning files beside `keep` that no process loaded for `STALE_S`
    (builds of older sources or compilers; another CPU sharing this cache keeps its own fresh by
    loading it)."""
    now = time.time() if now is None else now
    removed = []
    for old in (path for pattern in _CACHED for path in keep.parent.glob(pattern)):
        try:
            if old != keep and now - old.stat().st_mtime > STALE_S:
                old.unlink()
                removed.append(old)
        except OSError:
            continue  # gone already, or not ours to remove
    return removed


def reset() -> None:
    """Forget the loaded library and any failure, so the next `load_library` tries again."""
    global _library, _library_file, _failure
    with _lock:
        _library = _library_file = _failure = None


def loaded_library() -> Path | None:
    """The file `load_library` loaded (its name says which source, flags, compiler and CPU it was
    built for), or None."""
    return _library_file


def unavailable_reason() -> str | None:
    """Why the last `load_library` returned None (None when it loaded, or was not tried yet)."""
    return _failure


def load_library() -> ctypes.CDLL | None:
    """The compiled step (built now if needed), or None when this machine cannot build it.

    Never raises: every reason not to use the step is logged once, as a warning, and the callers
    decode with torch."""
    global _library, _library_file, _failure
    with _lock:
        if _library is not None or _failure is not None:
            return _library
        cc = compiler()
        if not SOURCE.is_file():
            _failure = f"its source {SOURCE} is not installed"
        elif cc is None:
            _failure = f"no C compiler ({os.environ.get('CC') or 'cc'}) on PATH"
        else:
            try:
                target = library_path(cc)
                if not target.exists():
                    _build(cc, target)
                try:
                    lib = ctypes.CDLL(str(target))
                    with contextlib.suppress(OSError):
                        os.utime(target)  # loaded now: not stale (`prune_stale`)
                except OSError as exc:  # a truncated or foreign file under our name: build it again
                    log.warning("rebuilding the fused decode step (%s did not load: %s)", target, exc)
                    _build(cc, target)
                    lib = ctypes.CDLL(str(target))
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                _failure = f"cannot build it: {exc}"
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
                lib.squid_q4_activation_bits.restype = c_int
                lib.squid_q4_activation_bits.argtypes = []
                lib.squid_q4_integer_products.restype = ctypes.c_char_p
                lib.squid_q4_integer_products.argtypes = []
                lib.squid_head_q8.restype = c_int
                lib.squid_head_q8.argtypes = [f32p, f32p, f32p, f32p, c_int, c_int, c_int, c_int]
                _library, _library_file = lib, target
        if _failure is not None:
            log.warning("decoding with torch instead of the fused CPU step (slower): %s", _failure)
        return _library


class FusedDecodeStep:
    """Runs a few tokens through every decoder layer with `cpu_decode.c`."""

    def __init__(self, lib: ctypes.CDLL, layers: list[dict[str, torch.Tensor]], *, hidden: int, inter: int,
                 heads: int, kv_heads: int, head_dim: int, eps: float, scaling: float, layout: int,
                 cos: torch.Tensor, sin: torch.Tensor, packed: list[dict[str, tuple]] | None = None,
                 integer: bool = True):
        """`packed`: per layer, each projection's `pack_q4` codes, steps and offsets (layout Q4).
        `integer`: with them, integer products where the CPU has them (`activation_bits`)."""
        self._lib = lib
        self._tensors = [layer[name] for layer in layers for name in _WEIGHTS_PER_LAYER]  # kept alive
        table = [0] * (3 * len(_WEIGHTS_PER_LAYER))
        pointers = []
        for index, layer in enumerate(layers):
            for slot, name in enumerate(_WEIGHTS_PER_LAYER):
                if packed is not None and name in _PROJECTIONS:
                    codes, steps, offsets = packed[index][name]
                    self._tensors += [codes, steps, offsets]
                    table[slot], table[9 + slot], table[18 + slot] = (
                        codes.data_ptr(), steps.data_ptr(), offsets.data_ptr())
                else:
                    table[slot] = layer[name].data_ptr()
            pointers += table
        self._pointers = (ctypes.c_int64 * len(pointers))(*pointers)
        self.layers, self.hidden, self.inter = len(layers), hidden, inter
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.eps, self.scaling, self.layout = eps, scaling, layout
        self.transposed = layout == LAYOUT_TRANSPOSED
        # 4-bit codes meet activations rounded to 15 bits in integer products where the CPU has
        # AVX-512 VNNI or AVX2 (`gemm_q4x8`), else float32 ones (0)
        self.activation_bits = lib.squid_q4_activation_bits() if layout == LAYOUT_Q4 and integer else 0
        # the instructions those products run in ("AVX-512 VNNI", "AVX2"), "" without them
        self.integer_products = lib.squid_q4_integer_products().decode() if self.activation_bits else ""
        self._cos, self._sin = cos, sin

    @classmethod
    def build(cls, layers: list[dict[str, torch.Tensor]], q4: bool = False, integer: bool = True,
              **shape) -> FusedDecodeStep | None:
        """A runner for these per-layer weights (`_WEIGHTS_PER_LAYER` names, the projections as
        [out, in] tensors), or None when they are not float32 CPU tensors in one of the two layouts.
        `q4`: read 4-bit codes instead where every projection packs exactly (`pack_q4`); `integer`:
        multiply those in integers where the CPU can (float32 products otherwise)."""
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
        if q4:
            packed = [{name: pack_q4(layer[name]) for name in _PROJECTIONS} for layer in layers]
            if all(p is not None for layer in packed for p in layer.values()):
                return cls(lib, layers, layout=LAYOUT_Q4, packed=packed, integer=integer, **shape)
            log.info("the fused step reads float32 weights: not every projection is exactly 4-bit")
        return cls(lib, layers, layout=LAYOUT_TRANSPOSED if transposed else LAYOUT_ROWS, **shape)

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
            self.eps, self.scaling, self.layout | (LAYOUT_INTEGER if self.activation_bits else 0),
            hidden.data_ptr(), tokens, self._cos.data_ptr(),
            self._sin.data_ptr(), keys.data_ptr(), values.data_ptr(), capacity, position,
            scratch.data_ptr(), threads,
        )
        if code != 0:
            raise ValueError(f"the fused step refused positions {position}..{position + tokens - 1} of a "
                             f"{capacity}-position cache")
        return hidden


class FusedHead:
    """The output projection from exact 8-bit codes of its weights (`pack_q8`), every logit exact:
    half the bytes of the bfloat16 copy greedy steps read otherwise, and no shortlist to check."""

    def __init__(self, lib: ctypes.CDLL, codes: torch.Tensor, steps: torch.Tensor):
        self._lib, self._codes, self._steps = lib, codes, steps
        self.vocab, self.hidden = codes.shape

    @classmethod
    def build(cls, weight: torch.Tensor) -> FusedHead | None:
        """A head for `weight` [vocab, hidden], or None where it is not float32 on the CPU or not
        exactly 8-bit, or the library cannot be built."""
        if weight.device.type != "cpu" or weight.dtype != torch.float32 or weight.dim() != 2:
            return None
        packed = pack_q8(weight)
        if packed is None:
            return None
        lib = load_library()
        return None if lib is None else cls(lib, *packed)

    def __call__(self, hidden: torch.Tensor, threads: int | None = None) -> torch.Tensor:
        """Logits [..., vocab] (float32) for hidden states [..., hidden]."""
        shape = hidden.shape
        x = hidden.reshape(-1, self.hidden).float().contiguous()
        logits = torch.empty(x.shape[0], self.vocab, dtype=torch.float32)
        code = self._lib.squid_head_q8(self._codes.data_ptr(), self._steps.data_ptr(), x.data_ptr(),
                                       logits.data_ptr(), x.shape[0], self.vocab, self.hidden,
                                       threads or torch.get_num_threads())
        if code != 0:
            raise ValueError(f"the fused head refused {x.shape[0]} rows of {self.hidden}")
        return logits.view(*shape[:-1], self.vocab)
