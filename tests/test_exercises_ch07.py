"""The chapter 7 checks accept right answers and reject plausible wrong ones with the right message."""

import pytest
import torch
from _exercise_cases import FIELDS, assert_verdict, case, stub

import transformer_lib as tl
from transformer_lib.exercises import ch07

# ---------------------------------------------------------------- check_ffn_params


def ffn_model_answer(d_model, d_ff, bias=True):
    return 2 * d_model * d_ff + ((d_ff + d_model) if bias else 0)


def ffn_by_counting(d_model, d_ff, bias=True):
    return sum(p.numel() for p in tl.FeedForward(d_model, d_ff, bias=bias).parameters())


def ffn_weights_only(d_model, d_ff, bias=True):
    return 2 * d_model * d_ff


def ffn_ignores_bias_flag(d_model, d_ff, bias=True):
    return 2 * d_model * d_ff + d_ff + d_model


def ffn_both_biases_d_ff(d_model, d_ff, bias=True):
    return 2 * d_model * d_ff + (2 * d_ff if bias else 0)


def ffn_one_layer(d_model, d_ff, bias=True):
    return d_model * d_ff + ((d_ff + d_model) if bias else 0)


def ffn_float(d_model, d_ff, bias=True):
    return float(ffn_model_answer(d_model, d_ff, bias))


FFN = ch07.check_ffn_params
FFN_CASES = [
    case(FFN, ffn_model_answer, "passed"),
    case(FFN, ffn_by_counting, "passed"),
    case(FFN, lambda d, f, bias=True: torch.tensor(ffn_model_answer(d, f, bias)), "passed", id="an integer tensor"),
    case(FFN, ffn_weights_only, "failed", "ffn_param_count(2, 3, bias=True)", "returned 12", "also has a bias vector"),
    case(FFN, ffn_ignores_bias_flag, "failed", "bias=False", "no bias vectors"),
    case(FFN, ffn_both_biases_d_ff, "failed", "its bias has d_model entries"),
    case(FFN, ffn_one_layer, "failed", "looks like one linear layer"),
    case(FFN, ffn_float, "failed", "as an int"),
    case(FFN, stub, "not implemented"),
    case(FFN, lambda d_model, d_ff: 0, "error", "TypeError", id="forgot the bias argument"),
]


def test_ffn_params_does_not_move_the_global_rng():
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    ch07.check_ffn_params(ffn_model_answer, verbose=False)
    assert torch.equal(torch.random.get_rng_state(), before)


# ---------------------------------------------------------------- check_pre_ln


def pre_ln_model_answer(x, sublayer, norm):
    return x + sublayer(norm(x))


def pre_ln_is_post_ln(x, sublayer, norm):
    return norm(x + sublayer(x))


def pre_ln_norm_after_residual(x, sublayer, norm):
    return norm(x + sublayer(norm(x)))


def pre_ln_no_residual(x, sublayer, norm):
    return sublayer(norm(x))


def pre_ln_normed_residual(x, sublayer, norm):
    x = norm(x)
    return x + sublayer(x)


def pre_ln_residual_before_sublayer(x, sublayer, norm):
    return sublayer(x + norm(x))


def pre_ln_no_norm(x, sublayer, norm):
    return x + sublayer(x)


def pre_ln_in_place(x, sublayer, norm):
    x += sublayer(norm(x))
    return x


def pre_ln_float32(x, sublayer, norm):
    return (x + sublayer(norm(x))).float()


PRE_LN = ch07.check_pre_ln
PRE_LN_CASES = [
    case(PRE_LN, pre_ln_model_answer, "passed"),
    case(PRE_LN, pre_ln_is_post_ln, "failed", "post-LN arrangement", "x of shape (2, 3, 4)",
         "x + Sublayer(LayerNorm(x))"),
    case(PRE_LN, pre_ln_norm_after_residual, "failed", "after adding the residual"),
    case(PRE_LN, pre_ln_no_residual, "failed", "residual connection is missing"),
    case(PRE_LN, pre_ln_normed_residual, "failed", "carries the normalised x"),
    case(PRE_LN, pre_ln_residual_before_sublayer, "failed", "added before the sublayer"),
    case(PRE_LN, pre_ln_no_norm, "failed", "LayerNorm is missing"),
    case(PRE_LN, pre_ln_in_place, "failed", "in place"),
    case(PRE_LN, pre_ln_float32, "failed", "float64", "dtype"),
    # other answers: expected and actual values, the shape, the type
    case(PRE_LN, lambda x, sublayer, norm: 2 * x, "failed", "expected [", "got [", id="unknown"),
    case(PRE_LN, lambda x, sublayer, norm: (x + sublayer(norm(x)))[:, :1], "failed", "keeps the shape of x",
         id="wrong shape"),
    case(PRE_LN, lambda x, sublayer, norm: (x + sublayer(norm(x))).tolist(), "failed", "return a torch.Tensor",
         id="a list"),
    case(PRE_LN, stub, "not implemented"),
    case(PRE_LN, lambda x, sublayer, norm: x @ torch.ones(3, 3), "error", "RuntimeError", id="crash"),
]  # fmt: skip


# ---------------------------------------------------------------- check_post_ln


def post_ln_model_answer(x, sublayer, norm):
    return norm(x + sublayer(x))


POST_LN = ch07.check_post_ln
POST_LN_CASES = [
    case(POST_LN, post_ln_model_answer, "passed"),
    case(POST_LN, pre_ln_model_answer, "failed", "pre-LN arrangement", "LayerNorm(x + Sublayer(x))"),
    case(POST_LN, lambda x, sublayer, norm: norm(sublayer(x)), "failed", "residual connection is missing",
         id="no residual"),
    case(POST_LN, lambda x, sublayer, norm: x + norm(sublayer(x)), "failed", "normalised the sublayer's output only",
         id="norm on the branch only"),
    case(POST_LN, lambda x, sublayer, norm: norm(x) + sublayer(x), "failed", "adds first and then normalises",
         id="added to the normalised input"),
    case(POST_LN, pre_ln_no_norm, "failed", "LayerNorm is missing"),
]  # fmt: skip


@pytest.mark.parametrize(FIELDS, FFN_CASES + PRE_LN_CASES + POST_LN_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)


def test_residual_checks_match_the_library_layers():
    """The model answers agree with the residual wrappers inside tl.EncoderLayer."""
    for norm_first, answer in ((False, post_ln_model_answer), (True, pre_ln_model_answer)):
        layer = tl.EncoderLayer(8, 2, 16, norm_first=norm_first)
        x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(layer.res_ff(x, layer.ff), answer(x, layer.ff, layer.res_ff.norm))


def test_residual_checks_do_not_move_the_global_rng():
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    ch07.check_pre_ln(pre_ln_model_answer, verbose=False)
    ch07.check_post_ln(post_ln_model_answer, verbose=False)
    assert torch.equal(torch.random.get_rng_state(), before)
