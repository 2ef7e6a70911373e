"""Tests for transformer_lib/exercises/scaling.py: the model answers pass, plausible mistakes fail clearly."""

import math

import pytest
import torch
from _exercise_cases import FIELDS, assert_verdict, case, stub

import transformer_lib as tl
from transformer_lib.exercises import scaling

# --------------------------------------------------------------------------------------------
# check_scaled_scores
# --------------------------------------------------------------------------------------------


def scores_right(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def scores_from_library(q, k):
    """The same scores with the square root taken by torch rather than math must pass too."""
    d_k = q.shape[-1]
    return q @ k.transpose(-2, -1) / torch.sqrt(torch.tensor(d_k, dtype=q.dtype))


def scores_no_scaling(q, k):
    return q @ k.transpose(-2, -1)


def scores_divide_by_dk(q, k):
    return q @ k.transpose(-2, -1) / q.shape[-1]


def scores_multiply(q, k):
    return q @ k.transpose(-2, -1) * math.sqrt(q.shape[-1])


def scores_sqrt_T_k(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(k.shape[-2])


def scores_sqrt_T_q(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-2])


def scores_transposed(q, k):
    return k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1])


def scores_2d_only(q, k):
    return q @ k.T / math.sqrt(q.shape[1])


def scores_axis_1(q, k):
    """Works for 2-D inputs, but reads d_k from axis 1 (the heads axis when batched)."""
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[1])


def scores_float32(q, k):
    return (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])


def scores_in_place(q, k):
    q /= math.sqrt(q.shape[-1])
    return q @ k.transpose(-2, -1)


def scores_numpy(q, k):
    return (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).numpy()


SCORES = scaling.check_scaled_scores
SCORES_CASES = [
    case(SCORES, scores_right, "passed", "Correct: scaled scores passed every test case."),
    case(SCORES, scores_from_library, "passed", "Correct: scaled scores passed every test case."),
    *(
        case(SCORES, fn, "failed", "Not yet: For q of shape", *phrases)
        for fn, phrases in [
            (scores_no_scaling, ["sqrt(d_k) = 4 times too large", "not scaled at all", "T_q=2, T_k=3, d_k=16"]),
            (scores_divide_by_dk, ["sqrt(d_k) = 4 times too small", "divided by d_k = 16"]),
            (scores_multiply, ["multiplied by sqrt(d_k) instead of dividing"]),
            (scores_sqrt_T_k, ["divided by sqrt(T_k) = 1.732", "last axis of q and k"]),
            (scores_sqrt_T_q, ["divided by sqrt(T_q) = 1.414", "last axis of q and k"]),
            (scores_transposed, ["expected (..., T_q, T_k) = (2, 3)", "not k times q"]),
            (scores_2d_only, ["shape (2, 3, 4, 25)", "raised RuntimeError", "k.transpose(-2, -1) rather than k.T"]),
            (scores_axis_1, ["shape (2, 3, 4, 25)", "the 2-D cases passed", "d_k = q.shape[-1]"]),
            (scores_float32, ["dtype torch.float32; expected torch.float64", "keep the input's dtype"]),
            (scores_in_place, ["changed q or k in place"]),
            (scores_numpy, ["returned a ndarray", "return a torch.Tensor"]),
        ]
    ),
    case(SCORES, stub, "not implemented", "scaled scores: not implemented yet."),
]


def test_scaled_scores_prints_one_line(capsys):
    scaling.check_scaled_scores(scores_no_scaling)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("Not yet:")


# --------------------------------------------------------------------------------------------
# check_softmax_jacobian
# --------------------------------------------------------------------------------------------


def jac_right(p):
    return torch.diag_embed(p) - p[..., :, None] * p[..., None, :]


def jac_autograd(p):
    """The Jacobian measured by autograd, one row of p at a time (slow but independent of the formula)."""
    s = p.clamp_min(1e-300).log()  # softmax(log p) = p for a probability vector
    rows = [torch.autograd.functional.jacobian(lambda x: torch.softmax(x, -1), r) for r in s.reshape(-1, p.shape[-1])]
    return torch.stack(rows).reshape(*p.shape, p.shape[-1])


def jac_diag_only(p):
    return torch.diag_embed(p)


def jac_sign_flipped(p):
    return p[..., :, None] * p[..., None, :] - torch.diag_embed(p)


def jac_diagonal_terms_only(p):
    return torch.diag_embed(p * (1 - p))


def jac_inner_product(p):
    return torch.diag_embed(p) - (p * p).sum(-1)[..., None, None]


def jac_minus_p(p):
    return torch.diag_embed(p) - p[..., None, :]


def jac_one_vector_only(p):
    return torch.diag(p) - torch.outer(p, p)


def jac_mixes_batch(p):
    """p.T @ p: right for one row (p as (1, n)), but sums the outer products of all rows of a batch."""
    P = p.reshape(-1, p.shape[-1])
    return torch.diag_embed(p) - P.T @ P


def jac_wrong_shape(p):
    return p - p * p


JACOBIAN = scaling.check_softmax_jacobian
JACOBIAN_CASES = [
    *(case(JACOBIAN, fn, "passed") for fn in (jac_right, tl.softmax_jacobian, jac_autograd)),
    *(
        case(JACOBIAN, fn, "failed", "Not yet: For p", *phrases)
        for fn, phrases in [
            (jac_diag_only, ["For p = [1.0] (shape (1,))", "diag(p) only", "Expected [[0.0]], got [[1.0]]"]),
            (jac_sign_flipped, ["For p = [0.2, 0.3, 0.5]", "sign is flipped"]),
            (jac_diagonal_terms_only, ["For p = [0.2, 0.3, 0.5]", "every off-diagonal entry is 0", "-p_i p_j"]),
            (jac_inner_product, ["For p = [0.2, 0.3, 0.5]", "inner product p . p", "outer product"]),
            (jac_minus_p, ["For p = [0.2, 0.3, 0.5]", "subtracted p itself"]),
            (jac_one_vector_only, ["For p of shape (2, 4)", "raised RuntimeError", "torch.diag_embed"]),
            (jac_mixes_batch, ["For p of shape (2, 4)", "the values are wrong", "First matrix expected"]),
            (jac_wrong_shape, ["expected (..., n, n) = (1, 1)", "has shape (1,)"]),
        ]
    ),
    case(JACOBIAN, stub, "not implemented"),
]


@pytest.mark.filterwarnings("ignore:The use of `x.T`:UserWarning")
@pytest.mark.parametrize(FIELDS, SCORES_CASES + JACOBIAN_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)


def test_checks_never_show_solution_code():
    for fn in (jac_diag_only, jac_inner_product, jac_one_vector_only):
        message = scaling.check_softmax_jacobian(fn, verbose=False).message
        assert "unsqueeze" not in message and "def " not in message
    for fn in (scores_no_scaling, scores_2d_only):
        message = scaling.check_scaled_scores(fn, verbose=False).message
        assert "math.sqrt" not in message and "def " not in message
