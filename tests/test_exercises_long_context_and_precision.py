"""The chapter "Long context and precision" checks accept right answers and reject plausible wrong ones with the right
message."""

import pytest
import torch
from _exercise_cases import FIELDS, Table, assert_verdict, case, stub

from transformer_lib.exercises import long_context_and_precision

MERGE = long_context_and_precision.check_softmax_merge
CASES = Table()

# ---------------------------------------------------------------- check_softmax_merge


@CASES.add(MERGE, "passed")
def merge_model_answer(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a1, a2 = l1 * torch.exp(m1 - m), l2 * torch.exp(m2 - m)
    return m, a1 + a2, (a1 * o1 + a2 * o2) / (a1 + a2)


@CASES.add(MERGE, "passed")
def merge_with_weights(m1, l1, o1, m2, l2, o2):
    m = torch.max(torch.cat([m1, m2], -1), dim=-1, keepdim=True).values
    l = l1 * torch.exp(m1 - m) + l2 * torch.exp(m2 - m)  # noqa: E741
    w1 = l1 * torch.exp(m1 - m) / l
    return m, l, w1 * o1 + (1 - w1) * o2


@CASES.add(MERGE, "failed", "rescale each to the new maximum")
def merge_no_rescale(m1, l1, o1, m2, l2, o2):
    l = l1 + l2  # noqa: E741
    return torch.maximum(m1, m2), l, (l1 * o1 + l2 * o2) / l


@CASES.add(MERGE, "failed", "equal weights")
def merge_plain_average(m1, l1, o1, m2, l2, o2):
    m, l, _ = merge_model_answer(m1, l1, o1, m2, l2, o2)  # noqa: E741
    return m, l, (o1 + o2) / 2


@CASES.add(MERGE, "failed", "did not divide by the new sum l")
def merge_no_division(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a1, a2 = l1 * torch.exp(m1 - m), l2 * torch.exp(m2 - m)
    return m, a1 + a2, a1 * o1 + a2 * o2


@CASES.add(MERGE, "failed", "larger of the two maxima")
def merge_sum_of_maxima(m1, l1, o1, m2, l2, o2):
    _, l, o = merge_model_answer(m1, l1, o1, m2, l2, o2)  # noqa: E741
    return m1 + m2, l, o


@CASES.add(MERGE, "failed", "contains NaN or inf", "exp of a large score overflows")
def merge_without_max(m1, l1, o1, m2, l2, o2):
    # unnormalised sums exp(m) l: overflow for large scores
    a1, a2 = l1 * torch.exp(m1), l2 * torch.exp(m2)
    m = torch.maximum(m1, m2)
    return m, (a1 + a2) * torch.exp(-m), (a1 * o1 + a2 * o2) / (a1 + a2)


@CASES.add(MERGE, "failed", "return a tuple (m, l, o)")
def merge_output_only(m1, l1, o1, m2, l2, o2):
    return merge_model_answer(m1, l1, o1, m2, l2, o2)[2]


@CASES.add(MERGE, "failed", "changed the statistics it was given in place")
def merge_in_place(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    l1.mul_(torch.exp(m1 - m))
    l2.mul_(torch.exp(m2 - m))
    return m, l1 + l2, (l1 * o1 + l2 * o2) / (l1 + l2)


# ---------------------------------------------------------------- the references themselves


@pytest.mark.parametrize("split", [1, 2, 5, 7])
def test_reference_merge_equals_softmax(gen, split):
    scores, values = 5 * torch.randn(4, 8, generator=gen, dtype=torch.float64), torch.randn(8, 3, generator=gen)
    values = values.double()
    m, l, o = long_context_and_precision.reference_softmax_merge(  # noqa: E741
        *long_context_and_precision.softmax_block_stats(scores[:, :split], values[:split]),
        *long_context_and_precision.softmax_block_stats(scores[:, split:], values[split:]),
    )
    assert torch.allclose(o, torch.softmax(scores, -1) @ values, atol=1e-12)
    assert torch.equal(m, scores.amax(-1, keepdim=True))
    assert torch.allclose(l, torch.exp(scores - m).sum(-1, keepdim=True), rtol=1e-12)


def test_masked_block_stats():
    m, l, o = long_context_and_precision.softmax_block_stats(torch.full((2, 3), float("-inf")), torch.ones(3, 4))  # noqa: E741
    assert torch.isinf(m).all() and (l == 0).all() and (o == 0).all()


STUB_CASES = [case(MERGE, stub, "not implemented")]


@pytest.mark.parametrize(FIELDS, CASES + STUB_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)
