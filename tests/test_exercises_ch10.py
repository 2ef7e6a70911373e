"""The chapter 10 checks accept right answers and reject plausible wrong ones with the right message."""

import math

import pytest
import torch
import torch.nn.functional as F
from _exercise_cases import FIELDS, Table, assert_verdict, case, stub

from transformer_lib.exercises import ch10

CACHE = ch10.check_cached_attention
CASES = Table()

# ---------------------------------------------------------------- check_cached_attention


def _end_aligned(T_new, T_k):
    return torch.arange(T_k)[None, :] <= T_k - T_new + torch.arange(T_new)[:, None]  # (T_new, T_k)


@CASES.add(CACHE, "passed")
def cache_model_answer(q, k_new, v_new, k_cache, v_cache):
    k_all = torch.cat([k_cache, k_new], dim=-2)
    v_all = torch.cat([v_cache, v_new], dim=-2)
    mask = _end_aligned(q.shape[-2], k_all.shape[-2])
    return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask), k_all, v_all


@CASES.add(CACHE, "passed")
def cache_by_hand(q, k_new, v_new, k_cache, v_cache):
    k_all = torch.cat([k_cache, k_new], dim=-2)
    v_all = torch.cat([v_cache, v_new], dim=-2)
    scores = q @ k_all.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, h, T_new, T_k)
    scores = scores.masked_fill(~_end_aligned(q.shape[-2], k_all.shape[-2]), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v_all, k_all, v_all


@CASES.add(CACHE, "passed")
def cache_tril_offset(q, k_new, v_new, k_cache, v_cache):
    # the mask as the lower triangle shifted right by T_cached
    k_all, v_all = torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)
    T_new, T_k = q.shape[-2], k_all.shape[-2]
    mask = torch.ones(T_new, T_k, dtype=torch.bool).tril(diagonal=T_k - T_new)
    return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask), k_all, v_all


@CASES.add(CACHE, "failed", "attended to the cached keys only")
def cache_forgets_itself(q, k_new, v_new, k_cache, v_cache):
    out = F.scaled_dot_product_attention(q, k_cache, v_cache)
    return out, torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)


@CASES.add(CACHE, "failed", "aligned to the top left", "T_cached + i")
def cache_top_left(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)
    return F.scaled_dot_product_attention(q, k_all, v_all, is_causal=True), k_all, v_all


@CASES.add(CACHE, "failed", "without a causal mask")
def cache_no_mask(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)
    return F.scaled_dot_product_attention(q, k_all, v_all), k_all, v_all


@CASES.add(CACHE, "failed", "not divided by sqrt(d_k)")
def cache_no_scale(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)
    mask = _end_aligned(q.shape[-2], k_all.shape[-2])
    return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, scale=1.0), k_all, v_all


@CASES.add(CACHE, "failed", "new entries before the cached ones")
def cache_wrong_order(q, k_new, v_new, k_cache, v_cache):
    out, _, _ = cache_model_answer(q, k_new, v_new, k_cache, v_cache)
    return out, torch.cat([k_new, k_cache], -2), torch.cat([v_new, v_cache], -2)


@CASES.add(CACHE, "failed", "along the sequence axis (dim=-2)")
def cache_wrong_axis(q, k_new, v_new, k_cache, v_cache):
    out, _, _ = cache_model_answer(q, k_new, v_new, k_cache, v_cache)
    return out, torch.cat([k_cache, k_new], 1), torch.cat([v_cache, v_new], 1)


@CASES.add(CACHE, "failed", "changed the tensors it was given")
def cache_in_place(q, k_new, v_new, k_cache, v_cache):
    out, k_all, v_all = cache_model_answer(q, k_new, v_new, k_cache, v_cache)
    k_new.zero_()
    return out, k_all, v_all


@CASES.add(CACHE, "failed", "return a tuple (out, k_all, v_all)")
def cache_output_only(q, k_new, v_new, k_cache, v_cache):
    return cache_model_answer(q, k_new, v_new, k_cache, v_cache)[0]


@CASES.add(CACHE, "failed", "dtype torch.float32; expected torch.float64")
def cache_float32(q, k_new, v_new, k_cache, v_cache):
    return tuple(t.float() for t in cache_model_answer(q, k_new, v_new, k_cache, v_cache))


# ---------------------------------------------------------------- the references themselves


def test_reference_cache_equals_full_causal_attention(gen):
    q, k, v = (torch.randn(2, 3, 7, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for split in range(7):
        out, k_all, v_all = ch10.reference_cached_attention(
            q[..., split:, :], k[..., split:, :], v[..., split:, :], k[..., :split, :], v[..., :split, :]
        )
        assert torch.allclose(out, full[..., split:, :], atol=1e-12)
        assert torch.equal(k_all, k) and torch.equal(v_all, v)


STUB_CASES = [case(CACHE, stub, "not implemented")]


@pytest.mark.parametrize(FIELDS, CASES + STUB_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)
