"""A tiny random-weight code model with fill-in-the-middle tokens, written as a GGUF file here.

No code model with FIM tokens installs on this machine (package registries only), so the tests that
need one (llama.cpp's `/infill`, the local runtime's FIM prompt) write this one: a Llama of two
small layers over a byte-level vocabulary (GPT-2's byte-to-character table, a few merges) with
Qwen2.5-Coder's special tokens. Its answers are noise, but they are tokens of a real model, read by
the real llama.cpp server and by transformers. Greedy decoding never picks a special token: their
output rows are zero, and some ordinary token always scores above zero.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SPECIAL = ("<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
           "<|repo_name|>", "<|file_sep|>")
# A few merges so that common code pieces are single tokens (and the vocabulary is a real BPE's).
MERGES = (("Ġ", "Ġ"), ("ĠĠ", "ĠĠ"), ("r", "e"), ("re", "t"), ("d", "e"), ("de", "f"), ("Ġ", "x"))


def _bytes_to_unicode() -> list[str]:
    """GPT-2's table: the character each byte is written as in a byte-level vocabulary."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def vocabulary() -> list[str]:
    return _bytes_to_unicode() + ["".join(pair) for pair in MERGES] + list(SPECIAL)


def write_fim_gguf(path: Path, *, seed: int = 0, dim: int = 64, layers: int = 2, heads: int = 4,
                   context: int = 2048) -> Path:
    """Write the model to `path` (a .gguf file) and return it."""
    import gguf

    tokens = vocabulary()
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("squidcode-tiny-fim")
    writer.add_context_length(context)
    writer.add_embedding_length(dim)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(dim * 2)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_rope_dimension_count(dim // heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    normal, control = gguf.TokenType.NORMAL, gguf.TokenType.CONTROL
    writer.add_token_types([control if t in SPECIAL else normal for t in tokens])
    writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
    writer.add_eos_token_id(tokens.index("<|endoftext|>"))
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    for key, token in (("fim_pre", "<|fim_prefix|>"), ("fim_suf", "<|fim_suffix|>"),
                       ("fim_mid", "<|fim_middle|>"), ("fim_pad", "<|fim_pad|>"),
                       ("fim_rep", "<|repo_name|>"), ("fim_sep", "<|file_sep|>")):
        writer.add_uint32(f"tokenizer.ggml.{key}_token_id", tokens.index(token))

    def weight(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    vocab = len(tokens)
    output = weight(vocab, dim, scale=1.0)
    output[-len(SPECIAL):] = 0.0  # [vocab, dim]: special tokens never win a greedy step
    writer.add_tensor("token_embd.weight", weight(vocab, dim, scale=1.0))
    writer.add_tensor("output_norm.weight", np.ones(dim, dtype=np.float32))
    writer.add_tensor("output.weight", output)
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(dim, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(dim, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", weight(dim, dim))  # [out, in]
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(dim * 2, dim))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(dim * 2, dim))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(dim, dim * 2))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
