"""Fill-in-the-middle formats (`context.fim`) against tokenizers built here with each family's
special tokens (no code model installs on this machine): detection, the prompt's layout and its
marker tokens, the setting, and the suffix cut to a budget at a line boundary."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from context.fim import FAMILIES, detect, fim_prompt, resolve, special_tokens_of, trim_suffix

WORDS = ["def", "f", "(", ")", ":", "return", "x", "y", "+", "1", "\n", " ", "a.py", "b.py", "g", "[UNK]"]


def tokenizer_with(special: tuple[str, ...]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer whose vocabulary is WORDS, with `special` added as special tokens."""
    model = models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]")
    raw = Tokenizer(model)
    raw.pre_tokenizer = pre_tokenizers.Split(r"\s|[():+]", behavior="isolated")
    raw.add_special_tokens(list(special))
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_is_detected_from_its_tokenizer_and_its_markers_are_single_tokens(family):
    fmt = FAMILIES[family]
    tokenizer = tokenizer_with(fmt.markers + fmt.stops)
    assert detect(special_tokens_of(tokenizer)) is fmt
    prompt = fim_prompt(fmt, "def f(x):\n    return ", "\n")
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    marker_ids = [tokenizer.convert_tokens_to_ids(m) for m in fmt.markers]
    # Every marker is one id of the prompt, in the family's order.
    seen = [i for i in ids if i in marker_ids]
    expected = sorted(marker_ids, key=lambda i: prompt.index(fmt.markers[marker_ids.index(i)]))
    assert seen == expected


def test_a_model_without_fim_tokens_keeps_the_prefix_prompt():
    plain = tokenizer_with(("<|im_start|>", "<|im_end|>", "<|endoftext|>"))  # SmolLM2's kind
    assert detect(special_tokens_of(plain)) is None
    assert resolve("auto", special_tokens_of(plain)) is None


def test_the_layouts():
    qwen, codellama, codestral = FAMILIES["qwen2.5-coder"], FAMILIES["codellama"], FAMILIES["codestral"]
    assert fim_prompt(codellama, "a = ", "\nb = 2") == "<PRE> a =  <SUF>\nb = 2 <MID>"
    assert fim_prompt(codestral, "a = ", "\nb = 2") == "[SUFFIX]\nb = 2[PREFIX]a = "
    repo = fim_prompt(qwen, "x = g(", ")\n", path="b.py", files=[("a.py", "def g(y):\n    return y\n")],
                      repo="demo")
    assert repo == ("<|repo_name|>demo\n<|file_sep|>a.py\ndef g(y):\n    return y\n"
                    "<|file_sep|>b.py\n<|fim_prefix|>x = g(<|fim_suffix|>)\n<|fim_middle|>")
    # A family without a repository layout gets the hole alone.
    assert fim_prompt(codellama, "a", "b", files=[("a.py", "x")]) == codellama.hole("a", "b")


def test_the_setting():
    tokens = set(FAMILIES["starcoder2"].markers)
    assert resolve("auto", tokens) is FAMILIES["starcoder2"]
    assert resolve("off", tokens) is None
    assert resolve("deepseek-coder", tokens) is FAMILIES["deepseek-coder"]
    custom = resolve("<pre>{prefix}<suf>{suffix}<mid>", tokens)
    assert custom.hole("a", "b") == "<pre>a<suf>b<mid>"
    with pytest.raises(ValueError, match="completion.fim"):
        resolve("fim please", tokens)


def test_the_suffix_is_cut_to_its_budget_at_a_line_boundary():
    def words(text: str) -> int:
        return len(text.split())

    suffix = ")\n    return y\n\ndef g(a, b):\n    return a + b\n"
    assert trim_suffix(suffix, 100, words) == suffix
    assert trim_suffix(suffix, 4, words) == ")\n    return y\n\n"  # whole lines only
    assert trim_suffix(suffix, 1, words) == ")\n"  # the cursor's line stays
    assert trim_suffix(suffix, 0, words) == ""
    assert trim_suffix("no newline at all", 1, words) == "no newline at all"


# -- the served prompt, the runtime's prefill limit, the local model --------------------------------

class _Codec:
    """`ServedPrompt`'s codec over a test tokenizer, as `ModelRuntime` encodes and decodes."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def byte_tokenizer(special: tuple[str, ...]) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (text round-trips through it) with `special` added."""
    from tokenizers import decoders

    from tests.fim_model import _bytes_to_unicode

    raw = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(_bytes_to_unicode())}, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens(list(special))
    return PreTrainedTokenizerFast(tokenizer_object=raw)


def _cursor(before: str, after: str):
    from context.boundary import cursor_context

    return cursor_context(before + after, len(before), 8)


def test_the_served_prompt_puts_the_window_in_the_hole_and_keeps_the_markers_when_cut():
    from context.config import CompletionConfig
    from context.prompt_record import ServedPrompt

    qwen = FAMILIES["qwen2.5-coder"]
    tokenizer = byte_tokenizer(qwen.markers + qwen.stops)
    codec = _Codec(tokenizer)
    before, after = "def f(x):\n return x", "\n\ndef g(y):\n return y + 1\n"
    config = CompletionConfig(suffix_tokens=4)
    served = ServedPrompt.build(codec, _cursor(before, after), config, qwen, after)
    marker = {m: tokenizer.convert_tokens_to_ids(m) for m in qwen.markers}
    ids = list(served.ids)
    assert ids[0] == marker["<|fim_prefix|>"] and ids[-1] == marker["<|fim_middle|>"]
    assert served.pinned_tokens == 1 and served.fim == "qwen2.5-coder"
    window = ids[1 : ids.index(marker["<|fim_suffix|>"])]
    assert codec.decode(window) == before
    assert served.suffix == "\n\n"  # 4 tokens' budget: whole lines, the cursor's line first
    # A shorter window (the keystroke's prefill budget) drops window tokens, never the marker.
    cut = replace(served, dropped_tokens=3)
    model_ids, _ = cut.model_ids(codec)
    assert model_ids[0] == marker["<|fim_prefix|>"] and model_ids[1:] == ids[4:]
    # Stored redacted (a secret after the cursor), the ids go and the hole is built again.
    stored = served.for_storage(lambda text: text.replace("\n\n", "\n<redacted>\n"))
    assert stored.ids is None and stored.suffix == "\n<redacted>\n"
    rebuilt, _ = ServedPrompt.from_json(stored.to_json()).model_ids(codec)
    assert rebuilt[0] == marker["<|fim_prefix|>"] and rebuilt[-1] == marker["<|fim_middle|>"]
    assert ServedPrompt.from_json(served.to_json()) == served


def test_codestrals_suffix_comes_first_and_is_pinned_with_its_markers():
    from context.config import CompletionConfig
    from context.prompt_record import ServedPrompt

    codestral = FAMILIES["codestral"]
    tokenizer = byte_tokenizer(codestral.markers)
    codec = _Codec(tokenizer)
    served = ServedPrompt.build(codec, _cursor("x = 1\n", "y\n"), CompletionConfig(), codestral, "y\n")
    ids = list(served.ids)
    assert ids[0] == tokenizer.convert_tokens_to_ids("[SUFFIX]")
    assert ids[served.pinned_tokens - 1] == tokenizer.convert_tokens_to_ids("[PREFIX]")
    assert codec.decode(ids[served.pinned_tokens:]) + served.heal == "x = 1\n"  # its last line break healed


def test_the_prefill_limit_keeps_pinned_tokens():
    from context.runtime import _plan_prefill

    prompt = list(range(100))
    head, kept, common = _plan_prefill([], prompt, reuse=True, slack=64, limit=10, pinned=1)
    assert (head, common) == ([], 0) and kept == [0] + list(range(91, 100))
    assert _plan_prefill([], prompt, reuse=True, slack=64, limit=10)[1] == list(range(90, 100))
    assert _plan_prefill([], prompt, reuse=True, slack=64, limit=0, pinned=1)[1] == prompt


def test_the_fim_setting_is_validated_with_the_others():
    from context.config import config_from_mapping

    config, problems = config_from_mapping({"completion": {"fim": "fim please", "backend": "openai"}})
    assert config.completion.fim == "auto" and config.completion.backend == "openai"
    assert len(problems) == 1 and "completion.fim" in problems[0] and "{prefix}" in problems[0]
    config, problems = config_from_mapping({"completion": {"fim": "<a>{prefix}<b>{suffix}<c>"}})
    assert config.completion.fim == "<a>{prefix}<b>{suffix}<c>" and not problems


def test_a_local_code_model_completes_in_its_fim_format(tmp_path):
    """The local runtime with a real (tiny, random-weight) model that has Qwen2.5-Coder's FIM tokens."""
    from agent.completion import CompletionRequest, complete, served_prompt
    from context.config import CompletionConfig, ModelConfig
    from context.runtime import ModelRuntime
    from tests.fim_model import write_fim_gguf

    gguf = write_fim_gguf(tmp_path / "tiny-fim.gguf")
    runtime = ModelRuntime(ModelConfig(path=str(gguf), threads=1), cache_dir=tmp_path / "cache").load()
    assert runtime.fim_format is FAMILIES["qwen2.5-coder"]
    vocab = runtime.tokenizer.get_vocab()
    assert {vocab["<|file_sep|>"], vocab["<|fim_pad|>"], vocab["<|endoftext|>"]} <= runtime._eos_ids
    text = "def f(x):\n    return x + 1\n\n\ndef g(y):\n    ret\n\n\nprint(g(2))\n"
    offset = text.index("ret\n") + 3
    completion = complete(runtime, CompletionRequest(text, offset, "python"), CompletionConfig(max_tokens=6))
    prompt = runtime.tokenizer.decode(list(completion.prompt.ids))
    assert prompt == f"<|fim_prefix|>{text[:offset]}<|fim_suffix|>{text[offset:]}<|fim_middle|>"
    assert completion.new_tokens >= 1 and completion.prompt.fim == "qwen2.5-coder"
    # "off" keeps the prefix prompt for the same model (its last whitespace healed).
    request = CompletionRequest(text, offset, "python")
    cursor = _cursor(text[:offset], text[offset:])
    plain = served_prompt(runtime, request, cursor, CompletionConfig(fim="off"))
    assert not plain.fim and plain.pinned_tokens == 0
    assert runtime.tokenizer.decode(list(plain.ids)) + plain.heal == text[:offset]


def test_the_trainer_asks_in_the_models_own_format_or_teaches_one():
    from context.fim import TAUGHT_TEMPLATE, taught

    plain = special_tokens_of(tokenizer_with(()))
    assert taught("auto", plain).template == TAUGHT_TEMPLATE
    star = special_tokens_of(tokenizer_with(FAMILIES["starcoder2"].markers))
    assert taught("auto", star) is FAMILIES["starcoder2"]
    assert taught("off", plain) is None
    assert taught("codellama", plain) is FAMILIES["codellama"]
    with pytest.raises(ValueError, match="completion.fim must be"):
        taught("the middle please", plain)
