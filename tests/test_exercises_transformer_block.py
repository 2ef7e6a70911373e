"""The chapter "The transformer block" checks accept right answers and reject plausible wrong ones with the right
message."""

import pytest
import torch
from _exercise_cases import FIELDS, Table, assert_verdict, case, stub

import transformer_lib as tl
from transformer_lib.exercises import transformer_block

FFN = transformer_block.check_ffn_params
PRE_LN = transformer_block.check_pre_ln
POST_LN = transformer_block.check_post_ln
CASES = Table()  # the rows of the answers below that are written as functions

# ---------------------------------------------------------------- check_ffn_params


@CASES.add(FFN, "passed")
def ffn_model_answer(d_model, d_ff, bias=True):
    return 2 * d_model * d_ff + ((d_ff + d_model) if bias else 0)


@CASES.add(FFN, "passed")
def ffn_by_counting(d_model, d_ff, bias=True):
    return sum(p.numel() for p in tl.FeedForward(d_model, d_ff, bias=bias).parameters())


@CASES.add(FFN, "failed", "ffn_param_count(2, 3, bias=True)", "returned 12", "also has a bias vector")
def ffn_weights_only(d_model, d_ff, bias=True):
    return 2 * d_model * d_ff


@CASES.add(FFN, "failed", "bias=False", "no bias vectors")
def ffn_ignores_bias_flag(d_model, d_ff, bias=True):
    return 2 * d_model * d_ff + d_ff + d_model


@CASES.add(FFN, "failed", "its bias has d_model entries")
def ffn_both_biases_d_ff(d_model, d_ff, bias=True):
    return 2 * d_model * d_ff + (2 * d_ff if bias else 0)


@CASES.add(FFN, "failed", "looks like one linear layer")
def ffn_one_layer(d_model, d_ff, bias=True):
    return d_model * d_ff + ((d_ff + d_model) if bias else 0)


@CASES.add(FFN, "failed", "as an int")
def ffn_float(d_model, d_ff, bias=True):
    return float(ffn_model_answer(d_model, d_ff, bias))


FFN_CASES = [
    case(FFN, lambda d, f, bias=True: torch.tensor(ffn_model_answer(d, f, bias)), "passed", id="an integer tensor"),
    case(FFN, stub, "not implemented"),
    case(FFN, lambda d_model, d_ff: 0, "error", "TypeError", id="forgot the bias argument"),
]


def test_ffn_params_does_not_move_the_global_rng():
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    transformer_block.check_ffn_params(ffn_model_answer, verbose=False)
    assert torch.equal(torch.random.get_rng_state(), before)


# ---------------------------------------------------------------- check_pre_ln


@CASES.add(PRE_LN, "passed")
@CASES.add(POST_LN, "failed", "pre-LN arrangement", "LayerNorm(x + Sublayer(x))")
def pre_ln_model_answer(x, sublayer, norm):
    return x + sublayer(norm(x))


@CASES.add(PRE_LN, "failed", "post-LN arrangement", "x of shape (2, 3, 4)", "x + Sublayer(LayerNorm(x))")
def pre_ln_is_post_ln(x, sublayer, norm):
    return norm(x + sublayer(x))


@CASES.add(PRE_LN, "failed", "after adding the residual")
def pre_ln_norm_after_residual(x, sublayer, norm):
    return norm(x + sublayer(norm(x)))


@CASES.add(PRE_LN, "failed", "residual connection is missing")
def pre_ln_no_residual(x, sublayer, norm):
    return sublayer(norm(x))


@CASES.add(PRE_LN, "failed", "carries the normalised x")
def pre_ln_normed_residual(x, sublayer, norm):
    x = norm(x)
    return x + sublayer(x)


@CASES.add(PRE_LN, "failed", "added before the sublayer")
def pre_ln_residual_before_sublayer(x, sublayer, norm):
    return sublayer(x + norm(x))


@CASES.add(PRE_LN, "failed", "LayerNorm is missing")
@CASES.add(POST_LN, "failed", "LayerNorm is missing")
def pre_ln_no_norm(x, sublayer, norm):
    return x + sublayer(x)


@CASES.add(PRE_LN, "failed", "in place")
def pre_ln_in_place(x, sublayer, norm):
    x += sublayer(norm(x))
    return x


@CASES.add(PRE_LN, "failed", "float64", "dtype")
def pre_ln_float32(x, sublayer, norm):
    return (x + sublayer(norm(x))).float()


PRE_LN_CASES = [
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


@CASES.add(POST_LN, "passed")
def post_ln_model_answer(x, sublayer, norm):
    return norm(x + sublayer(x))


POST_LN_CASES = [
    case(POST_LN, lambda x, sublayer, norm: norm(sublayer(x)), "failed", "residual connection is missing",
         id="no residual"),
    case(POST_LN, lambda x, sublayer, norm: x + norm(sublayer(x)), "failed", "normalised the sublayer's output only",
         id="norm on the branch only"),
    case(POST_LN, lambda x, sublayer, norm: norm(x) + sublayer(x), "failed", "adds first and then normalises",
         id="added to the normalised input"),
]  # fmt: skip


@pytest.mark.parametrize(FIELDS, CASES + FFN_CASES + PRE_LN_CASES + POST_LN_CASES)
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
    transformer_block.check_pre_ln(pre_ln_model_answer, verbose=False)
    transformer_block.check_post_ln(post_ln_model_answer, verbose=False)
    assert torch.equal(torch.random.get_rng_state(), before)
