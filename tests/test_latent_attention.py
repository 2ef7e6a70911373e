"""Chapter "Latent, sparse and sink attention"'s multi-head latent attention as properties: it computes what
transformers' DeepseekV3Attention computes on the same random weights, caches only a latent and a rotary key per
token, decodes from that cache as it computes without, and its folded path is the same function."""

import pytest
import torch
from _float64_patches import float64_rms_norm_and_rotary

from transformer_lib.blocks import DecoderLayer
from transformer_lib.inspect_heads import capture_attention
from transformer_lib.kv_cache import KVCache
from transformer_lib.latent_attention import LatentAttention, LatentCache
from transformer_lib.multihead import MultiHeadAttention
from transformer_lib.parts import part_weights
from transformer_lib.pretrained_latent import latent_from_deepseek

transformers = pytest.importorskip("transformers")
from transformers.cache_utils import DynamicCache  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds  # noqa: E402

F64 = torch.float64
TIGHT = dict(atol=1e-12, rtol=0)
FLOAT32_SIZED = dict(atol=1e-5, rtol=0)  # transformers' float32 norms and angles: up to about 1e-6 here


def _deepseek(q_lora=None, bias=False, interleave=True, seed=0):
    """A DeepseekV3Attention on random weights, float64; v_head_dim (6) differs from the nope width (8)."""
    torch.manual_seed(seed)
    config = transformers.DeepseekV3Config(
        hidden_size=48, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=q_lora,
        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, attention_bias=bias, rope_interleave=interleave,
        num_hidden_layers=1, vocab_size=10, max_position_embeddings=64, attn_implementation="sdpa",
    )  # fmt: skip
    attn = ds.DeepseekV3Attention(config, layer_idx=0).double().eval()
    with torch.no_grad():  # norms' gains away from 1, so that a gain read into the wrong place shows
        for name, p in attn.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "layernorm" in name else 0.3 * torch.randn_like(p))
    return attn


def _theirs(attn, x, start=0, cache=None):
    """transformers' output for ``x (B, T, d)`` at positions ``start ..``, with an additive causal mask."""
    T = x.shape[1]
    rotary = ds.DeepseekV3RotaryEmbedding(attn.config)
    position_embeddings = rotary(x, torch.arange(start, start + T)[None])
    allowed = torch.ones(T, start + T, dtype=torch.bool).tril(start)
    mask = torch.zeros(T, start + T, dtype=F64).masked_fill(~allowed, torch.finfo(F64).min)[None, None]
    return attn(x, position_embeddings, mask, cache=cache)[0]


@pytest.fixture
def deepseek_in_float64(monkeypatch):
    """transformers computes its RMSNorm and its rotary angles in float32 even for float64 weights:
    the same functions in float64, for a comparison at 1e-12."""
    float64_rms_norm_and_rotary(monkeypatch, ds.DeepseekV3RMSNorm, ds.DeepseekV3RotaryEmbedding)


def _layer(q_latent=None, bias=True, seed=0, **kw):
    torch.manual_seed(seed)
    layer = LatentAttention(32, 4, kv_latent=12, q_latent=q_latent, rope_dim=4, nope_dim=6, v_dim=5, bias=bias, **kw)
    layer = layer.double().eval()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return layer


def _x(B=2, T=7, d=32, seed=1):
    return torch.randn(B, T, d, dtype=F64, generator=torch.Generator().manual_seed(seed))


def _decode(layer, x, steps, *, window=None, folded=False):
    """``layer`` run over ``x`` in chunks of the sizes ``steps``, through one cache; the outputs joined."""
    cache, outs = layer.new_cache(window), []
    for chunk in x.split(steps, dim=1):
        outs.append(layer(chunk, chunk, chunk, is_causal=True, window=window, cache=cache, folded=folded)[0])
    return torch.cat(outs, dim=1), cache


@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("q_lora", [None, 24])
def test_outputs_equal_deepseek_v3_attention(q_lora, bias, interleave, monkeypatch, deepseek_in_float64):
    attn = _deepseek(q_lora, bias, interleave)
    ours = latent_from_deepseek(attn, interleaved=interleave)
    assert (ours.q_latent, ours.kv_latent, ours.nope_dim, ours.rope_dim, ours.v_dim) == (q_lora, 16, 8, 4, 6)
    x = _x(d=48)
    with torch.no_grad():
        expected = _theirs(attn, x)
        torch.testing.assert_close(ours(x, x, x, is_causal=True)[0], expected, **TIGHT)
        torch.testing.assert_close(ours(x, x, x, is_causal=True, folded=True)[0], expected, **TIGHT)
        monkeypatch.undo()  # transformers as it is: its float32 steps show at about 1e-7
        torch.testing.assert_close(ours(x, x, x, is_causal=True)[0], _theirs(attn, x), **FLOAT32_SIZED)


@pytest.mark.parametrize("interleave", [True, False])
def test_the_cache_holds_what_transformers_caches(interleave, deepseek_in_float64):
    attn = _deepseek(24, True, interleave)
    ours = latent_from_deepseek(attn, interleaved=interleave)
    x = _x(T=8, d=48)
    theirs_cache, expected = DynamicCache(config=attn.config), []
    with torch.no_grad():
        for start, stop in ((0, 5), (5, 6), (6, 8)):  # a prefill, then tokens
            expected.append(_theirs(attn, x[:, start:stop], start, theirs_cache))
        got, cache = _decode(ours, x, [5, 1, 2], folded=True)
    torch.testing.assert_close(got, torch.cat(expected, 1), **TIGHT)
    latent, k_rot = theirs_cache.layers[0].keys, theirs_cache.layers[0].values  # (B, 1, T, 16), (B, 1, T, 4)
    assert latent.shape == (2, 1, *cache.c.shape[1:]) and k_rot.shape == (2, 1, *cache.k_rope.shape[1:])
    torch.testing.assert_close(cache.c, latent[:, 0], **TIGHT)  # the normalised latent itself
    # their rotary key comes out in half-split order (theirs[i], theirs[i + 2] are a pair): ours in pairs
    torch.testing.assert_close(cache.k_rope, k_rot[:, 0, :, [0, 2, 1, 3]], **TIGHT)


def test_half_split_weights_copied_as_interleaved_give_other_outputs(deepseek_in_float64):
    # the mistake of reading half-split rotary rows as the book's pairs: it loads, and computes another function
    attn = _deepseek(interleave=False)
    x = _x(d=48)
    with torch.no_grad():
        expected = _theirs(attn, x)
        right = latent_from_deepseek(attn, interleaved=False)(x, x, x, is_causal=True)[0]
        wrong = latent_from_deepseek(attn, interleaved=True)(x, x, x, is_causal=True)[0]
    torch.testing.assert_close(right, expected, **TIGHT)
    torch.testing.assert_close(wrong[:, 0], expected[:, 0], **TIGHT)  # position 0: no rotation, no difference
    assert (wrong[:, 1:] - expected[:, 1:]).abs().amax(dim=-1).min() > 1e-4  # every later position differs


@pytest.mark.parametrize("folded", [False, True])
@pytest.mark.parametrize("q_latent", [None, 10])
@pytest.mark.parametrize("steps", [[1] * 7, [4, 1, 2], [7]])
def test_cached_decoding_equals_the_uncached_forward(steps, q_latent, folded):
    layer, x = _layer(q_latent), _x()
    with torch.no_grad():
        expected = layer(x, x, x, is_causal=True)[0]
        got, cache = _decode(layer, x, steps, folded=folded)
    torch.testing.assert_close(got, expected, **TIGHT)
    assert (cache.position, cache.length) == (7, 7)


@pytest.mark.parametrize("window", [1, 3, 5])
@pytest.mark.parametrize("folded", [False, True])
def test_a_windowed_cache_equals_the_uncached_window(window, folded):
    layer, x = _layer(10), _x(T=9)
    with torch.no_grad():
        expected = layer(x, x, x, is_causal=True, window=window)[0]
        got, cache = _decode(layer, x, [3, 1, 2, 1, 2], window=window, folded=folded)
    torch.testing.assert_close(got, expected, **TIGHT)
    assert (cache.position, cache.length) == (9, window - 1)  # bounded: only what the next token can see
    assert not torch.allclose(expected, layer(x, x, x, is_causal=True)[0])  # the window does hide keys


def _mask(B=2, T=7, seed=2):
    mask = torch.rand(B, 1, T, T, generator=torch.Generator().manual_seed(seed)) > 0.4
    mask[0, 0, 3] = False  # a query with no key at all: zeros, never NaN
    return mask


@pytest.mark.parametrize("is_causal, window", [(False, None), (True, None), (True, 3)])
def test_folded_equals_unfolded_with_masks_windows_and_weights(is_causal, window):
    layer, x, mask = _layer(10), _x(), _mask()
    kw = dict(mask=mask, is_causal=is_causal, window=window)
    with torch.no_grad():
        out, weights = layer(x, x, x, need_weights=True, **kw)
        for folded in (False, True):
            for need in (False, True):
                got, got_weights = layer(x, x, x, need_weights=need, folded=folded, **kw)
                torch.testing.assert_close(got, out, **TIGHT)
                if need:
                    torch.testing.assert_close(got_weights, weights, **TIGHT)
    assert torch.equal(out[0, 3], layer.out_proj.bias.expand(32))  # a fully masked query: zero heads


def test_weights_by_hand_equal_the_fused_path_and_the_inspection_tools():
    layer, x, mask = _layer(), _x(), _mask()
    with torch.no_grad():
        fused, none = layer(x, x, x, mask=mask, is_causal=True)
        by_hand, weights = layer(x, x, x, mask=mask, is_causal=True, need_weights=True)
        with capture_attention(layer) as captured:
            layer(x, x, x, mask=mask, is_causal=True)
    assert none is None and weights.shape == (2, 4, 7, 7)
    torch.testing.assert_close(by_hand, fused, **TIGHT)
    has_key = (mask & torch.ones(7, 7, dtype=torch.bool).tril()).any(-1)  # (B, 1, T_q)
    torch.testing.assert_close(weights.sum(-1), has_key.double().expand(2, 4, 7), **TIGHT)  # 1, or 0: no key
    assert torch.equal(weights.triu(1), torch.zeros_like(weights))  # causal: nothing from the future
    assert torch.equal(layer.attention_weights(x, x, x, mask=mask, is_causal=True), weights)
    assert torch.equal(captured[""], weights)


def test_gradients_reach_every_parameter_and_the_folded_path_has_the_same():
    layer, x = _layer(10, bias=True), _x()
    grads = []
    for folded in (False, True):
        layer.zero_grad()
        out, _ = layer(x, x, x, is_causal=True, folded=folded)
        (out**2).sum().backward()
        grads.append({n: p.grad.clone() for n, p in layer.named_parameters()})
    for name, grad in grads[0].items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(grads[1][name], grad, atol=1e-11, rtol=0)
    assert len(grads[0]) == 10  # q_down (weight, bias), q_norm, q_up, kv_down (2), kv_norm, kv_up, out_proj (2)


def test_gradients_flow_through_a_cache_too():
    layer, x = _layer(), _x(T=5)
    expected = torch.autograd.grad(layer(x, x, x, is_causal=True)[0].sum(), layer.kv_up.weight)[0]
    got = torch.autograd.grad(_decode(layer, x, [2, 1, 2])[0].sum(), layer.kv_up.weight)[0]
    torch.testing.assert_close(got, expected, **TIGHT)


def test_the_cache_holds_kv_latent_plus_rope_dim_numbers_per_token():
    layer, x = _layer(), _x(B=3, T=6)
    assert layer.cache_elements_per_token() == 12 + 4
    with torch.no_grad():
        _, cache = _decode(layer, x, [2, 1, 1, 1, 1])
        kv = KVCache()
        MultiHeadAttention(32, 4).double()(x, x, x, is_causal=True, cache=kv)
    assert cache.nbytes() == 3 * 6 * (12 + 4) * 8
    assert kv.nbytes() == 3 * 6 * (2 * 4 * 8) * 8  # multi-head attention: a key and a value per head
    assert cache.capacity >= cache.length == 6 and cache.capacity <= 2 * cache.length  # amortised growth


def test_the_latent_cache_keeps_its_accounts():
    c, k = torch.randn(2, 3, 5, dtype=F64), torch.randn(2, 3, 2, dtype=F64)
    cache = LatentCache(window=3)
    assert not cache.filled and cache.nbytes() == 0 and (cache.length, cache.position) == (0, 0)
    all_c, all_k = cache.append(c, k)
    assert torch.equal(all_c, c) and torch.equal(all_k, k)
    all_c, _ = cache.append(c[:, :1], k[:, :1])
    assert torch.equal(all_c, torch.cat([c[:, 1:], c[:, :1]], 1))  # the two kept, then the new one
    assert (cache.length, cache.position) == (2, 4) and torch.equal(cache.c, all_c[:, 1:])
    assert repr(cache) == "LatentCache(shapes=((2, 2, 5), (2, 2, 2)), position=4, window=3)"
    with pytest.raises(ValueError, match="start a new cache"):
        cache.append(c[:1], k[:1])  # another batch
    cache.reset()
    assert not cache.filled and cache.position == 0


def test_defaults_parts_and_a_decoder_layer():
    layer = LatentAttention(32, 4, kv_latent=8)
    assert (layer.nope_dim, layer.v_dim, layer.rope_dim, layer.q_latent) == (8, 8, 4, None)
    assert layer.scale == 1 / 12**0.5 and layer.folded is False
    assert part_weights(layer, "attention") == ["q_proj.weight", "kv_down.weight", "kv_up.weight", "out_proj.weight"]
    assert len(part_weights(_layer(10), "attention")) == 5  # q_down and q_up instead of q_proj
    torch.manual_seed(0)
    block = DecoderLayer(32, 4, cross_attention=False, window=4).double().eval()
    block.self_attn = _layer()
    x = _x(T=6)
    with torch.no_grad():
        expected, cache = block(x), block.new_cache()
        assert isinstance(cache.self_attn, LatentCache) and cache.self_attn.window == 4
        got = torch.cat([block(x[:, i : i + 1], cache=cache) for i in range(6)], 1)
    torch.testing.assert_close(got, expected, **TIGHT)


BAD_SETTINGS = [
    (dict(kv_latent=0), ValueError, "kv_latent must be positive"),
    (dict(kv_latent=None), TypeError, "kv_latent must be an int"),
    (dict(kv_latent=8, q_latent=2.0), TypeError, "q_latent must be an int"),
    (dict(kv_latent=8, rope_dim=3), ValueError, "rope_dim must be even"),
    (dict(kv_latent=8, rope_dim=True), TypeError, "rope_dim must be an int"),
    (dict(kv_latent=8, dropout=1.0), ValueError, "dropout"),
    (dict(kv_latent=8, bias="no"), TypeError, "bias must be True or False"),
    (dict(kv_latent=8, eps=0), ValueError, "eps"),
    (dict(kv_latent=8, rotary_base=-1.0), ValueError, "rotary_base"),
]


@pytest.mark.parametrize("settings, error, message", BAD_SETTINGS)
def test_bad_settings_are_refused_by_name(settings, error, message):
    with pytest.raises(error, match=message):
        LatentAttention(32, 4, **settings)


def test_widths_without_a_divisible_d_model():
    with pytest.raises(ValueError, match=r"d_model \(30\) is not divisible by n_heads \(4\)"):
        LatentAttention(30, 4, kv_latent=8)
    layer = LatentAttention(30, 4, kv_latent=8, rope_dim=2, nope_dim=3, v_dim=5).double()
    x = _x(d=30)
    assert layer(x, x, x, is_causal=True)[0].shape == (2, 7, 30)


def test_bad_calls_are_refused_by_name():
    layer, x = _layer(), _x()
    xf, narrow = x.float(), x[..., :8]
    bad = [
        (lambda: layer(x, x.clone(), x), ValueError, "self-attention only"),
        (lambda: layer(xf, xf, xf), TypeError, "float32 but the layer's weights are torch.float64"),
        (lambda: layer(narrow, narrow, narrow), ValueError, r"shape \(B, T, d_model=32\)"),
        (lambda: layer(x, x, x, window=2), ValueError, "pass is_causal=True"),
        (lambda: layer(x, x, x, is_causal=True, window=0), ValueError, "window must be positive"),
        (lambda: layer(x, x, x, mask=torch.ones(7, 7)), TypeError, "torch.bool"),
        (lambda: layer(x, x, x, mask=torch.ones(7, 6, dtype=torch.bool)), ValueError, "does not broadcast"),
        (lambda: layer(x, x, x, cache=object()), TypeError, "cache must be a LatentCache"),
        (lambda: layer(x, x, x, folded="yes"), TypeError, "folded must be True or False"),
        (lambda: layer(x, x, x, is_causal=True, window=5, cache=LatentCache(window=3)), ValueError, "window of 3"),
        (lambda: LatentCache(window=0), ValueError, "window must be positive"),
        (lambda: LatentCache().append(x, x[0]), ValueError, "k_rope must have shape"),
        (lambda: latent_from_deepseek(layer), TypeError, "DeepseekV3Attention"),
        (lambda: latent_from_deepseek(_deepseek(), interleaved=1), TypeError, "interleaved must be True or False"),
    ]
    for call, error, message in bad:
        with pytest.raises(error, match=message):
            call()
    cache = layer.new_cache()
    layer(x, x, x, is_causal=True, cache=cache)
    one = x[:1]
    with pytest.raises(ValueError, match="start a new cache"):
        layer(one, one, one, is_causal=True, cache=cache)  # another batch


@pytest.mark.parametrize("kind", ["latent", "gated_delta"])
def test_an_empty_sequence_gives_an_empty_output_and_leaves_the_cache_as_it_was(kind):
    # multi-head attention maps (B, 0, d) to (B, 0, d); so do the layers of chapters "Latent, sparse and sink attention"
    # and "Attention as a recurrence", with or without a cache, and decoding after an empty step equals decoding without
    # one
    from transformer_lib.delta_net import GatedDeltaNet

    torch.manual_seed(0)
    layer = (LatentAttention(16, 2, kv_latent=8) if kind == "latent" else GatedDeltaNet(16, 2)).double().eval()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    first, empty, rest = x[:, :3], x[:, :0], x[:, 3:]
    out, weights = layer(empty, empty, empty, is_causal=True, need_weights=True)
    assert out.shape == (2, 0, 16) and weights.shape == (2, 2, 0, 0)
    with torch.no_grad():
        with_empty, without = layer.new_cache(), layer.new_cache()
        layer(first, first, first, is_causal=True, cache=with_empty)
        assert layer(empty, empty, empty, is_causal=True, cache=with_empty)[0].shape == (2, 0, 16)
        after_empty = layer(rest, rest, rest, is_causal=True, cache=with_empty)[0]
        layer(first, first, first, is_causal=True, cache=without)
        torch.testing.assert_close(
            after_empty, layer(rest, rest, rest, is_causal=True, cache=without)[0], rtol=0, atol=0
        )


def test_the_default_rotary_width_is_the_even_part_of_half_a_head_and_a_head_too_narrow_is_named():
    assert [LatentAttention(2 * d_k, 2, kv_latent=8).rope_dim for d_k in (4, 6, 8, 12)] == [2, 2, 4, 6]
    with pytest.raises(ValueError, match="whose width d_model / n_heads is 2: give wider heads or a rope_dim"):
        LatentAttention(16, 8, kv_latent=8)
    with pytest.raises(ValueError, match=r"got 3$"):  # given, not defaulted: no word about the default
        LatentAttention(16, 2, kv_latent=8, rope_dim=3)
