"""The checks of the chapter "Longer than trained" accept right answers and reject plausible wrong ones with the
right message."""

import math

import pytest
import torch
from _exercise_cases import FIELDS, Table, assert_verdict, case, stub
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_lib as tl
from transformer_lib.exercises import longer_than_trained

NTK, YARN = longer_than_trained.check_ntk_frequencies, longer_than_trained.check_yarn_frequencies
CASES = Table()
FIRST_NTK = "for d = 4, base = 10000, factor = 2,"  # the smallest case; every named mistake fails there
FIRST_YARN = "for d = 16, base = 10000, factor = 4, original_context = 64,"


def _pairs(d):
    return torch.arange(0, d, 2, dtype=torch.float64) / d  # (d/2,): 2i / d


def _plain(d, base):
    return base ** -_pairs(d)  # (d/2,): the rotary frequencies of chapter "Positional encoding"


# --- exercise 1 of chapter "Longer than trained": NTK-aware scaling
# ----------------------------------------------------------


@CASES.add(NTK, "passed")
def ntk_model_answer(d, base, factor):
    new_base = base * factor ** (d / (d - 2))
    return new_base ** -_pairs(d)


@CASES.add(NTK, "passed")
def ntk_library(d, base, factor):
    return tl.RopeScaling("ntk", factor=float(factor)).frequencies(d, base)[0]


@CASES.add(NTK, "passed")
def ntk_float32_by_logarithms(d, base, factor):
    log_base = math.log(base) + d / (d - 2) * math.log(factor)
    return torch.exp(-torch.arange(0, d, 2, dtype=torch.float32) / d * log_base)


@CASES.add(NTK, "failed", FIRST_NTK, "the exponent is dropped", "not base * s", "divided by [1, 2]")
def ntk_exponent_dropped(d, base, factor):
    return (base * factor) ** -_pairs(d)


@CASES.add(NTK, "failed", "for d = 8, base = 10000, factor = 4,", "the exponent is dropped")
def ntk_integer_division(d, base, factor):
    return (base * factor ** (d // (d - 2))) ** -_pairs(d)  # d // (d - 2) is 2 for d = 4, then 1


@CASES.add(NTK, "failed", FIRST_NTK, "the exponent is upside down")
def ntk_exponent_upside_down(d, base, factor):
    return (base * factor ** ((d - 2) / d)) ** -_pairs(d)


@CASES.add(NTK, "failed", FIRST_NTK, "position interpolation", "omega_0 = 1", "yours is divided by [2, 2]")
def ntk_position_interpolation(d, base, factor):
    return _plain(d, base) / factor


@CASES.add(NTK, "failed", FIRST_NTK, "divided every frequency by s^(d / (d - 2))", "multiplies the base")
def ntk_frequencies_divided_by_the_base_factor(d, base, factor):
    return _plain(d, base) / factor ** (d / (d - 2))


@CASES.add(NTK, "failed", FIRST_NTK, "in the wrong order", "yours rise")
def ntk_reversed(d, base, factor):
    return ntk_model_answer(d, base, factor).flip(0)


@CASES.add(NTK, "failed", FIRST_NTK, "in the wrong order")
def ntk_rising_exponent(d, base, factor):
    new_base = base * factor ** (d / (d - 2))
    return new_base ** (_pairs(d) - _pairs(d)[-1])  # from the slowest up to 1


@CASES.add(NTK, "failed", FIRST_NTK, "you returned wavelengths, 1 / omega")
def ntk_inverse(d, base, factor):
    return (base * factor ** (d / (d - 2))) ** _pairs(d)


@CASES.add(NTK, "failed", FIRST_NTK, "you returned wavelengths, 2 pi / omega")
def ntk_wavelengths(d, base, factor):
    return 2 * math.pi / ntk_model_answer(d, base, factor)


@CASES.add(NTK, "failed", FIRST_NTK, "the factor has no effect")
def ntk_factor_ignored(d, base, factor):
    return _plain(d, base)


@CASES.add(NTK, "failed", FIRST_NTK, "omega has shape (4,); expected (d/2,) = (2,)", "not one per dimension")
def ntk_one_per_dimension(d, base, factor):
    return (base * factor ** (d / (d - 2))) ** -(torch.arange(d, dtype=torch.float64) / d)


@CASES.add(NTK, "failed", FIRST_NTK, "omega has dtype torch.int64; expected a floating-point dtype")
def ntk_integers(d, base, factor):
    return ntk_model_answer(d, base, factor).round().long()


@CASES.add(NTK, "failed", FIRST_NTK, "returned a pair; return omega alone")
def ntk_with_attention_factor(d, base, factor):
    return ntk_model_answer(d, base, factor), 1.0


@CASES.add(NTK, "failed", FIRST_NTK, "returned a list; return a torch.Tensor")
def ntk_list(d, base, factor):
    return ntk_model_answer(d, base, factor).tolist()


@CASES.add(NTK, "failed", FIRST_NTK, "contains NaN or inf")
def ntk_infinite(d, base, factor):
    return ntk_model_answer(d, base, factor) / 0


@CASES.add(NTK, "failed", FIRST_NTK, "raised TypeError", "torch.arange(0, d, 2, dtype=torch.float64)")
def ntk_log_of_a_range(d, base, factor):
    return torch.tensor(math.log(range(0, d, 2)))


@CASES.add(NTK, "failed", FIRST_NTK, "should be divided by [1, 2], yours is divided by [0.9901, 1.98]", "= 40000")
def ntk_one_percent_off(d, base, factor):
    return ntk_model_answer(d, base, factor) * 1.01


@CASES.add(NTK, "failed", "for d = 6, base = 10000, factor = 1,", "should be divided by [1, 1, 1]")
def ntk_wrong_at_factor_one(d, base, factor):
    return ntk_model_answer(d, base, factor) / (1.0 if factor > 1 else 2.0)


def test_ntk_through_transformers_dynamic_rope_passes():
    """transformers' dynamic NTK with factor 1, read at s times the trained length, is NTK-aware scaling by s."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    def dynamic(d, base, factor):
        L = 64
        config = LlamaConfig(
            hidden_size=2 * d,
            num_attention_heads=2,
            head_dim=d,
            max_position_embeddings=L,
            rope_parameters={"rope_type": "dynamic", "rope_theta": base, "factor": 1.0},
        )
        return ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", seq_len=round(factor * L))[0]

    result = NTK(dynamic, verbose=False)
    assert result, result.message


# --- exercise 2 of chapter "Longer than trained": YaRN
# -----------------------------------------------------------------------


def _yarn(d, base, factor, L, beta_fast, beta_slow, *, truncate=True, reverse=False, guard=0.001):
    """YaRN written out: the ramp's ends are the pair indices that turn beta_fast and beta_slow times over L."""
    omega = _plain(d, base)  # (d/2,)

    def pair_turning(turns):
        return d * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_turning(beta_fast), pair_turning(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if guard is not None and low == high:
        high += guard  # transformers' 0.001: no division by zero
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)  # 0: kept, 1: / factor
    if reverse:
        ramp = 1 - ramp
    return omega * (1 - ramp) + omega / factor * ramp


@CASES.add(YARN, "passed")
def yarn_model_answer(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    return _yarn(d, base, factor, original_context, beta_fast, beta_slow)


@CASES.add(YARN, "passed")
def yarn_library(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    spec = tl.RopeScaling("yarn", factor, original_context, beta_fast=beta_fast, beta_slow=beta_slow)
    return spec.frequencies(d, base)[0]


@CASES.add(YARN, "passed")
def yarn_other_guard(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    """When the ends meet, a ramp one whole pair long: the same frequencies, since both ends are whole pairs."""
    return _yarn(d, base, factor, original_context, beta_fast, beta_slow, guard=1.0)


@CASES.add(YARN, "failed", FIRST_YARN, "ramp from the new length s L = 256", "trained length L = 64")
def yarn_ramp_from_new_length(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    return _yarn(d, base, factor, factor * original_context, beta_fast, beta_slow)


@CASES.add(YARN, "failed", FIRST_YARN, "ramp from the new length", "round its ends to whole pairs")
def yarn_new_length_untruncated(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    return _yarn(d, base, factor, factor * original_context, beta_fast, beta_slow, truncate=False)


@CASES.add(YARN, "failed", FIRST_YARN, "the ramp is reversed", "divided by [1, 1.333, 2, 4, 4, 4, 4, 4]")
def yarn_ramp_reversed(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    return _yarn(d, base, factor, original_context, beta_fast, beta_slow, reverse=True)


@CASES.add(YARN, "failed", FIRST_YARN, "the ramp is reversed", "yours is divided by [4, 1.6, 1, 1")
def yarn_betas_swapped(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    return _yarn(d, base, factor, original_context, beta_slow, beta_fast)


@CASES.add(YARN, "failed", FIRST_YARN, "the ramp's ends are not rounded", "math.floor(low) and math.ceil(high)")
def yarn_no_truncation(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    return _yarn(d, base, factor, original_context, beta_fast, beta_slow, truncate=False)


@CASES.add(YARN, "failed", FIRST_YARN, "folded the attention factor (1.139 = 0.1 ln s + 1)", "multiplies cos and sin")
def yarn_attention_factor_folded(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    return _yarn(d, base, factor, original_context, beta_fast, beta_slow) * (0.1 * math.log(factor) + 1)


@CASES.add(YARN, "failed", FIRST_YARN, "folded the attention factor")
def yarn_divided_by_attention_factor(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    return _yarn(d, base, factor, original_context, beta_fast, beta_slow) / (0.1 * math.log(factor) + 1)


@CASES.add(YARN, "failed", FIRST_YARN, "position interpolation")
def yarn_position_interpolation(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    return _plain(d, base) / factor


@CASES.add(YARN, "failed", FIRST_YARN, "these are NTK-aware frequencies")
def yarn_ntk(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    return ntk_model_answer(d, base, factor)


@CASES.add(YARN, "failed", FIRST_YARN, "the factor has no effect")
def yarn_factor_ignored(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    return _plain(d, base)


@CASES.add(YARN, "failed", "beta_fast = 16, beta_slow = 2,", "should be divided by [1, 1, 1.111", "blends linearly")
def yarn_betas_ignored(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    return _yarn(d, base, factor, original_context, 32, 1)


@CASES.add(YARN, "failed", "original_context = 4,", "contains NaN or inf", "add 0.001 to high")
def yarn_no_guard(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    return _yarn(d, base, factor, original_context, beta_fast, beta_slow, guard=None)


@CASES.add(YARN, "failed", FIRST_YARN, "returned a pair; return omega alone", "attention factor multiplies cos")
def yarn_with_attention_factor(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    return yarn_library(d, base, factor, original_context, beta_fast, beta_slow), 0.1 * math.log(factor) + 1


@CASES.add(YARN, "failed", FIRST_YARN, "omega has shape (16,); expected (d/2,) = (8,)", "not one per dimension")
def yarn_one_per_dimension(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    return _yarn(2 * d, base, factor, original_context, beta_fast, beta_slow)


@CASES.add(YARN, "failed", FIRST_YARN, "raised TypeError", "Python numbers")
def yarn_log_of_a_tensor_list(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    return math.log([original_context])


@CASES.add(YARN, "failed", "for d = 128, base = 500000, factor = 8, original_context = 8192,", "pair 14 of 64")
def yarn_wrong_for_wide_heads(d, base, factor, original_context, beta_fast=32, beta_slow=1):
    right = _yarn(d, base, factor, original_context, beta_fast, beta_slow)
    return right * torch.where(torch.arange(d // 2) == 14, 1.5, 1.0) if d > 64 else right


def test_yarn_through_transformers_passes_and_without_truncation_is_named():
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    def transformers_yarn(truncate):
        def fn(d, base, factor, original_context, beta_fast=32, beta_slow=1):
            parameters = {
                "rope_type": "yarn",
                "rope_theta": base,
                "factor": factor,
                "beta_fast": beta_fast,
                "beta_slow": beta_slow,
                "original_max_position_embeddings": original_context,
                "truncate": truncate,
            }
            config = LlamaConfig(
                hidden_size=2 * d,
                num_attention_heads=2,
                head_dim=d,
                max_position_embeddings=round(factor * original_context),
                rope_parameters=parameters,
            )
            return ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")[0]

        return fn

    assert YARN(transformers_yarn(True), verbose=False)
    result = YARN(transformers_yarn(False), verbose=False)
    assert "the ramp's ends are not rounded" in result.message, result.message


# --- both: stubs, properties, and checks that never raise ---------------------------------------

STUB_CASES = [case(NTK, stub, "not implemented"), case(YARN, stub, "not implemented")]


@pytest.mark.parametrize(FIELDS, CASES + STUB_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)


def test_every_named_mistake_has_a_case():
    """Each mistake the brief names is a row above, so that its words are tested."""
    ids = {p.id for p in CASES}
    for name in ["exponent_dropped", "position_interpolation", "one_per_dimension", "reversed", "inverse"]:
        assert f"check_ntk_frequencies-ntk_{name}" in ids
    for name in ["ramp_from_new_length", "ramp_reversed", "no_truncation", "attention_factor_folded"]:
        assert f"check_yarn_frequencies-yarn_{name}" in ids


@pytest.mark.parametrize(
    ("check", "right", "n_cases"), [(NTK, ntk_model_answer, 5), (YARN, yarn_model_answer, 6)], ids=["ntk", "yarn"]
)
def test_one_pair_off_by_a_thousandth_fails(check, right, n_cases):
    """A right answer with any one pair's frequency moved by 0.1 % or more, in any one case, fails."""

    @given(st.integers(0, 63), st.floats(1e-3, 0.5), st.booleans(), st.integers(0, n_cases - 1))
    @settings(max_examples=40, deadline=None, derandomize=True)
    def moved_pair_fails(pair, change, up, spoiled):
        calls = []

        def moved(*args):
            omega = right(*args)
            if len(calls) == spoiled:
                omega[pair % len(omega)] *= 1 + change if up else 1 - change
            calls.append(args)
            return omega

        result = check(moved, verbose=False)
        assert result.status == "failed", result.message
        assert len(calls) == spoiled + 1, "the check stops at the spoiled case"

    moved_pair_fails()


def test_ntk_keeps_the_fastest_pair_and_divides_the_slowest_by_the_factor():
    @given(st.integers(2, 64).map(lambda n: 2 * n), st.floats(1.0, 64.0), st.sampled_from([1e4, 5e5, 1e6]))
    @settings(max_examples=40, deadline=None, derandomize=True)
    def ends(d, factor, base):
        omega = ntk_model_answer(d, base, factor)
        assert omega[0] == 1
        assert torch.isclose(omega[-1], _plain(d, base)[-1] / factor, rtol=1e-12)
        assert torch.equal(omega, tl.RopeScaling("ntk", factor=factor).frequencies(d, base)[0])

    ends()


_DTYPES = [torch.float32, torch.float64, torch.int64, torch.bool]
_junk_tensor = st.builds(
    lambda shape, dtype, fill: torch.full(shape, fill).to(dtype),
    st.lists(st.integers(0, 5), max_size=3).map(tuple),
    st.sampled_from(_DTYPES),
    st.sampled_from([0.0, 1.0, -3.0, 7.0, float("nan")]),
)
_junk = st.one_of(
    st.none(),
    st.integers(-3, 3),
    st.floats(allow_nan=True),
    st.text(max_size=3),
    _junk_tensor,
    st.tuples(_junk_tensor, _junk_tensor),
    st.tuples(_junk_tensor, st.floats(allow_nan=True)),
    st.lists(_junk_tensor, max_size=3),
)


@pytest.mark.parametrize("check", [NTK, YARN], ids=["ntk", "yarn"])
def test_checks_never_raise_whatever_the_function_returns(check):
    @given(_junk)
    @settings(max_examples=60, deadline=None, derandomize=True)
    def judged(value):
        result = check(lambda *args: value, verbose=False)
        assert result.status in ("failed", "error") and not result, result.message
        assert "\n" not in result.message

    judged()


@pytest.mark.parametrize("check", [NTK, YARN], ids=["ntk", "yarn"])
@pytest.mark.parametrize("error", [ValueError("no"), IndexError("out"), ZeroDivisionError()], ids=type)
def test_checks_never_raise_whatever_the_function_raises(check, error):
    def crash(*args):
        raise error

    result = check(crash, verbose=False)
    assert result.status in ("failed", "error") and f"raised {type(error).__name__}" in result.message
