"""Transformer layers and stacks (chapter 7, "The transformer block").

Every layer offers post-LN, ``LayerNorm(x + Sublayer(x))`` as in the original paper, and pre-LN,
``x + Sublayer(LayerNorm(x))`` as in most modern models, chosen by ``norm_first``.
Inputs and outputs are ``(B, T, d_model)``.
"""

from __future__ import annotations

from torch import Tensor, nn

from .multihead import MultiHeadAttention

__all__ = ["Decoder", "DecoderLayer", "Encoder", "EncoderLayer", "FeedForward"]


class FeedForward(nn.Module):
    """Position-wise feed-forward network: Linear(d_model, d_ff), activation, Linear(d_ff, d_model)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu", bias: bool = True):
        super().__init__()
        acts = {"relu": nn.ReLU, "gelu": nn.GELU}
        if activation not in acts:
            raise ValueError(f"activation must be one of {sorted(acts)}, got {activation!r}")
        self.net = nn.Sequential(
            nn.Linear(d_model, d_ff, bias=bias),
            acts[activation](),
            nn.Linear(d_ff, d_model, bias=bias),
            nn.Dropout(dropout),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)  # (B, T, d_model)


class _Residual(nn.Module):
    """One sublayer with its residual connection and LayerNorm, post-LN or pre-LN."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool, bias: bool = True):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))  # pre-LN
        return self.norm(x + self.dropout(sublayer(x)))  # post-LN


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in a residual connection and LayerNorm.

    ``forward(x, mask=None, need_weights=False)``; ``mask`` (True = may attend) broadcasts to
    ``(B, h, T, T)`` and is normally a padding mask. With ``need_weights`` the attention weights
    ``(B, h, T, T)`` are kept in ``self.attn_weights``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        dropout: float = 0.0,
        norm_first: bool = False,
        activation: str = "relu",
        bias: bool = True,
    ):
        super().__init__()
        d_ff = 4 * d_model if d_ff is None else d_ff
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout, bias=bias)
        self.ff = FeedForward(d_model, d_ff, dropout=0.0, activation=activation, bias=bias)
        self.res_attn = _Residual(d_model, dropout, norm_first, bias)
        self.res_ff = _Residual(d_model, dropout, norm_first, bias)
        self.attn_weights = None

    def forward(self, x: Tensor, mask: Tensor | None = None, need_weights: bool = False) -> Tensor:
        def attend(h: Tensor) -> Tensor:
            out, self.attn_weights = self.self_attn(h, h, h, mask=mask, need_weights=need_weights)
            return out

        x = self.res_attn(x, attend)
        return self.res_ff(x, self.ff)  # (B, T, d_model)


class DecoderLayer(nn.Module):
    """Causal self-attention, then cross-attention to the encoder's output, then feed-forward.

    ``forward(x, memory=None, self_mask=None, memory_mask=None, need_weights=False)``. The
    self-attention is always causal; ``self_mask`` can add a padding mask. With
    ``cross_attention=False`` the layer has no cross-attention: the block of a decoder-only
    model such as GPT. With ``need_weights`` the weights are kept in ``self.self_attn_weights``
    ``(B, h, T, T)`` and ``self.cross_attn_weights`` ``(B, h, T, T_src)``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        dropout: float = 0.0,
        norm_first: bool = False,
        cross_attention: bool = True,
        activation: str = "relu",
        bias: bool = True,
    ):
        super().__init__()
        d_ff = 4 * d_model if d_ff is None else d_ff
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout, bias=bias)
        self.res_self = _Residual(d_model, dropout, norm_first, bias)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout, bias=bias) if cross_attention else None
        self.res_cross = _Residual(d_model, dropout, norm_first, bias) if cross_attention else None
        self.ff = FeedForward(d_model, d_ff, dropout=0.0, activation=activation, bias=bias)
        self.res_ff = _Residual(d_model, dropout, norm_first, bias)
        self.self_attn_weights = self.cross_attn_weights = None

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        self_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        def self_attend(h: Tensor) -> Tensor:
            out, self.self_attn_weights = self.self_attn(
                h, h, h, mask=self_mask, need_weights=need_weights, is_causal=True
            )
            return out

        def cross_attend(h: Tensor) -> Tensor:
            out, self.cross_attn_weights = self.cross_attn(
                h, memory, memory, mask=memory_mask, need_weights=need_weights
            )
            return out

        x = self.res_self(x, self_attend)
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("this DecoderLayer has cross-attention and needs the encoder output `memory`")
            x = self.res_cross(x, cross_attend)
        return self.res_ff(x, self.ff)  # (B, T, d_model)


class Encoder(nn.Module):
    """A stack of ``n_layers`` :class:`EncoderLayer`; pre-LN stacks end with a final LayerNorm."""

    def __init__(
        self,
        n_layers: int,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        dropout: float = 0.0,
        norm_first: bool = False,
        activation: str = "relu",
        bias: bool = True,
    ):
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, n_heads, d_ff, dropout, norm_first, activation, bias) for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model, bias=bias) if norm_first else nn.Identity()

    def forward(self, x: Tensor, mask: Tensor | None = None, need_weights: bool = False) -> Tensor:
        for layer in self.layers:
            x = layer(x, mask=mask, need_weights=need_weights)
        return self.norm(x)  # (B, T, d_model)


class Decoder(nn.Module):
    """A stack of ``n_layers`` :class:`DecoderLayer`; pre-LN stacks end with a final LayerNorm."""

    def __init__(
        self,
        n_layers: int,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        dropout: float = 0.0,
        norm_first: bool = False,
        cross_attention: bool = True,
        activation: str = "relu",
        bias: bool = True,
    ):
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first, cross_attention, activation, bias)
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model, bias=bias) if norm_first else nn.Identity()

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        self_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        for layer in self.layers:
            x = layer(x, memory, self_mask=self_mask, memory_mask=memory_mask, need_weights=need_weights)
        return self.norm(x)  # (B, T, d_model)


# ---------------------------------------------------------------------------------------------
# Chapter 7 additions: where the gradient goes in a stack of layers.
# ---------------------------------------------------------------------------------------------


def layer_grad_norms(layers: nn.ModuleList | list[nn.Module]) -> Tensor:
    """The L2 norm of each layer's parameter gradients, a float32 tensor ``(n_layers,)`` (chapter 7).

    Call it after ``loss.backward()``, for example on ``encoder.layers``. All of a layer's
    parameters count together, as one long vector; a parameter without a gradient counts as
    zero. Chapter 7 uses it to compare how the gradient spreads over the layers of a deep
    post-LN stack and a deep pre-LN stack.
    """
    import torch

    norms = []
    for layer in layers:
        squares = [p.grad.detach().float().pow(2).sum() for p in layer.parameters() if p.grad is not None]
        norms.append(torch.stack(squares).sum().sqrt().cpu() if squares else torch.zeros(()))
    return torch.stack(norms) if norms else torch.zeros(0)


__all__ += ["layer_grad_norms"]
