"""Tests for transformer_lib/positional.py."""

import math

import pytest
import torch

import transformer_lib as tl


@pytest.mark.parametrize("d_model", [1, 6, 7, 64])
def test_sinusoidal_matches_formula(d_model):
    pe = tl.sinusoidal_encoding(50, d_model)
    assert pe.shape == (50, d_model) and pe.dtype == torch.float32
    for pos in (0, 1, 17, 49):
        for dim in range(d_model):
            i = dim // 2
            angle = pos / 10000 ** (2 * i / d_model)
            expected = math.sin(angle) if dim % 2 == 0 else math.cos(angle)
            assert abs(pe[pos, dim].item() - expected) < 1e-6
    assert pe.abs().max() <= 1.0


@pytest.mark.parametrize("module_cls", ["sinusoidal", "learned"])
def test_modules_add_position_and_reject_long_input(module_cls):
    torch.manual_seed(0)
    m = (
        tl.SinusoidalPositionalEncoding(8, max_len=10)
        if module_cls == "sinusoidal"
        else tl.LearnedPositionalEmbedding(10, 8)
    )
    x = torch.zeros(2, 6, 8)
    out = m(x)
    assert out.shape == (2, 6, 8)
    assert torch.equal(out[0], out[1])  # the same position vector for every sequence
    assert not torch.equal(out[0, 0], out[0, 1])  # different vectors for different positions
    with pytest.raises(ValueError, match="longer than the maximum length 10"):
        m(torch.zeros(1, 11, 8))
    with pytest.raises(ValueError, match="d_model=8"):
        m(torch.zeros(1, 3, 5))
