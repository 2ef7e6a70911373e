"""Tests for transformer_lib/exercises/positional_encoding.py: right answers pass, typical wrong ones are named."""

import pytest
import torch
from _exercise_cases import FIELDS, Table, assert_verdict, case, stub

import transformer_lib as tl
from transformer_lib.exercises import positional_encoding
from transformer_lib.positional import relative_rotation, sinusoidal_frequencies

SINUSOIDAL = positional_encoding.check_sinusoidal
ROTATION = positional_encoding.check_rotation
CASES = Table()  # the rows of the answers below that are written as functions

# --- answers to ex-06-2 (the sinusoidal encoding) ---------------------------------------------


def model_sinusoidal(d_model, context_len):
    pos = torch.arange(context_len, dtype=torch.float64)[:, None]
    angles = pos / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(context_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe


def _angles(context_len, d_model, base=10000.0, exponent=lambda i, d: 2 * i / d):
    pos = torch.arange(context_len, dtype=torch.float64)[:, None]
    i = torch.arange((d_model + 1) // 2, dtype=torch.float64)
    return pos / base ** exponent(i, d_model)


def _interleave(even, odd, d_model):
    """A float32 ``(context_len, d_model)`` encoding: ``even`` on dimensions 0, 2, ..., ``odd`` on 1, 3, ...."""
    pe = torch.zeros(even.shape[0], d_model)
    pe[:, 0::2] = even
    pe[:, 1::2] = odd  # a shape mismatch when the widths do not fit
    return pe


@CASES.add(SINUSOIDAL, "failed", "sine and cosine are swapped")
def swapped(d_model, context_len):
    a = _angles(context_len, d_model)
    return _interleave(torch.cos(a), torch.sin(a[:, : d_model // 2]), d_model)


@CASES.add(SINUSOIDAL, "failed", "10000^(i/d_model)")
def half_exponent(d_model, context_len):
    a = _angles(context_len, d_model, exponent=lambda i, d: i / d)
    return _interleave(torch.sin(a), torch.cos(a[:, : d_model // 2]), d_model)


@CASES.add(SINUSOIDAL, "failed", "must share one angle")
def dim_exponent(d_model, context_len):
    pos = torch.arange(context_len, dtype=torch.float64)[:, None]
    dims = torch.arange(d_model, dtype=torch.float64)
    a = pos / 10000 ** (dims / d_model)
    pe = torch.where(dims.long() % 2 == 0, torch.sin(a), torch.cos(a))
    return pe


@CASES.add(SINUSOIDAL, "failed", "all the sines first")
def blocked(d_model, context_len):
    a = _angles(context_len, d_model)
    return torch.cat([torch.sin(a), torch.cos(a[:, : d_model // 2])], dim=1)


@CASES.add(SINUSOIDAL, "failed", "base of the geometric progression is 10000, not 1000")
def base_1000(d_model, context_len):
    a = _angles(context_len, d_model, base=1000.0)
    return _interleave(torch.sin(a), torch.cos(a[:, : d_model // 2]), d_model)


# the crash on odd widths is named, with the smallest input that shows it
@CASES.add(SINUSOIDAL, "failed", "With an odd d_model the last dimension", "d_model=3, context_len=5")
def odd_crash(d_model, context_len):
    a = _angles(context_len, d_model)
    return _interleave(torch.sin(a), torch.cos(a), d_model)  # shape mismatch when d_model is odd


@CASES.add(SINUSOIDAL, "failed", "positions start at 0")
def from_one(d_model, context_len):
    return model_sinusoidal(d_model, context_len + 1)[1:]


@CASES.add(SINUSOIDAL, "failed", "your table is transposed", "(d_model, context_len) = (2, 1)")
def transposed(d_model, context_len):
    return model_sinusoidal(d_model, context_len).T


# the old order of this exercise, (context_len, d_model): a table of the wrong width
@CASES.add(SINUSOIDAL, "failed", "arguments in the other order", "d_model=2, context_len=1")
def arguments_swapped(d_model, context_len):
    return model_sinusoidal(context_len, d_model)


# transposed on a square case too, where the shape alone cannot tell
@CASES.add(SINUSOIDAL, "failed", "your table is transposed")
def transposed_square_only(d_model, context_len):
    pe = model_sinusoidal(d_model, context_len)
    return pe.T.contiguous() if d_model == context_len else pe


def float32_formula(d_model, context_len):
    # computing the angles in float32 is accurate enough for the check's tolerance
    pos = torch.arange(context_len, dtype=torch.float32)[:, None]
    a = pos * torch.exp(-torch.arange(0, d_model, 2, dtype=torch.float32) * (9.210340371976184 / d_model))
    return _interleave(torch.sin(a), torch.cos(a[:, : d_model // 2]), d_model)


# an unknown mistake: the first wrong entry
@CASES.add(SINUSOIDAL, "failed", "first wrong entry PE[pos=0, dim=1]: expected 1.0000, got 1.1000")
def off_by_a_bit(d_model, context_len):
    pe = model_sinusoidal(d_model, context_len)
    pe[-1, -1] += 0.1
    return pe


def library_sinusoidal(d_model, context_len):
    return tl.sinusoidal_encoding(d_model, context_len)  # the same order as the exercise


@pytest.mark.parametrize("fn", [model_sinusoidal, library_sinusoidal, float32_formula])
def test_sinusoidal_right_answers_print_correct(fn, capsys):
    assert positional_encoding.check_sinusoidal(fn).passed
    assert "Correct" in capsys.readouterr().out


SINUSOIDAL_CASES = [
    *(case(SINUSOIDAL, fn, "passed") for fn in (model_sinusoidal, library_sinusoidal, float32_formula)),
    case(SINUSOIDAL, lambda m, d: [[0.0]], "failed", "return a torch.Tensor", id="a list"),
    case(SINUSOIDAL, stub, "not implemented"),
]


# --- answers to ex-06-3 (the relative-position rotation) --------------------------------------


@CASES.add(ROTATION, "passed")
def model_rotation(k, d_model):
    blocks = []
    for w in sinusoidal_frequencies(d_model).tolist():
        c, s = torch.cos(torch.tensor(k * w, dtype=torch.float64)), torch.sin(torch.tensor(k * w, dtype=torch.float64))
        blocks.append(torch.stack([torch.stack([c, s]), torch.stack([-s, c])]))
    return torch.block_diag(*blocks)


@CASES.add(ROTATION, "failed", "moves the encoding backwards")
def backwards(k, d_model):
    return model_rotation(k, d_model).T


@CASES.add(ROTATION, "failed", "the block of pair i=1 (dimensions 2, 3) is wrong")
def same_frequency(k, d_model):
    # every pair rotated by k radians: right for pair 0 only
    c, s = torch.cos(torch.tensor(float(k))), torch.sin(torch.tensor(float(k)))
    return torch.block_diag(*[torch.tensor([[c, s], [-s, c]])] * (d_model // 2))


@CASES.add(ROTATION, "failed", "for k=0, d_model=2 the block of pair i=0")
def ignores_k(k, d_model):
    return model_rotation(1, d_model)


@CASES.add(ROTATION, "failed", "mixes different frequency pairs: entry M[0, 2]")
def dense_blocked(k, d_model):
    # rotation written for the [sines | cosines] layout
    w = k * sinusoidal_frequencies(d_model)
    c, s = torch.diag(torch.cos(w)), torch.diag(torch.sin(w))
    return torch.cat([torch.cat([c, s], 1), torch.cat([-s, c], 1)], 0)


ROTATION_CASES = [
    case(ROTATION, relative_rotation, "passed", id="library"),
    case(ROTATION, lambda k, d: relative_rotation(k, d).float(), "passed", id="library in float32"),
    case(ROTATION, lambda k, d: torch.eye(d + 1), "failed", "expected (d_model, d_model) = (2, 2)", id="wrong shape"),
    case(ROTATION, lambda k, d: torch.eye(d, dtype=torch.long), "failed", "floating-point", id="integer dtype"),
    case(ROTATION, stub, "not implemented"),
]


@pytest.mark.parametrize(FIELDS, CASES + SINUSOIDAL_CASES + ROTATION_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)
