"""Tests for transformer_lib/exercises/ch06.py: right answers pass, typical wrong ones are named."""

import pytest
import torch

import transformer_lib as tl
from transformer_lib.exercises import ch06
from transformer_lib.positional import relative_rotation, sinusoidal_frequencies

# --- answers to ex-06-2 (the sinusoidal encoding) ---------------------------------------------


def model_sinusoidal(max_len, d_model):
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    angles = pos / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe


def _angles(max_len, d_model, base=10000.0, exponent=lambda i, d: 2 * i / d):
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    i = torch.arange((d_model + 1) // 2, dtype=torch.float64)
    return pos / base ** exponent(i, d_model)


def swapped(max_len, d_model):
    a = _angles(max_len, d_model)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.cos(a)
    pe[:, 1::2] = torch.sin(a[:, : d_model // 2])
    return pe


def half_exponent(max_len, d_model):
    a = _angles(max_len, d_model, exponent=lambda i, d: i / d)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(a)
    pe[:, 1::2] = torch.cos(a[:, : d_model // 2])
    return pe


def dim_exponent(max_len, d_model):
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    dims = torch.arange(d_model, dtype=torch.float64)
    a = pos / 10000 ** (dims / d_model)
    pe = torch.where(dims.long() % 2 == 0, torch.sin(a), torch.cos(a))
    return pe


def blocked(max_len, d_model):
    a = _angles(max_len, d_model)
    return torch.cat([torch.sin(a), torch.cos(a[:, : d_model // 2])], dim=1)


def base_1000(max_len, d_model):
    a = _angles(max_len, d_model, base=1000.0)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(a)
    pe[:, 1::2] = torch.cos(a[:, : d_model // 2])
    return pe


def odd_crash(max_len, d_model):
    a = _angles(max_len, d_model)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(a)
    pe[:, 1::2] = torch.cos(a)  # shape mismatch when d_model is odd
    return pe


def from_one(max_len, d_model):
    return model_sinusoidal(max_len + 1, d_model)[1:]


def transposed(max_len, d_model):
    return model_sinusoidal(max_len, d_model).T


def float32_formula(max_len, d_model):
    # computing the angles in float32 is accurate enough for the check's tolerance
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    a = pos * torch.exp(-torch.arange(0, d_model, 2, dtype=torch.float32) * (9.210340371976184 / d_model))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(a)
    pe[:, 1::2] = torch.cos(a[:, : d_model // 2])
    return pe


def not_implemented(max_len, d_model):
    raise NotImplementedError("write your answer here")


def library_sinusoidal(max_len, d_model):
    return tl.sinusoidal_encoding(d_model, max_len)  # the library takes d_model first


@pytest.mark.parametrize("fn", [model_sinusoidal, library_sinusoidal, float32_formula])
def test_sinusoidal_right_answers_pass(fn, capsys):
    result = ch06.check_sinusoidal(fn)
    assert result.passed, result.message
    assert "Correct" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, message",
    [
        (swapped, "sine and cosine are swapped"),
        (half_exponent, "10000^(i/d_model)"),
        (dim_exponent, "must share one angle"),
        (blocked, "all the sines first"),
        (base_1000, "base of the geometric progression is 10000, not 1000"),
        (odd_crash, "With an odd d_model the last dimension"),
        (from_one, "positions start at 0"),
        (transposed, "transpose it"),
    ],
)
def test_sinusoidal_wrong_answers_are_named(fn, message):
    result = ch06.check_sinusoidal(fn, verbose=False)
    assert result.status == "failed"
    assert message in result.message


def test_sinusoidal_odd_crash_names_the_smallest_input():
    result = ch06.check_sinusoidal(odd_crash, verbose=False)
    assert "max_len=5, d_model=3" in result.message


def test_sinusoidal_unknown_mistake_reports_first_wrong_entry():
    def off_by_a_bit(max_len, d_model):
        pe = model_sinusoidal(max_len, d_model)
        pe[-1, -1] += 0.1
        return pe

    result = ch06.check_sinusoidal(off_by_a_bit, verbose=False)
    assert result.status == "failed"
    assert "first wrong entry PE[pos=0, dim=1]: expected 1.0000, got 1.1000" in result.message


def test_sinusoidal_wrong_type_and_stub():
    assert "return a torch.Tensor" in ch06.check_sinusoidal(lambda m, d: [[0.0]], verbose=False).message
    assert ch06.check_sinusoidal(not_implemented, verbose=False).status == "not implemented"


# --- answers to ex-06-3 (the relative-position rotation) --------------------------------------


def model_rotation(k, d_model):
    blocks = []
    for w in sinusoidal_frequencies(d_model).tolist():
        c, s = torch.cos(torch.tensor(k * w, dtype=torch.float64)), torch.sin(torch.tensor(k * w, dtype=torch.float64))
        blocks.append(torch.stack([torch.stack([c, s]), torch.stack([-s, c])]))
    return torch.block_diag(*blocks)


def backwards(k, d_model):
    return model_rotation(k, d_model).T


def same_frequency(k, d_model):
    # every pair rotated by k radians: right for pair 0 only
    c, s = torch.cos(torch.tensor(float(k))), torch.sin(torch.tensor(float(k)))
    return torch.block_diag(*[torch.tensor([[c, s], [-s, c]])] * (d_model // 2))


def ignores_k(k, d_model):
    return model_rotation(1, d_model)


def dense_blocked(k, d_model):
    # rotation written for the [sines | cosines] layout
    w = k * sinusoidal_frequencies(d_model)
    c, s = torch.diag(torch.cos(w)), torch.diag(torch.sin(w))
    return torch.cat([torch.cat([c, s], 1), torch.cat([-s, c], 1)], 0)


@pytest.mark.parametrize("fn", [model_rotation, relative_rotation, lambda k, d: relative_rotation(k, d).float()])
def test_rotation_right_answers_pass(fn):
    result = ch06.check_rotation(fn, verbose=False)
    assert result.passed, result.message


@pytest.mark.parametrize(
    "fn, message",
    [
        (backwards, "moves the encoding backwards"),
        (same_frequency, "the block of pair i=1 (dimensions 2, 3) is wrong"),
        (ignores_k, "for k=0, d_model=2 the block of pair i=0"),
        (dense_blocked, "mixes different frequency pairs: entry M[0, 2]"),
        (lambda k, d: torch.eye(d + 1), "expected a (d_model, d_model) = (2, 2) matrix"),
        (lambda k, d: torch.eye(d, dtype=torch.long), "floating-point"),
    ],
)
def test_rotation_wrong_answers_are_named(fn, message):
    result = ch06.check_rotation(fn, verbose=False)
    assert result.status == "failed"
    assert message in result.message


def test_rotation_stub_is_not_implemented():
    assert ch06.check_rotation(not_implemented, verbose=False).status == "not implemented"
