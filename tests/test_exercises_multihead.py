"""The chapter "Multi-head attention" checks accept the model answers and reject plausible wrong answers with the right
message."""

import pytest
import torch
from _exercise_cases import FIELDS, assert_verdict, case, stub

import transformer_lib as tl
from transformer_lib.exercises import multihead

# --------------------------------------------------------------------------- ex-05-1: parameter count


def good_count(d_model, n_heads, bias=True):
    return 4 * d_model * d_model + (4 * d_model if bias else 0)


def counted(d_model, n_heads, bias=True):
    return sum(p.numel() for p in tl.MultiHeadAttention(d_model, n_heads, bias=bias).parameters())


COUNT = multihead.check_mha_param_count
COUNT_CASES = [
    case(COUNT, good_count, "passed"),
    case(COUNT, counted, "passed"),
    case(COUNT, lambda d, h, bias=True: h * good_count(d, h, bias), "failed", "full d_model x d_model projections",
         id="full-size heads"),
    case(COUNT, lambda d, h, bias=True: 3 * d * d + (3 * d if bias else 0), "failed", "output projection W_o",
         id="no output projection"),
    case(COUNT, lambda d, h, bias=True: 4 * d * d, "failed", "bias vectors", "bias=True", id="no biases"),
    case(COUNT, lambda d, h, bias=True: 4 * d * d + 4 * d, "failed", "bias=False", id="biases when bias=False"),
    case(COUNT, lambda d, h, bias=True: 4 * d * (d // h) + (4 * (d // h) if bias else 0), "failed", "single head",
         id="one head only"),
    case(COUNT, lambda d, h, bias=True: good_count(d, h, bias) + 0.5, "failed", "whole number", id="not an integer"),
    case(COUNT, stub, "not implemented"),
]  # fmt: skip


# --------------------------------------------------------------------------- ex-05-2: split and merge


def good_split(x, n_heads):
    B, T, d_model = x.shape
    return x.reshape(B, T, n_heads, d_model // n_heads).transpose(1, 2)


def good_merge(x):
    B, h, T, d_k = x.shape
    return x.transpose(1, 2).reshape(B, T, h * d_k)


SPLIT, MERGE = multihead.check_split_heads, multihead.check_merge_heads
SPLIT_MERGE_CASES = [
    case(SPLIT, good_split, "passed"),
    case(SPLIT, tl.split_heads, "passed", id="library"),
    # the smallest failing case: one sequence of 3 tokens
    case(SPLIT, lambda x, h: x.reshape(x.shape[0], h, x.shape[1], x.shape[2] // h), "failed",
         "reshaped straight to (B, h, T, d_k)", "n_heads=2", id="view without transpose"),
    case(SPLIT, lambda x, h: x.reshape(x.shape[0], x.shape[1], x.shape[2] // h, h).permute(0, 3, 1, 2), "failed",
         "every h-th feature", id="interleaved features"),
    case(SPLIT, lambda x, h: x.reshape(x.shape[0], x.shape[1], h, x.shape[2] // h), "failed",
         "expected (B, h, T, d_k)", id="no transpose"),
    case(SPLIT, lambda x, h: x.reshape(x.shape[0], x.shape[1], h, x.shape[2] // h).permute(0, 2, 3, 1), "failed",
         "(B, h, T, d_k)", id="wrong transpose order"),
    case(SPLIT, lambda x, h: good_split(x, h).float(), "failed", "torch.float64", id="dtype change"),
    case(MERGE, good_merge, "passed"),
    case(MERGE, tl.merge_heads, "passed", id="library"),
    case(MERGE, lambda x: x.reshape(x.shape[0], x.shape[2], x.shape[1] * x.shape[3]), "failed",
         "Swap the h and T axes first", id="reshape without transpose"),
    case(MERGE, lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], x.shape[1] * x.shape[3]), "failed",
         "interleaved", id="interleaved heads"),
    case(MERGE, lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], x.shape[1] * x.shape[3]), "failed",
         "contiguous", id="view after transpose"),
    case(MERGE, lambda x: x.transpose(1, 2), "failed", "(B, T, h * d_k)", id="wrong shape"),
]  # fmt: skip


# --------------------------------------------------------------------------- ex-05-3: head contributions


def _heads(mha, x, scaled=True):
    """Each head's attention output (B, h, T, d_k), with or without the 1/sqrt(d_k) scaling."""
    q, k, v = (tl.split_heads(p(x), mha.n_heads) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
    if scaled:
        return tl.scaled_dot_product_attention(q, k, v)[0]
    return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v  # no 1/sqrt(d_k)


def _through_w_o(mha, heads):
    W_o = mha.out_proj.weight.view(mha.d_model, mha.n_heads, mha.d_k)  # (d_model, h, d_k)
    return torch.einsum("bhtk,dhk->bhtd", heads, W_o)


def _bias(mha):
    return mha.out_proj.bias if mha.out_proj.bias is not None else 0


def good_contributions(mha, x):
    return _through_w_o(mha, _heads(mha, x))


def bias_in_every_head(mha, x):
    return good_contributions(mha, x) + _bias(mha)


def bias_share(mha, x):
    return good_contributions(mha, x) + _bias(mha) / mha.n_heads


def rows_of_w_o(mha, x):
    heads, W, d_k = _heads(mha, x), mha.out_proj.weight, mha.d_k
    return torch.stack([heads[:, i] @ W[i * d_k : (i + 1) * d_k] for i in range(mha.n_heads)], 1)


def even_split_of_the_output(mha, x):
    out, _ = mha(x, x, x)
    return ((out - _bias(mha)) / mha.n_heads)[:, None].expand(-1, mha.n_heads, -1, -1)


CONTRIBUTIONS = multihead.check_head_contributions
CONTRIBUTION_CASES = [
    case(CONTRIBUTIONS, good_contributions, "passed"),
    case(CONTRIBUTIONS, bias_in_every_head, "failed", "bias h times"),
    case(CONTRIBUTIONS, bias_share, "failed", "bias / h"),
    case(CONTRIBUTIONS, rows_of_w_o, "failed", "rows", "x @ W.T"),
    case(CONTRIBUTIONS, _heads, "failed", "heads' outputs themselves", id="heads without W_o"),
    case(CONTRIBUTIONS, even_split_of_the_output, "failed", "split between heads"),
    case(CONTRIBUTIONS, lambda mha, x: _through_w_o(mha, _heads(mha, x, scaled=False)), "failed",
         "must equal mha(x, x, x)[0]", id="no scaling"),
    case(CONTRIBUTIONS, lambda mha, x: mha.no_such_thing, "error", "AttributeError", id="crash"),
]  # fmt: skip


@pytest.mark.parametrize(FIELDS, COUNT_CASES + SPLIT_MERGE_CASES + CONTRIBUTION_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)
