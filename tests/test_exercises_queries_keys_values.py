"""Chapter "Queries, keys and values"'s exercise checks: the references pass, plausible mistakes fail with the right
hint."""

import math
import warnings

import pytest
import torch
from _exercise_cases import FIELDS, assert_verdict, case, stub

import transformer_lib as tl
from transformer_lib.exercises.queries_keys_values import check_attention, check_soft_lookup, soft_lookup


def test_soft_lookup_becomes_hard_at_low_temperature():
    keys = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.7, 0.7]])
    values = torch.tensor([1.0, 2.0, 4.0])
    query = torch.tensor([0.0, 1.0])
    assert soft_lookup(query, keys, values, 1e-3).item() == pytest.approx(2.0)
    assert soft_lookup(query, keys, values, 1e3).item() == pytest.approx(values.mean().item(), abs=1e-3)


# soft lookup ---------------------------------------------------------------------------------


def model_lookup(query, keys, values, temperature=1.0):
    """Softmax-weighted average of the values."""
    scores = keys @ query / temperature  # (n,)
    weights = torch.softmax(scores, dim=0)
    return torch.tensordot(weights, values, dims=1)


LOOKUP_CASES = [
    case(check_soft_lookup, soft_lookup, "passed", id="reference"),
    case(check_soft_lookup, model_lookup, "passed"),
    *(
        case(check_soft_lookup, wrong, "failed", message, id=message)
        for wrong, message in [
            (lambda q, k, v, t=1.0: v[(k @ q).argmax()], "hard lookup"),
            (lambda q, k, v, t=1.0: torch.softmax(k @ q, dim=0) @ v, "temperature was ignored"),
            (lambda q, k, v, t=1.0: torch.softmax(k @ q * t, dim=0) @ v, "multiplied by the temperature"),
            (lambda q, k, v, t=1.0: ((k @ q / t) / (k @ q / t).sum()) @ v, "divided by their sum"),
            (lambda q, k, v, t=1.0: torch.exp(k @ q / t) @ v, "not normalised"),
            (lambda q, k, v, t=1.0: torch.exp(k @ q / t) / torch.exp(k @ q / t).sum() @ v, "overflows"),
            (lambda q, k, v, t=1.0: (torch.softmax(k @ q / t, dim=0) @ v).float(), "dtype"),
            (lambda q, k, v, t=1.0: torch.softmax(k @ q / t, dim=0)[:, None] * v, "shape"),
            (lambda q, k, v, t=1.0: (torch.softmax(k @ q / t, dim=0) @ v).tolist(), "torch.Tensor"),
        ]
    ),
    case(check_soft_lookup, stub, "not implemented"),
]


# attention -----------------------------------------------------------------------------------


def model_attention(q, k, v):
    """softmax(q k^T / sqrt(d_k)) v, returning (output, weights)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T_q, T_k)
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def _scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def _unnormalised(q, k, v):
    w = torch.exp(_scores(q, k))
    return w @ v, w


def _normalised_out_of_unnormalised(q, k, v):
    w = torch.softmax(_scores(q, k), dim=-1)
    return torch.exp(_scores(q, k)) @ v, w


def _implicit_dim(q, k, v):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = torch.nn.functional.softmax(_scores(q, k))  # the deprecated implicit dim
    return w @ v, w


def _dim1(q, k, v):
    w = torch.softmax(_scores(q, k), dim=1)  # right for 2-D only
    return w @ v, w


def _float32(q, k, v):
    w = torch.softmax(_scores(q, k).float(), dim=-1)
    return w @ v.float(), w


def _with_T(q, k, v):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1)
    return w @ v, w


ATTENTION_CASES = [
    case(check_attention, lambda q, k, v: tl.scaled_dot_product_attention(q, k, v), "passed", id="library"),
    case(check_attention, model_attention, "passed"),
    *(
        case(check_attention, wrong, "failed", message, id=message)
        for wrong, message in [
            (
                lambda q, k, v: (
                    torch.softmax(q @ k.transpose(-2, -1), -1) @ v,
                    torch.softmax(q @ k.transpose(-2, -1), -1),
                ),
                "not divided by sqrt(d_k)",
            ),
            (
                lambda q, k, v: (
                    torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1], -1) @ v,
                    torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1], -1),
                ),
                "divided by d_k",
            ),
            (
                lambda q, k, v: (torch.softmax(_scores(q, k), -2) @ v, torch.softmax(_scores(q, k), -2)),
                "columns sum to 1",
            ),
            (_unnormalised, "do not sum to 1"),
            (_normalised_out_of_unnormalised, "output is wrong"),
            (lambda q, k, v: tl.scaled_dot_product_attention(q, k, v)[0], "return a pair"),
            (lambda q, k, v: tuple(reversed(tl.scaled_dot_product_attention(q, k, v))), "shape"),
            (
                lambda q, k, v: (
                    torch.softmax(k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1).transpose(-2, -1) @ v,
                    torch.softmax(k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1),
                ),
                "transposed",
            ),
            (_float32, "keep the inputs' dtype"),
            (_implicit_dim, "batch axis"),
            (_dim1, "dim=1 is not the last axis"),
        ]
    ),
    case(check_attention, _with_T, "failed", "k.transpose(-2, -1)", id="k.T on batched input"),
    case(check_attention, stub, "not implemented"),
]


@pytest.mark.parametrize(FIELDS, LOOKUP_CASES + ATTENTION_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)
