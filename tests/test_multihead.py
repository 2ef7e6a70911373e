"""Tests for transformer_lib/multihead.py: parity with torch.nn.MultiheadAttention, fused vs
hand-written path, causality, padding invariance, errors."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import transformer_lib as tl
from transformer_lib.cost import multihead_cost
from transformer_lib.multihead import head_contributions, merge_heads, split_heads


def make_pair(d_model=16, n_heads=4, bias=True, dtype=torch.float64):
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True).to(dtype)
    with torch.no_grad():  # random biases, so a bias mix-up cannot hide behind zeros
        for p in ref.parameters():
            p.normal_(0, 0.3)
    return ref.eval(), tl.MultiHeadAttention.from_torch(ref).eval()


@pytest.mark.parametrize("bias", [True, False])
def test_from_torch_parity(gen, bias):
    ref, mine = make_pair(bias=bias)
    q = torch.randn(3, 5, 16, generator=gen, dtype=torch.float64)
    kv = torch.randn(3, 7, 16, generator=gen, dtype=torch.float64)
    out_ref, w_ref = ref(q, kv, kv, average_attn_weights=False)
    for need_weights in (True, False):
        out, w = mine(q, kv, kv, need_weights=need_weights)
        torch.testing.assert_close(out, out_ref)
        if need_weights:
            torch.testing.assert_close(w, w_ref)
        else:
            assert w is None


def test_from_torch_parity_with_masks(gen):
    ref, mine = make_pair()
    x = torch.randn(2, 6, 16, generator=gen, dtype=torch.float64)
    keep = tl.padding_mask(torch.tensor([6, 4]), 6)
    causal = tl.causal_mask(6)
    out_ref, w_ref = ref(x, x, x, key_padding_mask=~keep, attn_mask=~causal, average_attn_weights=False)
    out, w = mine(x, x, x, mask=tl.combine_masks(keep, causal=True), need_weights=True)
    torch.testing.assert_close(out, out_ref)
    torch.testing.assert_close(w, w_ref)
    out2, _ = mine(x, x, x, mask=keep[:, None, None, :], is_causal=True)
    torch.testing.assert_close(out2, out_ref)


def test_fused_and_handwritten_paths_agree_with_gradients(gen):
    torch.manual_seed(1)
    mha = tl.MultiHeadAttention(24, 3).double()
    x = torch.randn(2, 9, 24, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, 1, 9, 9, generator=gen) > 0.4
    mask[0, 0, 2] = False  # a fully masked query row
    grads = []
    outs = []
    for need_weights in (True, False):
        for kwargs in ({"mask": mask}, {"is_causal": True}, {"mask": mask, "is_causal": True}):
            x.grad = None
            mha.zero_grad()
            out, _ = mha(x, x, x, need_weights=need_weights, **kwargs)
            out.sum().backward()
            outs.append(out.detach())
            grads.append([x.grad.clone()] + [p.grad.clone() for p in mha.parameters()])
    for i in range(3):
        torch.testing.assert_close(outs[i], outs[i + 3])
        for a, b in zip(grads[i], grads[i + 3], strict=True):
            torch.testing.assert_close(a, b)
            assert torch.isfinite(a).all()


def test_split_merge_roundtrip_and_loop_equivalence(gen):
    x = torch.randn(2, 5, 12, generator=gen)
    h = split_heads(x, 3)
    assert h.shape == (2, 3, 5, 4)
    torch.testing.assert_close(h[:, 1], x[..., 4:8])  # head 1 holds dimensions 4..7
    assert torch.equal(merge_heads(h), x)


def test_causal_property(gen):
    """Changing positions >= t never changes outputs before t."""
    torch.manual_seed(0)
    mha = tl.MultiHeadAttention(16, 4).double().eval()
    x = torch.randn(2, 8, 16, generator=gen, dtype=torch.float64)
    for need_weights in (True, False):
        base, _ = mha(x, x, x, is_causal=True, need_weights=need_weights)
        for t in range(8):
            y = x.clone()
            y[:, t:] = torch.randn(2, 8 - t, 16, generator=gen, dtype=torch.float64)
            out, _ = mha(y, y, y, is_causal=True, need_weights=need_weights)
            assert torch.equal(out[:, :t], base[:, :t])


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"d_model \(10\) must be divisible by n_heads \(4\)"):
        tl.MultiHeadAttention(10, 4)
    mha = tl.MultiHeadAttention(8, 2)
    x = torch.randn(2, 3, 8)
    with pytest.raises(ValueError, match="d_model=8"):
        mha(torch.randn(2, 3, 6), x, x)
    with pytest.raises(TypeError, match="dtype torch.bool"):
        mha(x, x, x, mask=torch.ones(3, 3))
    with pytest.raises(ValueError, match="does not broadcast"):
        mha(x, x, x, mask=torch.ones(2, 3, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="batch_first=True"):
        tl.MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(8, 2))


@pytest.mark.parametrize("d_model,h,bias", [(8, 2, True), (12, 3, False), (6, 1, True), (8, 8, True)])
def test_head_contributions_sum_to_output(d_model, h, bias):
    tl.set_seed(0)
    mha = tl.MultiHeadAttention(d_model, h, bias=bias).eval()
    x = torch.randn(2, 5, d_model)
    parts = head_contributions(mha, x, x, x, is_causal=True)
    assert parts.shape == (2, h, 5, d_model)
    out, _ = mha(x, x, x, is_causal=True)
    total = parts.sum(1) + (mha.out_proj.bias if bias else 0)
    torch.testing.assert_close(total, out, atol=1e-5, rtol=1e-5)


def test_head_contributions_cross_attention_with_mask_and_one_head_switched_off():
    tl.set_seed(1)
    mha = tl.MultiHeadAttention(8, 2).eval()
    q, kv = torch.randn(2, 3, 8), torch.randn(2, 4, 8)
    keep = torch.tensor([[True, True, True, False], [True, True, False, False]])[:, None, None, :]
    parts = head_contributions(mha, q, kv, kv, mask=keep)
    assert parts.shape == (2, 2, 3, 8)
    out, _ = mha(q, kv, kv, mask=keep)
    torch.testing.assert_close(parts.sum(1) + mha.out_proj.bias, out, atol=1e-5, rtol=1e-5)
    # zeroing head 1's columns of W_o removes exactly head 1's contribution
    with torch.no_grad():
        mha.out_proj.weight[:, 4:] = 0
    out0, _ = mha(q, kv, kv, mask=keep)
    torch.testing.assert_close(parts[:, 0] + mha.out_proj.bias, out0, atol=1e-5, rtol=1e-5)


def test_head_contributions_leaves_no_hook_behind():
    mha = tl.MultiHeadAttention(4, 2)
    x = torch.randn(1, 2, 4)
    head_contributions(mha, x, x, x)
    assert not mha.out_proj._forward_pre_hooks


@pytest.mark.parametrize("d_model,h,bias", [(8, 2, True), (12, 3, False), (16, 16, True), (32, 1, True)])
def test_multihead_cost_params_match_the_module(d_model, h, bias):
    mha = tl.MultiHeadAttention(d_model, h, bias=bias)
    n = sum(p.numel() for p in mha.parameters())
    assert multihead_cost(d_model, h, T_q=3, bias=bias)["params"] == n


@pytest.mark.parametrize("d_model,h,T_q,T_k,B", [(16, 4, 7, 7, 2), (12, 3, 2, 5, 1), (8, 1, 4, 4, 3)])
def test_multihead_cost_flops_match_flop_counter(d_model, h, T_q, T_k, B):
    mha = tl.MultiHeadAttention(d_model, h)
    q, kv = torch.randn(B, T_q, d_model), torch.randn(B, T_k, d_model)
    with FlopCounterMode(display=False) as counter:
        mha(q, kv, kv, need_weights=True)  # the hand-written path: every product is a counted matmul
    cost = multihead_cost(d_model, h, T_q, T_k, batch=B)
    assert cost["total_flops"] == counter.get_total_flops()
    assert cost["score_entries"] == B * h * T_q * T_k


def test_multihead_cost_flops_do_not_depend_on_heads():
    costs = [multihead_cost(64, h, T_q=10) for h in (1, 2, 4, 8, 64)]
    assert len({c["total_flops"] for c in costs}) == 1
    assert len({c["params"] for c in costs}) == 1
    assert [c["score_entries"] for c in costs] == [100, 200, 400, 800, 6400]


def test_multihead_cost_rejects_bad_heads():
    with pytest.raises(ValueError, match="divisible"):
        multihead_cost(10, 3, T_q=4)


# --- grouped-query attention, chapter "Generation" (equivalence tests: tests/test_cache.py) ---


def test_the_default_is_standard_multi_head_attention_with_the_fused_layout():
    m = tl.MultiHeadAttention(24, 6)
    assert m.n_kv_heads == 6 and m.in_proj_weight.shape == (72, 24) and m.in_proj_bias.shape == (72,)
    assert [p.weight.shape for p in (m.q_proj, m.k_proj, m.v_proj)] == [(24, 24)] * 3


@pytest.mark.parametrize("n_kv_heads", [1, 2, 3])
def test_grouped_projections_are_views_of_fewer_rows(n_kv_heads):
    m = tl.MultiHeadAttention(24, 6, n_kv_heads=n_kv_heads, bias=True)
    d_kv = n_kv_heads * 4
    assert m.in_proj_weight.shape == (24 + 2 * d_kv, 24)
    assert m.k_proj.weight.shape == m.v_proj.weight.shape == (d_kv, 24) and m.k_proj.bias.shape == (d_kv,)
    with torch.no_grad():
        m.v_proj.weight.fill_(7.0)
    assert (m.in_proj_weight[24 + d_kv :] == 7.0).all() and not (m.in_proj_weight[: 24 + d_kv] == 7.0).any()
    x = torch.randn(2, 5, 24)
    q, k, v = m.project(x, x, x)
    assert q.shape == (2, 6, 5, 4) and k.shape == v.shape == (2, n_kv_heads, 5, 4)
    q2, k2, v2 = m.project(x, x.clone(), x.clone())  # three products instead of one: the same numbers
    torch.testing.assert_close((q, k, v), (q2, k2, v2))


@pytest.mark.parametrize(("n_kv_heads", "error"), [(4, ValueError), (0, ValueError), (2.0, TypeError),
                                                   (12, ValueError)])  # fmt: skip
def test_n_kv_heads_must_divide_n_heads(n_kv_heads, error):
    with pytest.raises(error, match="n_kv_heads"):
        tl.MultiHeadAttention(24, 6, n_kv_heads=n_kv_heads)
