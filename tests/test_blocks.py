"""Tests for transformer_lib/blocks.py: causality of the decoder, padding invariance of the
encoder and of cross-attention, post-LN vs pre-LN wiring."""

import pytest
import torch

import transformer_lib as tl


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_is_causal(gen, norm_first):
    torch.manual_seed(0)
    dec = tl.Decoder(2, 16, 4, dropout=0.0, norm_first=norm_first).double().eval()
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
    enc = tl.Encoder(2, 16, 4, norm_first=norm_first).double().eval()
    x = torch.randn(1, 5, 16, generator=gen, dtype=torch.float64)
    ref = enc(x)
    padded = torch.cat([x, torch.randn(1, 3, 16, generator=gen, dtype=torch.float64)], dim=1)
    keep = tl.padding_mask(torch.tensor([5]), 8)
    out = enc(padded, mask=keep[:, None, None, :])
    torch.testing.assert_close(out[:, :5], ref)


def test_cross_attention_ignores_padded_memory(gen):
    torch.manual_seed(0)
    dec = tl.Decoder(2, 16, 4).double().eval()
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
    dec = tl.Decoder(2, 8, 2).eval()
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
