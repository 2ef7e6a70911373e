"""The chapter "Generation" checks accept right answers and reject plausible wrong ones with the right message."""

import math

import pytest
import torch
import torch.nn.functional as F
from _exercise_cases import FIELDS, Table, assert_verdict, case, stub

from transformer_lib.exercises import generation

CACHE = generation.check_cached_attention
TOP_P = generation.check_top_p_filter
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


# ---------------------------------------------------------------- check_top_p_filter


@CASES.add(TOP_P, "passed")
def top_p_model_answer(logits, p):
    if p >= 1:
        return logits
    sorted_logits, _ = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # the mass of the more likely tokens
    n = (before < p).sum(dim=-1, keepdim=True)  # the nucleus's size, at least 1
    threshold = sorted_logits.gather(-1, n - 1)
    return logits.masked_fill(logits < threshold, float("-inf"))


@CASES.add(TOP_P, "passed")
def top_p_library(logits, p):
    import transformer_lib as tl

    return tl.top_p_filter(logits, p)


def _scatter_back(logits, sorted_keep, order):
    """logits with the tokens whose sorted position is not kept at -inf, in vocabulary order."""
    keep = torch.zeros_like(sorted_keep).scatter(-1, order, sorted_keep)
    return logits.masked_fill(~keep, float("-inf"))


@CASES.add(TOP_P, "failed", "left out the token that brings the mass to p")
def top_p_cumsum_at_most_p(logits, p):
    probs, order = logits.softmax(-1).sort(dim=-1, descending=True)
    keep = probs.cumsum(-1) <= p
    keep[..., 0] = True
    return _scatter_back(logits, keep, order)


@CASES.add(TOP_P, "failed", "lost every token", "always in the nucleus")
def top_p_may_empty_a_row(logits, p):
    probs, order = logits.softmax(-1).sort(dim=-1, descending=True)
    return _scatter_back(logits, probs.cumsum(-1) < p, order)


@CASES.add(TOP_P, "failed", "kept the least likely tokens")
def top_p_ascending(logits, p):
    probs, order = logits.softmax(-1).sort(dim=-1)
    keep = probs.cumsum(-1) - probs < p
    return _scatter_back(logits, keep, order)


@CASES.add(TOP_P, "failed", "added up logits")
def top_p_sums_logits(logits, p):
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    keep = sorted_logits.cumsum(-1) - sorted_logits < p
    return _scatter_back(logits, keep, order)


@CASES.add(TOP_P, "failed", "returned probabilities")
def top_p_returns_probabilities(logits, p):
    kept = torch.isfinite(top_p_model_answer(logits, p))
    return logits.softmax(-1) * kept


@CASES.add(TOP_P, "failed", "must become -inf, not a large negative number")
def top_p_minus_1e9(logits, p):
    kept = torch.isfinite(top_p_model_answer(logits, p))
    return logits.masked_fill(~kept, -1e9)


@CASES.add(TOP_P, "failed", "in sorted order", "scatter")
def top_p_left_sorted(logits, p):
    sorted_logits, _ = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    return sorted_logits.masked_fill(probs.cumsum(-1) - probs >= p, float("-inf"))


@CASES.add(TOP_P, "failed", "tied with the least likely member")
def top_p_drops_ties(logits, p):
    if p >= 1:
        return logits
    probs, order = logits.softmax(-1).sort(dim=-1, descending=True, stable=True)
    keep = probs.cumsum(-1) - probs < p
    return _scatter_back(logits, keep, order)


@CASES.add(TOP_P, "failed", "p = 1 keeps every token")
def top_p_rounds_away_the_tail(logits, p):
    # the model answer without its p >= 1 shortcut: in float32 the mass before a token of
    # probability 1e-13 rounds to 1.0, which is not below p = 1
    sorted_logits, _ = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    n = (probs.cumsum(dim=-1) - probs < p).sum(dim=-1, keepdim=True)
    return logits.masked_fill(logits < sorted_logits.gather(-1, n - 1), float("-inf"))


@CASES.add(TOP_P, "failed", "changed the logits it was given")
def top_p_in_place(logits, p):
    kept = torch.isfinite(top_p_model_answer(logits, p))
    return logits.masked_fill_(~kept, float("-inf"))


@CASES.add(TOP_P, "failed", "dtype torch.float32; expected torch.float64")
def top_p_float32(logits, p):
    return top_p_model_answer(logits.float(), p)


# ---------------------------------------------------------------- the references themselves


def test_reference_cache_equals_full_causal_attention(gen):
    q, k, v = (torch.randn(2, 3, 7, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for split in range(7):
        out, k_all, v_all = generation.reference_cached_attention(
            q[..., split:, :], k[..., split:, :], v[..., split:, :], k[..., :split, :], v[..., :split, :]
        )
        assert torch.allclose(out, full[..., split:, :], atol=1e-12)
        assert torch.equal(k_all, k) and torch.equal(v_all, v)


STUB_CASES = [case(CACHE, stub, "not implemented"), case(TOP_P, stub, "not implemented")]


@pytest.mark.parametrize(FIELDS, CASES + STUB_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)
