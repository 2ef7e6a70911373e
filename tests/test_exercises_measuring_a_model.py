"""The chapter "Measuring a model" checks accept right answers and reject plausible wrong ones with the right
message."""

import math

import pytest
import torch
from _exercise_cases import FIELDS, Table, assert_verdict, case, stub

import transformer_lib as tl
from transformer_lib.exercises import measuring_a_model

PASS_AT_K, INT8 = measuring_a_model.check_pass_at_k, measuring_a_model.check_quantize_int8
CASES = Table()


# --- exercise 1 of chapter "Measuring a model": pass@k
# ---------------------------------------------------------------------


@CASES.add(PASS_AT_K, "passed")
def pass_model_answer(n, c, k):
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@CASES.add(PASS_AT_K, "passed")
def pass_product(n, c, k):
    out = 1.0
    for i in range(n - c + 1, n + 1):
        out *= 1 - k / i
    return 1.0 - out


@CASES.add(PASS_AT_K, "failed", "with replacement", "biased low")
def pass_with_replacement(n, c, k):
    return 1 - (1 - c / n) ** k


@CASES.add(PASS_AT_K, "failed", "that is pass@1 whatever k is")
def pass_share_right(n, c, k):
    return c / n


@CASES.add(PASS_AT_K, "failed", "all k answers are right")
def pass_all_right(n, c, k):
    return math.comb(c, k) / math.comb(n, k)


@CASES.add(PASS_AT_K, "failed", "do not add")
def pass_times_k(n, c, k):
    return min(1.0, k * c / n)


@CASES.add(PASS_AT_K, "failed", "none is right")
def pass_none_right(n, c, k):
    return math.comb(n - c, k) / math.comb(n, k)


@CASES.add(PASS_AT_K, "failed", "overflows a float")
def pass_float_binomials(n, c, k):
    comb = lambda a, b: math.gamma(a + 1) / (math.gamma(b + 1) * math.gamma(a - b + 1))  # noqa: E731
    return 1.0 - comb(n - c, k) / comb(n, k) if n - c >= k else 1.0


@CASES.add(PASS_AT_K, "failed", "returned a str")
def pass_as_text(n, c, k):
    return f"{pass_model_answer(n, c, k):.3f}"


# --- exercise 2 of chapter "Measuring a model": 8-bit weights per output channel
# ------------------------------------------


def _codes(w, scale, how=torch.round):
    return how(w * (1.0 / scale)).clamp(-128, 127).to(torch.int8)


@CASES.add(INT8, "passed")
def int8_model_answer(w):
    scales = (w.abs().amax(dim=1) / 127.5).clamp(min=torch.finfo(torch.float32).eps)
    return _codes(w, scales[:, None]), scales


@CASES.add(INT8, "passed")
def int8_with_pytorch(w):
    observer = torch.ao.quantization.PerChannelMinMaxObserver(
        ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric
    )
    observer(w)
    scales, zero_points = observer.calculate_qparams()
    q = torch.quantize_per_channel(w, scales.float(), zero_points, 0, torch.qint8)
    return q.int_repr(), scales.float()


@CASES.add(INT8, "failed", "one scale for the whole matrix")
def int8_per_tensor(w):
    scale = w.abs().amax() / 127.5
    return _codes(w, scale), scale.expand(w.shape[0]).clone()


@CASES.add(INT8, "failed", "divided by 127,")
def int8_over_127(w):
    scales = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).eps)
    return _codes(w, scales[:, None]), scales


@CASES.add(INT8, "failed", "truncated toward zero")
def int8_truncated(w):
    codes, scales = int8_model_answer(w)
    return _codes(w, scales[:, None], torch.trunc), scales


@CASES.add(INT8, "failed", "the scales should be")
def int8_per_column(w):
    scales = w.abs().amax(dim=0) / 127.5
    return _codes(w, scales[None, :]), scales[: w.shape[0]]


@CASES.add(INT8, "failed", "dtype torch.int32")
def int8_wrong_dtype(w):
    codes, scales = int8_model_answer(w)
    return codes.int(), scales


@CASES.add(INT8, "failed", "changed w in place")
def int8_in_place(w):
    codes, scales = int8_model_answer(w)
    w.zero_()
    return codes, scales


@CASES.add(INT8, "failed", "row of zeros still needs a scale")
def int8_zero_scale(w):
    scales = w.abs().amax(dim=1) / 127.5
    return _codes(w, scales[:, None].clamp(min=1e-30)), scales / scales * scales  # 0/0 for the zero row


def test_the_library_passes_its_own_checks():
    assert PASS_AT_K(tl.pass_at_k, verbose=False)
    assert INT8(tl.quantize_int8, verbose=False)


STUB_CASES = [case(PASS_AT_K, stub, "not implemented"), case(INT8, stub, "not implemented")]


@pytest.mark.parametrize(FIELDS, CASES + STUB_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)
