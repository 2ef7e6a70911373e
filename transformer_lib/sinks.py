"""Attention sinks (chapter "Latent, sparse and sink attention").

Softmax makes every query spend all of its attention somewhere, even when nothing in view is
worth reading. Trained models then park the surplus on a token that carries little, most often
the first one: an attention sink. Two ways to take that into account:

- a learned sink (gpt-oss): each head has one more logit, ``sinks[h]``, that joins every row's
  softmax denominator but has no value. The weights of the keys then sum to less than 1, and a
  head may attend to nothing. :func:`sink_softmax` is that softmax, :class:`SinkAttention` the
  attention that uses it;
- keep the first tokens (StreamingLLM): a sliding window drops old keys, and with them the
  first token the model had learned to park attention on. ``keep_first`` keeps the first keys
  in view of every query, in the mask (:func:`keep_first_mask`) and in the key-value cache
  (:class:`KeepFirstKVCache`).

The online softmax and the tiled attention of chapter "Long context and precision" take a learned
sink too (their ``sink`` argument): there it starts the running maximum and sum, inside the loop.

:func:`attention_sink_mass` measures how much of each head's attention a trained model gives to
position 0. Shapes: ``B`` batch, ``h`` heads, ``T_q``/``T_k`` query and key lengths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_bool, check_float_tensors, check_int
from ._specs import Spec, option
from .attention import check_mask
from .inspect_heads import attention_layers, eval_attention
from .kv_cache import KVCache, check_cache, window_positions
from .masks import causal_mask, sliding_window_mask
from .modern_block import QKTransform, qk_transformed
from .multihead import MultiHeadAttention
from .positional import half_split_rows

__all__ = [
    "KeepFirstKVCache",
    "MultiHeadSpec",
    "SinkAttention",
    "attention_sink_mass",
    "keep_first_mask",
    "sink_attention_from_gpt_oss",
    "sink_softmax",
]


def sink_softmax(scores: Tensor, sink: Tensor) -> Tensor:
    """The softmax of each row of ``scores`` with one more column holding its head's sink logit,
    that column then dropped (chapter "Latent, sparse and sink attention").

    ``scores (..., h, T_q, T_k)`` (masked keys at ``-inf``) and ``sink (h,)`` -> weights
    ``(..., h, T_q, T_k)``: ``exp(s_j) / (exp(sink) + sum_j exp(s_j))``, computed after
    subtracting the row's largest logit, the sink included. Rows sum to less than 1; a row whose
    keys are all masked gives zeros, not NaN, since the sink is always there (with a sink of
    ``-inf``, which is plain softmax, such a row gives zeros too).
    """
    check_float_tensors({"scores": scores, "sink": sink})
    if scores.dim() < 3:
        raise ValueError(f"scores must have shape (..., h, T_q, T_k), got {tuple(scores.shape)}")
    h = scores.shape[-3]
    if sink.shape != (h,) or sink.device != scores.device:
        raise ValueError(
            f"sink must have shape (h,) = ({h},), one logit per head, on {scores.device}, got "
            f"{tuple(sink.shape)} on {sink.device}"
        )
    s = sink[:, None]  # (h, 1): broadcasts over (..., h, T_q)
    m = torch.maximum(scores.amax(dim=-1), s).detach()  # (..., h, T_q): the shift changes no weight
    m = torch.where(m == -math.inf, torch.zeros_like(m), m)  # no -inf - -inf on a row of nothing
    e = torch.exp(scores - m[..., None])  # (..., h, T_q, T_k)
    denominator = e.sum(dim=-1) + torch.exp(s - m)  # (..., h, T_q)
    denominator = torch.where(denominator == 0, torch.ones_like(denominator), denominator)
    return e / denominator[..., None]


def keep_first_mask(
    T_q: int, T_k: int | None, window: int, keep_first: int, *, device: torch.device | str | None = None
) -> Tensor:
    """Bool ``(T_q, T_k)``: a sliding window that also keeps the first keys in view, StreamingLLM's
    attention sinks (chapter "Latent, sparse and sink attention").

    Every query sees what :func:`~transformer_lib.masks.sliding_window_mask` shows it (itself and
    the ``window - 1`` keys before it, the queries being the last ``T_q`` of ``T_k`` positions) and,
    besides, the first ``keep_first`` keys ``0 .. keep_first - 1``, those not in its future.
    ``keep_first=0`` is the sliding window alone.
    """
    check_int(keep_first, "keep_first", minimum=0)
    mask = sliding_window_mask(T_q, T_k, window, device=device)  # (T_q, T_k)
    if keep_first:
        first = causal_mask(T_q, T_k, device=device)[:, :keep_first]  # the first keys, where not in the future
        mask[:, :keep_first] |= first
    return mask


class KeepFirstKVCache(KVCache):
    """A sliding window's key-value cache that also keeps the first ``keep_first`` positions ever
    appended, StreamingLLM's attention sinks (chapter "Latent, sparse and sink attention").

    ``KeepFirstKVCache(window=w, keep_first=n)`` holds at most ``n + w - 1`` positions: the first
    ``n``, then the last ``w - 1`` in order, which is the order :func:`keep_first_mask` reads them
    in. Everything else is :class:`~transformer_lib.kv_cache.KVCache`'s (``append``, ``crop``,
    ``select``, ``nbytes``); :meth:`SinkAttention.new_cache` makes one for its attention.
    """

    def __init__(self, *, window: int | None, keep_first: int, _checked: bool = False):
        super().__init__(window=window, _checked=_checked)
        check_int(keep_first, "keep_first", minimum=0)
        if window is None:
            raise ValueError(f"keep_first={keep_first} keeps the first keys besides a window: give the cache a window")
        self.keep_first = keep_first

    def _kept(self, x: Tensor) -> Tensor:
        """What the cache keeps of ``x (B, n_kv_heads, T, d_k)``, every position held plus the new
        ones: the first ``keep_first`` positions and the last ``window - 1``."""
        T = x.shape[2]
        if T <= self.keep_first + self.window - 1:
            return x
        recent = x[:, :, T - (self.window - 1) :]
        return torch.cat([x[:, :, : self.keep_first], recent], dim=2) if self.keep_first else recent

    def _held(self, total: int) -> list[int]:
        """The positions :meth:`_kept` holds after ``total`` tokens (what ``crop`` goes back to)."""
        if total <= self.keep_first + self.window - 1:
            return list(range(total))
        return list(range(self.keep_first)) + window_positions(total, self.window)

    def _repr_extra(self) -> str:
        return f", keep_first={self.keep_first}" if self.keep_first else ""


class SinkAttention(MultiHeadAttention):
    """Multi-head attention with a learned sink logit per head and the first keys kept in view of
    a sliding window (chapter "Latent, sparse and sink attention").

    ``SinkAttention(d_model, n_heads, *, sinks=True, keep_first=0, n_kv_heads=None, dropout=0.0,
    bias=True)``. ``sinks``: ``self.sinks``, an ``nn.Parameter (n_heads,)`` initialised to zeros,
    joins every query's softmax denominator (:func:`sink_softmax`), as in gpt-oss; None with
    ``sinks=False``. ``keep_first``: with a ``window``, every query also sees the first
    ``keep_first`` keys (StreamingLLM), and :meth:`new_cache` keeps them. Everything else is
    :class:`~transformer_lib.multihead.MultiHeadAttention`'s: the fused projections, grouped-query
    attention, ``qk_transform`` (rotary, query-key norm) and the key-value cache. With sinks the
    attention is the hand-written one (PyTorch's fused kernel has no sink column). As there, a
    NaN or inf in a masked position's value still reaches the other queries' outputs (its weight
    is 0, and 0 times NaN is NaN): masking does not clean the inputs.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        sinks: bool = True,
        keep_first: int = 0,
        n_kv_heads: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        _checked: bool = False,
    ):
        super().__init__(d_model, n_heads, n_kv_heads=n_kv_heads, dropout=dropout, bias=bias, _checked=_checked)
        check_bool(sinks, "sinks")
        check_int(keep_first, "keep_first", minimum=0)
        self.keep_first = keep_first
        self.sinks = nn.Parameter(torch.zeros(n_heads)) if sinks else None

    def extra_repr(self) -> str:
        sinks = self.sinks is not None
        return f"d_model={self.d_model}, n_heads={self.n_heads}, sinks={sinks}, keep_first={self.keep_first}"

    def new_cache(self, window: int | None) -> KVCache:
        """An empty :class:`~transformer_lib.kv_cache.KVCache` for this attention with ``window``
        (chapter "Latent, sparse and sink attention"): with a window and ``keep_first``, a :class:`KeepFirstKVCache`
        that also keeps the first ``keep_first`` keys."""
        if window is None or not self.keep_first:
            return KVCache(window=window, _checked=True)
        return KeepFirstKVCache(window=window, keep_first=self.keep_first, _checked=True)

    def attention_weights(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        window: int | None = None,
        **other,
    ) -> Tensor:
        """``query (B, T_q, d_model)``, ``key`` and ``value`` ``(B, T_k, d_model)`` -> the weights
        ``(B, h, T_q, T_k)`` :meth:`forward` uses, before dropout; with sinks a row sums to less than 1
        (chapter "Latent, sparse and sink attention"). The arguments are :meth:`forward`'s; its other keywords are
        accepted and ignored, but not a cache."""
        if other.get("cache") is not None:
            raise ValueError("attention_weights does not follow a KVCache: call it without cache=")
        self._check_inputs(query, key, value, is_causal, window, None)
        (B, T_q, _), T_k = query.shape, key.shape[1]
        check_mask(mask, torch.Size((B, self.n_heads, T_q, T_k)))
        q, k, v = self._project_cached(query, key, value, None)  # (B, h, T_q, d_k), (B, h_kv, T_k, d_k)
        if is_causal:
            mask = self._causal(mask, T_q, T_k, window, True, query.device)
        return self._attend_by_hand(q, k, v, mask, 0.0)[1]  # (B, h, T_q, T_k)

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
        """The parent's checks; a cache must also keep this attention's ``keep_first``."""
        super()._check_inputs(query, key, value, is_causal, window, None, window_checked)
        if cache is not None:
            check_cache(cache, window, query.shape[0], self.keep_first)

    def _causal(
        self, mask: Tensor | None, T_q: int, T_k: int, window: int | None, need_weights: bool, device: torch.device
    ) -> Tensor | None:
        """The parent's causal or sliding-window mask, end-aligned; with ``keep_first`` the window
        also shows the first ``keep_first`` keys. The keys of a :meth:`new_cache` cache are the first
        ones followed by the recent ones in order, so the same mask fits them."""
        if not self.keep_first or window is None or window >= T_k:
            return super()._causal(mask, T_q, T_k, window, need_weights, device)
        structural = keep_first_mask(T_q, T_k, window, self.keep_first, device=device)  # (T_q, T_k)
        return structural if mask is None else mask & structural

    def _attend_by_hand(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p: float) -> tuple[Tensor, Tensor]:
        """``q (B, h, T_q, d_k)``, ``k, v (B, h_kv, T_k, d_k)`` -> ``(out (B, h, T_q, d_k), weights
        (B, h, T_q, T_k))``: the scores, masked keys at ``-inf``, through :func:`sink_softmax`."""
        if self.sinks is None:
            return super()._attend_by_hand(q, k, v, mask, p)
        k, v = self._shared_kv(k, v)  # (B, h, T_k, d_k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, h, T_q, T_k)
        weights = self._sink_weights(scores, mask)  # (B, h, T_q, T_k)
        if p > 0.0:
            weights = F.dropout(weights, p=p, training=True)
        out = weights @ v  # (B, h, T_q, d_k)
        if mask is not None:  # a query with no key: zeros, also where a masked value holds NaN
            out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        return out, weights

    def _sink_weights(self, scores: Tensor, mask: Tensor | None) -> Tensor:
        """``scores (B, h, T_q, T_k)``, masked keys set to ``-inf``, through :func:`sink_softmax`."""
        if mask is not None:
            scores = scores.masked_fill(~mask, -math.inf)
        return sink_softmax(scores, self.sinks.to(scores.dtype))

    def _scores(self, q: Tensor, k: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """The record of :meth:`record_scores`: the parent's logits and, with sinks, the weights of
        :meth:`_attend_by_hand` (a row sums to less than 1)."""
        if self.sinks is None:
            return super()._scores(q, k, mask)
        k = self._shared_kv(k, k)[0]  # (B, h, T_k, d_k)
        logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, h, T_q, T_k)
        return logits, self._sink_weights(logits, mask)

    def _attend_fused(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p: float, causal: bool = False
    ) -> Tensor:
        """The parent's fused kernel without sinks; with them, :meth:`_attend_by_hand`: ``(B, h, T_q, d_k)``."""
        if self.sinks is None:
            return super()._attend_fused(q, k, v, mask, p, causal)
        if causal:
            mask = causal_mask(q.shape[2], k.shape[2], device=q.device)  # (T_q, T_k)
        return self._attend_by_hand(q, k, v, mask, p)[0]

    def _attend_fused_masked(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, p: float) -> Tensor:
        """As :meth:`_attend_fused`, with a mask: ``(B, h, T_q, d_k)``."""
        if self.sinks is None:
            return super()._attend_fused_masked(q, k, v, mask, p)
        return self._attend_by_hand(q, k, v, mask, p)[0]


@dataclass(frozen=True)
class MultiHeadSpec(Spec):
    """Multi-head attention as a recipe's choice (chapters "Multi-head attention" and "Today's
    block"), with its options: query-key norms, a learned sink logit per head (gpt-oss's) and, with a
    sliding window, the first tokens kept in view (StreamingLLM)."""

    kind = "multi_head"
    qk_norm: bool = option(False, "RMSNorm on each head's queries and keys before the scores")
    sinks: bool = option(False, "a learned sink logit per head (gpt-oss's attention sinks)")
    keep_first: int = option(0, "with --window, every token also sees the first this many tokens")

    def __post_init__(self):
        super().__post_init__()
        check_bool(self.qk_norm, "qk_norm")
        check_bool(self.sinks, "sinks")
        check_int(self.keep_first, "keep_first", minimum=0)

    def layer(self, recipe, d_model: int, n_heads: int, *, n_kv_heads, dropout, self_attention) -> MultiHeadAttention:
        """One layer: :class:`~transformer_lib.multihead.MultiHeadAttention`, or :class:`SinkAttention`
        with sinks or kept first tokens; in self-attention with the recipe's query-key transform (an
        encoder-decoder's cross-attention takes neither)."""
        options = dict(n_kv_heads=n_kv_heads, dropout=dropout, bias=recipe.bias, _checked=True)
        if not self_attention:
            return MultiHeadAttention(d_model, n_heads, **options)
        if self.sinks or self.keep_first:
            mha = SinkAttention(d_model, n_heads, sinks=self.sinks, keep_first=self.keep_first, **options)
        else:
            mha = MultiHeadAttention(d_model, n_heads, **options)
        return qk_transformed(mha, recipe, qk_norm=self.qk_norm)


@torch.no_grad()
def attention_sink_mass(model: nn.Module, idx: Tensor, first_query: int = 1) -> Tensor:
    """How much attention each head gives to the first token (chapter "Latent, sparse and sink attention"): ``(n_layers,
    n_heads)``.

    ``model`` is a language model called as ``model(idx)`` (a :class:`~transformer_lib.models.GPT`),
    ``idx (B, T)`` token ids with ``T >= 2``. Entry ``[l, i]`` is the mean, over the batch and the
    queries at positions ``first_query .. T - 1`` (default 1), of the weight head ``i`` of attention
    layer ``l`` gives to position 0, recorded by :func:`~transformer_lib.inspect_heads.capture_attention`; layers are in
    the order of :func:`~transformer_lib.inspect_heads.attention_layers`. Uniform causal attention
    gives ``(1/2 + ... + 1/T) / (T - 1)``; a sink head gives nearly 1. The model runs in eval mode
    (no dropout) and is put back in its mode after.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(idx, Tensor) or idx.dim() != 2 or idx.shape[1] < 2:
        raise ValueError(f"idx must be token ids of shape (B, T) with T >= 2, got {getattr(idx, 'shape', idx)!r}")
    check_int(first_query, "first_query")
    if first_query >= idx.shape[1]:
        raise ValueError(f"first_query={first_query} leaves no query in idx of length T={idx.shape[1]}")
    weights = eval_attention(model, idx)
    names = [name for name in attention_layers(model) if name in weights]
    return torch.stack([weights[name][:, :, first_query:, 0].mean(dim=(0, 2)) for name in names])  # (n_layers, h)


@torch.no_grad()
def sink_attention_from_gpt_oss(attn: nn.Module) -> SinkAttention:
    """A :class:`SinkAttention` with the weights of ``transformers``' ``GptOssAttention`` (chapter "Latent, sparse and
    sink attention").

    gpt-oss rotates the half-split pairs ``(i, i + d/2)`` of a head, the book its neighbouring pairs
    (:func:`~transformer_lib.positional.half_split_rows` reorders the rows of ``W_q`` and ``W_k`` and
    of their biases; every score is unchanged); ``W_v``, ``W_o`` and the sinks are copied as they are.
    The layer's sliding window is not a weight: pass ``window=attn.sliding_window`` to its forward.
    Only the default rotary frequencies (``rope_type="default"``) are supported.
    """
    if type(attn).__name__ != "GptOssAttention":
        raise TypeError(f"attn must be a transformers GptOssAttention, got {type(attn).__name__}")
    config = attn.config
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"only the default rotary frequencies can be copied, got rope_type={rope['rope_type']!r}")
    h, h_kv, d = config.num_attention_heads, config.num_key_value_heads, attn.head_dim
    if h * d != config.hidden_size:
        raise ValueError(f"the book's heads are d_model / n_heads wide, not {h} heads of {d} in {config.hidden_size}")
    bias = attn.q_proj.bias is not None
    ours = SinkAttention(config.hidden_size, h, n_kv_heads=h_kv, bias=bias).to(attn.q_proj.weight.dtype)
    ours.qk_transform = QKTransform(d, rotary_base=float(rope.get("rope_theta", 10000.0)))
    q_rows, k_rows = half_split_rows(h, d), half_split_rows(h_kv, d)
    for mine, theirs, rows in (
        (ours.q_proj, attn.q_proj, q_rows),
        (ours.k_proj, attn.k_proj, k_rows),
        (ours.v_proj, attn.v_proj, slice(None)),
    ):
        mine.weight.copy_(theirs.weight[rows])
        if bias:
            mine.bias.copy_(theirs.bias[rows])
    ours.out_proj.load_state_dict(attn.o_proj.state_dict())
    ours.sinks.copy_(attn.sinks)
    return ours.eval()
