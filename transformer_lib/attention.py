"""Attention functions: chapter "Queries, keys and values" and chapter "Why divide by
sqrt(d_k)" ("Why divide by sqrt(d_k)": the softmax's entropy, Jacobian and temperature).

Shapes follow the book's notation: ``B`` batch, ``h`` heads, ``T_q``/``T_k`` query and key
lengths, ``d_k`` the query/key width and ``d_v`` the value width.

Mask convention for the whole project: a **boolean** mask where ``True`` means "may attend",
broadcastable to ``(..., T_q, T_k)``; the same convention as
:func:`torch.nn.functional.scaled_dot_product_attention`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_float_tensor, check_float_tensors, check_probability

__all__ = [
    "AdditiveAttention",
    "SingleHeadAttention",
    "check_attention_weights",
    "check_mask",
    "dot_product_attention",
    "masked_softmax",
    "scaled_dot_product_attention",
    "simple_self_attention",
    "soft_lookup",
    "softmax_entropy",
    "softmax_jacobian",
    "softmax_with_temperature",
]


def check_mask(mask: Tensor | None, scores_shape: torch.Size) -> None:
    """Raise a clear error unless ``mask`` is a boolean tensor that broadcasts to ``scores_shape`` (chapter
    "Masking")."""
    if mask is None:
        return
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor of dtype torch.bool, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must have dtype torch.bool (True = may attend), got {mask.dtype}; "
            "convert with mask.bool() if 1 means 'may attend'"
        )
    try:
        shape = torch.broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        shape = None
    if shape != scores_shape:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the attention scores' "
            f"shape {tuple(scores_shape)} (..., T_q, T_k)"
        )


def masked_softmax(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """Softmax over the last axis (the keys), ignoring positions where ``mask`` is False (chapter "Masking").

    Masked scores are replaced by the dtype's most negative finite value before the softmax, so
    their weight underflows to exactly 0. A row whose keys are *all* masked would be 0/0 (NaN)
    with ``-inf``; here it returns a row of zeros, and its gradient is zero, never NaN.
    """
    check_float_tensor(scores, "scores")
    check_mask(mask, scores.shape)
    if mask is None:
        return torch.softmax(scores, dim=-1)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    any_key = mask.any(dim=-1, keepdim=True)  # (..., T_q, 1)
    return weights * any_key


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    check_float_tensors({"q": q, "k": k, "v": v})
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., T, d), got shape {tuple(t.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same last dimension d_k, got q {tuple(q.shape)} (d_k={q.shape[-1]}) "
            f"and k {tuple(k.shape)} (d_k={k.shape[-1]})"
        )
    if q.shape[-1] == 0:
        raise ValueError(f"q and k must have a width d_k >= 1, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of positions T_k, got k {tuple(k.shape)} and v {tuple(v.shape)}"
        )
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"the batch dimensions (...) of q, k and v must match or broadcast, got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)} and v {tuple(v.shape)}"
        ) from None


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(d_k)) v, written out so every step can be read (chapter "Why divide by sqrt(d_k)").

    Args:
        q: ``(..., T_q, d_k)`` queries.
        k: ``(..., T_k, d_k)`` keys.
        v: ``(..., T_k, d_v)`` values.
        mask: optional boolean, ``True`` = may attend, broadcastable to ``(..., T_q, T_k)``.
        dropout_p: probability of dropping an attention weight (applied whenever > 0).

    Returns:
        ``(output, weights)`` of shapes ``(..., T_q, d_v)`` and ``(..., T_q, T_k)``. A query
        whose keys are all masked gets zeros in both, never NaN. A NaN in a query gives NaN in
        that query's row of both (IEEE arithmetic), unless all its keys are masked: a fully masked
        query's output is zeros whatever the values hold. But a NaN (or inf) in the *value* of a
        masked key reaches every other output row: its weight is exactly 0, and 0 * NaN is NaN
        (PyTorch's fused kernel does the same). Masking does not protect from NaN in the values:
        clean the padding (``v.nan_to_num()``, or zeros) before attention.

    q, k and v must be floating-point tensors of one dtype (``TypeError`` otherwise).
    """
    _check_qkv(q, k, v)
    check_probability(dropout_p, "dropout_p")
    d_k = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., T_q, T_k)
    weights = masked_softmax(scores, mask)  # (..., T_q, T_k)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    out = weights @ v  # (..., T_q, d_v)
    if mask is not None:  # zero weights times a NaN value would still be NaN
        out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return out, weights  # (..., T_q, d_v), (..., T_q, T_k)


class AdditiveAttention(nn.Module):
    """Bahdanau's additive attention: score(q, k) = w^T tanh(W_q q + W_k k) (chapter "Queries, keys and values").

    Queries and keys may have different sizes (see :meth:`forward`).
    """

    def __init__(self, query_size: int, key_size: int, hidden_size: int, dropout: float = 0.0):
        super().__init__()
        self.query_size, self.key_size = query_size, key_size
        self.W_q = nn.Linear(query_size, hidden_size, bias=False)
        self.W_k = nn.Linear(key_size, hidden_size, bias=False)
        self.w_v = nn.Linear(hidden_size, 1, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, queries: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``queries (..., T_q, query_size)``, ``keys (..., T_k, key_size)``, ``values (..., T_k, d_v)``,
        an optional boolean ``mask`` (True = may attend) broadcastable to ``(..., T_q, T_k)`` ->
        ``(output (..., T_q, d_v), weights (..., T_q, T_k))``. A NaN in a masked key's value
        still reaches every output row (its weight is 0, and 0 * NaN is NaN)."""
        for name, t in (("queries", queries), ("keys", keys), ("values", values)):
            check_float_tensor(t, name)
            if t.dim() < 2:
                raise ValueError(
                    f"{name} must have shape (..., T, size) with at least 2 dimensions, got {tuple(t.shape)}"
                )
        if queries.shape[-1] != self.query_size:
            raise ValueError(f"queries must have last dimension {self.query_size}, got shape {tuple(queries.shape)}")
        if keys.shape[-1] != self.key_size:
            raise ValueError(f"keys must have last dimension {self.key_size}, got shape {tuple(keys.shape)}")
        if keys.shape[-2] != values.shape[-2]:
            raise ValueError(
                f"keys and values must have the same number of positions T_k, got {tuple(keys.shape)} "
                f"and {tuple(values.shape)}"
            )
        q = self.W_q(queries).unsqueeze(-2)  # (..., T_q, 1, hidden)
        k = self.W_k(keys).unsqueeze(-3)  # (..., 1, T_k, hidden)
        scores = self.w_v(torch.tanh(q + k)).squeeze(-1)  # (..., T_q, T_k)
        weights = masked_softmax(scores, mask)  # softmax over the keys: dim=-1, always explicit
        return self.dropout(weights) @ values, weights


def check_attention_weights(weights: Tensor, mask: Tensor | None = None, atol: float = 1e-4) -> None:
    """Raise ``ValueError`` unless every row of ``weights`` is a probability distribution (chapter "Queries, keys and
    values").

    ``weights`` has shape ``(..., T_k)``: each row (the last axis, one query's weights over the
    keys) must be finite, non-negative and sum to 1 within ``atol``. With a boolean ``mask``
    (True = may attend, broadcastable to ``weights``), masked keys must get weight 0, and a row
    whose keys are all masked must be all zeros (the library's convention). The message names the
    first bad row, its weights and its sum.
    """
    w = torch.as_tensor(weights).detach().to(torch.float64)
    if w.dim() < 1 or w.shape[-1] == 0:
        raise ValueError(f"weights must have shape (..., T_k) with T_k >= 1, got {tuple(w.shape)}")
    if mask is not None:
        check_mask(mask, w.shape)
        mask = mask.expand(w.shape)
    else:
        mask = torch.ones(w.shape, dtype=torch.bool)
    rows, keep = w.reshape(-1, w.shape[-1]), mask.reshape(-1, w.shape[-1])  # (rows, T_k)
    totals = rows.sum(-1)  # (rows,)
    all_masked = ~keep.any(-1)  # (rows,)
    problems = [
        (~torch.isfinite(rows).all(-1), "contains NaN or inf"),
        ((rows < 0).any(-1), "has a negative weight (softmax weights are never negative)"),
        (((rows != 0) & ~keep).any(-1), "gives non-zero weight to a masked key"),
        (all_masked & (totals != 0), "should be all zeros because every key is masked"),
        (~all_masked & ((totals - 1).abs() > atol), None),
    ]
    bad = torch.stack([p for p, _ in problems])  # (checks, rows)
    if not bad.any():
        return
    r = int(bad.any(0).nonzero()[0])
    what = next(text for p, text in problems if p[r])
    if what is None:
        what = f"sums to {totals[r].item():.4g}, not 1"
    if w.dim() == 1:
        name = "the row of weights"
    else:
        index = [int(i) for i in torch.unravel_index(torch.tensor(r), w.shape[:-1])]
        name = f"row {index[0] if len(index) == 1 else tuple(index)} of the weights"
    raise ValueError(f"{name} {what}: {[round(x, 4) for x in rows[r].tolist()]}")


def dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Luong's (unscaled) dot-product attention, softmax(q k^T) v (chapter "Queries, keys and values").

    Same arguments and results as :func:`scaled_dot_product_attention`, without the division by
    ``sqrt(d_k)``: ``q (..., T_q, d_k)``, ``k (..., T_k, d_k)``, ``v (..., T_k, d_v)``, optional
    boolean mask (True = may attend); returns ``(output (..., T_q, d_v), weights (..., T_q, T_k))``.
    A NaN in a masked key's value reaches every output row, fully masked queries included.
    """
    _check_qkv(q, k, v)
    scores = q @ k.transpose(-2, -1)  # (..., T_q, T_k)
    weights = masked_softmax(scores, mask)  # (..., T_q, T_k)
    return weights @ v, weights  # (..., T_q, d_v), (..., T_q, T_k)


def simple_self_attention(x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Parameter-free self-attention, softmax(X X^T) X (chapter "Queries, keys and values").

    The token vectors ``x (..., T, d)`` serve as queries, keys and values at once, with no
    learned weights. Returns ``(output (..., T, d), weights (..., T, T))``.
    """
    return dot_product_attention(x, x, x, mask)


class SingleHeadAttention(nn.Module):
    """One attention head with learned projections W_q, W_k, W_v (chapter "Queries, keys and values").

    Keys and values come from a ``context``, by default the queries' own sequence (then it is
    *self*-attention; with another sequence it is cross-attention); see :meth:`forward`. The
    same three matrices are applied to every position; there is no output projection.
    """

    def __init__(
        self, d_model: int, d_k: int, d_v: int | None = None, d_context: int | None = None, bias: bool = False
    ):
        super().__init__()
        d_v = d_k if d_v is None else d_v
        d_context = d_model if d_context is None else d_context
        self.d_model, self.d_k, self.d_v, self.d_context = d_model, d_k, d_v, d_context
        self.W_q = nn.Linear(d_model, d_k, bias=bias)
        self.W_k = nn.Linear(d_context, d_k, bias=bias)
        self.W_v = nn.Linear(d_context, d_v, bias=bias)

    def forward(self, x: Tensor, context: Tensor | None = None, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Queries from ``x (..., T_q, d_model)``, keys and values from ``context (..., T_k,
        d_context)`` (default ``x``), an optional boolean ``mask`` broadcastable to ``(..., T_q,
        T_k)`` -> ``(output (..., T_q, d_v), weights (..., T_q, T_k))``, from
        :func:`scaled_dot_product_attention` (NaN in a masked key's value included)."""
        context = x if context is None else context
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x must have last dimension d_model={self.d_model}, got shape {tuple(x.shape)}")
        if context.shape[-1] != self.d_context:
            raise ValueError(
                f"context must have last dimension d_context={self.d_context}, got shape {tuple(context.shape)}"
            )
        q = self.W_q(x)  # (..., T_q, d_k)
        k = self.W_k(context)  # (..., T_k, d_k)
        v = self.W_v(context)  # (..., T_k, d_v)
        return scaled_dot_product_attention(q, k, v, mask)


def soft_lookup(query: Tensor, keys: Tensor, values: Tensor, temperature: float = 1.0) -> Tensor:
    """Soft dictionary lookup (chapter "Queries, keys and values"): ``softmax(keys @ query / temperature) @ values``.

    Args:
        query: ``(d,)`` the vector we look up.
        keys: ``(n, d)`` one key per row.
        values: ``(n,)`` or ``(n, d_v)`` one value per key.
        temperature: > 0; small values make the lookup nearly hard (all weight on the best key).

    Returns:
        ``values.shape[1:]``: the weighted average of the values.
    """
    check_float_tensors({"query": query, "keys": keys, "values": values})
    if query.dim() != 1 or keys.dim() != 2 or keys.shape[1] != query.shape[0]:
        raise ValueError(
            f"soft_lookup takes query (d,) and keys (n, d) of the same d, got query {tuple(query.shape)} "
            f"and keys {tuple(keys.shape)}"
        )
    if values.dim() not in (1, 2) or values.shape[0] != keys.shape[0]:
        raise ValueError(
            f"values must be (n,) or (n, d_v) with one row per key (n={keys.shape[0]}), got {tuple(values.shape)}"
        )
    return softmax_with_temperature(keys @ query, temperature) @ values  # (n,) weights times values


def softmax_entropy(weights: Tensor, dim: int = -1) -> Tensor:
    """Entropy in nats of each row of attention weights ``(..., T_k)`` along ``dim`` (chapter "Why divide by
    sqrt(d_k)").

    0 for one-hot rows, ``log(T_k)`` for uniform ones; zero weights contribute 0 (the limit of
    ``p log p``), so masked keys are handled. Returns the shape of ``weights`` without ``dim``.
    """
    p = weights.clamp_min(0)
    return -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(dim)


def softmax_jacobian(weights: Tensor) -> Tensor:
    """Jacobian of the softmax, written with its output: ``diag(p) - p p^T`` (chapter "Why divide by sqrt(d_k)").

    Args:
        weights: ``(..., n)`` softmax outputs ``p`` (each row sums to 1), for example one row of
            attention weights per query.

    Returns:
        ``(..., n, n)`` tensor ``J`` with ``J[..., i, j] = d p_i / d s_j``, where ``p = softmax(s)``.
        ``J`` is symmetric, its rows sum to 0, and it tends to 0 as ``p`` tends to one-hot.
    """
    if not isinstance(weights, Tensor):
        raise TypeError(f"weights must be a torch.Tensor, got {type(weights).__name__}")
    if weights.dim() < 1:
        raise ValueError("weights must have at least 1 dimension (..., n), got a 0-d tensor")
    if not weights.is_floating_point():
        raise TypeError(f"weights must be a floating-point tensor, got dtype {weights.dtype}")
    p = weights
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)  # (..., n, n)


def softmax_with_temperature(scores: Tensor, temperature: float, dim: int = -1) -> Tensor:
    """``softmax(scores / tau)`` along ``dim``, same shape as ``scores (..., n)`` (chapter "Why divide by sqrt(d_k)").

    The temperature is tau (``T`` is a sequence length in this book): ``tau < 1`` sharpens the
    weights towards one-hot (the argmax as ``tau -> 0``), ``tau > 1`` flattens them towards uniform.
    Scaled dot-product attention is this with ``tau = sqrt(d_k)``.
    """
    if not isinstance(scores, Tensor):
        raise TypeError(f"scores must be a torch.Tensor, got {type(scores).__name__}")
    tau = float(temperature)
    if not (tau > 0.0 and math.isfinite(tau)):
        raise ValueError(
            f"temperature must be a finite number > 0, got {temperature} (tau -> 0: argmax, tau -> inf: uniform)"
        )
    return torch.softmax(scores / tau, dim=dim)
