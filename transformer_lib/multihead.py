"""Multi-head attention (chapter "Multi-head attention").

``h`` heads each attend in a ``d_k = d_model / h`` wide subspace; the efficient version does all
heads in one batched matrix product by reshaping ``(B, T, d_model)`` to ``(B, h, T, d_k)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_bool, check_divisible, check_float_tensors, check_int, check_kv_heads, check_probability
from .attention import check_mask, masked_softmax, scaled_dot_product_attention
from .kv_cache import KVCache, check_cache
from .masks import causal_mask, sliding_window_mask

__all__ = ["MultiHeadAttention", "Projection", "RecordsScores", "head_contributions", "merge_heads", "split_heads"]


def _sdpa_has_gqa() -> bool:
    """Does the fused kernel share K/V heads itself (``enable_gqa=True``, PyTorch >= 2.5)? One call tells."""
    q, kv = torch.zeros(1, 2, 1, 1), torch.zeros(1, 1, 1, 1)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except (TypeError, RuntimeError):
        return False
    return True


_SDPA_HAS_GQA = _sdpa_has_gqa()


class Projection(NamedTuple):
    """One of the Q, K, V projections of a :class:`MultiHeadAttention` (chapter "Multi-head attention").

    ``weight (d_out, d_model)`` and ``bias (d_out,)`` (or None) are *views* of rows of the
    layer's fused ``in_proj_weight`` and ``in_proj_bias``: reading them, or writing into them
    under ``torch.no_grad()``, reads or changes the layer. ``proj(x)`` maps ``(..., d_model)`` to
    ``(..., d_out)`` like an ``nn.Linear``. ``d_out`` is ``d_model``, except for the keys and
    values of grouped-query attention (chapter "Generation"), where it is ``n_kv_heads * d_k``.
    """

    weight: Tensor
    bias: Tensor | None

    def __call__(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


def _nan_rows_like(out: Tensor, q: Tensor) -> Tensor:
    """``out (B, T_q, d_model)`` with NaN in every row whose query ``q (B, h, T_q, d_k)`` holds a NaN
    or an inf in any head, as the hand-written path gives (some fused kernels return zeros there).
    ``max * 0`` is 0 or NaN (max propagates NaN and never overflows): no copy of the heads."""
    marks = q.detach().amax(dim=(1, 3)).unsqueeze(-1)  # (B, T_q, 1)
    return torch.add(out, marks, alpha=0)  # 0 * NaN and 0 * inf are NaN


def _split(x: Tensor, n_heads: int) -> Tensor:
    """:func:`split_heads` for a width already checked."""
    B, T, d_model = x.shape
    return x.view(B, T, n_heads, d_model // n_heads).transpose(1, 2)  # (B, h, T, d_k)


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """``(B, T, d_model)`` -> ``(B, h, T, d_k)`` with ``d_k = d_model / h`` (chapter "Multi-head attention").

    ``n_heads`` must be a positive int dividing ``d_model``."""
    if not isinstance(x, Tensor) or x.dim() != 3:
        raise ValueError(f"split_heads expects x of shape (B, T, d_model), got {getattr(x, 'shape', type(x).__name__)}")
    B, T, d_model = x.shape
    check_int(n_heads, "n_heads")
    if d_model % n_heads:
        raise ValueError(f"split_heads: the width d_model={d_model} is not divisible by n_heads={n_heads}")
    return x.view(B, T, n_heads, d_model // n_heads).transpose(1, 2)  # (B, h, T, d_k)


def merge_heads(x: Tensor) -> Tensor:
    """``(B, h, T, d_k)`` -> ``(B, T, h * d_k)``, the inverse of :func:`split_heads` (chapter "Multi-head
    attention")."""
    if not isinstance(x, Tensor) or x.dim() != 4:
        raise ValueError(f"merge_heads expects x of shape (B, h, T, d_k), got {getattr(x, 'shape', type(x).__name__)}")
    B, h, T, d_k = x.shape
    return x.transpose(1, 2).reshape(B, T, h * d_k)  # (B, T, d_model)


class RecordsScores:
    """The one hook through which the inspection tools read an attention layer's scores (chapter
    "What attention learns").

    ``with layer.record_scores(callback): ...`` asks the layer to call ``callback(logits,
    weights)`` once in each of its forward passes inside the block. ``logits (B, h, T_q, T_k)``
    are the scaled scores ``q . k / sqrt(d)`` of every query-key pair, masked pairs included (a
    mask hides a score, it does not change it); ``weights (B, h, T_q, T_k)`` are the attention
    probabilities the layer mixes its values with, before dropout, zero where a key is hidden.
    Both are detached. A layer whose mixing has no softmax (a recurrence, chapter "Attention as
    a recurrence") passes ``logits=None`` and its mixing matrix as ``weights``. The layer's own
    output does not change: the record is computed beside it, without gradients. A layer run
    with a key-value cache while it records raises ``ValueError``: the record is of a whole
    sequence. Several callbacks may record at once; each leaves when its ``with`` block ends,
    also on an error.

    Every attention layer of the library inherits this class and computes its record in
    ``forward``; a new kind of attention may inherit it too, or offer its own ``record_scores``
    with the same meaning. Tools such as :func:`~transformer_lib.inspect_heads.capture_attention`
    and :func:`~transformer_lib.modern_block.attention_logit_max` use nothing else.
    """

    _score_callbacks: tuple = ()  # the callbacks recording now; none by default

    @contextmanager
    def record_scores(self, callback: Callable[[Tensor | None, Tensor], object]) -> Iterator[None]:
        """Call ``callback(logits, weights)`` in every forward pass inside the ``with`` block."""
        if not callable(callback):
            raise TypeError(f"record_scores needs a function callback(logits, weights), got {type(callback).__name__}")
        self._score_callbacks = (*self._score_callbacks, callback)
        try:
            yield
        finally:
            rest = tuple(c for c in self._score_callbacks if c is not callback)
            if rest:
                self._score_callbacks = rest
            else:
                del self._score_callbacks  # the class's empty tuple again

    def _recording(self, cache: object) -> bool:
        """Does this forward pass record its scores? A cache cannot be recorded: ``ValueError``."""
        if not self._score_callbacks:
            return False
        if cache is not None:
            raise ValueError(
                f"{type(self).__name__} records its scores over a whole sequence, not through a KVCache: "
                "run the model without cache= while recording"
            )
        return True

    def _report_scores(self, scores: Callable[[], tuple[Tensor | None, Tensor]]) -> None:
        """Compute ``(logits, weights)`` with ``scores()``, without gradients, and give them to every callback."""
        with torch.no_grad():
            logits, weights = scores()
        for callback in self._score_callbacks:
            callback(logits, weights)


class MultiHeadAttention(RecordsScores, nn.Module):
    """Multi-head attention with Q, K, V and output projections (chapter "Multi-head attention").

    The three input projections are stored as ``torch.nn.MultiheadAttention`` stores them: one
    ``in_proj_weight`` of shape ``(3 d_model, d_model)`` (the rows of ``W_q``, then ``W_k``, then
    ``W_v``) and one ``in_proj_bias (3 d_model,)``, so self-attention computes Q, K and V with a
    single matrix product. ``q_proj``, ``k_proj`` and ``v_proj`` are :class:`Projection` views of
    their rows.

    :meth:`forward` says what goes in and comes out. Chapter "Generation" adds ``n_kv_heads`` (keyword,
    default ``n_heads``): grouped-query attention. Only ``n_kv_heads`` key and value heads are
    computed, each shared by ``n_heads / n_kv_heads`` consecutive query heads (``n_kv_heads =
    1``: multi-query attention). ``in_proj_weight`` is then ``(d_model + 2 n_kv_heads d_k,
    d_model)``, ``k_proj`` and ``v_proj`` map to ``n_kv_heads * d_k`` features.
    """

    part_role, part_matrices = "attention", {"qkv": "in_proj_weight", "out": "out_proj.weight"}  # see parts.py

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        n_kv_heads: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        _checked: bool = False,
    ):
        super().__init__()
        check_divisible(d_model, n_heads)
        check_probability(dropout, "dropout")
        check_bool(bias, "bias")
        if not _checked:  # a layer building its attention checked n_kv_heads already
            check_kv_heads(n_kv_heads, n_heads)
        if n_kv_heads is None:
            n_kv_heads = n_heads
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.n_kv_heads = n_kv_heads
        self.dropout = dropout
        d_kv = n_kv_heads * self.d_k  # the width of K and of V: d_model unless grouped
        self.in_proj_weight = nn.Parameter(torch.empty(d_model + 2 * d_kv, d_model))  # rows: W_q, W_k, W_v
        self.in_proj_bias = nn.Parameter(torch.empty(d_model + 2 * d_kv)) if bias else None
        with torch.no_grad():  # each block as nn.Linear(d_model, d_out) initialises itself, in the same order
            for proj in (self.q_proj, self.k_proj, self.v_proj):
                nn.init.kaiming_uniform_(proj.weight, a=math.sqrt(5))
                if proj.bias is not None:
                    nn.init.uniform_(proj.bias, -1 / math.sqrt(d_model), 1 / math.sqrt(d_model))
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.qk_transform = None  # chapter "Today's block": a module applied to q and k (rotary, query-key norm), or
        # None

    @property
    def _widths(self) -> tuple[int, int, int]:
        d_kv = self.n_kv_heads * self.d_k
        return self.d_model, d_kv, d_kv  # the rows of W_q, W_k, W_v

    def _projection(self, i: int) -> Projection:
        widths = self._widths
        start = sum(widths[:i])
        rows = slice(start, start + widths[i])
        bias = self.in_proj_bias[rows] if self.in_proj_bias is not None else None
        return Projection(self.in_proj_weight[rows], bias)

    @property
    def q_proj(self) -> Projection:
        """The query projection ``W_q``: rows ``0 .. d_model - 1`` of ``in_proj_weight``."""
        return self._projection(0)

    @property
    def k_proj(self) -> Projection:
        """The key projection ``W_k``: the next ``n_kv_heads * d_k`` rows (``d_model`` by default)."""
        return self._projection(1)

    @property
    def v_proj(self) -> Projection:
        """The value projection ``W_v``: the last ``n_kv_heads * d_k`` rows (``d_model`` by default)."""
        return self._projection(2)

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``q (B, h, T_q, d_k)``, ``k`` and ``v`` ``(B, n_kv_heads, T_k, d_k)``: one matrix product
        when ``query``, ``key`` and ``value`` are the same tensor (self-attention), two when only
        ``key`` and ``value`` are (cross-attention), three otherwise."""
        h, h_kv = self.n_heads, self.n_kv_heads
        widths = self._widths
        if query is key and key is value:
            qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)  # (B, T, d_model + 2 d_kv)
            q, k, v = qkv.split(widths, dim=-1)
            return _split(q, h), _split(k, h_kv), _split(v, h_kv)
        q = _split(self.q_proj(query), h)  # (B, h, T_q, d_k)
        k, v = self._project_kv(key, value)
        return q, k, v

    def _project_kv(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """``k, v (B, n_kv_heads, T_k, d_k)``; one matrix product when ``key is value``."""
        h_kv, d = self.n_kv_heads, self.d_model
        if key is value:
            w, b = self.in_proj_weight[d:], None if self.in_proj_bias is None else self.in_proj_bias[d:]
            k, v = F.linear(key, w, b).split(self._widths[1:], dim=-1)  # (B, T_k, d_kv) each
            return _split(k, h_kv), _split(v, h_kv)
        return _split(self.k_proj(key), h_kv), _split(self.v_proj(value), h_kv)

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
            new.out_proj.weight.copy_(m.out_proj.weight)
            if has_bias:
                new.in_proj_bias.copy_(m.in_proj_bias)
                new.out_proj.bias.copy_(m.out_proj.bias)
        return new

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        *,
        mask: Tensor | None = None,
        need_weights: bool = False,
        is_causal: bool = False,
        window: int | None = None,
        cache: KVCache | None = None,
        _checked: bool = False,
        _trusted: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """``query (B, T_q, d_model)``, ``key`` and ``value`` ``(B, T_k, d_model)``, floating point
        of one dtype -> ``(output (B, T_q, d_model), weights (B, h, T_q, T_k) or None)``.

        ``mask``: boolean (True = may attend), broadcastable to ``(B, h, T_q, T_k)``; ``is_causal``
        adds a causal mask, ``window=w`` (chapter "Long context and precision") a sliding window: each query sees itself
        and the ``w - 1`` keys before it. ``need_weights``: return the weights, computed by the
        hand-written :func:`~transformer_lib.attention.scaled_dot_product_attention` (after dropout
        in train mode); without it, PyTorch's fused kernel computes the same function. ``cache``
        (a :class:`~transformer_lib.kv_cache.KVCache`, chapter "Generation"): the new queries come after
        ``T_cached`` positions, so masks and weights have ``T_k = T_cached + T_new`` keys; a filled
        static cache stands in for ``key`` and ``value``.

        NaN: a NaN in a query (after projection) gives NaN in that query's row; a query whose keys
        are all masked gets zeros. A NaN (or inf) in a masked key's *value* still reaches every
        other output row: its weight is exactly 0, but 0 * NaN is NaN, in both paths and in
        PyTorch's own kernel. Masking does not protect from NaN in the values: clean the padding.
        """
        # _checked: the caller checked `window`; _trusted: a model checked every input once per call
        if not _trusted:
            self._check_inputs(query, key, value, is_causal, window, cache, _checked)
        B, T_q, _ = query.shape
        T_k = key.shape[1] if cache is None else cache.keys_after(key.shape[1])
        if not _trusted:
            check_mask(mask, torch.Size((B, self.n_heads, T_q, T_k)))
        recording = self._recording(cache)
        q, k, v = self._project_cached(query, key, value, cache)  # (B, h, T_q, d_k), (B, h_kv, T_k, d_k)
        if recording:  # the weights' mask, as need_weights=True builds it (no query: nothing to mask)
            seen = self._causal(mask, T_q, T_k, window, True, query.device) if is_causal and T_q else mask
            self._report_scores(lambda: self._scores(q, k, seen))
        if is_causal:
            mask = self._causal(mask, T_q, T_k, window, need_weights, query.device)
        p = self.dropout if self.training else 0.0
        if need_weights:
            out, weights = self._attend_by_hand(q, k, v, mask, p)  # (B, h, T_q, d_k), (B, h, T_q, T_k)
            return self.out_proj(merge_heads(out)), weights  # (B, T_q, d_model)
        if mask is not None:
            return self.out_proj(merge_heads(self._attend_fused_masked(q, k, v, mask, p))), None
        # no mask (the causal case goes to the fused kernel's own causal path): every query has a
        # key, and a NaN query must give a NaN output row, as in the hand-written path
        out = self._attend_fused(q, k, v, None, p, causal=is_causal and T_q == T_k)  # (B, h, T_q, d_k)
        return _nan_rows_like(self.out_proj(merge_heads(out)), q), None  # (B, T_q, d_model)

    def _check_inputs(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        is_causal: bool,
        window: int | None,
        cache: KVCache | None,
        window_checked: bool = False,
    ) -> None:
        """The checks of :meth:`forward`: shapes and dtypes, the window (unless already checked), the cache."""
        check_float_tensors({"query": query, "key": key, "value": value}, layer_dtype=self.in_proj_weight.dtype)
        for name, t in (("query", query), ("key", key), ("value", value)):
            if t.dim() != 3 or t.shape[-1] != self.d_model:
                raise ValueError(f"{name} must have shape (B, T, d_model={self.d_model}), got {tuple(t.shape)}")
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ValueError(
                f"query, key and value must share B, and key/value must share T_k: got {tuple(query.shape)}, "
                f"{tuple(key.shape)}, {tuple(value.shape)}"
            )
        if window is not None and not window_checked:
            check_int(window, "window")
            if not is_causal:
                raise ValueError(f"window={window} is sliding-window *causal* attention: pass is_causal=True too")
        if cache is not None:
            check_cache(cache, window, query.shape[0])

    def _project_cached(self, query: Tensor, key: Tensor, value: Tensor, cache: KVCache | None) -> tuple[Tensor, ...]:
        """:meth:`project`, with the keys and values added to the cache (chapter "Generation"), or read from
        a filled static one (cross-attention after the first step)."""
        if cache is not None and cache.static and cache.filled:
            return _split(self.q_proj(query), self.n_heads), cache.k, cache.v
        q, k, v = self.project(query, key, value)  # (B, h, T_q, d_k), (B, h_kv, T_new, d_k) twice
        if self.qk_transform is not None:  # chapter "Today's block": before the cache, so that it holds rotated keys
            q, k = self.qk_transform(q, k, 0 if cache is None else cache.position)
        if cache is not None:
            k, v = cache.set(k, v) if cache.static else cache.append(k, v)  # (B, h_kv, T_k, d_k)
        return q, k, v

    def _shared_kv(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Grouped-query attention (chapter "Generation"): query head i reads K/V head i // group, so each
        K/V head is repeated ``group`` times, ``(B, h_kv, T_k, d_k)`` -> ``(B, h, T_k, d_k)``."""
        group = self.n_heads // self.n_kv_heads
        if group == 1:
            return k, v
        return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    def _scores(self, q: Tensor, k: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """The record of :meth:`record_scores`: ``q (B, h, T_q, d_k)`` and ``k (B, h_kv, T_k, d_k)`` ->
        ``logits (B, h, T_q, T_k)``, every pair's ``q . k / sqrt(d_k)``, and the weights the
        hand-written attention computes from them under ``mask``, before dropout."""
        group = self.n_heads // self.n_kv_heads  # grouped-query attention: query head i reads key head i // group
        k = k.repeat_interleave(group, dim=1) if group > 1 else k  # (B, h, T_k, d_k)
        logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # as scaled_dot_product_attention scores
        return logits, masked_softmax(logits, mask)

    def _attend_by_hand(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p: float) -> tuple[Tensor, Tensor]:
        """The library's hand-written attention, which returns the weights ``(B, h, T_q, T_k)``."""
        k, v = self._shared_kv(k, v)  # (B, h, T_k, d_k)
        return scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=p)  # (B, h, T_q, d_k), weights

    def _attend_fused(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p: float, causal: bool = False
    ) -> Tensor:
        """PyTorch's fused kernel, without the weights: ``(B, h, T_q, d_k)``. ``causal``: its own
        causal path, no mask. A NaN query may come out as zeros here (PyTorch's CPU flash kernel
        does that); :meth:`forward` marks its row NaN after the output projection."""
        gqa = {"enable_gqa": True} if self.n_kv_heads != self.n_heads and _SDPA_HAS_GQA else {}
        if not gqa:  # the kernel cannot share K/V heads itself
            k, v = self._shared_kv(k, v)  # (B, h, T_k, d_k)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal, **gqa)

    def _attend_fused_masked(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, p: float) -> Tensor:
        """:meth:`_attend_fused` with a mask, the same function as :meth:`_attend_by_hand`: a query
        with no key gets zeros (it attends everywhere, then is zeroed), a NaN query NaN."""
        any_key = mask.any(dim=-1, keepdim=True)  # (..., T_q, 1)
        out = self._attend_fused(q, k, v, mask | ~any_key, p)  # (B, h, T_q, d_k)
        nan_rows = q.detach().amax(dim=-1, keepdim=True) * 0  # (B, h, T_q, 1), 0 or NaN
        return torch.where(any_key, out + nan_rows, 0.0)

    @staticmethod
    def _causal(
        mask: Tensor | None, T_q: int, T_k: int, window: int | None, need_weights: bool, device: torch.device
    ) -> Tensor | None:
        """``mask`` and the causal (or sliding-window) mask, end-aligned; None where the fused
        kernel's own causal path can do it (``T_q == T_k``, no other mask, no weights) or where
        nothing is masked (one query at the end, all keys within the window)."""
        if window is None or window >= T_k:  # the window hides nothing: plain causal attention
            if T_q == T_k and mask is None and not need_weights:
                return None  # the fused kernel's own causal path
            if T_q == 1 and T_k > 1:
                return mask  # one new query at the end sees every key
            structural = causal_mask(T_q, T_k, device=device)  # (T_q, T_k)
        else:
            structural = sliding_window_mask(T_q, T_k, window, device=device)  # (T_q, T_k)
        return structural if mask is None else mask & structural


def head_contributions(
    mha: MultiHeadAttention, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None, is_causal=False
) -> Tensor:
    """Each head's additive share of a :class:`MultiHeadAttention` output (chapter "Multi-head attention").

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
