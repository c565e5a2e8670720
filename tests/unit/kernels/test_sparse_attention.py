"""Block-sparse decode attention: summaries, block choice, and each path against the masked-dense oracle."""

from __future__ import annotations

import pytest
import torch

from kernels.sparse_attention import (
    build_block_summaries,
    dense_decode_attention,
    extend_block_summaries,
    gather_planned,
    plan_sparse_attention,
    select_blocks,
    sparse_decode_attention,
    sparse_decode_attention_reference,
)
from tests.unit.kernels.conftest import max_rel_err, requires_triton

CASES = [  # (batch, q_heads, kv_heads, seq, head_dim, block, sinks, window, top_k)
    (1, 4, 4, 130, 16, 8, 4, 20, 3),  # no GQA, sinks rounded up to one block
    (2, 6, 2, 517, 40, 16, 10, 50, 5),  # group of 3, odd length
    (1, 8, 2, 301, 32, 32, 0, 33, 4),  # group of 4, no sinks
    (1, 9, 3, 45, 64, 16, 16, 64, 8),  # everything fits: sparse is dense
]


def _qkv(batch, q_heads, kv_heads, seq, dim, seed):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, q_heads, dim, generator=gen)
    keys = torch.randn(batch, kv_heads, seq, dim, generator=gen)
    return query, keys, torch.randn(batch, kv_heads, seq, dim, generator=gen)


def _plan(q, k, case, score="minmax"):
    *_, block, sinks, window, top_k = case
    return plan_sparse_attention(q, k, sinks=sinks, window=window, top_k=top_k, block_size=block, score=score)


def test_summaries_hold_each_full_block_and_extend_incrementally():
    keys = torch.randn(2, 3, 70, 8)
    s = build_block_summaries(keys, 16, kinds=("mean", "minmax"))
    assert s.n_blocks == 4 and s.covered == 64  # the partial block of 6 tokens is left out
    block = keys[:, :, 32:48]
    torch.testing.assert_close(s.mean[:, :, 2], block.mean(2))
    torch.testing.assert_close(s.kmin[:, :, 2], block.amin(2))
    torch.testing.assert_close(s.kmax[:, :, 2], block.amax(2))
    grown = torch.cat((keys, torch.randn(2, 3, 40, 8)), dim=2)
    ext = extend_block_summaries(build_block_summaries(keys, 16, kinds=("mean", "minmax")), grown)
    full = build_block_summaries(grown, 16, kinds=("mean", "minmax"))
    assert ext.n_blocks == 6
    for name in ("mean", "kmin", "kmax"):
        torch.testing.assert_close(getattr(ext, name), getattr(full, name))
    with pytest.raises(ValueError, match="fewer than"):
        extend_block_summaries(full, keys)


def test_mass_weighs_a_block_by_the_attention_of_the_whole_group():
    """Two query heads of a group want block 1 moderately, one head wants block 2 a little more
    sharply: the group's highest score (mean) takes block 2, the summed shares (mass) block 1."""
    from kernels.sparse_attention import _block_scores

    dim = 4
    keys = torch.zeros(1, 1, 3 * 8, dim)
    keys[0, 0, 8:16, 0] = 2.0  # block 1: along channel 0
    keys[0, 0, 16:24, 1] = 2.6  # block 2: along channel 1
    q = torch.zeros(1, 3, dim)
    q[0, 0, 0] = q[0, 1, 0] = 2.0  # heads 0 and 1 look along channel 0
    q[0, 2, 1] = 2.0  # head 2 along channel 1
    s = build_block_summaries(keys, 8, kinds=("mean",))
    shares = _block_scores(q, s, 0, 3, "mass", 0.5)[0, 0]
    assert shares.argmax() == 1 and abs(float(shares.sum()) - 3) < 1e-5  # three heads, one share each
    assert _block_scores(q, s, 0, 3, "mean")[0, 0].argmax() == 2
    plan = select_blocks(q, s, 24, sinks=0, window=0, top_k=1, score="mass", scale=0.5)
    assert plan.blocks.tolist() == [[[1]]]


def test_minmax_score_bounds_every_key_in_the_block():
    q, k, _ = _qkv(1, 4, 2, 256, 16, seed=3)
    s = build_block_summaries(k, 16)
    plan = select_blocks(q, s, 256, sinks=0, window=0, top_k=16)  # all blocks, so the order is total
    assert plan.blocks.shape == (1, 2, 16)
    from kernels.sparse_attention import _block_scores

    bound = _block_scores(q, s, 0, 16, "minmax")  # [1, kv, 16]
    true = (q.reshape(1, 2, 2, 16) @ k.transpose(-1, -2)).amax(2).reshape(1, 2, 16, 16).amax(-1)
    assert (bound >= true - 1e-5).all()


@pytest.mark.parametrize("score", ["minmax", "mean", "mass"])
def test_a_planted_needle_block_is_chosen_for_the_one_head_that_wants_it(score):
    q, k, v = _qkv(1, 6, 2, 400, 32, seed=7)
    k = k * 0.1
    k[0, 1, 200:216] = q[0, 4] * 3  # block 12 of kv head 1 matches query head 4 (group of kv head 1)
    plan = plan_sparse_attention(q, k, sinks=16, window=32, top_k=2, block_size=16, score=score)
    assert 12 in plan.blocks[0, 1].tolist()
    out = sparse_decode_attention(q, k, v, plan)
    want = dense_decode_attention(q, k, v)
    # The needle takes nearly all of head 4's attention, so sparse matches dense there.
    assert max_rel_err(out[0, 4], want[0, 4]) < 1e-3


def test_plan_regions_are_block_aligned_and_cover_sinks_window_and_tail():
    q, k, _ = _qkv(1, 2, 1, 203, 8, seed=1)
    plan = plan_sparse_attention(q, k, sinks=5, window=30, top_k=3, block_size=16)
    assert plan.sink_end == 16 and plan.window_start == 160  # (203 - 30) // 16 * 16
    assert plan.blocks.shape == (1, 1, 3)
    assert all(1 <= b < 10 for b in plan.blocks.flatten().tolist())
    assert plan.blocks[0, 0].tolist() == sorted(plan.blocks[0, 0].tolist())
    assert plan.n_tokens == 16 + 48 + 43
    got = gather_planned(k, plan)
    positions = list(range(16)) + [b * 16 + i for b in plan.blocks[0, 0].tolist() for i in range(16)]
    positions += list(range(160, 203))
    assert torch.equal(got[0, 0], k[0, 0, positions])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("score", ["minmax", "mean", "mass"])
def test_torch_path_matches_the_masked_dense_oracle(case, score):
    q, k, v = _qkv(*case[:5], seed=sum(case))
    plan = _plan(q, k, case, score)
    want = sparse_decode_attention_reference(q, k, v, plan)
    got = sparse_decode_attention(q, k, v, plan, backend="torch")
    assert max_rel_err(got, want) < 1e-5
    if plan.n_tokens == case[3]:
        assert max_rel_err(got, dense_decode_attention(q, k, v)) < 1e-5


def test_selection_needs_only_the_summaries():
    q, k, v = _qkv(1, 4, 2, 300, 16, seed=5)
    summaries = build_block_summaries(k, 16)
    host_keys, host_values = k.clone(), v.clone()  # stands for a cache in CPU memory
    plan = select_blocks(q, summaries.to("cpu"), 300, sinks=16, window=32, top_k=4)
    got = sparse_decode_attention(q, host_keys, host_values, plan)
    assert max_rel_err(got, sparse_decode_attention_reference(q, k, v, plan)) < 1e-5
    with pytest.raises(ValueError, match="summaries cover"):
        select_blocks(q, build_block_summaries(k[:, :, :100], 16), 300, sinks=16, window=32, top_k=4)


def test_bad_input_gets_a_clear_error():
    q, k, v = _qkv(1, 4, 2, 100, 16, seed=2)
    plan = plan_sparse_attention(q, k, sinks=8, window=16, top_k=2, block_size=8)
    with pytest.raises(ValueError, match="GQA"):
        sparse_decode_attention(q[:, :3], k, v, plan)
    with pytest.raises(ValueError, match="the plan is for"):
        sparse_decode_attention(q, k[:, :, :90], v[:, :, :90], plan)
    with pytest.raises(ValueError, match="unknown score"):
        plan_sparse_attention(q, k, sinks=8, window=16, top_k=2, block_size=8, score="max")
    with pytest.raises(ValueError, match="needs mean"):
        select_blocks(q, build_block_summaries(k, 8), 100, sinks=8, window=16, top_k=2, score="mean")
    with pytest.raises(ValueError, match="'mass' needs mean"):
        select_blocks(q, build_block_summaries(k, 8), 100, sinks=8, window=16, top_k=2, score="mass")
    with pytest.raises(ValueError, match="block_size"):
        build_block_summaries(k, 0)


@requires_triton
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("split_len", [32, 256])
def test_triton_kernel_matches_the_reference(case, split_len):
    from kernels._sparse_attention_triton import sparse_decode_triton

    q, k, v = _qkv(*case[:5], seed=3 * sum(case) + split_len)
    plan = _plan(q, k, case)
    want = sparse_decode_attention_reference(q, k, v, plan)
    got = sparse_decode_triton(q, k, v, plan, split_len=split_len, poison_scratch=True)
    assert max_rel_err(got, want) < 1e-5


@requires_triton
def test_triton_kernel_on_strided_caches():
    from kernels._sparse_attention_triton import sparse_decode_triton

    case = CASES[1]
    q, k, v = _qkv(*case[:5], seed=11)
    k_strided = k.transpose(1, 2).contiguous().transpose(1, 2)  # [b, kv, s, d] stored as [b, s, kv, d]
    plan = _plan(q, k, case)
    got = sparse_decode_triton(q, k_strided, v, plan, split_len=64, poison_scratch=True)
    assert max_rel_err(got, sparse_decode_attention_reference(q, k, v, plan)) < 1e-5


def test_gathered_blocks_copy_only_what_came_in_and_match_the_oracle_at_every_step():
    from kernels.sparse_attention import GatheredBlocks

    gen = torch.Generator().manual_seed(11)
    keys = torch.randn(2, 2, 900, 16, generator=gen)
    values = torch.randn(2, 2, 900, 16, generator=gen)
    query = torch.randn(2, 6, 16, generator=gen)
    gathered = GatheredBlocks()
    copied = []
    for step, seq in enumerate(range(800, 812)):  # a decode loop: the cache grows by one token a step
        q = query + 0.05 * step * torch.randn(2, 6, 16, generator=gen)  # the query drifts
        k, v = keys[:, :, :seq], values[:, :, :seq]
        plan = plan_sparse_attention(q, k, sinks=16, window=64, top_k=6, block_size=16, score="mass")
        got = sparse_decode_attention(q, k, v, plan, backend="torch", gathered=gathered)
        assert max_rel_err(got, sparse_decode_attention_reference(q, k, v, plan)) < 1e-5
        copied.append(gathered.copied_blocks)
    assert copied[0] == 2 * 2 * 6  # the first step copies every chosen block of every head
    assert copied[-1] < 12 * copied[0]  # later steps copy only the blocks that changed
    assert copied[1] - copied[0] < copied[0]
    # A plan of another shape (more blocks) starts over.
    plan = plan_sparse_attention(query, keys, sinks=16, window=64, top_k=8, block_size=16, score="mass")
    got = sparse_decode_attention(query, keys, values, plan, backend="torch", gathered=gathered)
    assert gathered.copied_blocks == 2 * 2 * 8
    assert max_rel_err(got, sparse_decode_attention_reference(query, keys, values, plan)) < 1e-5
