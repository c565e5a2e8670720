"""Fill-in-the-middle formats (`context.fim`) against tokenizers built here with each family's
special tokens (no code model installs on this machine): detection, the prompt's layout and its
marker tokens, the setting, and the suffix cut to a budget at a line boundary."""

from __future__ import annotations

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
