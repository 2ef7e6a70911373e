"""Positional encodings (chapter "Positional encoding").

Both modules take token embeddings ``x (B, T, d_model)`` and return ``x`` plus a position
vector for each of the ``T`` positions. Sequences longer than ``context_len`` raise a ``ValueError``.
Every encoding takes ``d_model`` (the width) first, then ``context_len``; the rest is keyword-only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ._checks import check_base, check_float_tensor, check_int, check_probability
from ._specs import Spec

__all__ = [
    "LearnedPositionalEmbedding",
    "LearnedSpec",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "apply_rotary",
    "binary_encoding",
    "relative_rotation",
    "rotate_pairs",
    "sinusoidal_encoding",
    "sinusoidal_frequencies",
    "half_split_rows",
]


def sinusoidal_encoding(d_model: int, context_len: int, *, base: float = 10000.0) -> Tensor:
    """The paper's encoding, ``(context_len, d_model)``, float32 (chapter "Positional encoding").

    PE(pos, 2i) = sin(pos / base^(2i/d_model)) and PE(pos, 2i+1) = cos(pos / base^(2i/d_model)):
    sines on the even dimensions, cosines on the odd ones, interleaved.
    """
    check_int(d_model, "d_model")
    check_int(context_len, "context_len")
    check_base(base)
    pos = torch.arange(context_len, dtype=torch.float64)[:, None]  # (context_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(d_model / 2),)
    angles = pos / base ** (two_i / d_model)  # (context_len, ceil(d_model / 2))
    pe = torch.empty(context_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe.float()


def _check_length(x: Tensor, d_model: int, context_len: int, start: int) -> None:
    """``x (B, T, d_model)`` placed at positions ``start .. start + T - 1``, all below ``context_len``."""
    check_float_tensor(x, "x")
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(f"expected input of shape (B, T, d_model={d_model}), got {tuple(x.shape)}")
    if start:
        check_int(start, "start", minimum=0)
    if start + x.shape[1] > context_len:
        where = f"sequence length {x.shape[1]}" + (f" from position {start}" if start else "")
        raise ValueError(f"{where} is longer than the context length context_len={context_len}")


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal encoding (no parameters) to ``x (B, T, d_model)``, then dropout (chapter "Positional
    encoding").

    Returns ``(B, T, d_model)``; ``T`` must be at most ``context_len``. ``forward(x, start=s)``
    places ``x`` at positions ``s, s + 1, ...`` (chapter "Generation": the new tokens after a cache).
    """

    def __init__(self, d_model: int, context_len: int = 5000, *, dropout: float = 0.0):
        super().__init__()
        check_probability(dropout, "dropout")
        self.d_model, self.context_len = d_model, context_len
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_encoding(d_model, context_len), persistent=False)

    def forward(self, x: Tensor, *, start: int = 0) -> Tensor:
        """``x (B, T, d_model)`` -> ``(B, T, d_model)``: ``x`` plus the encoding of positions
        ``start .. start + T - 1`` (``start + T <= context_len``), then dropout."""
        _check_length(x, self.d_model, self.context_len, start)
        return self.dropout(x + self.pe[start : start + x.shape[1]].to(x.dtype))  # (B, T, d_model)


class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned vector per position (an ``nn.Embedding`` of ``context_len`` rows) to ``x`` (chapter "Positional
    encoding").

    ``x (B, T, d_model)`` in, ``(B, T, d_model)`` out, then dropout; ``T`` at most ``context_len``.
    ``forward(x, start=s)`` places ``x`` at positions ``s, s + 1, ...`` (chapter "Generation": after a cache).
    """

    def __init__(self, d_model: int, context_len: int, *, dropout: float = 0.0):
        super().__init__()
        check_int(d_model, "d_model")
        check_int(context_len, "context_len")
        check_probability(dropout, "dropout")
        self.d_model, self.context_len = d_model, context_len
        self.embedding = nn.Embedding(context_len, d_model)
        nn.init.normal_(self.embedding.weight, std=0.02)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, *, start: int = 0) -> Tensor:
        """``x (B, T, d_model)`` -> ``(B, T, d_model)``: ``x`` plus the learned vectors of positions
        ``start .. start + T - 1`` (``start + T <= context_len``), then dropout."""
        _check_length(x, self.d_model, self.context_len, start)
        x = x + self.embedding.weight[start : start + x.shape[1]]  # (B, T, d_model): rows start, start + 1, ...
        return self.dropout(x) if self.dropout.p and self.training else x  # p = 0: no call at all


@dataclass(frozen=True)
class LearnedSpec(Spec):
    """Learned position vectors added to the embeddings (GPT-2's), as a recipe's choice of positions
    (chapter "Today's block"); it has no options."""

    kind = "learned"


def binary_encoding(n_bits: int, context_len: int) -> Tensor:
    """Positions written in binary, ``(context_len, n_bits)`` float32 of 0s and 1s (chapter "Positional encoding").

    Column ``j`` holds bit ``j`` of the position, lowest bit first, so column 0 flips at every
    step and column ``j`` has period ``2^(j+1)``. Positions wrap around modulo ``2^n_bits``.
    """
    if context_len < 1 or n_bits < 1:
        raise ValueError(f"context_len and n_bits must be positive, got context_len={context_len}, n_bits={n_bits}")
    pos = torch.arange(context_len)[:, None]  # (context_len, 1)
    bits = torch.arange(n_bits)  # (n_bits,)
    return ((pos >> bits) & 1).float()  # (context_len, n_bits)


def sinusoidal_frequencies(d_model: int, *, base: float = 10000.0) -> Tensor:
    """The angular frequencies ``omega_i = base^(-2i/d_model)``, ``(ceil(d_model/2),)`` float64 (chapter "Positional
    encoding").

    Pair ``i`` of the sinusoidal encoding (dimensions ``2i`` and ``2i+1``) is
    ``(sin(pos * omega_i), cos(pos * omega_i))``.
    """
    check_int(d_model, "d_model")
    check_base(base)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(d_model / 2),)
    return base ** (-two_i / d_model)


def relative_rotation(k: int | float, d_model: int, *, base: float = 10000.0) -> Tensor:
    """The ``(d_model, d_model)`` float64 matrix ``M_k`` with ``PE(pos + k) = M_k @ PE(pos)`` (chapter "Positional
    encoding").

    ``M_k`` is block-diagonal: for each frequency ``omega_i`` the 2x2 block
    ``[[cos(k w), sin(k w)], [-sin(k w), cos(k w)]]`` (``w = omega_i``) turns the pair
    ``(sin(pos w), cos(pos w))`` into ``(sin((pos + k) w), cos((pos + k) w))``, whatever ``pos``.
    For row-major encodings ``pe (T, d_model)`` this reads ``pe[:-k] @ M_k.T == pe[k:]``.
    ``d_model`` must be even: a lone last sine has no cosine partner to rotate with.
    """
    if d_model < 2 or d_model % 2:
        raise ValueError(f"relative_rotation needs an even d_model (each sine needs its cosine partner), got {d_model}")
    angle = float(k) * sinusoidal_frequencies(d_model, base=base)  # (d_model / 2,)
    c, s = torch.cos(angle), torch.sin(angle)
    blocks = torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)  # (d_model / 2, 2, 2)
    return torch.block_diag(*blocks)  # (d_model, d_model)


def apply_rotary(x: Tensor, positions: Tensor | None = None, *, base: float = 10000.0) -> Tensor:
    """Rotary position embedding (RoPE) of ``x (..., T, d)`` with ``d`` even (chapter "Positional encoding").

    Each pair of dimensions ``(2i, 2i+1)`` of the vector at position ``m`` is rotated by the
    angle ``m * omega_i`` with ``omega_i = base^(-2i/d)``, the frequencies of the sinusoidal
    encoding. Applied to queries and keys, it makes ``q_m . k_n`` depend on the positions only
    through the offset ``n - m``. ``positions`` is ``(T,)`` (default ``0, 1, ..., T-1``).
    Returns a tensor of the shape and dtype of ``x``; the norms of the pairs are unchanged.
    """
    check_float_tensor(x, "x")
    if x.dim() < 2:
        raise ValueError(f"apply_rotary expects x of shape (..., T, d), got {tuple(x.shape)}")
    T, d = x.shape[-2], x.shape[-1]
    if d % 2:
        raise ValueError(f"apply_rotary needs an even last dimension d (dimensions are rotated in pairs), got {d}")
    if positions is None:
        positions = torch.arange(T, device=x.device)
    if positions.shape != (T,):
        raise ValueError(f"positions must have shape (T,) = ({T},), got {tuple(positions.shape)}")
    return rotate_pairs(x, positions, sinusoidal_frequencies(d, base=base))


def rotate_pairs(x: Tensor, positions: Tensor, omega: Tensor, scale: float = 1.0) -> Tensor:
    """Pair ``(2i, 2i+1)`` of ``x (..., T, d)`` at position ``positions[t]`` rotated by the angle
    ``positions[t] * omega[i]`` (chapter "Positional encoding"; chapter "Longer than trained" passes rescaled
    frequencies ``omega (d/2,)``), and multiplied by ``scale`` (YaRN's attention factor: 1 leaves
    the norms unchanged). Returns the shape and dtype of ``x``."""
    omega = omega.to(device=x.device, dtype=torch.float64)  # (d / 2,)
    angles = positions.to(torch.float64)[:, None] * omega  # (T, d / 2)
    cos, sin = (scale * torch.cos(angles)).to(x.dtype), (scale * torch.sin(angles)).to(x.dtype)  # (T, d / 2)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]  # (..., T, d / 2) each
    out = torch.empty_like(x)
    out[..., 0::2] = x_even * cos - x_odd * sin
    out[..., 1::2] = x_even * sin + x_odd * cos
    return out  # (..., T, d)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding for ``d``-wide queries or keys (chapter "Positional encoding"); no parameters.

    ``forward(x, positions=None)`` is :func:`apply_rotary` with this module's ``base``. Use it
    on ``q`` and ``k`` of shape ``(B, h, T, d_k)`` after splitting heads, never on ``v``.
    """

    def __init__(self, d: int, *, base: float = 10000.0, scaling=None):
        super().__init__()
        check_int(d, "d")
        if d < 2 or d % 2:
            raise ValueError(f"RotaryEmbedding needs an even width d, got {d}")
        check_base(base)
        if scaling is not None and not callable(getattr(scaling, "frequencies", None)):
            raise TypeError(f"scaling must be a RopeScaling (or None), got {scaling!r}")
        self.d, self.base, self.scaling = d, base, scaling

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """``x (..., T, d)`` -> the same shape, each pair of dimensions rotated by its position's
        angle; ``positions (T,)`` (default ``0 .. T - 1``). :func:`apply_rotary` with ``base``, or
        with ``scaling`` (chapter "Longer than trained") its rescaled frequencies and attention factor."""
        if x.shape[-1] != self.d:
            raise ValueError(f"expected last dimension d={self.d}, got shape {tuple(x.shape)}")
        if self.scaling is None:
            return apply_rotary(x, positions, base=self.base)
        if positions is None:
            positions = torch.arange(x.shape[-2], device=x.device)
        seq_len = int(positions.max()) + 1 if positions.numel() else 0
        omega, factor = self.scaling.frequencies(self.d, self.base, seq_len=seq_len)
        return rotate_pairs(x, positions, omega, factor)

    def extra_repr(self) -> str:
        return f"d={self.d}, base={self.base}" + ("" if self.scaling is None else f", scaling={self.scaling.kind!r}")


def half_split_rows(n_heads: int, d: int) -> Tensor:
    """The rows that turn rotary weights of the half-split convention into the book's (chapters "Today's block"
    and "Latent, sparse and sink attention"): ``(n_heads * d,)`` indices, per head ``0, d/2, 1, d/2 + 1, ...``.

    The book rotates neighbouring dimensions ``(2i, 2i + 1)`` together (:func:`apply_rotary`);
    ``transformers``' Llama, gpt-oss and DeepSeek-V3.2's indexer rotate ``(i, i + d/2)``, with the
    same frequency for pair ``i``. Row ``j`` of the book's query (or key) projection is then row
    ``rows[j]`` of theirs: ``W_book = W_theirs[half_split_rows(h, d)]``, which leaves every score
    unchanged. ``d`` is a head's rotated width (even).
    """
    check_int(n_heads, "n_heads")
    check_int(d, "d")
    if d % 2:
        raise ValueError(f"a rotated width pairs its dimensions: d must be even, got {d}")
    head = torch.arange(d).view(2, d // 2).t().reshape(-1)  # (d,): 0, d/2, 1, d/2 + 1, ...
    return (torch.arange(n_heads)[:, None] * d + head).reshape(-1)  # (n_heads * d,)
