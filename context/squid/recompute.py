"""Quality recovery: recompute chosen context tokens against the composed context, layer by layer.

Independently encoded documents never attended to each other. Recomputing a token means running it
through every layer again, attending to the whole composed context before it (the other tokens'
cached keys and values, the recomputed tokens' fresh ones), and writing its fresh keys and values
back. Two ways to choose the tokens:

- first k of each document (after the first, which already follows the prefix exactly): the tokens
  whose attention changes most when the text before them changes;
- CacheBlend (Yao et al., 2024): run the first layer on every document token (cheap: one layer of
  thirty), compare the second layer's fresh keys and values with the cached ones, and recompute only
  the r% tokens that deviate most, from the second layer on.

The layer loop re-implements a Llama-style decoder layer (pre-norm attention with grouped KV heads,
then MLP) from the layer's own modules, because it must attend over an arbitrary set of tokens
scattered through the cache. Recomputing every token reproduces full prefill (tested).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["cacheblend_select", "recompute_tokens", "supports_recompute"]


def supports_recompute(model) -> bool:
    """True for decoder layers this loop knows (Llama, Mistral, Qwen2 style)."""
    try:
        layer = model.model.layers[0]
        attn = layer.self_attn
        return all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")) and hasattr(
            layer, "post_attention_layernorm"
        ) and not hasattr(attn, "q_norm")
    except (AttributeError, IndexError, TypeError):
        return False


def _apply_rope():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    return apply_rotary_pos_emb


def _project_kv(layer, hidden, cos, sin):
    """Fresh (query, key, value) of `hidden` [1, m, d] for `layer`, keys and queries rotated."""
    attn = layer.self_attn
    x = layer.input_layernorm(hidden)
    shape = (*hidden.shape[:-1], -1, attn.head_dim)
    q = attn.q_proj(x).view(shape).transpose(1, 2)  # [1, heads, m, head_dim]
    k = attn.k_proj(x).view(shape).transpose(1, 2)  # [1, kv_heads, m, head_dim]
    v = attn.v_proj(x).view(shape).transpose(1, 2)
    q, k = _apply_rope()(q, k, cos, sin)
    return q, k, v


def _layer_step(layer, hidden, q, keys_l, values_l, plan):
    """The rest of one decoder layer for the chosen tokens, given their fresh query.

    `plan`: (first row, end row, columns, mask) per group of chosen tokens; each group attends to
    its own columns of the layer's `keys_l`/`values_l` [kv_heads, S, head_dim].
    """
    attn = layer.self_attn
    outs = []
    for first, end, columns, mask in plan:
        # [1, heads, m, head_dim] against [1, kv_heads, n, head_dim]; GQA repeats the KV heads.
        outs.append(F.scaled_dot_product_attention(
            q[:, :, first:end], keys_l[:, columns][None], values_l[:, columns][None], attn_mask=mask,
            scale=attn.scaling, enable_gqa=True))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    out = attn.o_proj(out.transpose(1, 2).reshape(*hidden.shape[:-1], -1))
    hidden = hidden + out
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))


def _plan(selected: torch.Tensor, groups) -> list:
    """Per group of chosen tokens: its rows, the columns it attends to and its causal mask."""
    plan, first = [], 0
    for rows, columns in groups or [(len(selected), None)]:
        mine = selected[first : first + rows]
        seen = int(mine[-1]) + 1
        if columns is None:
            # A chosen token at position p sees every context position <= p: none past the last one.
            at = slice(0, seen)
            mask = torch.arange(seen, device=selected.device)[None, :] <= mine[:, None]
        else:
            at = torch.unique(torch.cat([columns[columns < seen], mine]))  # sorted
            mask = at[None, :] <= mine[:, None]
        plan.append((first, first + rows, at, mask))
        first += rows
    if first != len(selected):
        raise ValueError(f"groups cover {first} of {len(selected)} chosen tokens")
    return plan


def recompute_tokens(
    model,
    keys: torch.Tensor,
    values: torch.Tensor,
    token_ids: torch.Tensor,
    selected: torch.Tensor,
    *,
    first_layer: int = 0,
    hidden: torch.Tensor | None = None,
    last_layer: int | None = None,
    groups: list[tuple[int, torch.Tensor | None]] | None = None,
) -> torch.Tensor:
    """Recompute the `selected` positions (sorted [m] indices into the context) in place.

    `keys`/`values` [layers, kv_heads, S, head_dim] are the composed context's (positions 0..S-1);
    `token_ids` [S] its tokens. Layers `first_layer` to `last_layer` (exclusive; default all) run,
    starting from `hidden` [1, m, d] (default: the token embeddings). Returns the hidden states
    after the last layer run.

    `groups` (default: one group, attending to everything before it): consecutive groups of the
    chosen tokens as (how many, columns), each attending to its sorted `columns` of the context
    besides itself (None: every position before it). The projections and MLPs run on all chosen
    tokens at once; attention costs in proportion to each group's columns.
    """
    layers = model.model.layers
    last_layer = len(layers) if last_layer is None else last_layer
    positions = selected[None]  # [1, m]
    if hidden is None:
        hidden = model.model.embed_tokens(token_ids[selected][None])  # [1, m, d]
    cos, sin = model.model.rotary_emb(hidden, position_ids=positions)
    plan = _plan(selected, groups)
    for index in range(first_layer, last_layer):
        layer = layers[index]
        q, k, v = _project_kv(layer, hidden, cos, sin)
        keys[index][:, selected] = k[0].to(keys.dtype)
        values[index][:, selected] = v[0].to(values.dtype)
        hidden = _layer_step(layer, hidden, q, keys[index], values[index], plan)
    return hidden


def cacheblend_select(
    model,
    keys: torch.Tensor,
    values: torch.Tensor,
    token_ids: torch.Tensor,
    candidates: torch.Tensor,
    ratio: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CacheBlend's choice: run layer 0 on all `candidates`, rank them by how far their fresh layer-1
    keys and values are from the cached ones, and keep the top `ratio`.

    Layer 0's keys and values depend on nothing but the token and its position, so they are already
    exact after re-rotation; the first deviation shows at layer 1. Returns (the chosen positions,
    their hidden states after layer 0), ready for `recompute_tokens(first_layer=1, hidden=...)`.
    """
    hidden = recompute_tokens(model, keys, values, token_ids, candidates, last_layer=1)
    layer1 = model.model.layers[1]
    cos, sin = model.model.rotary_emb(hidden, position_ids=candidates[None])
    _, k, v = _project_kv(layer1, hidden, cos, sin)
    cached_k = keys[1][:, candidates].float()  # [kv_heads, m, head_dim]
    cached_v = values[1][:, candidates].float()
    deviation = (k[0].float() - cached_k).pow(2).sum(dim=(0, 2)) + (v[0].float() - cached_v).pow(2).sum(
        dim=(0, 2)
    )  # [m]
    count = max(1, round(ratio * len(candidates))) if ratio > 0 else 0
    order = torch.topk(deviation, count).indices.sort().values
    return candidates[order], hidden[:, order]
