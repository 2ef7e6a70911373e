"""Chapter "Why attention?"'s exercise check: the reference passes, plausible mistakes fail with the right hint."""

import math

import pytest
from _exercise_cases import FIELDS, assert_verdict, case, stub

from transformer_lib.exercises.why_attention import check_layers_to_connect, layers_to_connect, receptive_field


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


# ---------------------------------------------------------------- answers, right and wrong


def by_simulation(n, k, dilated=False):
    layers, field = 0, 1
    while field < n:
        field = field * k if dilated else field + k - 1
        layers += 1
    return layers


def _log_k(n, k):
    return layers_to_connect(n, k, dilated=True)


def contiguous_as_logarithm(n, k, dilated=False):
    """The exponential/log confusion: treats a contiguous stack as if it were dilated."""
    return _log_k(n, k)


def ignores_dilation(n, k, dilated=False):
    return layers_to_connect(n, k, dilated=False)


def contiguous_by(wrong):
    """A right dilated count with ``wrong(n, k)`` as the contiguous one."""

    def fn(n, k, dilated=False):
        return _log_k(n, k) if dilated else wrong(n, k)

    return fn


def dilated_by(wrong):
    """A right contiguous count with ``wrong(n, k)`` as the dilated one."""

    def fn(n, k, dilated=False):
        return wrong(n, k) if dilated else layers_to_connect(n, k)

    return fn


def dilated_floor_plus_one(n, k):
    """Smallest L with k**L > n (floor(log_k n) + 1): one layer too many at exact powers of k, n = 1 included."""
    layers, field = 0, 1
    while field <= n:
        layers, field = layers + 1, field * k
    return layers


def crash(n, k, dilated=False):
    return n // (k - 2)


# counting gaps as positions, a receptive field of L * k instead of 1 + L(k - 1), rounding down
OFF_BY_ONE = ("off by one", "dilated=False", "count positions, not gaps")

CASES = [
    case(check_layers_to_connect, layers_to_connect, "passed", id="reference"),
    case(check_layers_to_connect, by_simulation, "passed"),
    case(
        check_layers_to_connect,
        contiguous_as_logarithm,
        "failed",
        "grows linearly",
        "layers_to_connect(4, 2, dilated=False) returned 2, expected 3",
    ),
    case(
        check_layers_to_connect,
        ignores_dilation,
        "failed",
        "dilation was ignored",
        "layers_to_connect(4, 2, dilated=True) returned 3, expected 2",
    ),
    case(check_layers_to_connect, contiguous_by(lambda n, k: math.ceil(n / (k - 1))), "failed", *OFF_BY_ONE, id="gaps"),
    case(check_layers_to_connect, contiguous_by(lambda n, k: math.ceil(n / k)), "failed", *OFF_BY_ONE, id="L * k"),
    case(check_layers_to_connect, contiguous_by(lambda n, k: (n - 1) // (k - 1)), "failed", *OFF_BY_ONE, id="floor"),
    case(
        check_layers_to_connect,
        dilated_by(dilated_floor_plus_one),
        "failed",
        "layers_to_connect(1, 2, dilated=True) returned 1, expected 0: off by one",
        id="dilated floor plus one",
    ),
    case(
        check_layers_to_connect,
        dilated_by(lambda n, k: math.ceil(math.log(n, k))),
        "failed",
        "layers_to_connect(125, 5, dilated=True) returned 4, expected 3",
        "exact power",
        id="float logarithm",
    ),
    case(
        check_layers_to_connect,
        dilated_by(lambda n, k: _log_k(n, 2)),
        "failed",
        "log base 2",
        "layers_to_connect(3, 3, dilated=True) returned 2, expected 1",
        id="log base two",
    ),
    case(
        check_layers_to_connect,
        lambda n, k, dilated=False: n - 1,
        "failed",
        "layers_to_connect(3, 3, dilated=False) returned 2, expected 1",
        "recurrent network",
        id="one layer per step, as an RNN",
    ),
    case(check_layers_to_connect, contiguous_by(lambda n, k: (n - 1) / (k - 1)), "failed", "as an int", id="float"),
    case(check_layers_to_connect, stub, "not implemented"),
    case(check_layers_to_connect, crash, "error", "ZeroDivisionError"),
]


@pytest.mark.parametrize(FIELDS, CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)
