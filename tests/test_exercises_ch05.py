"""The chapter 5 checks accept the model answers and reject plausible wrong answers with the right message."""

import torch

import transformer_lib as tl
from transformer_lib.exercises import ch05

# --------------------------------------------------------------------------- ex-05-1: parameter count


def good_count(d_model, n_heads, bias=True):
    return 4 * d_model * d_model + (4 * d_model if bias else 0)


def test_param_count_accepts_the_model_answer_and_a_counted_module():
    assert ch05.check_mha_param_count(good_count, verbose=False).passed
    counted = lambda d, h, bias=True: sum(p.numel() for p in tl.MultiHeadAttention(d, h, bias=bias).parameters())
    assert ch05.check_mha_param_count(counted, verbose=False).passed


def test_param_count_rejects_full_size_heads():
    wrong = lambda d, h, bias=True: h * good_count(d, h, bias)
    r = ch05.check_mha_param_count(wrong, verbose=False)
    assert r.status == "failed" and "full d_model x d_model projections" in r.message


def test_param_count_rejects_missing_output_projection():
    wrong = lambda d, h, bias=True: 3 * d * d + (3 * d if bias else 0)
    r = ch05.check_mha_param_count(wrong, verbose=False)
    assert r.status == "failed" and "output projection W_o" in r.message


def test_param_count_rejects_missing_biases():
    wrong = lambda d, h, bias=True: 4 * d * d
    r = ch05.check_mha_param_count(wrong, verbose=False)
    assert r.status == "failed" and "bias vectors" in r.message and "bias=True" in r.message


def test_param_count_rejects_biases_when_bias_false():
    wrong = lambda d, h, bias=True: 4 * d * d + 4 * d
    r = ch05.check_mha_param_count(wrong, verbose=False)
    assert r.status == "failed" and "bias=False" in r.message


def test_param_count_rejects_one_head_only():
    wrong = lambda d, h, bias=True: 4 * d * (d // h) + (4 * (d // h) if bias else 0)
    r = ch05.check_mha_param_count(wrong, verbose=False)
    assert r.status == "failed" and "single head" in r.message


def test_param_count_rejects_a_non_integer():
    r = ch05.check_mha_param_count(lambda d, h, bias=True: good_count(d, h, bias) + 0.5, verbose=False)
    assert r.status == "failed" and "whole number" in r.message


def test_param_count_reports_a_stub():
    def stub(d, h, bias=True):
        raise NotImplementedError

    assert ch05.check_mha_param_count(stub, verbose=False).status == "not implemented"


# --------------------------------------------------------------------------- ex-05-2: split and merge


def good_split(x, n_heads):
    B, T, d_model = x.shape
    return x.reshape(B, T, n_heads, d_model // n_heads).transpose(1, 2)


def good_merge(x):
    B, h, T, d_k = x.shape
    return x.transpose(1, 2).reshape(B, T, h * d_k)


def test_split_accepts_model_answer_and_library():
    assert ch05.check_split_heads(good_split, verbose=False).passed
    assert ch05.check_split_heads(tl.split_heads, verbose=False).passed


def test_split_rejects_view_without_transpose():
    wrong = lambda x, h: x.reshape(x.shape[0], h, x.shape[1], x.shape[2] // h)
    r = ch05.check_split_heads(wrong, verbose=False)
    assert r.status == "failed" and "reshaped straight to (B, h, T, d_k)" in r.message
    assert "n_heads=2" in r.message  # the smallest failing case: one sequence of 3 tokens


def test_split_rejects_interleaved_features():
    wrong = lambda x, h: x.reshape(x.shape[0], x.shape[1], x.shape[2] // h, h).permute(0, 3, 1, 2)
    r = ch05.check_split_heads(wrong, verbose=False)
    assert r.status == "failed" and "every h-th feature" in r.message


def test_split_rejects_missing_transpose_by_shape():
    wrong = lambda x, h: x.reshape(x.shape[0], x.shape[1], h, x.shape[2] // h)
    r = ch05.check_split_heads(wrong, verbose=False)
    assert r.status == "failed" and "expected (B, h, T, d_k)" in r.message


def test_split_rejects_wrong_transpose_order():
    wrong = lambda x, h: x.reshape(x.shape[0], x.shape[1], h, x.shape[2] // h).permute(0, 2, 3, 1)
    r = ch05.check_split_heads(wrong, verbose=False)
    assert r.status == "failed" and "(B, h, T, d_k)" in r.message


def test_split_rejects_a_dtype_change():
    r = ch05.check_split_heads(lambda x, h: good_split(x, h).float(), verbose=False)
    assert r.status == "failed" and "torch.float64" in r.message


def test_merge_accepts_model_answer_and_library():
    assert ch05.check_merge_heads(good_merge, verbose=False).passed
    assert ch05.check_merge_heads(tl.merge_heads, verbose=False).passed


def test_merge_rejects_reshape_without_transpose():
    wrong = lambda x: x.reshape(x.shape[0], x.shape[2], x.shape[1] * x.shape[3])
    r = ch05.check_merge_heads(wrong, verbose=False)
    assert r.status == "failed" and "Swap the h and T axes first" in r.message


def test_merge_rejects_interleaved_heads():
    wrong = lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], x.shape[1] * x.shape[3])
    r = ch05.check_merge_heads(wrong, verbose=False)
    assert r.status == "failed" and "interleaved" in r.message


def test_merge_explains_view_after_transpose():
    wrong = lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], x.shape[1] * x.shape[3])
    r = ch05.check_merge_heads(wrong, verbose=False)
    assert r.status == "failed" and "contiguous" in r.message


def test_merge_rejects_wrong_shape():
    r = ch05.check_merge_heads(lambda x: x.transpose(1, 2), verbose=False)
    assert r.status == "failed" and "(B, T, h * d_k)" in r.message


# --------------------------------------------------------------------------- ex-05-3: head contributions


def good_contributions(mha, x):
    q, k, v = (tl.split_heads(p(x), mha.n_heads) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
    heads, _ = tl.scaled_dot_product_attention(q, k, v)  # (B, h, T, d_k)
    W_o = mha.out_proj.weight.view(mha.d_model, mha.n_heads, mha.d_k)  # (d_model, h, d_k)
    return torch.einsum("bhtk,dhk->bhtd", heads, W_o)


def test_contributions_accept_model_answer():
    assert ch05.check_head_contributions(good_contributions, verbose=False).passed


def test_contributions_reject_bias_in_every_head():
    def wrong(mha, x):
        b = mha.out_proj.bias if mha.out_proj.bias is not None else 0
        return good_contributions(mha, x) + b

    r = ch05.check_head_contributions(wrong, verbose=False)
    assert r.status == "failed" and "bias h times" in r.message


def test_contributions_reject_bias_share():
    def wrong(mha, x):
        b = mha.out_proj.bias if mha.out_proj.bias is not None else 0
        return good_contributions(mha, x) + b / mha.n_heads

    r = ch05.check_head_contributions(wrong, verbose=False)
    assert r.status == "failed" and "bias / h" in r.message


def test_contributions_reject_rows_of_w_o():
    def wrong(mha, x):
        q, k, v = (tl.split_heads(p(x), mha.n_heads) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
        heads, _ = tl.scaled_dot_product_attention(q, k, v)
        W = mha.out_proj.weight
        d_k = mha.d_k
        return torch.stack([heads[:, i] @ W[i * d_k : (i + 1) * d_k] for i in range(mha.n_heads)], 1)

    r = ch05.check_head_contributions(wrong, verbose=False)
    assert r.status == "failed" and "rows" in r.message and "x @ W.T" in r.message


def test_contributions_reject_heads_without_w_o():
    def wrong(mha, x):
        q, k, v = (tl.split_heads(p(x), mha.n_heads) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
        return tl.scaled_dot_product_attention(q, k, v)[0]

    r = ch05.check_head_contributions(wrong, verbose=False)
    assert r.status == "failed" and "heads' outputs themselves" in r.message


def test_contributions_reject_an_even_split_of_the_output():
    def wrong(mha, x):
        out, _ = mha(x, x, x)
        b = mha.out_proj.bias if mha.out_proj.bias is not None else 0
        return ((out - b) / mha.n_heads)[:, None].expand(-1, mha.n_heads, -1, -1)

    r = ch05.check_head_contributions(wrong, verbose=False)
    assert r.status == "failed" and "split between heads" in r.message


def test_contributions_reject_missing_scaling():
    def wrong(mha, x):
        q, k, v = (tl.split_heads(p(x), mha.n_heads) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
        heads = torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v  # no 1/sqrt(d_k)
        W_o = mha.out_proj.weight.view(mha.d_model, mha.n_heads, mha.d_k)
        return torch.einsum("bhtk,dhk->bhtd", heads, W_o)

    r = ch05.check_head_contributions(wrong, verbose=False)
    assert r.status == "failed" and "must equal mha(x, x, x)[0]" in r.message


def test_contributions_report_a_crash():
    r = ch05.check_head_contributions(lambda mha, x: mha.no_such_thing, verbose=False)
    assert r.status == "error" and "AttributeError" in r.message
