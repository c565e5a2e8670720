"""The lean decode engine: a hand-written forward pass for Llama-architecture models over a
preallocated KV cache.

Most of a transformers decode step on a small model is framework overhead (cache objects, masks,
hooks, the full-sequence logits), not arithmetic. This engine runs the same math with the model's
own weight tensors (no copies in float32, so in-place updates such as training are seen at once):
RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, and logits for the positions asked for.
Projections wrapped by a peft LoRA adapter run as the base weight plus each active adapter's
low-rank path, `scaling * B(A(x))`, read from the adapter's own tensors.

The cache (`KVCache`) has two parts:
  - a shared row holding the prompt (and, for single generations, what was generated), kept
    between calls so the next prompt only prefills from its first changed token;
  - optional per-candidate rows for batched decoding (best-of-K), each attending to the shared
    row plus its own tokens, so K candidates read one copy of the prompt's keys and values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .shortlist import ShortlistHead

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "DecodeEngine",
    "KVCache",
    "Linear",
    "engine_unsupported_reason",
]

SUPPORTED_MODEL_TYPES = ("llama",)
# Capacity grows in steps of this many positions, so a growing prompt rarely reallocates.
_CAPACITY_STEP = 1024

Linear = Callable[[torch.Tensor], torch.Tensor]


def engine_unsupported_reason(model) -> str | None:
    """Why the lean engine cannot run `model` (the runtime then uses transformers), or None."""
    config = model.config
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {config.model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"rope type {rope.get('rope_type')!r} is not supported"
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return "biased projections are not supported"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} is not supported"
    return _adapter_unsupported_reason(model)


_PROJECTIONS = {
    "self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}


def _adapter_unsupported_reason(model) -> str | None:
    """Why the engine cannot read what an adapter library (peft) put into `model`, or None.

    The engine adds plain LoRA paths (peft `lora.Linear`) to the decoder layers' projections; any
    other peft module, anywhere in the model, changes the math in a way it would silently skip.
    """
    projections = {
        id(getattr(getattr(layer, part), name))
        for layer in model.model.layers
        for part, names in _PROJECTIONS.items()
        for name in names
    }
    for name, module in model.named_modules():
        if not type(module).__module__.startswith("peft"):
            continue
        kind = type(module).__name__
        if id(module) not in projections:
            return f"{name} is a peft {kind}; the engine reads adapters on the layers' projections only"
        reason = _lora_linear_unsupported_reason(module)
        if reason is not None:
            return f"{name}: {reason}"
    return None


def _lora_linear_unsupported_reason(module) -> str | None:
    """Why the peft projection wrapper `module` is not a plain LoRA the engine can add, or None."""
    # peft is loaded already: one of its modules is in the model.
    from peft.tuners.lora import Linear as LoraLinear

    if type(module) is not LoraLinear:
        return f"a peft {type(module).__name__} (the engine runs lora.Linear only)"
    if type(module.base_layer) is not torch.nn.Linear:
        return f"LoRA over a {type(module.base_layer).__name__}, not a plain torch Linear"
    if module.merged:
        # The base weight then holds the adapter's delta, which quantized copies must not include.
        return "LoRA merged into the base weight"
    if module.fan_in_fan_out:
        return "LoRA with fan_in_fan_out (transposed weights)"
    for adapter in _active_lora_names(module):
        if adapter in module.lora_variant:
            return f"LoRA variant {type(module.lora_variant[adapter]).__name__} (e.g. DoRA)"
        if module.lora_B[adapter].bias is not None:
            return "LoRA with a bias (lora_bias)"
    return None


def _active_lora_names(module) -> list[str]:
    """The adapters of a peft LoRA layer that its forward applies (as peft decides it)."""
    if module.disable_adapters:
        return []
    return [name for name in module.active_adapters if name in module.lora_A]


LoraPath = tuple[torch.Tensor, torch.Tensor, float]  # A [rank, in], B [out, rank], scaling


def _lora_paths(module: torch.nn.Module) -> list[LoraPath]:
    """The low-rank paths a projection adds to its base output: none for a plain Linear."""
    if not hasattr(module, "lora_A"):
        return []
    return [
        (module.lora_A[name].weight, module.lora_B[name].weight, module.scaling[name])
        for name in _active_lora_names(module)
    ]


def _base_weight(module: torch.nn.Module) -> torch.Tensor:
    """The projection's own weight, without any adapter (a peft wrapper keeps it in `base_layer`)."""
    return module.base_layer.weight if hasattr(module, "lora_A") else module.weight


def _add_lora(out: torch.Tensor, x: torch.Tensor, paths: list[LoraPath]) -> torch.Tensor:
    """`out` (the base projection of `x`) plus every LoRA path, added in the activation dtype."""
    for a, b, scaling in paths:
        # As peft does: the input in the adapter's dtype (a no-op when they match).
        delta = F.linear(F.linear(x.to(a.dtype), a), b)  # [..., rank] -> [..., out]
        out = torch.add(out, delta.to(out.dtype), alpha=scaling)
    return out


def _dense(weight: torch.Tensor) -> Linear:
    return lambda x: F.linear(x, weight)


Projections = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]


@dataclass
class _Layer:
    attn_norm: torch.Tensor
    qkv: Projections  # x -> (q, k, v)
    o: Linear
    mlp_norm: torch.Tensor
    gate_up: Projections  # x -> (gate, up)
    down: Linear


# Forward passes of at most this many tokens (decoding steps, prompt-lookup verify passes, short
# re-prefills after a keystroke) go through the fused step; longer ones through torch's matrix
# products, which use the arithmetic better once many tokens share each weight read.
FUSED_MAX_TOKENS = 16


class KVCache:
    """Preallocated keys and values of every layer for one shared row (+ optional candidate rows).

    `ids[i]` is the token whose keys sit at position `past_length + i`; positions below
    `past_length` came from a caller's cache (`past=`), recognised again by the identity it carries
    (`squid_identity`: a Squid composition, whose tensors are never written) or else by value.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype, device, max_positions: int):
        self.shape = (layers, kv_heads, head_dim)
        self.dtype, self.device, self.max_positions = dtype, device, max_positions
        self.keys = self.values = torch.empty(0)  # [layers, kv_heads, capacity, head_dim]
        self.capacity = 0
        self.length = 0
        self.past_length = 0
        self.past_identity = None  # `squid_identity` of the cache loaded at 0..past_length-1
        self.ids: list[int] = []
        self.row_keys = self.row_values = None  # [layers, rows, kv_heads, row_capacity, head_dim]
        self.row_length = 0

    def reserve(self, positions: int) -> None:
        """Make room for `positions` in the shared row, keeping what it holds."""
        if positions <= self.capacity:
            return
        if positions > self.max_positions:
            raise ValueError(f"{positions} positions exceed the model's {self.max_positions}")
        capacity = min(self.max_positions, -(-positions // _CAPACITY_STEP) * _CAPACITY_STEP)
        layers, kv_heads, head_dim = self.shape
        keys = torch.zeros(layers, kv_heads, capacity, head_dim, dtype=self.dtype, device=self.device)
        values = torch.zeros_like(keys)
        if self.length:
            keys[:, :, : self.length] = self.keys[:, :, : self.length]
            values[:, :, : self.length] = self.values[:, :, : self.length]
        self.keys, self.values, self.capacity = keys, values, capacity

    def hold_placeholders(self, length: int) -> None:
        """Hold `length` positions of placeholder tokens (zero keys and values), nothing else: what a
        pass costs depends on how many positions it attends to, not on what they hold, so
        `context.tuning` times passes after a long context without prefilling one first."""
        self.crop(0)
        self.reserve(length)
        self.ids = [0] * length
        self.length = length

    def crop(self, length: int) -> None:
        """Forget everything from position `length` on (the keys stay allocated)."""
        length = max(0, min(length, self.length))
        if length < self.past_length:
            self.past_length = 0
            self.past_identity = None
            self.ids = []
            self.length = 0
            return
        del self.ids[length - self.past_length :]
        self.length = length

    def load_past(self, past) -> None:
        """Replace everything by the contents of a transformers cache (positions 0..n-1)."""
        layers = past.layers
        n = layers[0].keys.shape[-2]
        self.length = 0
        self.past_identity = None
        self.ids = []
        self.reserve(n + 1)
        for index, layer in enumerate(layers):
            self.keys[index, :, :n] = layer.keys[0]  # [kv_heads, n, head_dim]
            self.values[index, :, :n] = layer.values[0]
        self.length = self.past_length = n
        self.past_identity = getattr(past, "squid_identity", None)

    def holds_past(self, past) -> bool:
        """Whether positions 0..n-1 already hold exactly `past`: the same identity, or else the same
        values."""
        layers = past.layers
        n = layers[0].keys.shape[-2]
        if self.past_length != n or self.length < n or len(layers) != self.shape[0]:
            return False
        identity = getattr(past, "squid_identity", None)
        if identity is not None and identity == self.past_identity and identity[1] == n:
            return True
        for index, layer in enumerate(layers):
            if not torch.equal(self.keys[index, :, :n], layer.keys[0].to(self.dtype)):
                return False
            if not torch.equal(self.values[index, :, :n], layer.values[0].to(self.dtype)):
                return False
        self.past_identity = identity  # the same context again: recognised by identity next time
        return True

    def start_rows(self, rows: int, positions: int) -> None:
        """Per-candidate rows for batched decoding after the shared row's current contents."""
        layers, kv_heads, head_dim = self.shape
        self.row_keys = torch.zeros(
            layers, rows, kv_heads, positions, head_dim, dtype=self.dtype, device=self.device
        )
        self.row_values = torch.zeros_like(self.row_keys)
        self.row_length = 0

    def end_rows(self) -> None:
        self.row_keys = self.row_values = None
        self.row_length = 0


class DecodeEngine:
    """A Llama forward pass over `KVCache`, with the model's weights (or quantized copies)."""

    def __init__(self, model, linear: Callable[[torch.Tensor], Linear] | None = None,
                 quantize_head: bool = True, shortlist_head: bool = True, fused_step: bool = True,
                 fused_q4: bool = True, fused_integer: bool = True):
        """`linear` turns a weight into a projection (default: the weight as it is); the output
        projection uses it too unless `quantize_head` is False. `shortlist_head` lets greedy
        forward passes use `ShortlistHead` where it pays (float32 on the CPU). `fused_step` runs
        passes of up to `FUSED_MAX_TOKENS` tokens through `kernels.cpu_decode` where it can
        (float32 on the CPU, the model's own weights, no LoRA paths); with `fused_q4` it reads them
        as 4-bit codes where those give them back exactly (`kernels.cpu_decode.pack_q4`), and the
        output projection after it as exact 8-bit codes (`FusedHead`)."""
        config = model.config
        self.model = model
        base = model.model
        make = linear or _dense
        self.embed = base.embed_tokens.weight  # [vocab, hidden]
        self.final_norm = base.norm.weight
        self.lm_head = (make if quantize_head else _dense)(model.lm_head.weight)
        # Greedy steps read the output matrix mostly in bfloat16 (same argmax, see context.shortlist).
        head = model.lm_head.weight
        self.greedy_head = ShortlistHead(head) if shortlist_head and ShortlistHead.supports(head) else None
        self._make = linear
        self.layers = [
            _Layer(
                attn_norm=layer.input_layernorm.weight,
                qkv=self._projections([getattr(layer.self_attn, f"{n}_proj") for n in "qkv"]),
                o=self._projection(layer.self_attn.o_proj),
                mlp_norm=layer.post_attention_layernorm.weight,
                gate_up=self._projections([layer.mlp.gate_proj, layer.mlp.up_proj]),
                down=self._projection(layer.mlp.down_proj),
            )
            for layer in base.layers
        ]
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.groups = self.heads // self.kv_heads
        self.eps = config.rms_norm_eps
        self.scaling = self.head_dim**-0.5
        self.dtype = self.embed.dtype
        self.device = self.embed.device
        self.max_positions = config.max_position_embeddings
        self._cos, self._sin = self._rotary_tables(config)
        self._masks: dict[int, torch.Tensor] = {}
        self.fused_q4, self.fused_integer = fused_q4, fused_integer
        self.fused_step = self._fused_step(base.layers, config) if fused_step and linear is None else None
        # After the fused step, the output projection from exact 8-bit codes where its weights
        # have them (the embedded model's are GGUF Q8_0): exact logits, fewer bytes.
        self.fused_head = None
        if self.fused_step is not None and fused_q4:  # (the fused step runs only without `linear`)
            from kernels.cpu_decode import FusedHead

            self.fused_head = FusedHead.build(model.lm_head.weight)
        self.fused_threads = 0  # threads of the fused step; 0 = torch's current count

    def _fused_step(self, layers, config):
        """`kernels.cpu_decode`'s step over the model's own weights, or None where it cannot run."""
        from kernels.cpu_decode import FusedDecodeStep

        modules = [m for layer in layers for m in (*layer.self_attn.children(), *layer.mlp.children())]
        if any(_lora_paths(m) for m in modules):
            return None
        try:
            weights = [
                {"attn_norm": layer.input_layernorm.weight, "q": layer.self_attn.q_proj.weight,
                 "k": layer.self_attn.k_proj.weight, "v": layer.self_attn.v_proj.weight,
                 "o": layer.self_attn.o_proj.weight, "mlp_norm": layer.post_attention_layernorm.weight,
                 "gate": layer.mlp.gate_proj.weight, "up": layer.mlp.up_proj.weight,
                 "down": layer.mlp.down_proj.weight}
                for layer in layers
            ]
        except AttributeError:  # not a Llama-style layer: the torch steps run it
            return None
        return FusedDecodeStep.build(
            # the parameters themselves: their packed codes are remembered per tensor (and version)
            weights, q4=self.fused_q4, integer=self.fused_integer,
            hidden=config.hidden_size, inter=config.intermediate_size, heads=self.heads,
            kv_heads=self.kv_heads, head_dim=self.head_dim, eps=self.eps, scaling=self.scaling,
            cos=self._cos, sin=self._sin,
        )

    def _projection(self, module: torch.nn.Module) -> Linear:
        """One projection module (a Linear, or a peft LoRA wrapper around one) as a function of x."""
        base = (self._make or _dense)(_base_weight(module))
        paths = _lora_paths(module)
        if not paths:
            return base
        return lambda x: _add_lora(base(x), x, paths)

    def _projections(self, modules: list[torch.nn.Module]) -> Projections:
        """Several projections of the same input, each with its own LoRA paths if it has any."""
        base = self._base_projections([_base_weight(m) for m in modules])
        paths = [_lora_paths(m) for m in modules]
        if not any(paths):
            return base
        return lambda x: tuple(_add_lora(out, x, p) for out, p in zip(base(x), paths, strict=True))

    def _base_projections(self, weights: list[torch.Tensor]) -> Projections:
        """Several base weights applied to the same input: the model's own tensors one by one, or,
        where `linear` makes copies anyway, one fused copy whose output is split (fewer, larger calls)."""
        if self._make is None:
            if len(weights) == 3:
                first, second, third = weights
                return lambda x: (F.linear(x, first), F.linear(x, second), F.linear(x, third))
            first, second = weights
            return lambda x: (F.linear(x, first), F.linear(x, second))
        sizes = [w.shape[0] for w in weights]
        fused = self._make(torch.cat(weights))
        return lambda x: fused(x).split(sizes, dim=-1)

    def _rotary_tables(self, config):
        """cos/sin for every position, computed as transformers does (float32, then the model dtype)."""
        rope = getattr(config, "rope_parameters", None) or {"rope_theta": getattr(config, "rope_theta", 1e4)}
        dim = self.head_dim
        inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        positions = torch.arange(self.max_positions, dtype=torch.float)
        freqs = positions[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1).to(self.device)  # [positions, head_dim]
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def new_cache(self) -> KVCache:
        return KVCache(
            len(self.layers), self.kv_heads, self.head_dim, self.dtype, self.device, self.max_positions
        )

    # -- the forward pass ----------------------------------------------------------------------

    def forward(self, ids: torch.Tensor, cache: KVCache, *, rows: bool = False, all_logits: bool = False,
                greedy: bool = False):
        """Run `ids` [batch, T] after what `cache` holds and return logits [batch, T or 1, vocab].

        Without `rows` the tokens extend the shared row (batch 1); with it they extend each
        candidate row (batch = rows) after the shared row. Either way the cache length advances by T.
        `greedy` says only the argmax of the logits will be used (their other values may be
        approximate by a bounded amount): the output projection is then the cheaper greedy head.
        """
        batch, steps = ids.shape
        if self.fused_step is not None and steps <= FUSED_MAX_TOKENS and batch == 1 and not rows:
            return self._fused_forward(ids, cache, all_logits, greedy)
        start = cache.length + cache.row_length if rows else cache.length
        if rows:
            if cache.row_length + steps > cache.row_keys.shape[3]:
                raise ValueError("candidate rows are full")
        else:
            cache.reserve(start + steps)
        cos = self._cos[start : start + steps, None, :]  # [T, 1, head_dim]
        sin = self._sin[start : start + steps, None, :]
        mask = None
        if steps > 1:  # rows: an additive [T, T] mask over their own tokens; else [T, n] booleans
            mask = self._causal_mask(steps) if rows else self._keep_mask(start, steps)
        hidden = F.embedding(ids, self.embed)  # [batch, T, hidden]
        for index, layer in enumerate(self.layers):
            hidden = hidden + self._attention(index, layer, hidden, cos, sin, mask, cache, rows, start)
            x = self._rms_norm(hidden, layer.mlp_norm)
            gate, up = layer.gate_up(x)
            hidden = hidden + layer.down(F.silu(gate) * up)
        if rows:
            cache.row_length += steps
        else:
            cache.length += steps
            cache.ids.extend(ids[0].tolist())
        if not all_logits:
            hidden = hidden[:, -1:]
        hidden = self._rms_norm(hidden, self.final_norm)
        if greedy and self.greedy_head is not None:
            return self.greedy_head(hidden)
        return self.lm_head(hidden).float()

    def _fused_forward(self, ids: torch.Tensor, cache: KVCache, all_logits: bool,
                       greedy: bool) -> torch.Tensor:
        """`forward` for a few tokens of the shared row, every layer in one `kernels.cpu_decode` call."""
        start, steps = cache.length, ids.shape[1]
        cache.reserve(start + steps)
        hidden = F.embedding(ids[0], self.embed).contiguous()  # [T, hidden], written in place
        self.fused_step(hidden, cache.keys, cache.values, start, self.fused_threads or None)
        cache.length += steps
        cache.ids.extend(ids[0].tolist())
        hidden = hidden[None] if all_logits else hidden[None, -1:]
        hidden = self._rms_norm(hidden, self.final_norm)
        if self.fused_head is not None:  # exact, and cheaper than the shortlist head up to 12 rows
            return self.fused_head(hidden, self.fused_threads or None)
        # The output projection reads 57-113 MB a step: it gets the fused step's threads too, not
        # torch's decoding count (one, for torch's many small operations).
        before = torch.get_num_threads()
        threads = self.fused_threads or before
        if threads != before:
            torch.set_num_threads(threads)
        try:
            if greedy and self.greedy_head is not None:
                return self.greedy_head(hidden)
            return self.lm_head(hidden).float()
        finally:
            if threads != before:
                torch.set_num_threads(before)

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * x.to(dtype)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def _causal_mask(self, steps: int) -> torch.Tensor:
        """[T, T] additive mask: the new tokens see themselves and earlier ones, not later ones."""
        mask = self._masks.get(steps)
        if mask is None:
            mask = torch.full((steps, steps), float("-inf"), dtype=torch.float32, device=self.device)
            mask = torch.triu(mask, diagonal=1)
            self._masks[steps] = mask
        return mask

    def _keep_mask(self, start: int, steps: int) -> torch.Tensor:
        """[T, start + T] boolean mask: token t of the chunk sees everything cached and itself."""
        keep = torch.ones(steps, start + steps, dtype=torch.bool, device=self.device)
        keep[:, start:] = torch.tril(keep[:, start:])
        return keep

    def _attention(self, index, layer, hidden, cos, sin, mask, cache: KVCache, rows: bool, start: int):
        batch, steps, _ = hidden.shape
        kv_heads, groups, head_dim = self.kv_heads, self.groups, self.head_dim
        x = self._rms_norm(hidden, layer.attn_norm)
        q, k, v = layer.qkv(x)
        q = self._rotate(q.view(batch, steps, self.heads, head_dim), cos, sin)
        k = self._rotate(k.view(batch, steps, kv_heads, head_dim), cos, sin)
        v = v.view(batch, steps, kv_heads, head_dim)
        # Query heads kvh*G .. kvh*G+G-1 share kv head kvh: group them as extra query rows.
        q = (q * self.scaling).view(batch, steps, kv_heads, groups, head_dim)
        q = q.permute(0, 2, 3, 1, 4).reshape(batch, kv_heads, groups * steps, head_dim)
        if rows:
            out = self._attend_rows(index, q, k, v, mask, cache)
        else:
            cache.keys[index, :, start : start + steps] = k[0].transpose(0, 1)  # [kv_heads, T, head_dim]
            cache.values[index, :, start : start + steps] = v[0].transpose(0, 1)
            keys = cache.keys[index, :, : start + steps]  # [kv_heads, n, head_dim]
            values = cache.values[index, :, : start + steps]
            if mask is not None:  # a prefill chunk: torch's fused attention, no score matrix kept
                out = F.scaled_dot_product_attention(
                    q.view(batch, kv_heads * groups, steps, head_dim), keys[None], values[None],
                    attn_mask=mask, scale=1.0, enable_gqa=True)
                out = out.view(batch, kv_heads, groups, steps, head_dim).permute(0, 3, 1, 2, 4)
                return layer.o(out.reshape(batch, steps, self.heads * head_dim))
            scores = torch.matmul(q[0], keys.transpose(1, 2)).float()  # [kv_heads, G*T, n]
            probs = torch.softmax(scores, dim=-1).to(values.dtype)
            out = torch.matmul(probs, values).unsqueeze(0)  # [1, kv_heads, G*T, head_dim]
        # [batch, kv_heads, G, T, head_dim] -> [batch, T, heads * head_dim]
        out = out.view(batch, kv_heads, groups, steps, head_dim).permute(0, 3, 1, 2, 4)
        return layer.o(out.reshape(batch, steps, self.heads * head_dim))

    def _attend_rows(self, index, q, k, v, mask, cache: KVCache):
        """Attention of each candidate row over the shared prompt and its own tokens."""
        batch, kv_heads, rows_t, head_dim = q.shape
        steps = k.shape[1]
        own_start = cache.row_length
        cache.row_keys[index, :, :, own_start : own_start + steps] = k.transpose(1, 2)
        cache.row_values[index, :, :, own_start : own_start + steps] = v.transpose(1, 2)
        own_keys = cache.row_keys[index, :, :, : own_start + steps]  # [batch, kv_heads, m, head_dim]
        own_values = cache.row_values[index, :, :, : own_start + steps]
        shared_keys = cache.keys[index, :, : cache.length]  # [kv_heads, n, head_dim]
        shared_values = cache.values[index, :, : cache.length]
        # Every row's queries against the one shared copy: [kv_heads, batch*G*T, head_dim].
        q_shared = q.transpose(0, 1).reshape(kv_heads, batch * rows_t, head_dim)
        shared_scores = torch.matmul(q_shared, shared_keys.transpose(1, 2)).float()
        shared_scores = shared_scores.view(kv_heads, batch, rows_t, -1).transpose(0, 1)  # [b, kvh, GT, n]
        own_scores = torch.matmul(q, own_keys.transpose(2, 3)).float()  # [batch, kv_heads, G*T, m]
        if mask is not None:
            own_scores.view(batch, kv_heads, -1, steps, own_start + steps)[..., own_start:] += mask
        probs = torch.softmax(torch.cat((shared_scores, own_scores), dim=-1), dim=-1)
        n = cache.length
        shared_probs = probs[..., :n].transpose(0, 1).reshape(kv_heads, batch * rows_t, n)
        out = torch.matmul(shared_probs.to(shared_values.dtype), shared_values)  # [kvh, b*GT, hd]
        out = out.view(kv_heads, batch, rows_t, head_dim).transpose(0, 1)
        return out + torch.matmul(probs[..., n:].to(own_values.dtype), own_values)
