"""The chapter 4 checks accept right answers and reject plausible wrong ones with the right message."""

import torch

import transformer_lib as tl
from transformer_lib.exercises import ch04

# ---------------------------------------------------------------- check_causal_mask


def causal_model_answer(T):
    return torch.tril(torch.ones(T, T, dtype=torch.bool))


def causal_upper_triangle(T):
    return torch.triu(torch.ones(T, T, dtype=torch.bool))


def causal_excludes_self(T):
    return torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=-1)


def causal_int_dtype(T):
    return torch.tril(torch.ones(T, T, dtype=torch.long))


def causal_additive(T):
    return torch.triu(torch.full((T, T), float("-inf")), diagonal=1)


def causal_inverted(T):
    return torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)


def causal_only_diagonal(T):
    return torch.eye(T, dtype=torch.bool)


def causal_list(T):
    return [[j <= i for j in range(T)] for i in range(T)]


def causal_fixed_size(T):
    return torch.tril(torch.ones(4, 4, dtype=torch.bool))


def causal_stub(T):
    raise NotImplementedError


def run(checker, fn):
    return checker(fn, verbose=False)


def test_causal_mask_accepts_model_answer_and_library():
    assert run(ch04.check_causal_mask, causal_model_answer).passed
    assert run(ch04.check_causal_mask, tl.causal_mask).passed


def test_causal_mask_rejects_upper_triangle():
    r = run(ch04.check_causal_mask, causal_upper_triangle)
    assert r.status == "failed"
    assert "row 0 attends to position 1, which is in the future" in r.message


def test_causal_mask_rejects_missing_diagonal():
    r = run(ch04.check_causal_mask, causal_excludes_self)
    assert r.status == "failed"
    assert "row 0 may not attend to itself" in r.message and "T=1" in r.message


def test_causal_mask_rejects_int_dtype():
    r = run(ch04.check_causal_mask, causal_int_dtype)
    assert "dtype torch.int64" in r.message and "torch.bool" in r.message


def test_causal_mask_rejects_additive_float_mask():
    r = run(ch04.check_causal_mask, causal_additive)
    assert "additive mask" in r.message


def test_causal_mask_rejects_inverted_convention():
    r = run(ch04.check_causal_mask, causal_inverted)
    assert "exact opposite" in r.message and "True means 'may attend'" in r.message


def test_masked_softmax_accepts_where_after_masked_fill():
    # the masked_fill version of the where trick: masked_fill's backward stops the NaN
    def fn(scores, mask):
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return torch.where(mask.any(-1, keepdim=True), weights, torch.zeros_like(weights))

    assert run(ch04.check_masked_softmax, fn).passed


def test_causal_mask_rejects_past_masked():
    r = run(ch04.check_causal_mask, causal_only_diagonal)
    assert "row 1 cannot attend to position 0, which is in its past" in r.message


def test_causal_mask_rejects_non_tensor_and_wrong_shape():
    assert "returned a list" in run(ch04.check_causal_mask, causal_list).message
    assert "shape (4, 4); expected (1, 1)" in run(ch04.check_causal_mask, causal_fixed_size).message


def test_causal_mask_stub_is_not_implemented(capsys):
    r = ch04.check_causal_mask(causal_stub)
    assert r.status == "not implemented"
    assert "not implemented yet" in capsys.readouterr().out


# ---------------------------------------------------------------- check_masked_softmax


def softmax_model_answer(scores, mask):
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    return weights * mask.any(dim=-1, keepdim=True)


def softmax_tiny_fill(scores, mask):
    weights = torch.softmax(scores.masked_fill(~mask, -1e-9), dim=-1)
    return weights * mask.any(dim=-1, keepdim=True)


def softmax_zero_fill(scores, mask):
    weights = torch.softmax(scores.masked_fill(~mask, 0.0), dim=-1)
    return weights * mask.any(dim=-1, keepdim=True)


def softmax_zero_after(scores, mask):
    return torch.softmax(scores, dim=-1) * mask


def softmax_minus_inf(scores, mask):
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def softmax_uniform_empty_rows(scores, mask):
    return torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)


def softmax_add_minus_inf_then_where(scores, mask):
    additive = torch.zeros_like(scores).masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores + additive, dim=-1)
    return torch.where(mask.any(-1, keepdim=True), weights, torch.zeros_like(weights))


def softmax_wrong_axis(scores, mask):
    weights = torch.softmax(scores.masked_fill(~mask, -1e9), dim=-2)
    return weights * mask.any(dim=-1, keepdim=True)


def softmax_float32(scores, mask):
    return softmax_model_answer(scores.float(), mask)


def softmax_in_place(scores, mask):
    scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1) * mask.any(dim=-1, keepdim=True)


def test_masked_softmax_accepts_model_answer_and_library():
    assert run(ch04.check_masked_softmax, softmax_model_answer).passed
    assert run(ch04.check_masked_softmax, tl.masked_softmax).passed
    assert run(ch04.check_masked_softmax, softmax_in_place).passed


def test_masked_softmax_rejects_tiny_fill():
    r = run(ch04.check_masked_softmax, softmax_tiny_fill)
    assert r.status == "failed"
    assert "is masked in row 0 but gets weight" in r.message and "-1e-9" in r.message


def test_masked_softmax_rejects_zero_fill():
    r = run(ch04.check_masked_softmax, softmax_zero_fill)
    assert "but gets weight" in r.message and "a causal mask, T=4" in r.message


def test_masked_softmax_rejects_zeroing_after_softmax():
    r = run(ch04.check_masked_softmax, softmax_zero_after)
    assert "not 1" in r.message and "after the softmax" in r.message


def test_masked_softmax_rejects_nan_rows():
    r = run(ch04.check_masked_softmax, softmax_minus_inf)
    assert "row 0 has every key masked" in r.message and "NaN" in r.message and "0/0" in r.message


def test_masked_softmax_rejects_uniform_empty_rows():
    r = run(ch04.check_masked_softmax, softmax_uniform_empty_rows)
    assert "row 0 has every key masked" in r.message and "uniform" in r.message


def test_masked_softmax_rejects_nan_gradient():
    r = run(ch04.check_masked_softmax, softmax_add_minus_inf_then_where)
    assert "gradient" in r.message and "rows [0, 3]" in r.message


def test_masked_softmax_rejects_wrong_axis():
    r = run(ch04.check_masked_softmax, softmax_wrong_axis)
    assert "dim=-2" in r.message and "nothing masked" in r.message


def test_masked_softmax_rejects_wrong_dtype():
    r = run(ch04.check_masked_softmax, softmax_float32)
    assert "dtype torch.float32" in r.message and "float64" in r.message
