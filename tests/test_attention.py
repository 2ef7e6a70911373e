"""Tests for transformer_lib/attention.py: parity with PyTorch, masking, gradients, errors; the
weight check, Luong and parameter-free attention, one head, the soft lookup; the softmax's
entropy, Jacobian and temperature (chapter "Why divide by sqrt(d_k)")."""

import math

import pytest
import torch
import torch.nn.functional as F

import transformer_lib as tl
from transformer_lib.attention import (
    SingleHeadAttention,
    check_attention_weights,
    dot_product_attention,
    simple_self_attention,
)


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


# --------------------------------------------------------------------------------------------
# softmax_entropy
# --------------------------------------------------------------------------------------------


def test_entropy_of_one_hot_is_zero_and_of_uniform_is_log_n():
    w = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    h = tl.softmax_entropy(w)
    assert h.shape == (2,)
    torch.testing.assert_close(h, torch.tensor([0.0, math.log(4)]))


def test_entropy_matches_the_definition_and_zero_weights_add_nothing(gen):
    p = torch.softmax(torch.randn(3, 5, 7, generator=gen, dtype=torch.float64), dim=-1)
    torch.testing.assert_close(tl.softmax_entropy(p), -(p * p.log()).sum(-1))
    padded = torch.cat([p, torch.zeros(3, 5, 2, dtype=torch.float64)], dim=-1)  # masked keys get weight 0
    torch.testing.assert_close(tl.softmax_entropy(padded), tl.softmax_entropy(p))
    assert not torch.isnan(tl.softmax_entropy(torch.zeros(2, 3))).any()


def test_entropy_along_another_axis(gen):
    p = torch.softmax(torch.randn(4, 6, generator=gen), dim=0)
    torch.testing.assert_close(tl.softmax_entropy(p, dim=0), tl.softmax_entropy(p.T))


def test_entropy_lies_between_zero_and_log_n(gen):
    p = torch.softmax(3 * torch.randn(100, 9, generator=gen), dim=-1)
    h = tl.softmax_entropy(p)
    assert (h >= -1e-6).all() and (h <= math.log(9) + 1e-6).all()


# --------------------------------------------------------------------------------------------
# softmax_jacobian
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1,), (5,), (3, 4), (2, 3, 6)])
def test_softmax_jacobian_equals_autograd(gen, shape):
    s = torch.randn(*shape, generator=gen, dtype=torch.float64)
    J = tl.softmax_jacobian(torch.softmax(s, dim=-1))
    n = shape[-1]
    assert J.shape == (*shape, n)
    for row, J_row in zip(s.reshape(-1, n), J.reshape(-1, n, n), strict=True):
        auto = torch.autograd.functional.jacobian(lambda x: torch.softmax(x, dim=-1), row)
        torch.testing.assert_close(J_row, auto)


def test_softmax_jacobian_is_symmetric_rows_sum_to_zero_and_vanishes_at_one_hot(gen):
    p = torch.softmax(torch.randn(4, 7, generator=gen, dtype=torch.float64), dim=-1)
    J = tl.softmax_jacobian(p)
    torch.testing.assert_close(J, J.transpose(-2, -1))
    torch.testing.assert_close(J.sum(-1), torch.zeros(4, 7, dtype=torch.float64))
    one_hot = torch.tensor([0.0, 0.0, 1.0, 0.0])
    assert torch.equal(tl.softmax_jacobian(one_hot), torch.zeros(4, 4))


def test_softmax_jacobian_entries_are_bounded_by_one_minus_the_largest_weight(gen):
    """Exercise ex-03-4: if the largest weight is 1 - eps, every entry of J is at most eps in size."""
    p = torch.softmax(5 * torch.randn(500, 8, generator=gen, dtype=torch.float64), dim=-1)
    eps = 1 - p.max(dim=-1).values  # (500,)
    J = tl.softmax_jacobian(p)  # (500, 8, 8)
    assert (J.abs().amax(dim=(-2, -1)) <= eps + 1e-12).all()


def test_softmax_jacobian_keeps_dtype():
    assert tl.softmax_jacobian(torch.full((3,), 1 / 3, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize(
    "bad, error, phrase",
    [
        ([0.5, 0.5], TypeError, "must be a torch.Tensor"),
        (torch.tensor(1.0), ValueError, "at least 1 dimension"),
        (torch.tensor([0, 1]), TypeError, "floating-point"),
    ],
)
def test_softmax_jacobian_errors(bad, error, phrase):
    with pytest.raises(error, match=phrase):
        tl.softmax_jacobian(bad)


# --------------------------------------------------------------------------------------------
# softmax_with_temperature
# --------------------------------------------------------------------------------------------


def test_temperature_one_is_the_plain_softmax(gen):
    s = torch.randn(3, 5, generator=gen)
    torch.testing.assert_close(tl.softmax_with_temperature(s, 1.0), torch.softmax(s, dim=-1))
    torch.testing.assert_close(tl.softmax_with_temperature(s, 2.0, dim=0), torch.softmax(s / 2, dim=0))


def test_temperature_sharpens_and_flattens():
    s = torch.tensor([2.0, 1.0, 0.5, -1.0])
    entropies = [float(tl.softmax_entropy(tl.softmax_with_temperature(s, T))) for T in (0.01, 0.5, 1, 2, 100)]
    assert entropies == sorted(entropies)
    torch.testing.assert_close(tl.softmax_with_temperature(s, 0.01), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(tl.softmax_with_temperature(s, 1e6), torch.full((4,), 0.25), atol=1e-5, rtol=0)


def test_temperature_sqrt_dk_is_scaled_dot_product_attention(gen):
    q = torch.randn(2, 3, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 5, 16, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 5, 4, generator=gen, dtype=torch.float64)
    _, w = tl.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(tl.softmax_with_temperature(q @ k.transpose(-2, -1), math.sqrt(16)), w)


@pytest.mark.parametrize("T", [0.0, -1.0, float("inf"), float("nan")])
def test_temperature_must_be_positive_and_finite(T):
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        tl.softmax_with_temperature(torch.zeros(3), T)


def test_temperature_needs_a_tensor():
    with pytest.raises(TypeError, match="scores must be a torch.Tensor"):
        tl.softmax_with_temperature([1.0, 2.0], 1.0)
