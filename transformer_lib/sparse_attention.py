"""Sparse attention by selection (chapter "Latent, sparse and sink attention"): DeepSeek-V3.2's.

A cheap :class:`Indexer` scores every earlier key for each query, which attends only to its
``top_k`` best keys. The indexer learns beside the model to imitate the dense attention, by an
auxiliary loss (:class:`AddAuxiliaryLoss`) on detached tensors: the model's training is unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_base, check_bool, check_float_tensors, check_int, check_layer_dtype, check_window, is_real
from ._specs import Spec, option
from .attention import check_mask, masked_softmax, scaled_dot_product_attention
from .kv_cache import KVCache, crop_positions, is_prefix, select_rows
from .masks import sliding_window_mask
from .modern_block import qk_transformed
from .multihead import MultiHeadAttention, merge_heads
from .positional import apply_rotary

__all__ = [
    "AddAuxiliaryLoss",
    "Indexer",
    "SparseAttention",
    "SparseCache",
    "SparseSpec",
    "select_keys",
]


def _top_k(scores: Tensor, top_k: int) -> Tensor:
    """The positions ``(..., T_q, n)`` of the ``n = min(top_k, T_k)`` highest ``scores (..., T_q, T_k)``
    in each row; of equal scores the earliest key, so a row gives the same keys whatever its length,
    with a cache or without."""
    n = min(top_k, scores.shape[-1])
    best, at = scores.topk(n, dim=-1)  # (..., T_q, n); equal scores in no promised order
    kth = best[..., -1:]
    tied = (scores == kth).sum(-1) > (best == kth).sum(-1)  # (..., T_q): an equal score left out
    if tied.any():  # such rows (relu makes exact zeros common) take the earliest of the equal keys
        rows = torch.nan_to_num(scores[tied], nan=-math.inf, posinf=math.inf, neginf=-math.inf)  # (R, T_k)
        kth = rows.topk(n, dim=-1).values[:, -1:]
        above, equal = rows > kth, rows == kth
        chosen = above | (equal & (equal.cumsum(-1) <= n - above.sum(-1, keepdim=True)))  # n per row
        at[tied] = chosen.nonzero()[:, -1].view(-1, n)  # nonzero lists each row's keys in order
    return at


def _chosen(at: Tensor, T_k: int) -> Tensor:
    """Positions ``(..., T_q, n)`` -> bool ``(..., T_q, T_k)``, True at them."""
    return torch.zeros((*at.shape[:-1], T_k), dtype=torch.bool, device=at.device).scatter_(-1, at, True)


def select_keys(scores: Tensor, top_k: int, mask: Tensor | None = None) -> Tensor:
    """The keys each query keeps (chapter "Latent, sparse and sink attention"): ``scores (B, T_q, T_k)`` and ``mask``
    (True = may attend, broadcastable to ``scores``) -> bool ``(B, T_q, T_k)``, True at the ``top_k`` highest
    scores among the keys ``mask`` allows, fewer where fewer are allowed. Of equal scores the earliest
    key goes first."""
    check_float_tensors({"scores": scores})
    check_int(top_k, "top_k")
    if mask is not None:
        check_mask(mask, scores.shape)
        scores = scores.masked_fill(~mask, float("-inf"))
    chosen = _chosen(_top_k(scores, top_k), scores.shape[-1])
    return chosen if mask is None else chosen & mask  # a masked key ranked only for want of others


def _any_head(visible: Tensor | None) -> Tensor | None:
    """A mask broadcastable to ``(B, h, T_q, T_k)`` -> the keys some head may see, broadcastable to
    ``(B, T_q, T_k)`` (no pass over the heads when the mask has none)."""
    if visible is None or visible.dim() < 3:
        return visible
    return visible.any(-3) if visible.shape[-3] > 1 else visible.squeeze(-3)


class Indexer(nn.Module):
    """DeepSeek-V3.2's lightning indexer (chapter "Latent, sparse and sink attention"): a small, cheap attention that
    scores keys.

    ``Indexer(d_model, n_heads, head_dim, *, rope_dim=0, q_dim=None, rotary_base=10000.0)``: its
    ``n_heads`` query heads of width ``head_dim`` come from ``q_proj`` (reading ``q_dim``-wide
    inputs, ``d_model`` by default), its one key per position from ``k_proj`` then the LayerNorm
    ``k_norm``, and a weight per head and query from ``weights_proj``. The score of key ``t`` for
    query ``s`` is ``sum_h w[s, h] / sqrt(n_heads) * relu(q[s, h] . k[t] / sqrt(head_dim))``. The
    first ``rope_dim`` dimensions of every query head and key are rotated by their positions
    (chapter "Positional encoding"'s interleaved pairs, :func:`~transformer_lib.positional.apply_rotary`).
    """

    def __init__(
        self, d_model: int, n_heads: int, head_dim: int, *, rope_dim: int = 0, q_dim: int | None = None,
        rotary_base: float = 10000.0,
    ):  # fmt: skip
        super().__init__()
        for value, name in ((d_model, "d_model"), (n_heads, "n_heads"), (head_dim, "head_dim")):
            check_int(value, name)
        check_int(rope_dim, "rope_dim", minimum=0)
        if rope_dim % 2 or rope_dim > head_dim:
            raise ValueError(
                f"rope_dim must be even (pairs are rotated) and at most head_dim={head_dim}, got {rope_dim}"
            )
        if q_dim is not None:
            check_int(q_dim, "q_dim")
        check_base(rotary_base, "rotary_base")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, head_dim
        self.rope_dim, self.rotary_base = rope_dim, float(rotary_base)
        self.q_proj = nn.Linear(q_dim or d_model, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, head_dim, bias=False)
        self.k_norm = nn.LayerNorm(head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(d_model, n_heads, bias=False)

    def _rotate(self, x: Tensor, start: int) -> Tensor:
        """``x (..., T, head_dim)`` at positions ``start ..``, its first ``rope_dim`` dimensions rotated."""
        if not self.rope_dim:
            return x
        positions = torch.arange(start, start + x.shape[-2], device=x.device)
        rotated = apply_rotary(x[..., : self.rope_dim], positions, base=self.rotary_base)
        return torch.cat([rotated, x[..., self.rope_dim :]], dim=-1)

    def _check(self, x: Tensor, name: str = "x") -> None:
        check_layer_dtype(x, self, name)
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"{name} must have shape (B, T, d_model={self.d_model}), got {tuple(x.shape)}")

    def keys(self, x: Tensor, start: int = 0) -> Tensor:
        """``x (B, T, d_model)`` at positions ``start ..`` -> the rotated key rows ``(B, T, head_dim)``."""
        self._check(x)
        check_int(start, "start", minimum=0)
        return self._rotate(self.k_norm(self.k_proj(x)), start)

    def forward(self, x: Tensor, q_input: Tensor | None = None, start: int = 0, keys: Tensor | None = None) -> Tensor:
        """``x (B, T_q, d_model)`` (the new tokens, from position ``start``) -> index scores
        ``(B, T_q, T_k)``. ``q_input (B, T_q, q_dim)``: what the queries are read from (default
        ``x``); ``keys (B, T_k, head_dim)``: the key rows to score (default ``keys(x, start)``)."""
        self._check(x)
        check_int(start, "start", minimum=0)
        q_input = x if q_input is None else q_input
        check_float_tensors({"x": x, "q_input": q_input})
        if q_input.shape[:2] != x.shape[:2] or q_input.shape[-1] != self.q_proj.in_features:
            raise ValueError(
                f"q_input must have shape {(*x.shape[:2], self.q_proj.in_features)}, got {tuple(q_input.shape)}"
            )
        keys = self.keys(x, start) if keys is None else keys
        if keys.dim() != 3 or keys.shape[0] != x.shape[0] or keys.shape[-1] != self.head_dim:
            raise ValueError(
                f"keys must have shape (B={x.shape[0]}, T_k, head_dim={self.head_dim}), got {tuple(keys.shape)}"
            )
        B, T, _ = x.shape
        q = self._rotate(self.q_proj(q_input).view(B, T, self.n_heads, self.head_dim).transpose(1, 2), start)
        logits = F.relu(q @ keys.unsqueeze(1).transpose(-2, -1) * self.head_dim**-0.5)  # (B, H, T_q, T_k)
        w = self.weights_proj(x) * self.n_heads**-0.5  # (B, T_q, H)
        return torch.einsum("bsh,bhst->bst", w, logits)  # (B, T_q, T_k)

    scores = forward  # indexer.scores(x, ...): the same call, by its name


class AddAuxiliaryLoss(torch.autograd.Function):
    """An auxiliary loss that reaches backward with no change to the training loop (chapter "Latent, sparse and sink
    attention"): ``AddAuxiliaryLoss.apply(out, loss, weight)`` returns ``out`` unchanged; in backward its gradient
    passes through and the scalar ``loss`` gets ``weight``, as if ``weight * loss`` joined the loss."""

    @staticmethod
    def forward(ctx, out: Tensor, loss: Tensor, weight: float) -> Tensor:
        """``out`` (any shape), unchanged."""
        ctx.weight, ctx.like = float(weight), loss.detach()
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        """``out``'s gradient passed through; ``weight`` for the loss."""
        loss_grad = torch.full_like(ctx.like, ctx.weight) if ctx.needs_input_grad[1] else None
        return grad, loss_grad, None


class SparseCache(KVCache):
    """A :class:`~transformer_lib.kv_cache.KVCache` that also keeps the indexer's key rows (chapter "Latent, sparse and
    sink attention"): ``index_keys (B, T_cached, index_dim)``, at the same positions as the keys (with a window, the
    last ``window - 1``), appended as the keys are (outside autograd, into a buffer whose capacity
    doubles). :meth:`SparseAttention.new_cache` makes one."""

    def __init__(self, *, window: int | None = None, _checked: bool = False):
        super().__init__(window=window, _checked=_checked)
        self.index_keys: Tensor | None = None  # (B, T_cached, index_dim)
        self._index_buffer: Tensor | None = None  # (B, capacity, index_dim)

    def append_index(self, keys: Tensor) -> Tensor:
        """Add the new key rows ``(B, T_new, index_dim)``; returns all of them ``(B, T_cached + T_new, index_dim)``.
        Rows of another batch size, width or dtype than those held are refused: start a new cache."""
        old = self.index_keys
        if old is not None and (keys.shape[::2] != old.shape[::2] or keys.dtype != old.dtype):
            raise ValueError(
                f"SparseCache holds index keys (B, T, index_dim) = {tuple(old.shape)} {old.dtype}; cannot add "
                f"{tuple(keys.shape)} {keys.dtype} (a different batch, layer or dtype: start a new cache)"
            )
        held = 0 if old is None else old.shape[1]
        if self.window is not None or (torch.is_grad_enabled() and keys.requires_grad):
            self._index_buffer = None
            if self.index_keys is not None:
                keys = torch.cat([self.index_keys, keys], dim=1)
            keep = keys.shape[1] if self.window is None else min(keys.shape[1], self.window - 1)
            self.index_keys = keys[:, keys.shape[1] - keep :]
            return keys
        need = held + keys.shape[1]
        if self._index_buffer is None or need > self._index_buffer.shape[1]:
            buffer = keys.new_empty(keys.shape[0], max(need, 2 * held), keys.shape[2])
            buffer[:, :held] = 0 if self.index_keys is None else self.index_keys
            self._index_buffer = buffer
        self._index_buffer[:, held:need] = keys
        self.index_keys = self._index_buffer[:, :need]  # a view: (B, T_cached + T_new, index_dim)
        return self.index_keys

    def nbytes(self) -> int:
        """Bytes of the cached keys, values and index keys."""
        held = self.index_keys
        return super().nbytes() + (0 if held is None else held.numel() * held.element_size())

    def reset(self) -> None:
        """Empty the cache."""
        super().reset()
        self.index_keys = self._index_buffer = None

    def crop(self, n: int) -> None:
        """Back to what the cache held after its first ``n`` tokens, index keys included (chapter "Generation"'s
        protocol, :mod:`~transformer_lib.kv_cache`)."""
        index = crop_positions(self.position, self.length, n, window=self.window, what="this SparseCache")
        super().crop(n)
        if index.numel() == 0:
            self.index_keys = self._index_buffer = None
        elif is_prefix(index):
            self.index_keys = self.index_keys[:, : index.numel()]
        else:
            self._index_buffer = None
            self.index_keys = self.index_keys[:, index]

    def select(self, rows) -> None:
        """Keep the batch rows ``rows`` of the keys, values and index keys."""
        if self.index_keys is not None:
            index = select_rows(rows, self.index_keys.shape[0], "this SparseCache")
            self._index_buffer = None
            self.index_keys = self.index_keys[index]
        super().select(rows)


class SparseAttention(MultiHeadAttention):
    """Causal self-attention in which each query attends only to the keys an :class:`Indexer`
    selects (chapter "Latent, sparse and sink attention", DeepSeek-V3.2's sparse attention).

    ``SparseAttention(d_model, n_heads, *, top_k, index_heads=None, index_dim=None, rope_dim=None,
    rotary_base=10000.0, index_loss_weight=1.0, n_kv_heads=None, dropout=0.0, bias=True)``: the
    parent's projections, plus ``indexer`` (``index_heads`` heads, default ``n_heads``, of width
    ``index_dim``, default ``d_k``). Each query keeps its ``top_k`` best-scored keys among those
    the causal, window and given masks allow; with ``top_k`` at least the visible keys it is
    exactly dense attention. ``rope_dim`` (default: all of ``index_dim`` while the layer has a
    rotary ``qk_transform``, none otherwise): the indexer's rotated dimensions, base ``rotary_base``.

    In train mode with gradients on, the indexer learns to imitate the dense attention:
    ``index_loss = KL(p || softmax(index scores))``, ``p`` the dense attention weights summed over
    heads and renormalised, averaged over queries, computed from detached tensors (the indexer
    reads a detached ``x``), so the model's own gradients are unchanged. It reaches backward
    through :class:`AddAuxiliaryLoss` with weight ``index_loss_weight``; ``self.index_loss`` keeps
    its last value (a detached tensor).

    ``gathered`` (attribute, default False; or ``forward(..., gathered=)``): how the heads read the
    selected keys. False: every score of the heads is computed and the unselected ones masked, which
    saves no compute. True: the selected keys and values are gathered (``torch.gather``) and each
    query's heads score only those ``top_k``, ``T_q * top_k`` scores in place of ``T_q * T_k``. Both
    compute the same function; the indexer scores every earlier key either way.
    """

    def __init__(
        self, d_model: int, n_heads: int, *, top_k: int, index_heads: int | None = None, index_dim: int | None = None,
        rope_dim: int | None = None, rotary_base: float = 10000.0, index_loss_weight: float = 1.0,
        n_kv_heads: int | None = None, dropout: float = 0.0, bias: bool = True, _checked: bool = False,
    ):  # fmt: skip
        super().__init__(d_model, n_heads, n_kv_heads=n_kv_heads, dropout=dropout, bias=bias, _checked=_checked)
        check_int(top_k, "top_k")
        if not is_real(index_loss_weight):
            raise TypeError(f"index_loss_weight must be a number, got {index_loss_weight!r}")
        if not 0 <= index_loss_weight < math.inf:
            raise ValueError(f"index_loss_weight must be a finite number >= 0, got {index_loss_weight!r}")
        index_heads = n_heads if index_heads is None else index_heads
        index_dim = self.d_k if index_dim is None else index_dim
        check_int(index_heads, "index_heads")
        check_int(index_dim, "index_dim")
        self.top_k, self.index_loss_weight, self._rope_dim = top_k, float(index_loss_weight), rope_dim
        self.indexer = Indexer(d_model, index_heads, index_dim, rope_dim=rope_dim or 0, rotary_base=rotary_base)
        self.index_loss: Tensor | None = None
        self.gathered = False

    def extra_repr(self) -> str:
        return f"top_k={self.top_k}, index_loss_weight={self.index_loss_weight}"

    def new_cache(self, window: int | None = None) -> SparseCache:
        """An empty :class:`SparseCache` for this layer, keeping what ``window`` needs (chapter "Latent, sparse and sink
        attention")."""
        return SparseCache(window=window)

    def _ready_indexer(self) -> Indexer:
        """The indexer, rotating as the layer does when ``rope_dim`` was left to follow the layer."""
        if self._rope_dim is None:
            rotates = getattr(self.qk_transform, "rotary", None) is not None
            self.indexer.rope_dim = self.indexer.head_dim // 2 * 2 if rotates else 0
        return self.indexer

    def _learns(self) -> bool:  # does this call train the indexer?
        return self.training and torch.is_grad_enabled() and self.index_loss_weight > 0

    def _check_sparse(self, query: Tensor, key: Tensor, value: Tensor, is_causal: bool, cache) -> None:
        if key is not query or value is not query:
            raise ValueError("SparseAttention is self-attention: pass the same tensor as query, key and value")
        if not is_causal:
            raise ValueError("SparseAttention selects among each query's earlier keys: call it with is_causal=True")
        if cache is not None and not isinstance(cache, SparseCache):
            raise TypeError(f"cache must be a SparseCache (layer.new_cache()) or None, got {type(cache).__name__}")
        if cache is not None and cache.length != (0 if cache.index_keys is None else cache.index_keys.shape[1]):
            raise ValueError("this SparseCache holds keys without their index keys: start a new cache")

    def _select(self, x: Tensor, mask: Tensor | None, window: int | None, cache: SparseCache | None):
        """The projections (appended to ``cache``), the visible keys and the attended ones:
        ``q (B, h, T_q, d_k)``, ``k, v (B, h_kv, T_k, d_k)``, ``visible`` (None or broadcastable to
        ``(B, h, T_q, T_k)``), ``scores (B, T_q, T_k)`` and ``at (B, T_q, n)``: the positions of the keys
        ranked highest among the visible ones, ``n = min(top_k, T_k)`` per query (invisible ones where
        too few are visible: the attention leaves those out)."""
        start = 0 if cache is None else cache.position
        indexer = self._ready_indexer()
        with torch.set_grad_enabled(self._learns()):  # the indexer's graph only for its loss
            index_keys = indexer.keys(x.detach(), start)  # (B, T_q, index_dim)
            if cache is not None:
                index_keys = cache.append_index(index_keys)  # (B, T_k, index_dim)
            scores = indexer.scores(x.detach(), start=start, keys=index_keys)  # (B, T_q, T_k)
        q, k, v = self._project_cached(x, x, x, cache)  # (B, h, T_q, d_k), (B, h_kv, T_k, d_k)
        T_q, T_k = q.shape[2], k.shape[2]
        visible = self._causal(mask, T_q, T_k, window, True, x.device)  # None: every key
        per_query = _any_head(visible)  # None, or broadcastable to (B, T_q, T_k)
        ranked = scores.detach() if per_query is None else torch.where(per_query, scores.detach(), -math.inf)
        return q, k, v, visible, scores, _top_k(ranked, self.top_k)  # at: (B, T_q, min(top_k, T_k))

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, *, mask: Tensor | None = None, need_weights: bool = False,
        is_causal: bool = False, window: int | None = None, cache: SparseCache | None = None,
        gathered: bool | None = None, _checked: bool = False, _trusted: bool = False,
    ) -> tuple[Tensor, Tensor | None]:  # fmt: skip
        """``query (B, T, d_model)``, the same tensor as ``key`` and ``value``, with ``is_causal=True``
        -> ``(output (B, T, d_model), weights (B, h, T, T_k) or None)``, as
        :meth:`MultiHeadAttention.forward` (``mask``, ``window``, ``cache``: a :class:`SparseCache`),
        but each query attends only to the keys the indexer selects; the weights are zero elsewhere.
        ``gathered``: read only the selected keys (default ``self.gathered``; the same function)."""
        gathered = self.gathered if gathered is None else gathered
        check_bool(gathered, "gathered")
        self._check_sparse(query, key, value, is_causal, cache)
        if not _trusted:
            self._check_inputs(query, key, value, is_causal, window, cache, _checked)
            T_k = query.shape[1] + (0 if cache is None else cache.length)
            check_mask(mask, torch.Size((query.shape[0], self.n_heads, query.shape[1], T_k)))
        q, k, v, visible, scores, at = self._select(query, mask, window, cache)
        p = self.dropout if self.training else 0.0
        chosen = _chosen(at, k.shape[2])[:, None]  # (B, 1, T_q, T_k)
        attended = chosen if visible is None else visible & chosen  # (B, 1 or h, T_q, T_k)
        if self._recording(cache):  # record_scores: the logits of every pair, the weights on the selected keys
            self._report_scores(lambda: self._scores(q, k, attended))
        if gathered:
            heads, weights = self._attend_gathered(q, k, v, visible, at, p, need_weights)
        elif need_weights:  # every score computed, the keys not selected masked
            heads, weights = self._attend_by_hand(q, k, v, attended, p)  # (B, h, T, d_k), (B, h, T, T_k)
        else:
            heads, weights = self._attend_fused_masked(q, k, v, attended, p), None
        out = self.out_proj(merge_heads(heads))  # (B, T, d_model)
        if self._learns():
            loss = self._imitation_loss(q, k, visible, scores)
            self.index_loss = loss.detach()
            out = AddAuxiliaryLoss.apply(out, loss, self.index_loss_weight)
        return out, weights

    def _attend_gathered(
        self, q: Tensor, k: Tensor, v: Tensor, visible: Tensor | None, at: Tensor, p: float, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Attention over the selected keys alone: ``q (B, h, T_q, d_k)``, ``k, v (B, h_kv, T_k, d_k)``,
        ``at (B, T_q, n)`` (the selected positions) -> ``(B, h, T_q, d_k)`` and, with ``need_weights``,
        the weights scattered back to ``(B, h, T_q, T_k)``. Each query's ``n`` key and value rows are
        gathered, so the heads compute ``T_q * n`` scores, not ``T_q * T_k``."""
        B, h, T_q, d = q.shape
        h_kv, T_k, n = k.shape[1], k.shape[2], at.shape[-1]
        group = h // h_kv  # query head i reads K/V head i // group
        rows = (at + T_k * torch.arange(B, device=at.device)[:, None, None]).flatten()  # (B T_q n,)
        k_sel, v_sel = (  # a token's row holds all its K/V heads: one gather per selected key
            t.transpose(1, 2).reshape(B * T_k, h_kv * d).index_select(0, rows).view(B, T_q, n, h_kv, d) for t in (k, v)
        )  # (B, T_q, n, h_kv, d_k) each
        q = q.transpose(1, 2).reshape(B, T_q, h_kv, group, d)  # (B, T_q, h_kv, group, d_k)
        scores = q @ k_sel.permute(0, 1, 3, 4, 2) * d**-0.5  # (B, T_q, h_kv, group, n)
        keep = None  # a selected key the masks hide (a query with fewer than n visible keys)
        if visible is not None:
            visible = visible.reshape((1,) * (4 - visible.dim()) + visible.shape)  # (B or 1, h or 1, T_q, T_k)
            visible = visible.expand(B, -1, T_q, T_k)
            keep = visible.gather(-1, at[:, None].expand(B, visible.shape[1], T_q, n))  # (B, h or 1, T_q, n)
            keep = keep.expand(B, h, T_q, n).transpose(1, 2).reshape(B, T_q, h_kv, group, n)
        weights = masked_softmax(scores, keep)
        if p > 0:
            weights = F.dropout(weights, p)
        heads = (weights @ v_sel.transpose(2, 3)).view(B, T_q, h, d).transpose(1, 2)  # (B, h, T_q, d_k)
        if not need_weights:
            return heads, None
        spread = weights.new_zeros(B, h, T_q, T_k)
        return heads, spread.scatter_(-1, at[:, None].expand(B, h, T_q, n), weights.view(B, T_q, h, n).transpose(1, 2))

    def _imitation_loss(self, q: Tensor, k: Tensor, visible: Tensor | None, scores: Tensor) -> Tensor:
        """``KL(p || softmax(scores))`` averaged over the queries, ``p`` the dense attention of
        ``q (B, h, T_q, d_k)`` on ``k (B, h_kv, T_k, d_k)`` summed over heads, renormalised, detached."""
        with torch.no_grad():
            k_all = k.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)  # (B, h, T_k, d_k)
            dense = masked_softmax(q @ k_all.transpose(-2, -1) * self.d_k**-0.5, visible).sum(1)  # (B, T_q, T_k)
            p = dense / dense.sum(-1, keepdim=True).clamp_min(torch.finfo(dense.dtype).tiny)
        if visible is not None:
            per_query = visible.broadcast_to((*q.shape[:3], k.shape[2])).any(1)  # (B, T_q, T_k)
            scores = scores.masked_fill(~per_query, torch.finfo(scores.dtype).min)  # finite: 0 * min is 0
        return (torch.xlogy(p, p) - p * scores.log_softmax(-1)).sum(-1).mean()

    def attention_weights(
        self, query: Tensor, key: Tensor, value: Tensor, *, mask: Tensor | None = None, is_causal: bool = False,
        window: int | None = None, **_,
    ) -> Tensor:  # fmt: skip
        """The weights ``(B, h, T_q, T_k)`` of :meth:`forward` before dropout, zero at the keys not
        selected, for chapter "What attention learns"'s inspection tools (no cache)."""
        self._check_sparse(query, key, value, is_causal, None)
        q, k, v, visible, _, at = self._select(query, mask, window, None)
        k, v = self._shared_kv(k, v)  # (B, h, T_k, d_k)
        chosen = _chosen(at, k.shape[2])[:, None]  # (B, 1, T_q, T_k)
        attended = chosen if visible is None else visible & chosen
        return scaled_dot_product_attention(q, k, v, mask=attended)[1]

    @torch.no_grad()
    def selected(self, x: Tensor, start: int = 0, *, window: int | None = None) -> Tensor:
        """The keys each query of ``x (B, T, d_model)`` (at positions ``start ..``) attends to, without
        a cache: bool ``(B, T, T)``, True at most ``top_k`` times per row, never after the query."""
        check_float_tensors({"x": x})
        check_window(window)
        T = x.shape[1]
        allowed = sliding_window_mask(T, T, window or T, device=x.device)  # a window of T: causal
        return select_keys(self._ready_indexer().scores(x, start=start), self.top_k, allowed)


@dataclass(frozen=True)
class SparseSpec(Spec):
    """Sparse attention as a recipe's choice (chapter "Latent, sparse and sink attention"): each query
    reads the ``sparse_k`` keys an indexer picks (DeepSeek-V3.2's ``index_topk``)."""

    kind = "sparse"
    sparse_k: int | None = option(None, "sparse attention: the keys each query reads, picked by the indexer")
    qk_norm: bool = option(False, "RMSNorm on each head's queries and keys before the scores")

    def __post_init__(self):
        super().__post_init__()
        if self.sparse_k is None:
            raise ValueError("attention='sparse' needs sparse_k, the number of keys each query reads")
        check_int(self.sparse_k, "sparse_k")
        check_bool(self.qk_norm, "qk_norm")

    def check(self, recipe) -> None:
        """The indexer rotates its own keys: a rescaling of the positions would not reach it."""
        if getattr(recipe.positions, "scaling", None) is not None:
            raise ValueError("rope_scaling rescales multi-head attention's rotary positions: attention is 'sparse'")

    def layer(self, recipe, d_model: int, n_heads: int, *, n_kv_heads, dropout, self_attention) -> SparseAttention:
        """One layer, with the recipe's query-key transform; the indexer rotates half of its width
        with rotary positions, as DeepSeek's."""
        if not self_attention:
            raise ValueError(
                "attention='sparse' is a causal self-attention: an encoder-decoder's cross-attention is not"
            )
        rotary = recipe.positions.kind == "rotary"
        sparse = SparseAttention(
            d_model,
            n_heads,
            top_k=self.sparse_k,
            rope_dim=(d_model // n_heads) // 2 if rotary else 0,
            rotary_base=recipe.positions.base if rotary else 10000.0,
            n_kv_heads=n_kv_heads,
            dropout=dropout,
            bias=recipe.bias,
            _checked=True,
        )
        return qk_transformed(sparse, recipe, qk_norm=self.qk_norm)
