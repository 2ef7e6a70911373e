"""Tests for the chapter-2 additions to transformer_lib.attention (weight check, Luong, parameter-free, one head)."""

import math

import pytest
import torch

import transformer_lib as tl
from transformer_lib.attention import (
    SingleHeadAttention,
    check_attention_weights,
    dot_product_attention,
    simple_self_attention,
)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# check_attention_weights ---------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3,), (1, 1), (4, 5), (2, 3, 4, 7)])
def test_softmax_weights_pass(shape):
    scores = torch.randn(shape, generator=_gen(), dtype=torch.float64)
    check_attention_weights(torch.softmax(scores, dim=-1))
    check_attention_weights(torch.softmax(scores.float(), dim=-1))


@pytest.mark.parametrize(
    ("weights", "text"),
    [
        ([0.5, 0.3, 0.3], "sums to 1.1, not 1"),
        ([0.41, 0.29, 0.23], "sums to 0.93, not 1"),
        ([1.2, -0.2], "negative weight"),
        ([float("nan"), 1.0], "NaN or inf"),
    ],
)
def test_bad_rows_are_named(weights, text):
    with pytest.raises(ValueError, match=text):
        check_attention_weights(torch.tensor(weights))


def test_message_names_the_first_bad_row():
    w = torch.softmax(torch.randn(2, 3, 4, generator=_gen()), dim=-1)
    w[1, 2, 0] += 0.1
    with pytest.raises(ValueError, match=r"row \(1, 2\) of the weights sums to 1\.1"):
        check_attention_weights(w)
    w2 = torch.tensor([[0.5, 0.5], [0.6, 0.5]])
    with pytest.raises(ValueError, match=r"row 1 of the weights sums to 1\.1"):
        check_attention_weights(w2)


def test_columns_summing_to_one_is_caught():
    scores = torch.randn(3, 4, generator=_gen())
    with pytest.raises(ValueError, match="sums to"):
        check_attention_weights(torch.softmax(scores, dim=0))


def test_mask_rules():
    mask = torch.tensor([[True, False, True], [False, False, False]])
    scores = torch.randn(2, 3, generator=_gen())
    check_attention_weights(tl.masked_softmax(scores, mask), mask)
    with pytest.raises(ValueError, match="masked key"):
        check_attention_weights(torch.softmax(scores, dim=-1), mask)
    bad = tl.masked_softmax(scores, mask)
    bad[1] = torch.tensor([0.0, 0.0, 0.0])
    check_attention_weights(bad, mask)
    with pytest.raises(TypeError, match="torch.bool"):
        check_attention_weights(bad, mask.int())
    with pytest.raises(ValueError, match="masked key"):
        check_attention_weights(torch.full((2, 3), 1 / 3), mask)


def test_atol_and_lists():
    check_attention_weights([0.5, 0.5 + 1e-6])
    with pytest.raises(ValueError):
        check_attention_weights([0.5, 0.5 + 1e-3], atol=1e-4)
    check_attention_weights([0.5, 0.5 + 1e-3], atol=1e-2)


# dot_product_attention and simple_self_attention ----------------------------------------------


def test_dot_product_equals_scaled_with_rescaled_queries():
    g = _gen(1)
    q = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 7, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 7, 3, generator=g, dtype=torch.float64)
    out, w = dot_product_attention(q, k, v)
    out2, w2 = tl.scaled_dot_product_attention(q * math.sqrt(8), k, v)
    torch.testing.assert_close(out, out2)
    torch.testing.assert_close(w, w2)
    torch.testing.assert_close(w, torch.softmax(q @ k.transpose(-2, -1), dim=-1))
    assert out.shape == (2, 5, 3) and w.shape == (2, 5, 7)


def test_dot_product_mask_and_shape_errors():
    g = _gen(2)
    q, k, v = torch.randn(3, 4, generator=g), torch.randn(5, 4, generator=g), torch.randn(5, 2, generator=g)
    mask = torch.tensor([True, True, False, False, True])
    _, w = dot_product_attention(q, k, v, mask)
    assert (w[:, ~mask] == 0).all()
    check_attention_weights(w)
    with pytest.raises(ValueError, match="same last dimension"):
        dot_product_attention(q, torch.randn(5, 3), v)


def test_simple_self_attention_is_softmax_xxt_x():
    x = torch.randn(2, 6, 4, generator=_gen(3), dtype=torch.float64)
    out, w = simple_self_attention(x)
    expected_w = torch.softmax(x @ x.transpose(-2, -1), dim=-1)
    torch.testing.assert_close(w, expected_w)
    torch.testing.assert_close(out, expected_w @ x)
    scores = x @ x.transpose(-2, -1)
    torch.testing.assert_close(scores, scores.transpose(-2, -1))


# SingleHeadAttention -------------------------------------------------------------------------


def test_single_head_matches_hand_computation():
    tl.set_seed(0)
    head = SingleHeadAttention(d_model=6, d_k=4, d_v=3).double()
    x = torch.randn(2, 5, 6, generator=_gen(4), dtype=torch.float64)
    out, w = head(x)
    q, k, v = x @ head.W_q.weight.T, x @ head.W_k.weight.T, x @ head.W_v.weight.T
    expected_w = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)
    torch.testing.assert_close(w, expected_w)
    torch.testing.assert_close(out, expected_w @ v)
    assert out.shape == (2, 5, 3)


def test_single_head_parameters_do_not_depend_on_length_and_are_shared():
    tl.set_seed(0)
    head = SingleHeadAttention(d_model=4, d_k=4)
    assert sum(p.numel() for p in head.parameters()) == 3 * 4 * 4
    x = torch.randn(7, 4, generator=_gen(5))
    perm = torch.randperm(7, generator=_gen(6))
    out, _ = head(x)
    out_p, _ = head(x[perm])
    torch.testing.assert_close(out_p, out[perm])  # the same W's at every position: permutation-equivariant


def test_single_head_cross_attention_and_mask():
    tl.set_seed(0)
    head = SingleHeadAttention(d_model=3, d_k=4, d_v=2, d_context=5)
    x, memory = torch.randn(2, 3, generator=_gen(7)), torch.randn(6, 5, generator=_gen(8))
    out, w = head(x, memory)
    assert out.shape == (2, 2) and w.shape == (2, 6)
    mask = torch.tensor([True, False, True, True, False, True])
    _, w = head(x, memory, mask)
    assert (w[:, ~mask] == 0).all()
    with pytest.raises(ValueError, match="d_context=5"):
        head(x)
    with pytest.raises(ValueError, match="d_model=3"):
        head(memory, memory)


def test_single_head_context_defaults_to_x():
    tl.set_seed(0)
    head = SingleHeadAttention(d_model=4, d_k=2, bias=True)
    x = torch.randn(5, 4, generator=_gen(9))
    torch.testing.assert_close(head(x)[0], head(x, x)[0])
