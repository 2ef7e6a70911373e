"""Tests for transformer_lib/positional.py."""

import math

import pytest
import torch

import transformer_lib as tl
from transformer_lib.positional import (
    RotaryEmbedding,
    apply_rotary,
    binary_encoding,
    relative_rotation,
    sinusoidal_frequencies,
)


@pytest.mark.parametrize("d_model", [1, 6, 7, 64])
def test_sinusoidal_matches_formula(d_model):
    pe = tl.sinusoidal_encoding(d_model, 50)
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
        tl.SinusoidalPositionalEncoding(8, context_len=10)
        if module_cls == "sinusoidal"
        else tl.LearnedPositionalEmbedding(8, 10)
    )
    x = torch.zeros(2, 6, 8)
    out = m(x)
    assert out.shape == (2, 6, 8)
    assert torch.equal(out[0], out[1])  # the same position vector for every sequence
    assert not torch.equal(out[0, 0], out[0, 1])  # different vectors for different positions
    with pytest.raises(ValueError, match="longer than the context length context_len=10"):
        m(torch.zeros(1, 11, 8))
    with pytest.raises(ValueError, match="d_model=8"):
        m(torch.zeros(1, 3, 5))


def formula64(positions, d_model, base=10000.0):
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(same), float64, written with math."""
    return torch.tensor(
        [
            [
                (math.sin if dim % 2 == 0 else math.cos)(pos / base ** (2 * (dim // 2) / d_model))
                for dim in range(d_model)
            ]
            for pos in positions
        ],
        dtype=torch.float64,
    )


# --- sinusoidal_encoding (chapter "Positional encoding") -----------------------------------------------------------


@pytest.mark.parametrize("d_model", [1, 2, 3, 8, 9, 32])
def test_sin_on_even_cos_on_odd_against_formula_float64(d_model):
    context_len = 120
    pe = tl.sinusoidal_encoding(d_model, context_len)
    assert pe.shape == (context_len, d_model) and pe.dtype == torch.float32
    ref = formula64(range(context_len), d_model)
    # the library computes in float64 and rounds once to float32: within float32 rounding
    torch.testing.assert_close(pe.double(), ref, atol=1e-7, rtol=0)
    # even dimensions are sines (0 at pos 0), odd ones cosines (1 at pos 0)
    assert torch.equal(pe[0, 0::2], torch.zeros_like(pe[0, 0::2]))
    assert torch.equal(pe[0, 1::2], torch.ones_like(pe[0, 1::2]))


@pytest.mark.parametrize("base", [100.0, 10000.0])
def test_base_argument(base):
    ref = formula64(range(30), 10, base=base)
    torch.testing.assert_close(tl.sinusoidal_encoding(10, 30, base=base).double(), ref, atol=1e-7, rtol=0)


def test_bounded_and_finite_for_long_sequences():
    pe = tl.sinusoidal_encoding(16, 20000)
    assert torch.isfinite(pe).all()
    assert pe.abs().max() <= 1.0
    # every sin/cos pair lies on the unit circle
    torch.testing.assert_close(pe[:, 0::2] ** 2 + pe[:, 1::2] ** 2, torch.ones(20000, 8))


@pytest.mark.parametrize("d_model", [1, 5, 7, 33])
def test_odd_d_model_last_dimension_is_a_lone_sine(d_model):
    pe = tl.sinusoidal_encoding(d_model, 40)
    last = (d_model - 1) // 2
    angles = torch.arange(40, dtype=torch.float64) / 10000 ** (2 * last / d_model)
    torch.testing.assert_close(pe[:, -1].double(), torch.sin(angles), atol=1e-7, rtol=0)


def test_bad_sizes_raise():
    for args in ((0, 4), (4, 0), (-1, 4)):
        with pytest.raises(ValueError, match="must be positive"):
            tl.sinusoidal_encoding(*args)


@pytest.mark.parametrize("module", ["sinusoidal", "learned"])
def test_modules_clear_error_past_context_len(module):
    m = (
        tl.SinusoidalPositionalEncoding(6, context_len=12)
        if module == "sinusoidal"
        else tl.LearnedPositionalEmbedding(6, 12)
    )
    assert m(torch.zeros(2, 12, 6)).shape == (2, 12, 6)  # exactly context_len is fine
    with pytest.raises(ValueError, match=r"sequence length 13 is longer than the context length context_len=12"):
        m(torch.zeros(2, 13, 6))


def test_sinusoidal_module_adds_the_table_and_has_no_parameters():
    m = tl.SinusoidalPositionalEncoding(10, context_len=50)
    x = torch.randn(3, 7, 10, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(m(x), x + tl.sinusoidal_encoding(10, 7))
    assert sum(p.numel() for p in m.parameters()) == 0


# --- binary_encoding ---------------------------------------------------------------------------


def test_binary_encoding_reads_back_the_position():
    b = binary_encoding(6, 64)
    assert b.shape == (64, 6) and b.dtype == torch.float32
    assert set(b.unique().tolist()) == {0.0, 1.0}
    weights = 2.0 ** torch.arange(6)
    assert torch.equal(b @ weights, torch.arange(64, dtype=torch.float32))
    # bit 0 flips at every step, bit j has period 2^(j+1)
    assert torch.equal(b[1:, 0] != b[:-1, 0], torch.ones(63, dtype=torch.bool))
    for j in range(6):
        assert torch.equal(b[: 64 - 2 ** (j + 1), j], b[2 ** (j + 1) :, j])


def test_binary_encoding_wraps_and_validates():
    b = binary_encoding(3, 10)
    assert torch.equal(b[8], b[0]) and torch.equal(b[9], b[1])
    with pytest.raises(ValueError, match="must be positive"):
        binary_encoding(0, 4)


# --- sinusoidal_frequencies and relative_rotation ----------------------------------------------


def test_frequencies_are_geometric():
    w = sinusoidal_frequencies(16)
    assert w.dtype == torch.float64 and w.shape == (8,)
    assert w[0] == 1.0
    torch.testing.assert_close(w[1:] / w[:-1], torch.full((7,), 10000 ** (-2 / 16), dtype=torch.float64))
    assert sinusoidal_frequencies(7).shape == (4,)


@pytest.mark.parametrize("d_model", [2, 8, 64])
@pytest.mark.parametrize("k", [0, 1, 5, -3, 250])
def test_rotation_maps_pe_pos_to_pe_pos_plus_k_for_every_pos(d_model, k):
    positions = list(range(300, 700))
    pe = formula64(positions, d_model)
    shifted = formula64([p + k for p in positions], d_model)
    M = relative_rotation(k, d_model)
    assert M.shape == (d_model, d_model) and M.dtype == torch.float64
    torch.testing.assert_close(pe @ M.T, shifted, atol=1e-11, rtol=0)


def test_rotation_is_orthogonal_block_diagonal_and_a_group():
    M3, M4, M7 = (relative_rotation(k, 12) for k in (3, 4, 7))
    torch.testing.assert_close(M3 @ M3.T, torch.eye(12, dtype=torch.float64))
    torch.testing.assert_close(M3 @ M4, M7)
    torch.testing.assert_close(relative_rotation(-3, 12), M3.T)
    torch.testing.assert_close(relative_rotation(0, 12), torch.eye(12, dtype=torch.float64))
    mask = torch.block_diag(*[torch.ones(2, 2)] * 6).bool()
    assert (M7[~mask] == 0).all()


def test_rotation_with_library_table_is_within_float32_precision():
    pe = tl.sinusoidal_encoding(32, 200).double()
    torch.testing.assert_close(pe[:-9] @ relative_rotation(9, 32).T, pe[9:], atol=1e-6, rtol=0)


@pytest.mark.parametrize("d_model", [1, 7])
def test_rotation_rejects_odd_d_model(d_model):
    with pytest.raises(ValueError, match="even d_model"):
        relative_rotation(1, d_model)


# --- rotary embeddings ------------------------------------------------------------------------


def rotary_by_complex_numbers(x, positions):
    """RoPE written independently: pairs as complex numbers times exp(i * pos * omega)."""
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2).contiguous())  # (..., T, d/2)
    angles = positions.double()[:, None] * sinusoidal_frequencies(x.shape[-1])
    return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def test_rotary_matches_complex_multiplication(gen):
    x = torch.randn(2, 3, 9, 8, generator=gen, dtype=torch.float64)
    positions = torch.tensor([0, 1, 2, 5, 7, 11, 100, 1000, 4])
    torch.testing.assert_close(apply_rotary(x, positions), rotary_by_complex_numbers(x, positions))
    torch.testing.assert_close(apply_rotary(x), rotary_by_complex_numbers(x, torch.arange(9)))


def test_rotary_score_depends_only_on_offset(gen):
    d, T = 16, 30
    q = torch.randn(d, generator=gen, dtype=torch.float64).expand(T, d)
    k = torch.randn(d, generator=gen, dtype=torch.float64).expand(T, d)
    scores = apply_rotary(q) @ apply_rotary(k).T  # (T, T), entry (m, n)
    for offset in range(-T + 1, T):
        diag = scores.diagonal(offset)
        torch.testing.assert_close(diag, diag[:1].expand_as(diag), atol=1e-12, rtol=0)


def test_rotary_scores_invariant_to_shifting_all_positions(gen):
    q = torch.randn(2, 4, 10, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 4, 10, 8, generator=gen, dtype=torch.float64)
    pos = torch.arange(10)
    s0 = apply_rotary(q, pos) @ apply_rotary(k, pos).transpose(-2, -1)
    s1 = apply_rotary(q, pos + 123) @ apply_rotary(k, pos + 123).transpose(-2, -1)
    torch.testing.assert_close(s0, s1, atol=1e-10, rtol=0)


def test_rotary_keeps_norms_shape_dtype_and_position_zero(gen):
    x = torch.randn(3, 5, 6, generator=gen)
    y = apply_rotary(x)
    assert y.shape == x.shape and y.dtype == x.dtype
    torch.testing.assert_close(y[:, 0], x[:, 0])
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))


def test_rotary_module_and_errors(gen):
    rope = RotaryEmbedding(8)
    x = torch.randn(1, 2, 5, 8, generator=gen)
    torch.testing.assert_close(rope(x), apply_rotary(x))
    assert sum(p.numel() for p in rope.parameters()) == 0
    with pytest.raises(ValueError, match="even width"):
        RotaryEmbedding(7)
    with pytest.raises(ValueError, match="last dimension d=8"):
        rope(torch.zeros(1, 5, 6))
    with pytest.raises(ValueError, match="even last dimension"):
        apply_rotary(torch.zeros(4, 5))
    with pytest.raises(ValueError, match=r"positions must have shape \(T,\) = \(5,\)"):
        apply_rotary(torch.zeros(5, 4), torch.arange(4))
    with pytest.raises(ValueError, match=r"\(\.\.\., T, d\)"):
        apply_rotary(torch.zeros(4))
