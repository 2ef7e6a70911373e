"""Tests for the chapter 5 additions to transformer_lib.multihead: head_contributions, multihead_cost."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import transformer_lib as tl
from transformer_lib.multihead import head_contributions, multihead_cost


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
