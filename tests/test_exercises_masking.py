"""The chapter "Masking" checks accept right answers and reject plausible wrong ones with the right message."""

import pytest
import torch
from _exercise_cases import FIELDS, Table, assert_verdict, case, stub

import transformer_lib as tl
from transformer_lib.exercises import masking

CAUSAL = masking.check_causal_mask
SOFTMAX = masking.check_masked_softmax
CASES = Table()  # the rows of the answers below that are written as functions

# ---------------------------------------------------------------- check_causal_mask


@CASES.add(CAUSAL, "passed")
def causal_model_answer(T):
    return torch.tril(torch.ones(T, T, dtype=torch.bool))


@CASES.add(CAUSAL, "failed", "row 0 attends to position 1, which is in the future")
def causal_upper_triangle(T):
    return torch.triu(torch.ones(T, T, dtype=torch.bool))


@CASES.add(CAUSAL, "failed", "row 0 may not attend to itself", "T=1")
def causal_excludes_self(T):
    return torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=-1)


@CASES.add(CAUSAL, "failed", "dtype torch.int64", "torch.bool")
def causal_int_dtype(T):
    return torch.tril(torch.ones(T, T, dtype=torch.long))


@CASES.add(CAUSAL, "failed", "additive mask")
def causal_additive(T):
    return torch.triu(torch.full((T, T), float("-inf")), diagonal=1)


@CASES.add(CAUSAL, "failed", "exact opposite", "True means 'may attend'")
def causal_inverted(T):
    return torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)


@CASES.add(CAUSAL, "failed", "row 1 cannot attend to position 0, which is in its past")
def causal_only_diagonal(T):
    return torch.eye(T, dtype=torch.bool)


@CASES.add(CAUSAL, "failed", "returned a list")
def causal_list(T):
    return [[j <= i for j in range(T)] for i in range(T)]


@CASES.add(CAUSAL, "failed", "shape (4, 4); expected (1, 1)")
def causal_fixed_size(T):
    return torch.tril(torch.ones(4, 4, dtype=torch.bool))


CAUSAL_CASES = [
    case(CAUSAL, tl.causal_mask, "passed", id="library"),
    case(CAUSAL, stub, "not implemented"),
]


def test_causal_mask_stub_prints_not_implemented(capsys):
    assert masking.check_causal_mask(stub).status == "not implemented"
    assert "not implemented yet" in capsys.readouterr().out


# ---------------------------------------------------------------- check_masked_softmax


def softmax_model_answer(scores, mask):
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    return weights * mask.any(dim=-1, keepdim=True)


@CASES.add(SOFTMAX, "failed", "is masked in row 0 but gets weight", "-1e-9")
def softmax_tiny_fill(scores, mask):
    weights = torch.softmax(scores.masked_fill(~mask, -1e-9), dim=-1)
    return weights * mask.any(dim=-1, keepdim=True)


@CASES.add(SOFTMAX, "failed", "but gets weight", "a causal mask, T=4")
def softmax_zero_fill(scores, mask):
    weights = torch.softmax(scores.masked_fill(~mask, 0.0), dim=-1)
    return weights * mask.any(dim=-1, keepdim=True)


@CASES.add(SOFTMAX, "failed", "not 1", "after the softmax")
def softmax_zero_after(scores, mask):
    return torch.softmax(scores, dim=-1) * mask


@CASES.add(SOFTMAX, "failed", "row 0 has every key masked", "NaN", "0/0")
def softmax_minus_inf(scores, mask):
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


@CASES.add(SOFTMAX, "failed", "row 0 has every key masked", "uniform")
def softmax_uniform_empty_rows(scores, mask):
    return torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)


@CASES.add(SOFTMAX, "failed", "gradient", "rows [0, 3]")
def softmax_add_minus_inf_then_where(scores, mask):
    additive = torch.zeros_like(scores).masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores + additive, dim=-1)
    return torch.where(mask.any(-1, keepdim=True), weights, torch.zeros_like(weights))


@CASES.add(SOFTMAX, "failed", "dim=-2", "nothing masked")
def softmax_wrong_axis(scores, mask):
    weights = torch.softmax(scores.masked_fill(~mask, -1e9), dim=-2)
    return weights * mask.any(dim=-1, keepdim=True)


@CASES.add(SOFTMAX, "failed", "dtype torch.float32", "float64")
def softmax_float32(scores, mask):
    return softmax_model_answer(scores.float(), mask)


def softmax_in_place(scores, mask):
    scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1) * mask.any(dim=-1, keepdim=True)


def softmax_where_after_masked_fill(scores, mask):
    """The masked_fill version of the where trick: masked_fill's backward stops the NaN."""
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.where(mask.any(-1, keepdim=True), weights, torch.zeros_like(weights))


SOFTMAX_CASES = [
    *(
        case(SOFTMAX, fn, "passed")
        for fn in (softmax_model_answer, tl.masked_softmax, softmax_in_place, softmax_where_after_masked_fill)
    ),
]


@pytest.mark.parametrize(FIELDS, CASES + CAUSAL_CASES + SOFTMAX_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)
