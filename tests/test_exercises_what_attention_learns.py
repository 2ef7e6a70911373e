"""The chapter "What attention learns" checks accept right answers and reject plausible wrong ones with the right
message."""

import pytest
import torch
from _exercise_cases import FIELDS, Table, assert_verdict, case, stub

import transformer_lib as tl
from transformer_lib.exercises import what_attention_learns

PREV = what_attention_learns.check_previous_token_score
IND = what_attention_learns.check_induction_score
CASES = Table()  # the rows of the answers below that are written as functions

# ---------------------------------------------------------------- check_previous_token_score


@CASES.add(PREV, "passed")
def prev_model_answer(pattern):
    return pattern.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)


@CASES.add(PREV, "passed")
def prev_loop_answer(pattern):
    T = pattern.shape[-1]
    return sum(pattern[..., t, t - 1] for t in range(1, T)) / (T - 1)


@CASES.add(PREV, "failed", "diagonal above the main one")
def prev_next_token(pattern):
    return pattern.diagonal(offset=1, dim1=-2, dim2=-1).mean(-1)


@CASES.add(PREV, "failed", "the main diagonal")
def prev_self(pattern):
    return pattern.diagonal(dim1=-2, dim2=-1).mean(-1)


@CASES.add(PREV, "failed", "divided by T instead of T - 1")
def prev_divide_by_T(pattern):
    return pattern.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1) / pattern.shape[-1]


@CASES.add(PREV, "failed", "summed the weights")
def prev_sum(pattern):
    return pattern.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1)


@CASES.add(PREV, "failed", "has shape", "one score per pattern")
def prev_keeps_queries(pattern):
    return pattern.diagonal(offset=-1, dim1=-2, dim2=-1)


@CASES.add(PREV, "failed", "keep the pattern's dtype")
def prev_float32(pattern):
    return prev_model_answer(pattern).float()


@CASES.add(PREV, "failed", "changed pattern in place")
def prev_in_place(pattern):
    score = prev_model_answer(pattern)
    pattern.zero_()  # clears the caller's weights
    return score


# ---------------------------------------------------------------- check_induction_score


@CASES.add(IND, "passed")
def ind_model_answer(pattern, distance):
    T = pattern.shape[-1]
    t = torch.arange(distance, T)
    return pattern[..., t, t - distance + 1].mean(-1)


@CASES.add(IND, "passed")
def ind_diagonal_answer(pattern, distance):
    # the keys t - distance + 1 form the diagonal at offset -(distance - 1)
    return pattern.diagonal(offset=-(distance - 1), dim1=-2, dim2=-1)[..., 1:].mean(-1)


@CASES.add(IND, "failed", "duplicate-token head")
def ind_duplicate_token(pattern, distance):
    T = pattern.shape[-1]
    t = torch.arange(distance, T)
    return pattern[..., t, t - distance].mean(-1)


@CASES.add(IND, "failed", "one too far")
def ind_two_after(pattern, distance):
    T = pattern.shape[-1]
    t = torch.arange(distance, T)
    return pattern[..., t, (t - distance + 2).clamp(0, T - 1)].mean(-1)


@CASES.add(IND, "failed", "including t < distance")
def ind_every_query(pattern, distance):
    T = pattern.shape[-1]
    t = torch.arange(T)
    return pattern[..., t, (t - distance + 1).clamp(0, T - 1)].mean(-1)


@CASES.add(IND, "failed", "left out the first query")
def ind_skip_first(pattern, distance):
    T = pattern.shape[-1]
    t = torch.arange(distance + 1, T)
    return pattern[..., t, t - distance + 1].mean(-1)


@CASES.add(IND, "failed", "has shape", "one score per pattern")
def ind_per_query(pattern, distance):
    T = pattern.shape[-1]
    t = torch.arange(distance, T)
    return pattern[..., t, t - distance + 1]


def test_library_scores_pass():
    assert PREV(tl.previous_token_score, verbose=False)
    assert IND(tl.induction_score, verbose=False)


def test_hand_built_patterns_score_one():
    # the checks' hand-built heads: a perfect head of each kind scores exactly 1 on its job
    assert tl.previous_token_score(what_attention_learns._shifted(6, 1)).item() == 1.0
    assert tl.induction_score(what_attention_learns._shifted(8, 3), 4).item() == 1.0


STUB_CASES = [case(PREV, stub, "not implemented"), case(IND, stub, "not implemented")]


@pytest.mark.parametrize(FIELDS, CASES + STUB_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)
