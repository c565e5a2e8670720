"""A tiny random Llama with a 32-word tokenizer and a chat template: the trainer's tests run the
real GRPO loop on it in seconds (the embedded model takes ~40 s a step on a shared 2-core machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

VOCAB = 32
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}t2"


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t1", unk_token="t0")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_model(seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, eos_token_id=1, pad_token_id=0,
                         bos_token_id=None, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        # At the default init the logits span about +-0.6, so no change to the body could make any
        # token much likelier than 1/32: widen the head so that the policy has something to learn.
        model.lm_head.weight.mul_(30)
    return model


@pytest.fixture(autouse=True)
def _every_training_test_on_one_thread(one_torch_thread):
    """Training steps run on one torch thread (tests/conftest.py says why)."""


@pytest.fixture
def tiny_model_dir(tmp_path: Path) -> Path:
    """The tiny model saved as a transformers directory (what `model.path` may point at)."""
    path = tmp_path / "tiny-model"
    tiny_model().save_pretrained(str(path))
    tiny_tokenizer().save_pretrained(str(path))
    return path
