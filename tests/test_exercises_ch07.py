"""The chapter 7 checks accept right answers and reject plausible wrong ones with the right message."""

import torch

import transformer_lib as tl
from transformer_lib.exercises import ch07


def run(checker, fn):
    return checker(fn, verbose=False)


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


def ffn_stub(d_model, d_ff, bias=True):
    raise NotImplementedError


def test_ffn_params_accepts_model_answer_and_counting():
    assert run(ch07.check_ffn_params, ffn_model_answer).passed
    assert run(ch07.check_ffn_params, ffn_by_counting).passed


def test_ffn_params_accepts_an_integer_tensor():
    assert run(ch07.check_ffn_params, lambda d, f, bias=True: torch.tensor(ffn_model_answer(d, f, bias))).passed


def test_ffn_params_rejects_weights_only():
    r = run(ch07.check_ffn_params, ffn_weights_only)
    assert r.status == "failed"
    assert "ffn_param_count(2, 3, bias=True)" in r.message and "returned 12" in r.message
    assert "also has a bias vector" in r.message


def test_ffn_params_rejects_ignoring_the_bias_flag():
    r = run(ch07.check_ffn_params, ffn_ignores_bias_flag)
    assert r.status == "failed"
    assert "bias=False" in r.message and "no bias vectors" in r.message


def test_ffn_params_rejects_wrong_bias_sizes():
    r = run(ch07.check_ffn_params, ffn_both_biases_d_ff)
    assert r.status == "failed" and "its bias has d_model entries" in r.message


def test_ffn_params_rejects_one_layer():
    r = run(ch07.check_ffn_params, ffn_one_layer)
    assert r.status == "failed" and "looks like one linear layer" in r.message


def test_ffn_params_rejects_floats_and_reports_stubs_and_crashes():
    r = run(ch07.check_ffn_params, ffn_float)
    assert r.status == "failed" and "as an int" in r.message
    assert run(ch07.check_ffn_params, ffn_stub).status == "not implemented"
    r = run(ch07.check_ffn_params, lambda d_model, d_ff: 0)  # forgot the bias argument
    assert r.status == "error" and "TypeError" in r.message


def test_ffn_params_does_not_move_the_global_rng():
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    run(ch07.check_ffn_params, ffn_model_answer)
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


def pre_ln_stub(x, sublayer, norm):
    raise NotImplementedError


def test_pre_ln_accepts_model_answer():
    assert run(ch07.check_pre_ln, pre_ln_model_answer).passed


def test_pre_ln_rejects_post_ln():
    r = run(ch07.check_pre_ln, pre_ln_is_post_ln)
    assert r.status == "failed" and "post-LN arrangement" in r.message
    assert "x of shape (2, 3, 4)" in r.message and "x + Sublayer(LayerNorm(x))" in r.message


def test_pre_ln_rejects_norm_after_residual():
    r = run(ch07.check_pre_ln, pre_ln_norm_after_residual)
    assert r.status == "failed" and "after adding the residual" in r.message


def test_pre_ln_rejects_missing_residual():
    r = run(ch07.check_pre_ln, pre_ln_no_residual)
    assert r.status == "failed" and "residual connection is missing" in r.message


def test_pre_ln_rejects_normalised_residual():
    r = run(ch07.check_pre_ln, pre_ln_normed_residual)
    assert r.status == "failed" and "carries the normalised x" in r.message


def test_pre_ln_rejects_residual_before_sublayer():
    r = run(ch07.check_pre_ln, pre_ln_residual_before_sublayer)
    assert r.status == "failed" and "added before the sublayer" in r.message


def test_pre_ln_rejects_missing_norm():
    r = run(ch07.check_pre_ln, pre_ln_no_norm)
    assert r.status == "failed" and "LayerNorm is missing" in r.message


def test_pre_ln_rejects_in_place_updates_and_wrong_dtypes():
    r = run(ch07.check_pre_ln, pre_ln_in_place)
    assert r.status == "failed" and "in place" in r.message
    r = run(ch07.check_pre_ln, pre_ln_float32)
    assert r.status == "failed" and "float64" in r.message and "dtype" in r.message


def test_pre_ln_rejects_other_answers_with_expected_and_actual_values():
    r = run(ch07.check_pre_ln, lambda x, sublayer, norm: 2 * x)
    assert r.status == "failed" and "expected [" in r.message and "got [" in r.message
    r = run(ch07.check_pre_ln, lambda x, sublayer, norm: (x + sublayer(norm(x)))[:, :1])
    assert r.status == "failed" and "keeps the shape of x" in r.message
    r = run(ch07.check_pre_ln, lambda x, sublayer, norm: (x + sublayer(norm(x))).tolist())
    assert r.status == "failed" and "return a torch.Tensor" in r.message


def test_pre_ln_reports_stubs_and_crashes():
    assert run(ch07.check_pre_ln, pre_ln_stub).status == "not implemented"
    r = run(ch07.check_pre_ln, lambda x, sublayer, norm: x @ torch.ones(3, 3))
    assert r.status == "error" and "RuntimeError" in r.message


# ---------------------------------------------------------------- check_post_ln


def post_ln_model_answer(x, sublayer, norm):
    return norm(x + sublayer(x))


def test_post_ln_accepts_model_answer():
    assert run(ch07.check_post_ln, post_ln_model_answer).passed


def test_post_ln_rejects_pre_ln():
    r = run(ch07.check_post_ln, pre_ln_model_answer)
    assert r.status == "failed" and "pre-LN arrangement" in r.message and "LayerNorm(x + Sublayer(x))" in r.message


def test_post_ln_rejects_missing_residual():
    r = run(ch07.check_post_ln, lambda x, sublayer, norm: norm(sublayer(x)))
    assert r.status == "failed" and "residual connection is missing" in r.message


def test_post_ln_rejects_norm_on_the_branch_only():
    r = run(ch07.check_post_ln, lambda x, sublayer, norm: x + norm(sublayer(x)))
    assert r.status == "failed" and "normalised the sublayer's output only" in r.message


def test_post_ln_rejects_adding_to_the_normalised_input():
    r = run(ch07.check_post_ln, lambda x, sublayer, norm: norm(x) + sublayer(x))
    assert r.status == "failed" and "adds first and then normalises" in r.message


def test_post_ln_rejects_missing_norm():
    r = run(ch07.check_post_ln, pre_ln_no_norm)
    assert r.status == "failed" and "LayerNorm is missing" in r.message


def test_residual_checks_match_the_library_layers():
    """The model answers agree with the residual wrappers inside tl.EncoderLayer."""
    for norm_first, answer in ((False, post_ln_model_answer), (True, pre_ln_model_answer)):
        layer = tl.EncoderLayer(8, 2, 16, norm_first=norm_first)
        x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(layer.res_ff(x, layer.ff), answer(x, layer.ff, layer.res_ff.norm))


def test_residual_checks_do_not_move_the_global_rng():
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    run(ch07.check_pre_ln, pre_ln_model_answer)
    run(ch07.check_post_ln, post_ln_model_answer)
    assert torch.equal(torch.random.get_rng_state(), before)
