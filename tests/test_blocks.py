"""Tests for transformer_lib/blocks.py: causality of the decoder, padding invariance of the
encoder and of cross-attention, post-LN vs pre-LN wiring."""

import math

import pytest
import torch

import transformer_lib as tl
from transformer_lib.blocks import layer_grad_norms


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_is_causal(gen, norm_first):
    torch.manual_seed(0)
    dec = tl.Decoder(16, 4, 2, dropout=0.0, norm_first=norm_first).double().eval()
    memory = torch.randn(2, 5, 16, generator=gen, dtype=torch.float64)
    x = torch.randn(2, 7, 16, generator=gen, dtype=torch.float64)
    base = dec(x, memory)
    for t in range(7):
        y = x.clone()
        y[:, t:] = torch.randn(2, 7 - t, 16, generator=gen, dtype=torch.float64)
        assert torch.equal(dec(y, memory)[:, :t], base[:, :t])


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_padding_invariance(gen, norm_first):
    """Appending masked padding leaves the outputs at the real positions unchanged."""
    torch.manual_seed(0)
    enc = tl.Encoder(16, 4, 2, norm_first=norm_first).double().eval()
    x = torch.randn(1, 5, 16, generator=gen, dtype=torch.float64)
    ref = enc(x)
    padded = torch.cat([x, torch.randn(1, 3, 16, generator=gen, dtype=torch.float64)], dim=1)
    keep = tl.padding_mask(torch.tensor([5]), 8)
    out = enc(padded, mask=keep[:, None, None, :])
    torch.testing.assert_close(out[:, :5], ref)


def test_cross_attention_ignores_padded_memory(gen):
    torch.manual_seed(0)
    dec = tl.Decoder(16, 4, 2).double().eval()
    x = torch.randn(1, 4, 16, generator=gen, dtype=torch.float64)
    memory = torch.randn(1, 5, 16, generator=gen, dtype=torch.float64)
    ref = dec(x, memory)
    padded = torch.cat([memory, 100 * torch.randn(1, 2, 16, generator=gen, dtype=torch.float64)], dim=1)
    keep = tl.padding_mask(torch.tensor([5]), 7)
    torch.testing.assert_close(dec(x, padded, memory_mask=keep[:, None, None, :]), ref)


def test_post_ln_and_pre_ln_wiring(gen):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, generator=gen)
    post = tl.EncoderLayer(8, 2, 16, norm_first=False).eval()
    out = post(x)
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 3), atol=1e-5, rtol=0)  # ends with LayerNorm
    pre = tl.EncoderLayer(8, 2, 16, norm_first=True).eval()
    attn, _ = pre.self_attn(*(pre.res_attn.norm(x),) * 3)
    h = x + attn
    torch.testing.assert_close(pre(x), h + pre.ff(pre.res_ff.norm(h)))


def test_weights_are_kept_when_asked(gen):
    torch.manual_seed(0)
    dec = tl.Decoder(8, 2, 2).eval()
    memory = torch.randn(1, 5, 8, generator=gen)
    dec(torch.randn(1, 3, 8, generator=gen), memory, need_weights=True)
    layer = dec.layers[1]
    assert layer.self_attn_weights.shape == (1, 2, 3, 3)
    assert layer.cross_attn_weights.shape == (1, 2, 3, 5)
    assert (layer.self_attn_weights[0, :, 0, 1:] == 0).all()  # causal
    with pytest.raises(ValueError, match="needs the encoder output"):
        dec(torch.randn(1, 3, 8))
    with pytest.raises(ValueError, match="activation"):
        tl.FeedForward(8, 16, activation="swish")


def test_layer_grad_norms_matches_a_manual_sum(gen):
    enc = tl.Encoder(8, 2, 3, 16)
    x = torch.randn(2, 5, 8, generator=gen)
    enc(x).pow(2).sum().backward()
    norms = layer_grad_norms(enc.layers)
    assert norms.shape == (3,) and norms.dtype == torch.float32
    for layer, norm in zip(enc.layers, norms, strict=True):
        manual = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in layer.parameters()))
        assert math.isclose(float(norm), manual, rel_tol=1e-5)


def test_layer_grad_norms_counts_missing_gradients_as_zero(gen):
    enc = tl.Encoder(8, 2, 2, 16)
    assert torch.equal(layer_grad_norms(enc.layers), torch.zeros(2))  # no backward yet
    x = torch.randn(1, 3, 8, generator=gen)
    enc.layers[1](x).sum().backward()  # only the second layer gets gradients
    norms = layer_grad_norms(enc.layers)
    assert norms[0] == 0 and norms[1] > 0


def test_layer_grad_norms_handles_empty_lists_and_parameterless_layers():
    assert layer_grad_norms([]).shape == (0,)
    assert torch.equal(layer_grad_norms([torch.nn.ReLU(), torch.nn.Identity()]), torch.zeros(2))


def test_layer_grad_norms_is_exported_from_blocks():
    assert "layer_grad_norms" in tl.blocks.__all__
    assert tl.layer_grad_norms is layer_grad_norms


# --- chapter "Generation": grouped-query attention, windows and caches through the blocks ---


def test_the_blocks_pass_n_kv_heads_and_window_on():
    dec = tl.Decoder(16, 4, 2, n_kv_heads=2, window=3)
    for layer in dec.layers:
        assert layer.window == 3 and layer.self_attn.n_kv_heads == layer.cross_attn.n_kv_heads == 2
    enc = tl.Encoder(16, 4, 1, n_kv_heads=1)
    assert enc.layers[0].self_attn.n_kv_heads == 1
    cache = dec.new_cache()
    assert isinstance(cache, tl.DecoderCache) and len(cache) == 2 and cache.position == 0
    assert all(c.self_attn.window == 3 and c.cross_attn.static for c in cache.layers)


def test_the_default_blocks_draw_the_same_weights_as_before():
    # n_kv_heads=None and window=None add no parameter and no random draw
    torch.manual_seed(0)
    a = tl.Decoder(16, 4, 2)
    torch.manual_seed(0)
    b = tl.Decoder(16, 4, 2, n_kv_heads=4, window=None)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert list(a.state_dict()) == list(b.state_dict())


def test_the_decoder_stack_through_a_cache_equals_the_full_stack():
    torch.manual_seed(0)
    dec = tl.Decoder(16, 4, 3, n_kv_heads=2, window=4, norm_first=True).eval()
    x, memory = torch.randn(2, 9, 16), torch.randn(2, 5, 16)
    full = dec(x, memory)
    cache = dec.new_cache()
    parts = [
        dec(x[:, :4], memory, cache=cache),
        dec(x[:, 4:5], memory, cache=cache),
        dec(x[:, 5:], memory, cache=cache),
    ]
    assert cache.position == 9 and cache.nbytes() > cache.nbytes(cross=False) > 0
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)


def test_a_wrong_cache_is_named():
    dec = tl.Decoder(16, 4, 2, cross_attention=False)
    x = torch.randn(1, 3, 16)
    with pytest.raises(ValueError, match="2 layers"):
        dec(x, cache=tl.Decoder(16, 4, 3, cross_attention=False).new_cache())
    with pytest.raises(TypeError, match="LayerCache"):
        dec.layers[0](x, cache=tl.KVCache())
