"""Multi-head attention (chapter 5, "Multi-head attention").

``h`` heads each attend in a ``d_k = d_model / h`` wide subspace; the efficient version does all
heads in one batched matrix product by reshaping ``(B, T, d_model)`` to ``(B, h, T, d_k)``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_bool, check_divisible, check_float_tensors, check_int, check_probability
from .attention import check_mask, scaled_dot_product_attention
from .masks import causal_mask

__all__ = ["MultiHeadAttention", "Projection", "head_contributions", "merge_heads", "multihead_cost", "split_heads"]


class Projection(NamedTuple):
    """One of the Q, K, V projections of a :class:`MultiHeadAttention` (chapter 5).

    ``weight (d_model, d_model)`` and ``bias (d_model,)`` (or None) are *views* of rows of the
    layer's fused ``in_proj_weight`` and ``in_proj_bias``: reading them, or writing into them
    under ``torch.no_grad()``, reads or changes the layer. ``proj(x)`` maps ``(..., d_model)`` to
    ``(..., d_model)`` like an ``nn.Linear``.
    """

    weight: Tensor
    bias: Tensor | None

    def __call__(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """``(B, T, d_model)`` -> ``(B, h, T, d_k)`` with ``d_k = d_model / h`` (chapter 5).

    ``n_heads`` must be a positive int dividing ``d_model``."""
    if not isinstance(x, Tensor) or x.dim() != 3:
        raise ValueError(f"split_heads expects x of shape (B, T, d_model), got {getattr(x, 'shape', type(x).__name__)}")
    B, T, d_model = x.shape
    check_int(n_heads, "n_heads")
    if d_model % n_heads:
        raise ValueError(f"split_heads: the width d_model={d_model} is not divisible by n_heads={n_heads}")
    return x.view(B, T, n_heads, d_model // n_heads).transpose(1, 2)  # (B, h, T, d_k)


def merge_heads(x: Tensor) -> Tensor:
    """``(B, h, T, d_k)`` -> ``(B, T, h * d_k)``, the inverse of :func:`split_heads` (chapter 5)."""
    B, h, T, d_k = x.shape
    return x.transpose(1, 2).reshape(B, T, h * d_k)  # (B, T, d_model)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with Q, K, V and output projections (chapter 5).

    The three input projections are stored as ``torch.nn.MultiheadAttention`` stores them: one
    ``in_proj_weight`` of shape ``(3 d_model, d_model)`` (the rows of ``W_q``, then ``W_k``, then
    ``W_v``) and one ``in_proj_bias (3 d_model,)``, so self-attention computes Q, K and V with a
    single matrix product. ``q_proj``, ``k_proj`` and ``v_proj`` are :class:`Projection` views of
    their rows.

    Forward takes ``query (B, T_q, d_model)``, ``key`` and ``value`` ``(B, T_k, d_model)``, an
    optional boolean ``mask`` (True = may attend) broadcastable to ``(B, h, T_q, T_k)`` and
    ``is_causal`` to add a causal mask. It returns ``(output (B, T_q, d_model), weights)``
    where ``weights`` is ``(B, h, T_q, T_k)`` if ``need_weights`` else ``None``.

    Without weights it calls PyTorch's fused kernel
    (:func:`torch.nn.functional.scaled_dot_product_attention`); with weights it uses the
    library's hand-written :func:`~transformer_lib.attention.scaled_dot_product_attention`.
    Both compute the same function, NaN included: a NaN in a query (after projection) gives NaN
    in that query's output row, as IEEE arithmetic does, while a query whose keys are all
    masked gets zeros. ``query``, ``key`` and ``value`` must be floating-point tensors of one dtype.
    """

    def __init__(self, d_model: int, n_heads: int, *, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        check_divisible(d_model, n_heads)
        check_probability(dropout, "dropout")
        check_bool(bias, "bias")
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.in_proj_weight = nn.Parameter(torch.empty(3 * d_model, d_model))  # rows: W_q, W_k, W_v
        self.in_proj_bias = nn.Parameter(torch.empty(3 * d_model)) if bias else None
        with torch.no_grad():  # each block as nn.Linear(d_model, d_model) initialises itself, in the same order
            for proj in (self.q_proj, self.k_proj, self.v_proj):
                nn.init.kaiming_uniform_(proj.weight, a=math.sqrt(5))
                if proj.bias is not None:
                    nn.init.uniform_(proj.bias, -1 / math.sqrt(d_model), 1 / math.sqrt(d_model))
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _projection(self, i: int) -> Projection:
        rows = slice(i * self.d_model, (i + 1) * self.d_model)
        bias = self.in_proj_bias[rows] if self.in_proj_bias is not None else None
        return Projection(self.in_proj_weight[rows], bias)

    @property
    def q_proj(self) -> Projection:
        """The query projection ``W_q``: rows ``0 .. d_model - 1`` of ``in_proj_weight``."""
        return self._projection(0)

    @property
    def k_proj(self) -> Projection:
        """The key projection ``W_k``: rows ``d_model .. 2 d_model - 1`` of ``in_proj_weight``."""
        return self._projection(1)

    @property
    def v_proj(self) -> Projection:
        """The value projection ``W_v``: rows ``2 d_model .. 3 d_model - 1`` of ``in_proj_weight``."""
        return self._projection(2)

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(q, k, v)``, each ``(B, h, T, d_k)``: one matrix product when ``query``, ``key`` and
        ``value`` are the same tensor (self-attention), two when only ``key`` and ``value`` are
        (cross-attention), three otherwise."""
        h, d = self.n_heads, self.d_model
        if query is key and key is value:
            qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)  # (B, T, 3 d_model)
            return tuple(split_heads(t, h) for t in qkv.split(d, dim=-1))
        q = split_heads(self.q_proj(query), h)  # (B, h, T_q, d_k)
        if key is value:
            w, b = self.in_proj_weight[d:], None if self.in_proj_bias is None else self.in_proj_bias[d:]
            k, v = F.linear(key, w, b).split(d, dim=-1)  # (B, T_k, d_model) each
            return q, split_heads(k, h), split_heads(v, h)
        return q, split_heads(self.k_proj(key), h), split_heads(self.v_proj(value), h)

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> MultiHeadAttention:
        """Build a copy of a ``torch.nn.MultiheadAttention(batch_first=True)`` with equal weights."""
        if not isinstance(m, nn.MultiheadAttention):
            raise TypeError(f"expected torch.nn.MultiheadAttention, got {type(m).__name__}")
        if not m.batch_first:
            raise ValueError("from_torch needs a torch.nn.MultiheadAttention built with batch_first=True")
        if not m._qkv_same_embed_dim or m.bias_k is not None or m.add_zero_attn:
            raise ValueError("from_torch supports only kdim == vdim == embed_dim, no add_bias_kv, no add_zero_attn")
        has_bias = m.in_proj_bias is not None
        new = cls(m.embed_dim, m.num_heads, dropout=m.dropout, bias=has_bias)
        new = new.to(device=m.in_proj_weight.device, dtype=m.in_proj_weight.dtype)
        with torch.no_grad():
            new.in_proj_weight.copy_(m.in_proj_weight)  # the same layout: rows of W_q, W_k, W_v
            if has_bias:
                new.in_proj_bias.copy_(m.in_proj_bias)
            new.out_proj.weight.copy_(m.out_proj.weight)
            if has_bias:
                new.out_proj.bias.copy_(m.out_proj.bias)
        return new

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        check_float_tensors({"query": query, "key": key, "value": value})
        for name, t in (("query", query), ("key", key), ("value", value)):
            if t.dim() != 3 or t.shape[-1] != self.d_model:
                raise ValueError(f"{name} must have shape (B, T, d_model={self.d_model}), got {tuple(t.shape)}")
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ValueError(
                f"query, key and value must share B, and key/value must share T_k: got {tuple(query.shape)}, "
                f"{tuple(key.shape)}, {tuple(value.shape)}"
            )
        B, T_q, _ = query.shape
        T_k = key.shape[1]
        check_mask(mask, torch.Size((B, self.n_heads, T_q, T_k)))
        # the pure causal case goes to the fused kernel's causal (flash) path with no mask at all
        fused_causal = is_causal and mask is None and T_q == T_k and not need_weights
        if is_causal and not fused_causal:
            causal = causal_mask(T_q, T_k, device=query.device)  # (T_q, T_k)
            mask = causal if mask is None else mask & causal
        q, k, v = self.project(query, key, value)  # (B, h, T_q, d_k), (B, h, T_k, d_k), (B, h, T_k, d_k)
        p = self.dropout if self.training else 0.0
        if need_weights:
            out, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=p)  # (B, h, T_q, d_k)
        else:
            weights = None
            # some fused kernels (PyTorch's CPU flash kernel) return zeros for a NaN query: adding
            # 0 * the row's largest entry makes that row NaN, as in the hand-written path (max
            # propagates NaN and, unlike a sum, never overflows), for one reduction outside autograd
            nan_rows = q.detach().amax(dim=-1, keepdim=True) * 0  # (B, h, T_q, 1), 0 or NaN
            if fused_causal:
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True) + nan_rows
            elif mask is None:
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=p) + nan_rows  # (B, h, T_q, d_k)
            else:
                # a query with no key to attend to gets zeros, as in the hand-written path, on every
                # PyTorch version and kernel: let it attend everywhere, then zero its output
                any_key = mask.any(dim=-1, keepdim=True)  # (..., T_q, 1)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~any_key, dropout_p=p)
                out = torch.where(any_key, out + nan_rows, 0.0)  # (B, h, T_q, d_k)
        return self.out_proj(merge_heads(out)), weights  # (B, T_q, d_model)


def head_contributions(
    mha: MultiHeadAttention,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
) -> Tensor:
    """Each head's additive share of a :class:`MultiHeadAttention` output (chapter 5).

    Concatenating the heads and applying ``W_o`` equals summing, over heads, head ``i``'s output
    ``(T_q, d_k)`` times the ``d_k`` columns of ``W_o`` that belong to it. This returns those
    terms, ``(B, h, T_q, d_model)``, so that
    ``head_contributions(...).sum(1) + mha.out_proj.bias == mha(query, key, value, ...)[0]``.
    Arguments are those of :meth:`MultiHeadAttention.forward`; the module itself computes the
    heads (a hook reads the input of ``out_proj``), so masks and dropout behave exactly as there.
    """
    captured = []
    handle = mha.out_proj.register_forward_pre_hook(lambda _module, args: captured.append(args[0]))
    try:
        mha(query, key, value, mask=mask, is_causal=is_causal)
    finally:
        handle.remove()
    merged = captured[0]  # (B, T_q, d_model), the concatenated heads
    heads = split_heads(merged, mha.n_heads)  # (B, h, T_q, d_k)
    W_o = mha.out_proj.weight.view(mha.d_model, mha.n_heads, mha.d_k)  # (d_model, h, d_k)
    return torch.einsum("bhtk,dhk->bhtd", heads, W_o)  # (B, h, T_q, d_model)


def multihead_cost(
    d_model: int, n_heads: int, T_q: int, T_k: int | None = None, batch: int = 1, bias: bool = True
) -> dict[str, int]:
    """Parameters and forward FLOPs of one :class:`MultiHeadAttention` call (chapter 5).

    FLOPs count the matrix products only, two per multiply-add (the convention of
    :class:`torch.utils.flop_counter.FlopCounterMode`); bias additions and the softmax are left
    out. Returns a dict with ``params``; ``projection_flops`` (Q, K, V and output projections);
    ``attention_flops`` (the scores ``Q K^T`` and the weighted sum of values, over all heads);
    ``total_flops``; and ``score_entries``, the number of attention weights, ``B * h * T_q * T_k``,
    the only term that grows with ``h``. ``T_k`` defaults to ``T_q`` (self-attention).
    """
    check_divisible(d_model, n_heads)
    T_k = T_q if T_k is None else T_k
    for name, n in (("T_q", T_q), ("T_k", T_k), ("batch", batch)):
        check_int(n, name, minimum=0)
    params = 4 * d_model * d_model + (4 * d_model if bias else 0)
    projection = 2 * batch * d_model * d_model * (2 * T_q + 2 * T_k)  # Q and output on T_q rows, K and V on T_k
    d_k = d_model // n_heads
    attention = 2 * (2 * batch * n_heads * T_q * T_k * d_k)  # Q K^T, then weights @ V
    return {
        "params": params,
        "projection_flops": projection,
        "attention_flops": attention,
        "total_flops": projection + attention,
        "score_entries": batch * n_heads * T_q * T_k,
    }
