"""Tests for chapter 1's exercise check: the reference passes, plausible mistakes fail with the right hint."""

import math

import pytest

from transformer_lib.exercises import ch01
from transformer_lib.exercises.ch01 import check_layers_to_connect, layers_to_connect, receptive_field


def _verdict(fn):
    return check_layers_to_connect(fn, verbose=False)


def test_reference_passes():
    result = _verdict(layers_to_connect)
    assert result.passed, result.message


def test_model_answer_with_loops_passes():
    def by_simulation(n, k, dilated=False):
        layers, field = 0, 1
        while field < n:
            field = field * k if dilated else field + k - 1
            layers += 1
        return layers

    assert _verdict(by_simulation).passed


@pytest.mark.parametrize("k", [2, 3, 5])
@pytest.mark.parametrize("dilated", [False, True])
def test_reference_matches_receptive_field(k, dilated):
    for n in range(1, 300):
        L = layers_to_connect(n, k, dilated)
        assert receptive_field(L, k, dilated) >= n
        if L > 0:
            assert receptive_field(L - 1, k, dilated) < n


def test_known_values():
    assert layers_to_connect(1, 3) == 0
    assert layers_to_connect(1024, 3) == 512
    assert layers_to_connect(1024, 3, dilated=True) == 7
    assert layers_to_connect(125, 5, dilated=True) == 3
    assert layers_to_connect(126, 5, dilated=True) == 4
    with pytest.raises(ValueError):
        layers_to_connect(10, 1)
    with pytest.raises(ValueError):
        layers_to_connect(0, 3)


def _log_k(n, k):
    return ch01.layers_to_connect(n, k, dilated=True)


def test_contiguous_as_logarithm_is_rejected():
    # the exponential/log confusion: treats a contiguous stack as if it were dilated
    result = _verdict(lambda n, k, dilated=False: _log_k(n, k))
    assert result.status == "failed"
    assert "grows linearly" in result.message
    assert "layers_to_connect(4, 2, dilated=False) returned 2, expected 3" in result.message


def test_ignoring_dilation_is_rejected():
    result = _verdict(lambda n, k, dilated=False: layers_to_connect(n, k, dilated=False))
    assert result.status == "failed"
    assert "dilation was ignored" in result.message
    assert "layers_to_connect(4, 2, dilated=True) returned 3, expected 2" in result.message


@pytest.mark.parametrize(
    "wrong",
    [
        lambda n, k, dilated=False: math.ceil(n / (k - 1)),  # counts gaps as positions
        lambda n, k, dilated=False: math.ceil(n / k),  # receptive field L * k instead of 1 + L(k - 1)
        lambda n, k, dilated=False: (n - 1) // (k - 1),  # rounds down
    ],
)
def test_contiguous_off_by_one_is_rejected(wrong):
    def fn(n, k, dilated=False):
        return _log_k(n, k) if dilated else wrong(n, k)

    result = _verdict(fn)
    assert result.status == "failed"
    assert "off by one" in result.message
    assert "dilated=False" in result.message
    assert "count positions, not gaps" in result.message


def test_dilated_floor_plus_one_is_rejected():
    # smallest L with k**L > n (floor(log_k n) + 1): one layer too many at exact powers of k, n = 1 included
    def fn(n, k, dilated=False):
        if not dilated:
            return layers_to_connect(n, k)
        layers, field = 0, 1
        while field <= n:
            layers, field = layers + 1, field * k
        return layers

    result = _verdict(fn)
    assert result.status == "failed"
    assert "layers_to_connect(1, 2, dilated=True) returned 1, expected 0: off by one" in result.message


def test_float_logarithm_is_rejected():
    def fn(n, k, dilated=False):
        return math.ceil(math.log(n, k)) if dilated else layers_to_connect(n, k)

    result = _verdict(fn)
    assert result.status == "failed"
    assert "layers_to_connect(125, 5, dilated=True) returned 4, expected 3" in result.message
    assert "exact power" in result.message


def test_log_base_two_is_rejected():
    def fn(n, k, dilated=False):
        return _log_k(n, 2) if dilated else layers_to_connect(n, k)

    result = _verdict(fn)
    assert result.status == "failed"
    assert "log base 2" in result.message
    assert "layers_to_connect(3, 3, dilated=True) returned 2, expected 1" in result.message


def test_rnn_style_count_is_rejected():
    # one step per layer, as in a recurrent network
    result = _verdict(lambda n, k, dilated=False: n - 1)
    assert result.status == "failed"
    assert "layers_to_connect(3, 3, dilated=False) returned 2, expected 1" in result.message
    assert "recurrent network" in result.message


def test_float_result_is_rejected():
    result = _verdict(lambda n, k, dilated=False: (n - 1) / (k - 1) if not dilated else _log_k(n, k))
    assert result.status == "failed"
    assert "as an int" in result.message


def test_not_implemented_and_crash_are_reported():
    def stub(n, k, dilated=False):
        raise NotImplementedError

    assert _verdict(stub).status == "not implemented"

    def crash(n, k, dilated=False):
        return n // (k - 2)

    result = _verdict(crash)
    assert result.status == "error"
    assert "ZeroDivisionError" in result.message
