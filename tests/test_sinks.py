"""Tests of attention sinks (chapter "Latent, sparse and sink attention"): the sink logit in the online softmax, in
tiled attention (forward and hand-written backward) and in :class:`SinkAttention`; the first keys kept by the
sliding-window mask and the key-value cache (StreamingLLM: :func:`keep_first_mask`, :class:`KeepFirstKVCache`);
parity with gpt-oss's attention in ``transformers``; the sink mass of a model's heads."""

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import GptOssConfig
from transformers.models.gpt_oss import modeling_gpt_oss

import transformer_lib as tl
from transformer_lib.attention import masked_softmax
from transformer_lib.blocks import DecoderLayer
from transformer_lib.inspect_heads import capture_attention
from transformer_lib.kv_cache import KVCache
from transformer_lib.long_context import online_softmax, tiled_attention
from transformer_lib.masks import sliding_window_mask
from transformer_lib.models import GPT, GPTConfig
from transformer_lib.modern_block import QKTransform
from transformer_lib.multihead import MultiHeadAttention
from transformer_lib.sinks import KeepFirstKVCache, SinkAttention, attention_sink_mass, keep_first_mask, sink_softmax

pytestmark = pytest.mark.usefixtures("one_thread")
TIGHT = dict(rtol=1e-12, atol=1e-13)


def with_sink_column(scores, sink):
    """The plain formula: softmax over ``scores (..., T_k)`` and one more column holding ``sink``
    (broadcast to ``scores.shape[:-1]``), that column dropped."""
    column = sink.expand(scores.shape[:-1]).unsqueeze(-1)  # (..., 1)
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]


def reference_attention(q, k, v, sink, is_causal):
    """Attention written out with the sink column: ``q (B, h, T_q, d)``, ``sink (h,)`` -> ``(B, h, T_q, d_v)``."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, h, T_q, T_k)
    if is_causal:
        scores = scores.masked_fill(~torch.ones(scores.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    return with_sink_column(scores, sink[:, None]) @ v


def random_qkv(B, h, T_q, T_k, d=6, seed=0):
    torch.manual_seed(seed)
    q, k, v = torch.randn(B, h, T_q, d), torch.randn(B, h, T_k, d), torch.randn(B, h, T_k, d + 1)
    sink = torch.randn(h) * 2
    return [t.double().requires_grad_() for t in (q, k, v, sink)]


# ---------------------------------------------------------------- the online softmax with a sink


@pytest.mark.parametrize("block_size", [1, 3, 5, 64])
@pytest.mark.parametrize("sink_shape", [(3, 4), (4,), ()])
def test_online_softmax_with_a_sink_is_the_softmax_with_one_more_column(block_size, sink_shape):
    torch.manual_seed(0)
    x = torch.randn(3, 4, 13, dtype=torch.float64) * 5
    sink = torch.randn(sink_shape, dtype=torch.float64) * 5
    weights = online_softmax(x, block_size, sink=sink)
    torch.testing.assert_close(weights, with_sink_column(x, sink), **TIGHT)
    assert (weights.sum(-1) < 1).all()  # the sink takes its share


def test_online_softmax_sink_edge_cases():
    torch.manual_seed(1)
    x = torch.randn(2, 9, dtype=torch.float64)
    minus_inf = torch.tensor(-math.inf, dtype=torch.float64)
    torch.testing.assert_close(online_softmax(x, 4, sink=minus_inf), torch.softmax(x, -1), **TIGHT)
    x[0] = -math.inf  # a row with every key masked: zeros, not NaN, since the sink is there
    weights = online_softmax(x, 4, sink=torch.tensor([0.5, 0.5], dtype=torch.float64))
    assert torch.equal(weights[0], torch.zeros(9, dtype=torch.float64))
    assert torch.isfinite(weights).all()
    with pytest.raises(ValueError, match="sink must broadcast"):
        online_softmax(x, 4, sink=torch.zeros(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="sink"):
        online_softmax(x, 4, sink=torch.zeros(2, dtype=torch.float32))


def naive_sink_softmax(x, block_size, sink):
    """The mistake: the online softmax of the row, then ``exp(sink)`` added to its sum as it is,
    without the shift by the running max that every other term had."""
    m = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype)
    l = torch.zeros(x.shape[:-1], dtype=x.dtype)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start : start + block_size]
        m_new = torch.maximum(m, block.amax(-1))
        l = l * torch.exp(m - m_new) + torch.exp(block - m_new[..., None]).sum(-1)
        m = m_new
    return torch.exp(x - m[..., None]) / (l + torch.exp(sink))[..., None]


def test_adding_exp_of_the_sink_without_the_running_max_is_wrong_and_overflows():
    torch.manual_seed(2)
    x = torch.randn(4, 10, dtype=torch.float64) * 3
    sink = torch.full((4,), 1.5, dtype=torch.float64)
    right = online_softmax(x, 3, sink=sink)
    torch.testing.assert_close(right, with_sink_column(x, sink), **TIGHT)
    # the sum was kept relative to the row's max, exp(sink) is not: wrong for every row whose max is not 0
    assert (naive_sink_softmax(x, 3, sink) - right).abs().max() > 1e-3
    # large logits: exp(sink) overflows to inf and the naive weights collapse to 0; started at the sink, finite
    big, big_sink = x + 1000.0, sink + 1000.0
    assert torch.isinf(torch.exp(big_sink)).all()
    assert torch.equal(naive_sink_softmax(big, 3, big_sink), torch.zeros_like(big))
    right_big = online_softmax(big, 3, sink=big_sink)
    assert (right_big.sum(-1) > 0.5).all()
    torch.testing.assert_close(right_big, right, rtol=1e-10, atol=1e-12)  # a shift of every logit changes nothing


# ---------------------------------------------------------------- tiled attention with a sink


CASES = [  # B, h, T_q, T_k, block_size, is_causal
    (1, 2, 11, 11, 4, True),  # T not a multiple of the block
    (2, 3, 13, 13, 5, False),
    (2, 2, 7, 10, 3, False),
    (1, 3, 9, 9, 64, True),  # one block
]


@pytest.mark.parametrize("B, h, T_q, T_k, block_size, is_causal", CASES)
def test_tiled_attention_with_a_sink_equals_the_plain_formula_and_its_gradients(B, h, T_q, T_k, block_size, is_causal):
    q, k, v, sink = random_qkv(B, h, T_q, T_k)
    out = tiled_attention(q, k, v, is_causal=is_causal, block_size=block_size, sink=sink)
    expected = reference_attention(q, k, v, sink, is_causal)
    torch.testing.assert_close(out, expected, **TIGHT)
    grad_out = torch.randn(out.shape, dtype=torch.float64)
    ours = torch.autograd.grad(out, (q, k, v, sink), grad_out)
    theirs = torch.autograd.grad(expected, (q, k, v, sink), grad_out)
    for name, a, b in zip("q k v sink".split(), ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12, msg=f"gradient of {name}")


def test_the_sink_gradient_is_minus_the_sink_weight_times_d():
    q, k, v, sink = random_qkv(2, 3, 8, 8, seed=3)
    out = tiled_attention(q, k, v, is_causal=True, block_size=3, sink=sink)
    grad_out = torch.randn(out.shape, dtype=torch.float64)
    (dsink,) = torch.autograd.grad(out, sink, grad_out)
    with torch.no_grad():  # P_sink(i) = exp(sink) / (exp(sink) + sum_j exp(s_ij)), D_i = dO_i . O_i
        scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(
            ~torch.ones(8, 8, dtype=torch.bool).tril(), -math.inf
        )
        p_sink = 1 - with_sink_column(scores, sink[:, None]).sum(-1)  # (B, h, T_q)
        D = (grad_out * out).sum(-1)  # (B, h, T_q)
    torch.testing.assert_close(dsink, -(p_sink * D).sum(dim=(0, 2)), **TIGHT)


@pytest.mark.parametrize("is_causal, T_k", [(True, 5), (False, 6)])
def test_tiled_attention_with_a_sink_passes_gradcheck(is_causal, T_k):
    q, k, v, sink = random_qkv(1, 2, 5, T_k, d=3, seed=4)
    assert torch.autograd.gradcheck(
        lambda *t: tiled_attention(*t[:3], is_causal=is_causal, block_size=2, sink=t[3]), (q, k, v, sink)
    )


def test_a_sink_of_minus_infinity_is_plain_tiled_attention():
    q, k, v, _ = random_qkv(2, 2, 9, 9, seed=5)
    sink = torch.full((2,), -math.inf, dtype=torch.float64, requires_grad=True)
    out = tiled_attention(q, k, v, is_causal=True, block_size=4, sink=sink)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), **TIGHT)
    (dsink,) = torch.autograd.grad(out.sum(), sink)
    assert torch.equal(dsink, torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"sink must have shape \(h,\)"):
        tiled_attention(q, k, v, sink=torch.zeros(1, dtype=torch.float64))


# ---------------------------------------------------------------- sink_softmax


def test_sink_softmax_is_the_softmax_with_the_sink_column_dropped():
    torch.manual_seed(6)
    scores = torch.randn(2, 3, 5, 7, dtype=torch.float64, requires_grad=True)
    sink = torch.randn(3, dtype=torch.float64, requires_grad=True)
    weights = sink_softmax(scores, sink)
    expected = with_sink_column(scores, sink[:, None])
    torch.testing.assert_close(weights, expected, **TIGHT)
    assert (weights.sum(-1) < 1).all()
    g = torch.randn(weights.shape, dtype=torch.float64)
    ours, theirs = torch.autograd.grad(weights, (scores, sink), g), torch.autograd.grad(expected, (scores, sink), g)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, **TIGHT)


def test_sink_softmax_masked_rows_and_a_sink_of_minus_infinity():
    torch.manual_seed(7)
    scores = torch.randn(2, 4, 6, dtype=torch.float64)
    mask = torch.rand(2, 4, 6) > 0.4
    mask[0, 1] = False  # a query with no key at all
    masked = scores.masked_fill(~mask, -math.inf).requires_grad_()
    weights = sink_softmax(masked, torch.tensor([0.3, -2.0], dtype=torch.float64))
    assert torch.equal(weights[0, 1], torch.zeros(6, dtype=torch.float64))
    assert torch.isfinite(torch.autograd.grad(weights.sum(), masked)[0]).all()
    no_sink = sink_softmax(masked, torch.full((2,), -math.inf, dtype=torch.float64))
    torch.testing.assert_close(no_sink, masked_softmax(scores, mask), **TIGHT)  # the fully masked row: zeros too
    with pytest.raises(ValueError, match=r"sink must have shape \(h,\) = \(2,\)"):
        sink_softmax(scores, torch.zeros(4, dtype=torch.float64))
    with pytest.raises(TypeError, match="scores"):
        sink_softmax(scores.long(), torch.zeros(2))


# ---------------------------------------------------------------- keep_first: the mask and the cache


def explicit_mask(T_q, T_k, window, keep_first):
    """Query i sits at key position p = i + T_k - T_q; it sees key j where j <= p and (p - j < window
    or j < keep_first)."""
    p = torch.arange(T_q)[:, None] + T_k - T_q
    j = torch.arange(T_k)[None, :]
    return (j <= p) & ((p - j < window) | (j < keep_first))


@pytest.mark.parametrize("T_q, T_k", [(9, 9), (3, 11), (1, 7)])
@pytest.mark.parametrize("window, keep_first", [(3, 0), (3, 2), (1, 1), (4, 6), (20, 2)])
def test_sliding_window_mask_keeps_the_first_keys(T_q, T_k, window, keep_first):
    mask = keep_first_mask(T_q, T_k, window, keep_first)
    assert torch.equal(mask, explicit_mask(T_q, T_k, window, keep_first))
    if not keep_first:
        assert torch.equal(mask, sliding_window_mask(T_q, T_k, window))


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_keep_first_must_be_a_non_negative_int(bad, error):
    with pytest.raises(error, match="keep_first"):
        keep_first_mask(4, 4, 2, bad)
    with pytest.raises(error, match="keep_first"):
        KeepFirstKVCache(window=2, keep_first=bad)
    with pytest.raises(error, match="keep_first"):
        SinkAttention(8, 2, keep_first=bad)


@pytest.mark.parametrize("chunks", [[1] * 12, [5, 1, 3, 1, 2]])
def test_a_cache_keeps_the_first_positions_and_the_window(chunks):
    window, keep_first = 4, 2
    cache = KeepFirstKVCache(window=window, keep_first=keep_first)
    seen = 0
    for n in chunks:
        positions = torch.arange(seen, seen + n, dtype=torch.float64).view(1, 1, n, 1)  # each key holds its position
        k, _ = cache.append(positions, -positions)
        held = cache.k.view(-1).tolist()
        assert k.view(-1).tolist()[-n:] == positions.view(-1).tolist()  # the new keys come last
        seen += n
        expected = list(range(seen)) if seen <= keep_first + window - 1 else [0, 1, *range(seen - window + 1, seen)]
        assert held == expected and cache.position == seen
        assert cache.length <= keep_first + window - 1
    assert repr(cache).endswith("window=4, keep_first=2)")


def test_keep_first_needs_a_window_and_a_matching_attention():
    with pytest.raises(ValueError, match="give the cache a window"):
        KeepFirstKVCache(window=None, keep_first=2)
    x = torch.randn(1, 3, 8, dtype=torch.float64)
    plain = MultiHeadAttention(8, 2).double()
    with pytest.raises(ValueError, match="keep_first"):  # it would read the kept keys as recent ones
        plain(x, x, x, is_causal=True, window=2, cache=KeepFirstKVCache(window=2, keep_first=1))
    attn = SinkAttention(8, 2, keep_first=1).double()
    with pytest.raises(ValueError, match="keep_first=1"):
        attn(x, x, x, is_causal=True, window=2, cache=KVCache(window=2))
    assert attn.new_cache(None).keep_first == 0 and attn.new_cache(3).keep_first == 1
    assert type(attn.new_cache(3)) is KeepFirstKVCache and type(attn.new_cache(None)) is KVCache
    assert type(SinkAttention(8, 2).new_cache(3)) is KVCache  # keep_first=0: the plain window's cache


def test_a_cache_that_keeps_the_first_positions_crops_back_to_what_it_held():
    window, keep_first = 4, 2

    def filled(n):
        cache = KeepFirstKVCache(window=window, keep_first=keep_first)
        for p in range(n):
            cache.append(*(torch.full((1, 1, 1, 1), float(p), dtype=torch.float64),) * 2)
        return cache

    cache = filled(8)  # holds 0, 1 and 5, 6, 7
    assert cache.k.view(-1).tolist() == [0, 1, 5, 6, 7]
    cache.crop(2)  # the first two tokens' cache: the kept first positions alone
    assert cache.k.view(-1).tolist() == filled(2).k.view(-1).tolist() == [0, 1] and cache.position == 2
    with pytest.raises(ValueError, match="already dropped position 2"):
        filled(6).crop(5)  # the first 5 tokens' cache held 0 .. 4, and 2 is gone
    assert repr(filled(3)) == "KVCache(shape=(1, 1, 3, 1), position=3, window=4, keep_first=2)"


# ---------------------------------------------------------------- SinkAttention


def sink_attention(keep_first=0, n_kv_heads=2, seed=0, rotary=True):
    torch.manual_seed(seed)
    attn = SinkAttention(16, 4, keep_first=keep_first, n_kv_heads=n_kv_heads).double().eval()
    if rotary:
        attn.qk_transform = QKTransform(4, rotary_base=100.0)
    with torch.no_grad():
        attn.sinks.copy_(torch.randn(4) * 2)
    return attn


@pytest.mark.parametrize("chunks", [[1] * 14, [6, 1, 1, 4, 1, 1]])
@pytest.mark.parametrize("keep_first", [0, 2])
def test_cached_decoding_equals_the_uncached_forward(chunks, keep_first):
    attn, window = sink_attention(keep_first), 4
    x = torch.randn(2, sum(chunks), 16, dtype=torch.float64)
    expected, _ = attn(x, x, x, is_causal=True, window=window)
    cache, outs, start = attn.new_cache(window), [], 0
    for n in chunks:
        step = x[:, start : start + n]
        outs.append(attn(step, step, step, is_causal=True, window=window, cache=cache)[0])
        start += n
    torch.testing.assert_close(torch.cat(outs, dim=1), expected, **TIGHT)
    assert cache.length == min(sum(chunks), keep_first + window - 1)


def test_a_decoder_layer_decodes_with_the_sink_attentions_cache():
    torch.manual_seed(8)
    layer = DecoderLayer(16, 4, 32, cross_attention=False, window=3, n_kv_heads=2, norm_first=True).double().eval()
    layer.self_attn = sink_attention(keep_first=2)
    x = torch.randn(1, 10, 16, dtype=torch.float64)
    expected = layer(x)
    cache = layer.new_cache()
    steps = [layer(x[:, t : t + 1], cache=cache) for t in range(10)]
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, **TIGHT)
    assert cache.self_attn.keep_first == 2 and cache.self_attn.length == 4


def test_keep_first_with_a_window_equals_the_explicit_mask():
    attn = sink_attention(keep_first=3)
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    out, weights = attn(x, x, x, is_causal=True, window=4, need_weights=True)
    mask = explicit_mask(12, 12, 4, 3)
    out_mask, weights_mask = attn(x, x, x, mask=mask, need_weights=True)
    torch.testing.assert_close(out, out_mask, **TIGHT)
    torch.testing.assert_close(weights, weights_mask, **TIGHT)
    assert torch.equal(weights[..., ~mask], torch.zeros_like(weights[..., ~mask]))
    torch.testing.assert_close(attn(x, x, x, is_causal=True, window=4)[0], out, **TIGHT)  # without the weights too


@pytest.mark.parametrize("kwargs", [dict(is_causal=True), dict(is_causal=True, window=3), dict()])
def test_a_sink_of_minus_infinity_is_plain_attention(kwargs):
    attn = sink_attention(seed=9)
    plain = MultiHeadAttention(16, 4, n_kv_heads=2).double().eval()
    plain.load_state_dict({k: v for k, v in attn.state_dict().items() if k != "sinks"})
    plain.qk_transform = attn.qk_transform
    with torch.no_grad():
        attn.sinks.fill_(-math.inf)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    for need_weights in (False, True):
        ours, w_ours = attn(x, x, x, need_weights=need_weights, **kwargs)
        theirs, w_theirs = plain(x, x, x, need_weights=need_weights, **kwargs)
        torch.testing.assert_close(ours, theirs, **TIGHT)
        if need_weights:
            torch.testing.assert_close(w_ours, w_theirs, **TIGHT)
    without = SinkAttention(16, 4, n_kv_heads=2, sinks=False).double().eval()
    without.load_state_dict(plain.state_dict())
    without.qk_transform = attn.qk_transform
    assert without.sinks is None
    torch.testing.assert_close(without(x, x, x, **kwargs)[0], theirs, **TIGHT)


def test_sink_attention_weights_and_gradients():
    attn = sink_attention(keep_first=1, seed=10)
    x = torch.randn(2, 8, 16, dtype=torch.float64, requires_grad=True)
    out, weights = attn(x, x, x, is_causal=True, window=3, need_weights=True)
    assert (weights.sum(-1) < 1).all()  # the sinks took their share
    torch.testing.assert_close(attn.attention_weights(x, x, x, is_causal=True, window=3, _checked=True), weights)
    with capture_attention(attn) as captured:
        attn(x, x, x, is_causal=True, window=3)
    torch.testing.assert_close(captured[""], weights.detach(), **TIGHT)
    out.square().sum().backward()
    assert attn.sinks.grad.abs().min() > 0 and torch.isfinite(x.grad).all()
    mask = torch.ones(2, 1, 8, 8, dtype=torch.bool)
    mask[0, :, 2] = False  # the third query of the first sequence sees no key: zeros
    masked, _ = attn(x, x, x, mask=mask)
    assert torch.equal(masked[0, 2], attn.out_proj.bias)
    with pytest.raises(ValueError, match="cache"):
        attn.attention_weights(x, x, x, cache=KVCache())
    with pytest.raises(TypeError, match="sinks"):
        SinkAttention(16, 4, sinks="yes")


# ---------------------------------------------------------------- parity with gpt-oss's attention


def gpt_oss_pair(layer_type, seed=11):
    """A ``GptOssAttention`` on random weights and the book's :class:`SinkAttention` with them."""
    torch.manual_seed(seed)
    config = GptOssConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, attention_bias=True,
        sliding_window=5, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 500.0}, vocab_size=50, intermediate_size=16,
        num_local_experts=2, num_experts_per_tok=1,
    )  # fmt: skip
    config._attn_implementation = "eager"
    theirs = modeling_gpt_oss.GptOssAttention(config, ["sliding_attention", "full_attention"].index(layer_type))
    theirs = theirs.double().eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn(p.shape) * 0.3)
    ours = SinkAttention(32, 4, n_kv_heads=2).double().eval()
    ours.qk_transform = QKTransform(8, rotary_base=500.0)
    # gpt-oss rotates the half-split pairs (i, i + d/2) of a head, the book the interleaved pairs
    # (2i, 2i + 1), with the same frequency for pair i: the book's row 2i of each head is theirs i,
    # its row 2i + 1 theirs i + d/2. Reordering the rows of W_q and W_k (and of their biases) the same
    # way in every head leaves q . k unchanged; W_v and W_o keep their order.
    d = 8
    order = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], dim=1).reshape(-1)  # 0, 4, 1, 5, ...

    def rows(n_heads):
        return (torch.arange(n_heads)[:, None] * d + order).reshape(-1)  # each head's rows, reordered

    with torch.no_grad():
        ours.q_proj.weight.copy_(theirs.q_proj.weight[rows(4)])
        ours.q_proj.bias.copy_(theirs.q_proj.bias[rows(4)])
        ours.k_proj.weight.copy_(theirs.k_proj.weight[rows(2)])
        ours.k_proj.bias.copy_(theirs.k_proj.bias[rows(2)])
        ours.v_proj.weight.copy_(theirs.v_proj.weight)
        ours.v_proj.bias.copy_(theirs.v_proj.bias)
        ours.out_proj.load_state_dict(theirs.o_proj.state_dict())
        ours.sinks.copy_(theirs.sinks)
    return config, theirs, ours


def gpt_oss_forward(config, theirs, x, window):
    """Their attention on ``x (B, T, d_model)``, with the additive causal (or sliding-window) mask built here."""
    T = x.shape[1]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (j <= i) & ((i - j < window) if window is not None else True)
    additive = torch.zeros(T, T, dtype=x.dtype).masked_fill(~allowed, -math.inf)[None, None]  # (1, 1, T, T)
    rotary = modeling_gpt_oss.GptOssRotaryEmbedding(config).double()
    position_embeddings = rotary(x, torch.arange(T)[None])
    with torch.no_grad():
        return theirs(x, position_embeddings, additive)


@pytest.fixture
def gpt_oss_rotary_in_float64(monkeypatch):
    """transformers computes the rotary angles in float32 even in a float64 model: the same function in float64."""

    def rotary(self, x, position_ids):
        d = self.config.head_dim
        inv_freq = self.config.rope_parameters["rope_theta"] ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)
        angles = position_ids[..., None].double() * inv_freq  # (1, T, d / 2): gpt-oss does not repeat them
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    monkeypatch.setattr(modeling_gpt_oss.GptOssRotaryEmbedding, "forward", rotary)


def compare_with_gpt_oss(layer_type):
    config, theirs, ours = gpt_oss_pair(layer_type)
    window = config.sliding_window if layer_type == "sliding_attention" else None
    assert theirs.sliding_window == window
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    out_theirs, weights_theirs = gpt_oss_forward(config, theirs, x, window)
    with torch.no_grad():
        out_ours, weights_ours = ours(x, x, x, is_causal=True, window=window, need_weights=True)
    assert (weights_ours.sum(-1) < 1).all()
    return (out_ours - out_theirs).abs().max().item(), (weights_ours - weights_theirs).abs().max().item()


@pytest.mark.parametrize("layer_type", ["sliding_attention", "full_attention"])
def test_equal_to_gpt_oss_attention_in_float64(gpt_oss_rotary_in_float64, layer_type):
    out_diff, weights_diff = compare_with_gpt_oss(layer_type)
    assert out_diff < 1e-12 and weights_diff < 1e-12  # about 4e-15 and 1e-15


@pytest.mark.parametrize("layer_type", ["sliding_attention", "full_attention"])
def test_equal_to_gpt_oss_attention_with_its_float32_angles(layer_type):
    out_diff, weights_diff = compare_with_gpt_oss(layer_type)
    assert out_diff < 1e-5 and weights_diff < 1e-5  # about 1e-6 and 1e-7: their rotary angles are float32


# ---------------------------------------------------------------- the sink mass of a model


def sink_gpt(sink_value=None, seed=12):
    torch.manual_seed(seed)
    gpt = GPT(GPTConfig(40, context_len=16, n_layers=2, n_heads=4, d_model=16, positions="rotary")).double()
    for layer in gpt.decoder.layers:
        old = layer.self_attn
        new = SinkAttention(16, 4).double()
        new.load_state_dict({**old.state_dict(), "sinks": new.sinks.detach()})
        new.qk_transform = old.qk_transform
        if sink_value is not None:
            with torch.no_grad():
                new.sinks.fill_(sink_value)
        layer.self_attn = new
    return gpt


def test_attention_sink_mass_reads_the_weights_on_position_zero():
    gpt = sink_gpt(sink_value=0.7).train()
    idx = torch.randint(0, 40, (3, 9), generator=torch.Generator().manual_seed(0))
    mass = attention_sink_mass(gpt, idx)
    assert mass.shape == (2, 4) and gpt.training  # its mode is put back
    gpt.eval()
    gpt(idx, need_weights=True)
    expected = torch.stack([layer.self_attn_weights[:, :, 1:, 0].mean(dim=(0, 2)) for layer in gpt.decoder.layers])
    torch.testing.assert_close(mass, expected, **TIGHT)
    assert (attention_sink_mass(sink_gpt(sink_value=8.0), idx) < mass).all()  # a larger sink takes a share from it
    with pytest.raises(ValueError, match="T >= 2"):
        attention_sink_mass(gpt, idx[:, :1])


@pytest.mark.parametrize("layer_type", ["sliding_attention", "full_attention"])
def test_the_converter_copies_gpt_oss_attention(gpt_oss_rotary_in_float64, layer_type):
    config, theirs, by_hand = gpt_oss_pair(layer_type)
    ours = tl.sink_attention_from_gpt_oss(theirs)
    window = theirs.sliding_window
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    want, _ = gpt_oss_forward(config, theirs, x, window)
    with torch.no_grad():
        got = ours(x, x, x, is_causal=True, window=window)[0]
        assert torch.equal(got, by_hand(x, x, x, is_causal=True, window=window)[0])
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    with pytest.raises(TypeError, match="must be a transformers GptOssAttention, got Linear"):
        tl.sink_attention_from_gpt_oss(torch.nn.Linear(2, 2))


def test_attention_sink_mass_from_a_later_query():
    model = sink_gpt()
    idx = torch.randint(40, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(idx, need_weights=True)
    expected = torch.stack([layer.self_attn_weights[:, :, 4:, 0].mean(dim=(0, 2)) for layer in model.decoder.layers])
    torch.testing.assert_close(tl.attention_sink_mass(model, idx, first_query=4), expected)
    with pytest.raises(ValueError, match="first_query=10"):
        tl.attention_sink_mass(model, idx, first_query=10)
