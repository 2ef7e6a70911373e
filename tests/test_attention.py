"""Tests for transformer_lib/attention.py: parity with PyTorch, masking, gradients, errors."""

import math

import pytest
import torch
import torch.nn.functional as F

import transformer_lib as tl


def random_mask(shape, gen, p=0.3, ensure_one=True):
    """Random boolean mask (True = may attend); optionally at least one key per query row."""
    mask = torch.rand(shape, generator=gen) > p
    if ensure_one:
        first = torch.randint(0, shape[-1], shape[:-1], generator=gen)
        mask.scatter_(-1, first[..., None], True)
    return mask


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 5, 7), (4, 7, 16), (3, 1, 9)])
@pytest.mark.parametrize("T_k", [1, 6, 13])
def test_parity_with_torch_random_masks(gen, shape, T_k):
    *batch, T_q, d = shape
    q = torch.randn(*batch, T_q, d, generator=gen, dtype=torch.float64)
    k = torch.randn(*batch, T_k, d, generator=gen, dtype=torch.float64)
    v = torch.randn(*batch, T_k, d + 2, generator=gen, dtype=torch.float64)
    for mask in (None, random_mask((*batch, T_q, T_k), gen), random_mask((T_q, T_k), gen)):
        out, w = tl.scaled_dot_product_attention(q, k, v, mask=mask)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
        assert w.shape == (*batch, T_q, T_k)
        torch.testing.assert_close(w.sum(-1), torch.ones(*batch, T_q, dtype=torch.float64))
        if mask is not None:
            assert (w[~mask.expand_as(w)] == 0).all()


def test_weights_match_explicit_formula(gen):
    q, k, v = (torch.randn(2, 4, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    _, w = tl.scaled_dot_product_attention(q, k, v)
    expected = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)
    torch.testing.assert_close(w, expected)


def test_fully_masked_rows_give_zeros_and_finite_gradients(gen):
    q = torch.randn(2, 4, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 5, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = random_mask((2, 4, 5), gen)
    mask[0, 1] = False  # query 1 of batch 0 may attend to nothing
    mask[1, 3] = False
    out, w = tl.scaled_dot_product_attention(q, k, v, mask=mask)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert (out[0, 1] == 0).all() and (w[0, 1] == 0).all() and (out[1, 3] == 0).all()
    (out.square().sum() + w.sum()).backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[0, 1] == 0).all()
    # the other rows are unaffected: they equal PyTorch's
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    keep = mask.any(-1)
    torch.testing.assert_close(out[keep], ref[keep])


def test_gradcheck(gen):
    q = torch.randn(2, 3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 5, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = random_mask((2, 3, 5), gen)
    mask[1, 0] = False

    def f(q, k, v):
        return tl.scaled_dot_product_attention(q, k, v, mask=mask)

    assert torch.autograd.gradcheck(f, (q, k, v))
    assert torch.autograd.gradgradcheck(lambda q, k, v: f(q, k, v)[0], (q, k, v))


def test_dropout_keeps_expectation_and_zeros_some_weights(gen):
    torch.manual_seed(0)
    q, k = torch.randn(1, 64, 8, generator=gen), torch.randn(1, 64, 8, generator=gen)
    v = torch.eye(64)[None]  # output row = weights row, so dropout is visible
    out, _ = tl.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    _, w = tl.scaled_dot_product_attention(q, k, v)
    assert 0.3 < (out == 0).float().mean() < 0.7
    assert abs(out.sum(-1).mean().item() - 1.0) < 0.1  # inverted dropout keeps the expectation
    assert torch.equal(torch.where(out != 0, out / 2, 0.0), torch.where(out != 0, w, 0.0))


@pytest.mark.parametrize(
    "q_shape,k_shape,v_shape,match",
    [
        ((2, 4, 8), (2, 5, 7), (2, 5, 3), "same last dimension d_k"),
        ((2, 4, 8), (2, 5, 8), (2, 6, 3), "same number of positions T_k"),
        ((8,), (2, 5, 8), (2, 5, 3), "at least 2 dimensions"),
    ],
)
def test_bad_shapes_raise(q_shape, k_shape, v_shape, match):
    with pytest.raises(ValueError, match=match):
        tl.scaled_dot_product_attention(torch.randn(q_shape), torch.randn(k_shape), torch.randn(v_shape))


def test_bad_masks_raise():
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 3)
    with pytest.raises(TypeError, match="dtype torch.bool"):
        tl.scaled_dot_product_attention(q, k, v, mask=torch.ones(4, 5))
    with pytest.raises(ValueError, match="does not broadcast"):
        tl.scaled_dot_product_attention(q, k, v, mask=torch.ones(5, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="does not broadcast"):  # would grow the output's shape
        tl.scaled_dot_product_attention(q, k, v, mask=torch.ones(3, 2, 4, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="torch.Tensor"):
        tl.scaled_dot_product_attention(q, k, v, mask=[[True] * 5] * 4)


def test_additive_attention_shapes_masks_and_softmax_axis(gen):
    torch.manual_seed(0)
    att = tl.AdditiveAttention(query_size=6, key_size=3, hidden_size=5).double()
    queries = torch.randn(2, 4, 6, generator=gen, dtype=torch.float64)
    keys = torch.randn(2, 7, 3, generator=gen, dtype=torch.float64)
    values = torch.randn(2, 7, 2, generator=gen, dtype=torch.float64)
    mask = random_mask((2, 1, 7), gen)  # a key-padding mask broadcast over queries
    out, w = att(queries, keys, values, mask=mask)
    assert out.shape == (2, 4, 2) and w.shape == (2, 4, 7)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, dtype=torch.float64))
    assert (w[~mask.expand(2, 4, 7)] == 0).all()
    # the score is w^T tanh(W_q q + W_k k): recompute one entry by hand
    s = att.w_v.weight @ torch.tanh(att.W_q.weight @ queries[1, 2] + att.W_k.weight @ keys[1, 3])
    scores = torch.stack(
        [att.w_v.weight @ torch.tanh(att.W_q.weight @ queries[1, 2] + att.W_k.weight @ keys[1, j]) for j in range(7)]
    ).squeeze(-1)
    expected = torch.softmax(scores.masked_fill(~mask[1, 0], -torch.inf), dim=0)
    torch.testing.assert_close(w[1, 2], expected)
    assert s.shape == (1,)
    with pytest.raises(ValueError, match="queries must have last dimension 6"):
        att(keys, keys, values)
