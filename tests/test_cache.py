"""Tests of chapter "Generation"'s incremental decoding: the key-value cache, grouped-query attention and
sliding windows. The central property: a model that reads its earlier keys and values from a
cache computes the same function as one that recomputes them (same tokens, logits equal up to
rounding), on both attention paths (hand-written with weights, fused), for every variant."""

import math

import pytest
import torch
import torch.nn.functional as F

import transformer_lib as tl

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}
VARIANTS = {
    "standard": {},
    "gqa": dict(n_kv_heads=2),
    "mqa": dict(n_kv_heads=1),
    "window": dict(window=3),
    "gqa+window": dict(n_kv_heads=2, window=4),
    "dropout (eval mode)": dict(dropout=0.3),
}


def gpt(dtype=torch.float32, **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=13, context_len=12, n_layers=2, n_heads=4, d_model=32, dropout=0.0)
    cfg.update(kw)
    return tl.GPT(tl.GPTConfig(**cfg)).to(dtype).eval()


def seq2seq(**kw):
    torch.manual_seed(0)
    cfg = dict(src_vocab_size=13, tgt_vocab_size=13, d_model=32, n_heads=4, n_encoder_layers=2,
               n_decoder_layers=2, dropout=0.0, context_len=16)  # fmt: skip
    cfg.update(kw)
    return tl.Transformer(tl.TransformerConfig(**cfg)).eval()


def cached_logits(model, idx, chunks, need_weights=False):
    """Logits of ``idx`` computed chunk by chunk through a cache: ``chunks`` are the lengths."""
    cache, out, start = model.new_cache(), [], 0
    for n in chunks:
        out.append(model(idx[:, start : start + n], need_weights=need_weights, cache=cache)[0])
        start += n
    assert cache.position == start == idx.shape[1]
    return torch.cat(out, dim=1)


# --- KVCache itself ---


def test_kv_cache_appends_and_returns_everything():
    cache = tl.KVCache()
    k1, v1 = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    k2, v2 = torch.randn(2, 3, 1, 5), torch.randn(2, 3, 1, 5)
    assert cache.length == cache.position == cache.nbytes() == 0 and not cache.filled
    assert torch.equal(cache.append(k1, v1)[0], k1)
    k, v = cache.append(k2, v2)
    assert torch.equal(k, torch.cat([k1, k2], 2)) and torch.equal(v, torch.cat([v1, v2], 2))
    assert cache.length == cache.position == 5
    assert cache.nbytes() == 2 * 2 * 3 * 5 * 5 * 4  # K and V, float32
    cache.reset()
    assert cache.length == 0 and cache.position == 0


def test_outside_autograd_the_cache_grows_in_a_buffer_without_copying_each_step():
    cache = tl.KVCache()
    steps = torch.randn(1, 2, 40, 3)
    with torch.no_grad():
        cache.append(steps[:, :, :5], steps[:, :, :5])
        for t in range(5, 40):
            k, _ = cache.append(steps[:, :, t : t + 1], steps[:, :, t : t + 1])
            assert torch.equal(k, steps[:, :, : t + 1]) and cache.length <= cache.capacity <= 2 * cache.length
    assert cache.capacity == 40 and cache.nbytes() == 2 * 2 * 40 * 3 * 4  # 5, 10, 20, 40: doubled
    assert cache.k.data_ptr() == cache._buffers[0].data_ptr()  # a view of the buffer, not a copy


def test_a_windowed_cache_keeps_only_what_the_window_needs():
    cache = tl.KVCache(window=3)
    k = torch.arange(7.0).view(1, 1, 7, 1)
    full, _ = cache.append(k, k)
    assert torch.equal(full, k)  # the caller gets every key of this call
    assert cache.length == 2 and cache.position == 7  # ... the cache keeps window - 1 of them
    assert torch.equal(cache.k.flatten(), torch.tensor([5.0, 6.0]))
    full, _ = cache.append(k[:, :, :1] + 10, k[:, :, :1])
    assert full.flatten().tolist() == [5.0, 6.0, 10.0] and cache.position == 8
    one = tl.KVCache(window=1)  # a window of one: each token sees itself only, nothing is kept
    one.append(k, k)
    assert one.length == 0 and one.position == 7


def test_a_static_cache_is_filled_once():
    cache = tl.KVCache(static=True)
    k = torch.randn(1, 2, 5, 3)
    cache.set(k, k)
    assert cache.length == 5 and cache.filled
    with pytest.raises(ValueError, match="already filled"):
        cache.set(k, k)
    with pytest.raises(ValueError, match="static"):
        cache.append(k, k)
    with pytest.raises(ValueError, match="set"):
        tl.KVCache().set(k, k)


def test_a_cache_refuses_a_different_batch_or_dtype():
    cache = tl.KVCache()
    cache.append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    with pytest.raises(ValueError, match="batch"):
        cache.append(torch.zeros(2, 2, 1, 4), torch.zeros(2, 2, 1, 4))
    with pytest.raises(ValueError, match="dtype"):
        cache.append(torch.zeros(1, 2, 1, 4).double(), torch.zeros(1, 2, 1, 4).double())
    with pytest.raises(ValueError, match="one shape"):
        cache.append(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 2, 4))


# --- one attention layer ---


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "hand-written"])
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("window", [None, 2, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("grad", [False, True], ids=["no-grad buffer", "autograd concatenation"])
def test_attention_through_a_cache_equals_attention_over_everything(need_weights, n_kv_heads, window, dtype, grad):
    torch.manual_seed(0)
    mha = tl.MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads).to(dtype).eval()
    x = torch.randn(2, 9, 32, dtype=dtype)
    full, full_w = mha(x, x, x, is_causal=True, window=window, need_weights=need_weights)
    cache, outs, start = tl.KVCache(window=window), [], 0
    with torch.set_grad_enabled(grad):  # the cache writes into a buffer, or concatenates under autograd
        for n in (4, 1, 1, 3):  # a prefill, single tokens, then a chunk
            part = x[:, start : start + n]
            out, w = mha(part, part, part, is_causal=True, window=window, need_weights=need_weights, cache=cache)
            if need_weights:  # the weights of the new queries over the keys the layer saw
                T_k = w.shape[-1]
                rows = full_w[:, :, start : start + n]
                torch.testing.assert_close(w, rows[..., start + n - T_k : start + n], **TOL[dtype])
                assert not rows[..., : start + n - T_k].any()  # keys the cache dropped had no weight
            outs.append(out)
            start += n
    torch.testing.assert_close(torch.cat(outs, 1), full, **TOL[dtype])


def test_cross_attention_reuses_a_static_cache():
    torch.manual_seed(0)
    mha = tl.MultiHeadAttention(16, 2, n_kv_heads=1).eval()
    memory, q = torch.randn(2, 6, 16), torch.randn(2, 4, 16)
    keep = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])[:, None, None, :]
    want, _ = mha(q, memory, memory, mask=keep)
    cache = tl.KVCache(static=True)
    first, _ = mha(q[:, :1], memory, memory, mask=keep, cache=cache)
    k = cache.k
    rest, _ = mha(q[:, 1:], memory, memory, mask=keep, cache=cache)
    assert cache.k is k  # filled once, never recomputed
    torch.testing.assert_close(torch.cat([first, rest], 1), want, atol=1e-6, rtol=1e-6)


def test_the_cache_must_keep_what_the_window_needs():
    mha = tl.MultiHeadAttention(8, 2)
    x = torch.randn(1, 2, 8)
    with pytest.raises(ValueError, match="window"):
        mha(x, x, x, is_causal=True, window=4, cache=tl.KVCache(window=2))
    with pytest.raises(ValueError, match="window"):
        mha(x, x, x, is_causal=True, cache=tl.KVCache(window=2))
    mha(x, x, x, is_causal=True, window=2, cache=tl.KVCache())  # a cache that keeps everything is fine


# --- grouped-query attention ---


def expanded_mha(gqa: tl.MultiHeadAttention) -> tl.MultiHeadAttention:
    """A standard multi-head layer whose K and V rows are the grouped layer's, repeated per query head."""
    h, d_k, group = gqa.n_heads, gqa.d_k, gqa.n_heads // gqa.n_kv_heads
    mha = tl.MultiHeadAttention(gqa.d_model, h).to(gqa.in_proj_weight.dtype)
    with torch.no_grad():
        mha.q_proj.weight.copy_(gqa.q_proj.weight)
        mha.q_proj.bias.copy_(gqa.q_proj.bias)
        for src, dst in ((gqa.k_proj, mha.k_proj), (gqa.v_proj, mha.v_proj)):
            dst.weight.copy_(src.weight.view(-1, d_k, gqa.d_model).repeat_interleave(group, 0).flatten(0, 1))
            dst.bias.copy_(src.bias.view(-1, d_k).repeat_interleave(group, 0).flatten())
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
    return mha.eval()


@pytest.mark.parametrize("n_kv_heads", [1, 2, 3, 6])
@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "hand-written"])
@pytest.mark.parametrize("where", ["self", "cross"])
def test_grouped_query_attention_equals_repeating_the_kv_heads(n_kv_heads, need_weights, where):
    torch.manual_seed(0)
    gqa = tl.MultiHeadAttention(24, 6, n_kv_heads=n_kv_heads).double().eval()
    assert gqa.in_proj_weight.shape == (24 + 2 * n_kv_heads * 4, 24)
    mha = expanded_mha(gqa)
    x, memory = torch.randn(2, 5, 24, dtype=torch.float64), torch.randn(2, 7, 24, dtype=torch.float64)
    key = x if where == "self" else memory
    causal = where == "self"
    got, w1 = gqa(x, key, key, is_causal=causal, need_weights=need_weights)
    want, w2 = mha(x, key, key, is_causal=causal, need_weights=need_weights)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    if need_weights:
        torch.testing.assert_close(w1, w2, atol=1e-12, rtol=1e-12)


def test_grouped_query_attention_equals_pytorchs_enable_gqa():
    try:
        F.scaled_dot_product_attention(torch.zeros(1, 2, 1, 1), *[torch.zeros(1, 1, 1, 1)] * 2, enable_gqa=True)
    except TypeError:
        pytest.skip("this PyTorch has no enable_gqa")
    torch.manual_seed(0)
    gqa = tl.MultiHeadAttention(24, 6, n_kv_heads=2).double().eval()
    x = torch.randn(2, 5, 24, dtype=torch.float64)
    q, k, v = gqa.project(x, x, x)
    assert q.shape == (2, 6, 5, 4) and k.shape == v.shape == (2, 2, 5, 4)
    heads = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # (B, h, T, d_k)
    want = gqa.out_proj(tl.merge_heads(heads))
    for need_weights in (False, True):
        got, _ = gqa(x, x, x, is_causal=True, need_weights=need_weights)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_a_grouped_cache_is_smaller_by_the_group_size_and_matches_the_formula():
    idx = torch.randint(0, 13, (3, 10), generator=torch.Generator().manual_seed(0))
    sizes = {}
    for n_kv in (4, 2, 1):
        model = gpt(n_kv_heads=n_kv)
        cache = model.new_cache()
        model(idx, cache=cache)
        sizes[n_kv] = cache.nbytes()
        assert sizes[n_kv] == tl.kv_cache_bytes(2, n_kv, 8, 10, batch=3, dtype=torch.float32)
    assert sizes[4] == 2 * sizes[2] == 4 * sizes[1]
    assert tl.kv_cache_bytes(2, 4, 8, 10, batch=3, dtype=torch.bfloat16) * 2 == sizes[4]


def test_a_windowed_cache_stays_bounded():
    model = gpt(window=4)
    cache = model.new_cache()
    model(torch.zeros(1, 12, dtype=torch.long), cache=cache)
    assert cache.nbytes() == tl.kv_cache_bytes(2, 4, 8, 3)  # window - 1 positions per layer


# --- GPT: cached generation equals uncached generation ---


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "hand-written"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gpt_logits_through_a_cache_equal_the_full_forward(variant, need_weights, dtype):
    model = gpt(dtype, **VARIANTS[variant])
    idx = torch.randint(0, 13, (2, 12), generator=torch.Generator().manual_seed(1))
    full, _ = model(idx, need_weights=need_weights)
    got = cached_logits(model, idx, [5, 1, 1, 1, 4], need_weights=need_weights)
    torch.testing.assert_close(got, full, **TOL[dtype])


@pytest.mark.parametrize("variant", VARIANTS)
def test_gpt_greedy_generation_is_the_same_with_and_without_the_cache(variant):
    model = gpt(**VARIANTS[variant])
    prompt = torch.randint(0, 13, (3, 4), generator=torch.Generator().manual_seed(2))
    cached = model.generate(prompt, 20, top_k=1)  # 24 tokens: past context_len = 12
    uncached = model.generate(prompt, 20, top_k=1, use_cache=False)
    assert torch.equal(cached, uncached)
    for t in range(4, 24):  # and each token is the argmax of the cropped window's last logits
        window = uncached[:, max(0, t - 12) : t]
        assert torch.equal(uncached[:, t], model(window)[0][:, -1].argmax(-1))


@pytest.mark.parametrize("options", [dict(), dict(temperature=0.7, top_k=5), dict(top_p=0.8),
                                     dict(temperature=1.3, top_k=8, top_p=0.9)], ids=str)  # fmt: skip
def test_gpt_sampling_under_one_seed_is_the_same_with_and_without_the_cache(options):
    model = gpt(dropout=0.2, n_kv_heads=2)  # dropout > 0, in eval mode
    prompt = torch.randint(0, 13, (4, 3), generator=torch.Generator().manual_seed(3))
    runs = [model.generate(prompt, 25, generator=torch.Generator().manual_seed(7), use_cache=c, **options)
            for c in (True, False)]  # fmt: skip
    assert torch.equal(*runs)


def test_a_prompt_longer_than_the_context_is_cropped_alike():
    model = gpt()
    prompt = torch.randint(0, 13, (2, 15), generator=torch.Generator().manual_seed(4))
    assert torch.equal(model.generate(prompt, 5, top_k=1), model.generate(prompt, 5, top_k=1, use_cache=False))


def test_gpt_with_a_cache_refuses_positions_past_the_context():
    model = gpt()
    cache = model.new_cache()
    model(torch.zeros(1, 10, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="context_len"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(TypeError, match="DecoderCache"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=[])


# --- the encoder-decoder ---


def padded_source():
    src = torch.randint(3, 13, (3, 7), generator=torch.Generator().manual_seed(5))
    src[1, 4:] = 0  # pad_id
    src[2, 2:] = 0
    return src


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "hand-written"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_decoding_through_a_cache_equals_the_full_decode(n_kv_heads, need_weights, norm_first):
    model = seq2seq(n_kv_heads=n_kv_heads, norm_first=norm_first)
    src = padded_source()
    tgt = torch.randint(3, 13, (3, 9), generator=torch.Generator().manual_seed(6))
    memory, keep = model.encode(src)
    full = model.decode(tgt, memory, keep, need_weights=need_weights)
    cache, steps = model.new_cache(), []
    for t in (3, 4, 5, 6, 7, 8, 9):  # the target prefix grows; only the new part is decoded
        steps.append(model.decode(tgt[:, :t], memory, keep, need_weights=need_weights, cache=cache))
    assert cache.position == 9 and all(c.cross_attn.length == 7 for c in cache.layers)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_kv_heads", [None, 1])
def test_transformer_greedy_decode_is_the_same_with_and_without_the_cache(n_kv_heads):
    model = seq2seq(n_kv_heads=n_kv_heads, dropout=0.3)
    src = padded_source()
    assert torch.equal(model.greedy_decode(src, 12), model.greedy_decode(src, 12, use_cache=False))


def test_cross_attention_keys_are_projected_once_per_layer():
    model = seq2seq()
    calls = []
    for layer in model.decoder.layers:
        original = layer.cross_attn._project_kv
        layer.cross_attn._project_kv = lambda key, value, f=original: calls.append(1) or f(key, value)
    model.greedy_decode(padded_source(), 8)
    assert len(calls) == len(model.decoder.layers)
    model.greedy_decode(padded_source(), 8, use_cache=False)  # the check can fail: uncached, once per step
    assert len(calls) > 3 * len(model.decoder.layers)


# --- sliding windows ---


def test_a_window_as_long_as_the_sequence_is_the_causal_model():
    idx = torch.randint(0, 13, (2, 12), generator=torch.Generator().manual_seed(7))
    full = gpt()
    for window in (12, 50):
        windowed = gpt(window=window)
        assert torch.equal(windowed(idx)[0], full(idx)[0])
        assert torch.equal(windowed(idx, need_weights=True)[0], full(idx, need_weights=True)[0])


@pytest.mark.parametrize(("n_layers", "window"), [(1, 2), (2, 3), (3, 2), (2, 4)])
def test_information_travels_at_most_layers_times_window_minus_one(n_layers, window):
    torch.manual_seed(0)
    decoder = tl.Decoder(16, 2, n_layers, cross_attention=False, norm_first=True, window=window).double()
    T = 14
    x = torch.randn(1, T, 16, dtype=torch.float64, requires_grad=True)
    reach = n_layers * (window - 1)
    direction = torch.randn(16, dtype=torch.float64)
    for t in (T - 1, 9, 5):
        # a random direction: the sum of a LayerNorm's output is constant, its gradient zero
        (grad,) = torch.autograd.grad(decoder(x)[0, t] @ direction, x)
        moved = grad[0].abs().sum(-1) > 0  # (T,): the inputs position t depends on
        assert not moved[t + 1 :].any(), "saw the future"
        assert not moved[: max(0, t - reach)].any(), f"saw further back than {reach}"
        assert moved[max(0, t - reach) : t + 1].all(), "every position within reach matters"


def test_gpt_window_reaches_no_further_than_its_layers_allow():
    model = gpt(window=2, n_layers=2)  # position t sees t-2 .. t through two layers
    idx = torch.randint(0, 13, (1, 12), generator=torch.Generator().manual_seed(8))
    base = model(idx)[0]
    changed = idx.clone()
    changed[0, 0] = (idx[0, 0] + 1) % 13
    out = model(changed)[0]
    assert torch.equal(out[0, 3:], base[0, 3:]) and not torch.equal(out[0, :3], base[0, :3])
    assert math.isfinite(float(out.detach().abs().sum()))
