"""Fill-in-the-middle prompts: the code after the cursor too, in the format a code model was trained on.

Code models (Qwen2.5-Coder, StarCoder2, DeepSeek-Coder, CodeLlama, Codestral) are trained to fill a
hole: they read the text before and after the cursor, marked by special tokens, and write what goes
between. A family is recognised by those tokens in its tokenizer (`detect`); `resolve` applies the
`completion.fim` setting ("auto", "off", a family's name, or a template with `{prefix}` and
`{suffix}`). Models without such tokens (the embedded SmolLM2) keep the plain prefix prompt.

The local runtime detects the family when it loads a model (`ModelRuntime.fim_format`, whose end
markers then end generation) and the completion path builds the hole through the served-prompt
record (`context.prompt_record.ServedPrompt.build`), Squid's reference caches in front of it. A
completion server gets the text around the cursor instead (`agent.completion_server`): llama.cpp's
`/infill` applies the model's own format, and an OpenAI-compatible server the one named here.

`fim_prompt` puts it together: repository files first where the family has a format for them
(Qwen2.5-Coder's and StarCoder2's `<file_sep>` repository layout), then the hole. The suffix is cut
to a token budget at a line boundary (`trim_suffix`): the lines nearest the cursor matter most.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

__all__ = ["FAMILIES", "FILE_SEPARATOR", "TAUGHT_TEMPLATE", "FimFormat", "detect", "fim_prompt", "resolve",
           "special_tokens_of", "taught", "trim_suffix"]


@dataclass(frozen=True)
class FimFormat:
    """How one family marks a hole. `template` holds `{prefix}` and `{suffix}`; the model's answer
    follows it. `file_sep` / `repo_name`: its repository layout (other files before the hole)."""

    name: str
    template: str
    markers: tuple[str, ...]  # the special tokens that identify the family (all present)
    stops: tuple[str, ...] = ()  # tokens that end the middle besides the end of text
    file_sep: str | None = None
    repo_name: str | None = None

    def hole(self, prefix: str, suffix: str) -> str:
        return self.template.replace("{suffix}", suffix).replace("{prefix}", prefix)


FAMILIES: dict[str, FimFormat] = {
    "qwen2.5-coder": FimFormat(
        "qwen2.5-coder", "<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>",
        ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
        ("<|fim_pad|>", "<|file_sep|>", "<|endoftext|>"),
        file_sep="<|file_sep|>", repo_name="<|repo_name|>"),
    "starcoder2": FimFormat(
        "starcoder2", "<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>",
        ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"), ("<file_sep>", "<|endoftext|>"),
        file_sep="<file_sep>", repo_name="<repo_name>"),
    "deepseek-coder": FimFormat(
        "deepseek-coder", "<｜fim▁begin｜>{prefix}<｜fim▁hole｜>{suffix}<｜fim▁end｜>",
        ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"), ("<|EOT|>",)),
    "codellama": FimFormat(
        "codellama", "<PRE> {prefix} <SUF>{suffix} <MID>", ("<PRE>", "<SUF>", "<MID>"), ("<EOT>",)),
    # Codestral puts the suffix first.
    "codestral": FimFormat("codestral", "[SUFFIX]{suffix}[PREFIX]{prefix}", ("[SUFFIX]", "[PREFIX]")),
}
# The format the trainer teaches a model without FIM tokens of its own (the embedded SmolLM2, whose
# tokenizer has a file separator): the text after the cursor first, then the window, so that the
# answer still continues the window as left-to-right text and a model that never saw the format
# reads the suffix as code in front of it. A LoRA adapter trained on tasks in it is served in it
# (`taught`).
FILE_SEPARATOR = "<file_sep>"
TAUGHT_TEMPLATE = f"{FILE_SEPARATOR}{{suffix}}{FILE_SEPARATOR}{{prefix}}"
# StarCoder2 and Qwen share nothing; checked most specific first (Qwen's tokens contain no others').
_ORDER = ("qwen2.5-coder", "deepseek-coder", "starcoder2", "codellama", "codestral")


def special_tokens_of(tokenizer) -> set[str]:
    """The added and special tokens of a transformers tokenizer (what `detect` reads)."""
    tokens = set(getattr(tokenizer, "all_special_tokens", ()) or ())
    added = getattr(tokenizer, "get_added_vocab", None)
    if callable(added):
        tokens |= set(added())
    return tokens


def detect(special_tokens: Iterable[str]) -> FimFormat | None:
    """The family whose markers are all among the tokenizer's special (added) tokens; None: none."""
    tokens = set(special_tokens)
    for name in _ORDER:
        if all(marker in tokens for marker in FAMILIES[name].markers):
            return FAMILIES[name]
    return None


def resolve(setting: str, special_tokens: Iterable[str]) -> FimFormat | None:
    """The format `completion.fim` asks for: "auto" (detected), "off" (None: the prefix prompt), a
    family's name, or a template holding `{prefix}` and `{suffix}`. ValueError for anything else."""
    if setting == "off":
        return None
    if setting == "auto":
        return detect(special_tokens)
    if setting in FAMILIES:
        return FAMILIES[setting]
    if "{prefix}" in setting and "{suffix}" in setting:
        return FimFormat("template", setting, ())
    raise ValueError(f"completion.fim must be auto, off, one of {', '.join(FAMILIES)}, or a template with "
                     f"{{prefix}} and {{suffix}}; got {setting!r}")


def taught(setting: str, special_tokens: Iterable[str]) -> FimFormat | None:
    """The format `train.fim` asks the trainer to prompt completion tasks in: "auto" = the model's
    own family, or the taught template for a model without one; otherwise as `resolve`."""
    if setting == "auto":
        return detect(special_tokens) or FimFormat("template", TAUGHT_TEMPLATE, ())
    return resolve(setting, special_tokens)


def trim_suffix(suffix: str, budget_tokens: int, count_tokens: Callable[[str], int]) -> str:
    """The start of `suffix` within `budget_tokens`, cut at a line boundary (the rest of the
    cursor's line always stays, even over budget: it is what the answer must meet)."""
    if budget_tokens <= 0:
        return ""
    head, newline, rest = suffix.partition("\n")
    if not newline or count_tokens(suffix) <= budget_tokens:
        return suffix
    kept = head + newline
    used = count_tokens(kept)
    for line in rest.splitlines(keepends=True):
        cost = count_tokens(line)
        if used + cost > budget_tokens:
            break
        kept += line
        used += cost
    return kept


def fim_prompt(fmt: FimFormat, prefix: str, suffix: str, *, path: str = "",
               files: Sequence[tuple[str, str]] = (), repo: str = "") -> str:
    """The prompt text for a hole between `prefix` and `suffix` in the file at `path`, after the
    repository `files` ((path, text) pairs) in the family's repository layout; a family without
    one gets the hole alone (its repository context then goes elsewhere: Squid caches, `/infill`'s
    `input_extra`)."""
    if fmt.file_sep is None or not files:
        return fmt.hole(prefix, suffix)
    parts = [f"{fmt.repo_name}{repo}\n"] if fmt.repo_name and repo else []
    for other, text in files:
        parts.append(f"{fmt.file_sep}{other}\n{text.rstrip()}\n")
    parts.append(f"{fmt.file_sep}{path}\n" + fmt.hole(prefix, suffix))
    return "".join(parts)
