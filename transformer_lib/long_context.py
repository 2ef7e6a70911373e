"""Long context (chapter "Long context and precision"): the online softmax and tiled attention.

The softmax of a row needs its maximum (for stability) and its sum of exponentials (to
normalise), both over the *whole* row. The online softmax keeps a running maximum ``m`` and a
running sum ``l`` while it reads the row block by block: when a new block raises the maximum
from ``m`` to ``m'``, the sum so far is rescaled by ``exp(m - m')``. Attention can do the same
with its weighted sum of values, so it never needs the ``(T_q, T_k)`` matrix of scores: only one
``(block, block)`` tile of it at a time. That is the idea behind FlashAttention; here it is
written in plain PyTorch, for reading, not for speed.

Chapter "Latent, sparse and sink attention" adds an attention sink: one extra logit per row (per head in attention) that
joins the softmax's denominator but has no value, so a row's weights may sum to less than 1. The
running max then starts at the sink and the running sum at ``exp(sink - sink) = 1``.

Shapes: ``B`` batch, ``h`` heads, ``T_q``/``T_k`` query and key lengths, ``d`` the query/key
width, ``d_v`` the value width.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ._checks import check_bool, check_float_tensors, check_int

__all__ = ["online_softmax", "tiled_attention"]


def _safe_max(m: Tensor) -> Tensor:
    """``m`` with ``-inf`` replaced by 0, to subtract from ``-inf`` scores without ``-inf - -inf = NaN``."""
    return torch.where(m == -math.inf, torch.zeros_like(m), m)


def _sink_start(sink: Tensor | None, shape: tuple[int, ...], like: Tensor) -> tuple[Tensor, Tensor]:
    """The running max and sum before any column (chapter "Latent, sparse and sink attention"), ``shape`` each, of
    ``like``'s dtype and device: ``-inf`` and 0, or, with a sink (broadcast to ``shape``), the sink and
    ``exp(sink - sink) = 1`` (0 for a sink of ``-inf``)."""
    if sink is None:
        return like.new_full(shape, -math.inf), like.new_zeros(shape)
    m = sink.to(like).expand(shape)
    return m, torch.exp(m - _safe_max(m))


def _check_sink(sink: object, like: Tensor, name: str, shape: tuple[int, ...], shape_name: str) -> None:
    """``sink`` must be a tensor of the dtype and device of ``like`` (named ``name``) that broadcasts to ``shape``."""
    check_float_tensors({name: like, "sink": sink})
    try:
        ok = torch.broadcast_shapes(sink.shape, shape) == shape and sink.device == like.device
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"sink must broadcast to {shape_name} {tuple(shape)} on {like.device}, got shape "
            f"{tuple(sink.shape)} on {sink.device}"
        )


def online_softmax(x: Tensor, block_size: int, *, sink: Tensor | None = None) -> Tensor:
    """Softmax over the last axis, computed block by block with a running max and sum (chapter "Long context and
    precision").

    One pass reads ``x (..., n)`` in blocks of ``block_size`` columns and keeps, per row, the
    largest value seen so far ``m`` and the sum ``l`` of ``exp(x - m)`` over the columns seen so
    far; a block that raises the maximum to ``m'`` rescales ``l`` by ``exp(m - m')`` first. At
    the end ``softmax(x) = exp(x - m) / l``. Returns ``(..., n)``, equal to
    ``torch.softmax(x, dim=-1)`` up to rounding (a row of only ``-inf`` gives NaN, as there).

    ``sink`` (chapter "Latent, sparse and sink attention"), a tensor broadcastable to ``x.shape[:-1]``: one more logit
    per row, in the denominator only; the result is the softmax of the row with a column holding ``sink``
    added, that column dropped, so rows sum to less than 1 (a row of only ``-inf`` gives zeros).
    """
    check_float_tensors({"x": x})
    check_int(block_size, "block_size")
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must have at least one column (..., n) with n >= 1, got shape {tuple(x.shape)}")
    if sink is not None:
        _check_sink(sink, x, "x", x.shape[:-1], "x.shape[:-1]")
    n = x.shape[-1]
    m, l = _sink_start(sink, x.shape[:-1], x)  # (...,) running max, running sum of exp(x - m)
    for start in range(0, n, block_size):
        block = x[..., start : start + block_size]  # (..., b)
        m_new = torch.maximum(m, block.amax(dim=-1))  # (...,)
        shift = _safe_max(m_new)
        l = l * torch.exp(m - shift) + torch.exp(block - shift[..., None]).sum(dim=-1)
        m = m_new
    return torch.exp(x - m[..., None]) / l[..., None]  # (..., n)


def _check_tiled_inputs(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, block_size: int) -> None:
    check_float_tensors({"q": q, "k": k, "v": v})
    check_bool(is_causal, "is_causal")
    check_int(block_size, "block_size")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (B, h, T, d), got {tuple(t.shape)}")
        if t.shape[2] == 0:
            raise ValueError(f"{name} has no positions (T = 0): shape {tuple(t.shape)}")
    if not (q.shape[:2] == k.shape[:2] == v.shape[:2]):
        raise ValueError(
            f"q, k and v must share B and h, got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the width d, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must share T_k, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    if is_causal and q.shape[2] != k.shape[2]:
        raise ValueError(
            f"is_causal=True needs T_q == T_k, got T_q={q.shape[2]} and T_k={k.shape[2]}: with different "
            "lengths PyTorch aligns the causal mask top-left and causal_mask bottom-right, so the meaning "
            "is ambiguous; pass an equal number of queries and keys"
        )


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float16 and bfloat16 keep their running statistics and sums in float32, as FlashAttention does."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _tile_scores(q_blk: Tensor, k_blk: Tensor, i0: int, j0: int, scale: float, is_causal: bool) -> Tensor:
    """The ``(B, h, bq, bk)`` scores of one tile, causal positions (key after query) set to ``-inf``."""
    s = (q_blk @ k_blk.transpose(-2, -1)) * scale  # (B, h, bq, bk)
    bq, bk = s.shape[-2:]
    if is_causal and j0 + bk - 1 > i0:  # some key of the tile lies after some query of it
        rows = torch.arange(i0, i0 + bq, device=s.device)[:, None]  # (bq, 1)
        cols = torch.arange(j0, j0 + bk, device=s.device)[None, :]  # (1, bk)
        s = s.masked_fill(cols > rows, -math.inf)
    return s


def _key_blocks(i0: int, i1: int, T_k: int, block_size: int, is_causal: bool) -> range:
    """Start of every key block the query rows ``i0 .. i1 - 1`` can see; causal skips the ones wholly after them."""
    return range(0, min(T_k, i1) if is_causal else T_k, block_size)


def _tiled_forward(
    q: Tensor, k: Tensor, v: Tensor, sink: Tensor | None, is_causal: bool, block_size: int
) -> tuple[Tensor, Tensor]:
    """``(out (B, h, T_q, d_v), lse (B, h, T_q))``; ``lse`` is each query's log-sum-exp of scores
    (and of its head's sink, chapter "Latent, sparse and sink attention")."""
    B, h, T_q, d = q.shape
    T_k, d_v = k.shape[2], v.shape[-1]
    work = _work_dtype(q.dtype)
    scale = 1.0 / math.sqrt(d)
    out = torch.empty(B, h, T_q, d_v, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, h, T_q, dtype=work, device=q.device)
    for i0 in range(0, T_q, block_size):
        i1 = min(i0 + block_size, T_q)
        q_blk = q[:, :, i0:i1].to(work)  # (B, h, bq, d)
        sink_h = None if sink is None else sink[:, None]  # (h, 1): broadcasts over (B, h, bq)
        m, l = _sink_start(sink_h, (B, h, i1 - i0), q_blk)  # running max, running sum of exp(s - m)
        acc = torch.zeros(B, h, i1 - i0, d_v, dtype=work, device=q.device)  # running sum of exp(s - m) v
        for j0 in _key_blocks(i0, i1, T_k, block_size, is_causal):
            j1 = min(j0 + block_size, T_k)
            s = _tile_scores(q_blk, k[:, :, j0:j1].to(work), i0, j0, scale, is_causal)  # (B, h, bq, bk)
            m_new = torch.maximum(m, s.amax(dim=-1))  # (B, h, bq)
            shift = _safe_max(m_new)
            alpha = torch.exp(m - shift)  # (B, h, bq): rescales what was summed under the old max
            p = torch.exp(s - shift[..., None])  # (B, h, bq, bk)
            l = l * alpha + p.sum(dim=-1)
            acc = acc * alpha[..., None] + p @ v[:, :, j0:j1].to(work)  # (B, h, bq, d_v)
            m = m_new
        out[:, :, i0:i1] = (acc / l[..., None]).to(q.dtype)
        lse[:, :, i0:i1] = m + torch.log(l)
    return out, lse


def _tiled_backward(q, k, v, sink, out, lse, grad_out, is_causal: bool, block_size: int):
    """Gradients of q, k, v and the sink, recomputing each tile's weights ``p = exp(s - lse)`` from ``lse``.

    With ``dP = dO V^T`` and ``D_i = sum_j P_ij dP_ij = dO_i . O_i``, the softmax's gradient is
    ``dS = P * (dP - D)``; then ``dQ = dS K / sqrt(d)``, ``dK = dS^T Q / sqrt(d)`` and ``dV = P^T dO``.
    The sink (chapter "Latent, sparse and sink attention") has no value, so its ``dP`` is 0: ``dsink_h = -sum_i
    P_sink(i) D_i``.
    """
    T_q, d = q.shape[2], q.shape[3]
    T_k = k.shape[2]
    work = _work_dtype(q.dtype)
    scale = 1.0 / math.sqrt(d)
    D = (grad_out.to(work) * out.to(work)).sum(dim=-1)  # (B, h, T_q)
    dq = torch.zeros(q.shape, dtype=work, device=q.device)
    dk = torch.zeros(k.shape, dtype=work, device=q.device)
    dv = torch.zeros(v.shape, dtype=work, device=q.device)
    for i0 in range(0, T_q, block_size):
        i1 = min(i0 + block_size, T_q)
        q_blk, do_blk = q[:, :, i0:i1].to(work), grad_out[:, :, i0:i1].to(work)  # (B, h, bq, d), (B, h, bq, d_v)
        for j0 in _key_blocks(i0, i1, T_k, block_size, is_causal):
            j1 = min(j0 + block_size, T_k)
            k_blk, v_blk = k[:, :, j0:j1].to(work), v[:, :, j0:j1].to(work)
            s = _tile_scores(q_blk, k_blk, i0, j0, scale, is_causal)  # (B, h, bq, bk)
            p = torch.exp(s - lse[:, :, i0:i1, None])  # (B, h, bq, bk), the attention weights of the tile
            dv[:, :, j0:j1] += p.transpose(-2, -1) @ do_blk  # (B, h, bk, d_v)
            dp = do_blk @ v_blk.transpose(-2, -1)  # (B, h, bq, bk)
            ds = p * (dp - D[:, :, i0:i1, None]) * scale  # (B, h, bq, bk)
            dq[:, :, i0:i1] += ds @ k_blk  # (B, h, bq, d)
            dk[:, :, j0:j1] += ds.transpose(-2, -1) @ q_blk  # (B, h, bk, d)
    dsink = None
    if sink is not None:  # P_sink = exp(sink - lse), (B, h, T_q)
        dsink = -(torch.exp(sink.to(work)[:, None] - lse) * D).sum(dim=(0, 2)).to(sink.dtype)  # (h,)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsink


class _TiledAttention(torch.autograd.Function):
    """Forward and backward of :func:`tiled_attention`; saves only ``out`` and ``lse``, O(T) memory."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, sink: Tensor | None, is_causal: bool, block_size: int):
        out, lse = _tiled_forward(q, k, v, sink, is_causal, block_size)
        ctx.save_for_backward(q, k, v, sink, out, lse)
        ctx.is_causal, ctx.block_size = is_causal, block_size
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        q, k, v, sink, out, lse = ctx.saved_tensors
        dq, dk, dv, dsink = _tiled_backward(q, k, v, sink, out, lse, grad_out, ctx.is_causal, ctx.block_size)
        return dq, dk, dv, dsink, None, None


def tiled_attention(
    q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool = False, block_size: int = 64, sink: Tensor | None = None
) -> Tensor:
    """softmax(q k^T / sqrt(d)) v, one ``(block_size, block_size)`` tile at a time (chapter "Long context and
    precision").

    ``q (B, h, T_q, d)``, ``k (B, h, T_k, d)``, ``v (B, h, T_k, d_v)`` in, ``(B, h, T_q, d_v)``
    out, equal to ``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=...)``
    up to rounding. Each block of queries reads the key/value blocks one after the other with
    the online softmax (a running max, a running sum and a running weighted sum of values,
    rescaled whenever the max grows), so the ``(T_q, T_k)`` score matrix never exists: besides
    the output, memory holds a few ``(block_size, block_size)`` tiles, so it grows linearly in T,
    not as T^2. The backward pass recomputes each tile's weights from the saved output and each
    query's log-sum-exp (the FlashAttention recipe), so training memory is linear in T too.
    float16 and bfloat16 inputs keep their statistics and sums in float32.

    ``is_causal=True`` lets query ``i`` see keys ``0 .. i`` and needs ``T_q == T_k`` (the case
    where PyTorch's top-left causal mask and :func:`~transformer_lib.masks.causal_mask` agree);
    key blocks that lie wholly after a query block are skipped, not computed and masked. The
    result is differentiable once (no double backward).

    ``sink (h,)`` (chapter "Latent, sparse and sink attention"): one learned logit per head, in every query's softmax
    denominator but with no value (gpt-oss's attention sink); the running max starts at it. It is
    differentiable too.
    """
    _check_tiled_inputs(q, k, v, is_causal, block_size)
    if sink is not None:
        _check_sink(sink, q, "q", (q.shape[1],), "(h,)")
        if sink.shape != (q.shape[1],):
            raise ValueError(
                f"sink must have shape (h,) = ({q.shape[1]},), one logit per head, got {tuple(sink.shape)}"
            )
    return _TiledAttention.apply(q, k, v, sink, is_causal, block_size)
