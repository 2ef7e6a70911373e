"""Multi-head latent attention, DeepSeek-V2's and V3's (chapter "Latent, sparse and sink attention").

Each token is compressed to one small latent ``c`` (``kv_latent`` numbers, normalised) from which
every head's key and value are projected back up, plus one rotary key ``k_rope`` (``rope_dim``
numbers) that all heads share. A cache keeps only these two: ``kv_latent + rope_dim`` numbers per
token and layer, against ``2 h d_k`` for multi-head attention. Positions touch only the shared
rotary part ("decoupled" rotary), never the latent, so the key up-projection can be folded into the
query and the value up-projection moved past the weighted sum: the *folded* path attends over the
latents directly, as multi-query attention with one key and value head, and computes the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_base, check_bool, check_float_tensors, check_int, check_probability, check_window
from ._specs import Spec, option
from .attention import check_mask, scaled_dot_product_attention
from .kv_cache import crop_positions, is_prefix, select_rows
from .masks import causal_mask
from .modern_block import RMSNorm
from .multihead import MultiHeadAttention, RecordsScores, merge_heads
from .positional import RotaryEmbedding

__all__ = ["LatentAttention", "LatentCache", "LatentSpec"]


class LatentCache:
    """What a :class:`LatentAttention` layer keeps per token for generation (chapter "Latent, sparse and sink
    attention").

    ``c (B, T_cached, kv_latent)``, the normalised latents, and ``k_rope (B, T_cached, rope_dim)``,
    the shared rotary keys already rotated at their positions (None while empty); not the heads'
    keys and values. As :class:`~transformer_lib.kv_cache.KVCache`: :meth:`append` adds the new
    tokens' and returns all of them; with ``window`` only the last ``window - 1`` are kept.
    ``length``: positions held, ``position``: appended in all, ``nbytes()``: the memory held. Outside
    autograd an unbounded cache writes into buffers whose capacity doubles when full.
    """

    def __init__(self, *, window: int | None = None):
        check_window(window)
        self.window = window
        self.c: Tensor | None = None  # (B, T_cached, kv_latent)
        self.k_rope: Tensor | None = None  # (B, T_cached, rope_dim)
        self.position = 0
        self._buffers: tuple[Tensor, Tensor] | None = None  # (B, capacity, width) each

    @property
    def length(self) -> int:
        """The number of positions held, ``T_cached``."""
        return 0 if self.c is None else self.c.shape[1]

    @property
    def filled(self) -> bool:
        """True once anything is cached."""
        return self.c is not None

    @property
    def capacity(self) -> int:
        """Positions allocated: ``length`` plus the spare room of the buffers, if any."""
        return self.length if self._buffers is None else self._buffers[0].shape[1]

    def nbytes(self) -> int:
        """Bytes taken by the held latents and rotary keys."""
        if self.c is None:
            return 0
        return self.c.numel() * self.c.element_size() + self.k_rope.numel() * self.k_rope.element_size()

    def _check(self, c: Tensor, k_rope: Tensor) -> None:
        for name, t in (("c", c), ("k_rope", k_rope)):
            if not isinstance(t, Tensor) or t.dim() != 3:
                got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"LatentCache: {name} must have shape (B, T, width), got {got}")
        new = (c.shape[0], c.shape[2], k_rope.shape[2], c.dtype)
        held = new if self.c is None else (self.c.shape[0], self.c.shape[2], self.k_rope.shape[2], self.c.dtype)
        if c.shape[:2] != k_rope.shape[:2] or c.dtype != k_rope.dtype or held != new:
            raise ValueError(
                f"LatentCache: cannot add c {tuple(c.shape)} {c.dtype} and k_rope {tuple(k_rope.shape)} "
                f"{k_rope.dtype}: they must share B, T and dtype, and (B, kv_latent, rope_dim, dtype) must stay "
                f"{held} (a different batch, layer or dtype: start a new cache)"
            )

    def append(self, c: Tensor, k_rope: Tensor) -> tuple[Tensor, Tensor]:
        """Add ``c (B, T_new, kv_latent)`` and ``k_rope (B, T_new, rope_dim)``; returns every latent and
        rotary key, ``(B, T_cached + T_new, kv_latent)`` and ``(B, T_cached + T_new, rope_dim)``."""
        self._check(c, k_rope)
        self.position += c.shape[1]
        if self.window is None and not (torch.is_grad_enabled() and (c.requires_grad or k_rope.requires_grad)):
            return self._write(c, k_rope)
        self._buffers = None
        if self.c is not None:
            c, k_rope = torch.cat([self.c, c], dim=1), torch.cat([self.k_rope, k_rope], dim=1)
        keep = c.shape[1] if self.window is None else min(c.shape[1], self.window - 1)
        self.c, self.k_rope = c[:, c.shape[1] - keep :], k_rope[:, c.shape[1] - keep :]
        return c, k_rope

    def _write(self, c: Tensor, k_rope: Tensor) -> tuple[Tensor, Tensor]:
        """Append into the buffers (amortised: a copy of the cache only when the capacity doubles)."""
        n, need = self.length, self.length + c.shape[1]
        if self._buffers is None or need > self.capacity:
            size = max(need, 2 * self.capacity)
            self._buffers = tuple(t.new_empty(t.shape[0], size, t.shape[2]) for t in (c, k_rope))
            if n:
                self._buffers[0][:, :n], self._buffers[1][:, :n] = self.c, self.k_rope
        cb, kb = self._buffers
        cb[:, n:need], kb[:, n:need] = c, k_rope
        self.c, self.k_rope = cb[:, :need], kb[:, :need]  # views of the first `need` positions
        return self.c, self.k_rope

    def reset(self) -> None:
        """Empty the cache."""
        self.c = self.k_rope = None
        self._buffers = None
        self.position = 0

    def crop(self, n: int) -> None:
        """Back to what the cache held after its first ``n`` tokens (the protocol of the caches of chapter "Generation",
        :mod:`~transformer_lib.kv_cache`); a window that already dropped a needed position refuses."""
        index = crop_positions(self.position, self.length, n, window=self.window, what="this LatentCache")
        if index.numel() == 0:
            self.c = self.k_rope = None
            self._buffers = None
        elif is_prefix(index):
            self.c, self.k_rope = self.c[:, : index.numel()], self.k_rope[:, : index.numel()]
        else:
            self._buffers = None
            self.c, self.k_rope = self.c[:, index], self.k_rope[:, index]
        self.position = n

    def select(self, rows) -> None:
        """Keep the batch rows ``rows`` (indices, in that order, repeats allowed)."""
        if self.c is None:
            return
        index = select_rows(rows, self.c.shape[0], "this LatentCache")
        self._buffers = None
        self.c, self.k_rope = self.c[index], self.k_rope[index]

    def __repr__(self) -> str:
        shapes = None if self.c is None else (tuple(self.c.shape), tuple(self.k_rope.shape))
        window = f", window={self.window}" if self.window else ""
        return f"LatentCache(shapes={shapes}, position={self.position}{window})"


class LatentAttention(RecordsScores, nn.Module):
    """Multi-head latent attention, DeepSeek-V2's and V3's (chapter "Latent, sparse and sink attention"). Self-attention
    only.

    ``LatentAttention(d_model, n_heads, *, kv_latent, q_latent=None, rope_dim=None, nope_dim=None,
    v_dim=None, rotary_base=10000.0, eps=1e-6, dropout=0.0, bias=False)``; with ``d_k = d_model //
    n_heads`` the defaults are ``nope_dim = v_dim = d_k`` and ``rope_dim``, the even part of ``d_k // 2``. Its maps:

    - queries: ``q_proj`` (``d_model -> h (nope_dim + rope_dim)``), or with ``q_latent`` ``q_down``
      (``d_model -> q_latent``), the :class:`~transformer_lib.modern_block.RMSNorm` ``q_norm`` and
      ``q_up`` (``q_latent -> h (nope_dim + rope_dim)``, no bias);
    - ``kv_down`` (``d_model -> kv_latent + rope_dim``): the latent, then the shared rotary key;
      ``kv_norm`` normalises the latent ``c``;
    - ``kv_up`` (``kv_latent -> h (nope_dim + v_dim)``, no bias): per head its key's ``nope_dim``
      rows, then its value's ``v_dim`` rows;
    - ``out_proj`` (``h v_dim -> d_model``), which reads the merged heads.

    ``bias`` adds biases to ``q_down``, ``kv_down`` and ``out_proj`` (never to ``q_proj``, as in
    DeepSeek). Head ``i``'s key is ``[k_nope_i, k_rope]``, its query ``[q_nope_i, q_rope_i]``; the
    rope parts turn in the book's interleaved pairs; the scale is ``1 / sqrt(nope_dim + rope_dim)``.

    ``folded`` (attribute, default False; or ``forward(..., folded=)``): the folded path, computed
    on the fly from views of ``kv_up.weight`` (:meth:`up_matrices`). Head ``i``'s query becomes
    ``[q_nope_i W_uk_i, q_rope_i]``, scored against ``[c, k_rope]``; the heads attend over the
    latents ``c`` and each head's latent result is mapped up by ``W_uv_i``, then by ``out_proj``.
    No key or value of a head is ever made: what decoding from a :class:`LatentCache` wants.

    :meth:`~transformer_lib.multihead.RecordsScores.record_scores` records, on either path, the
    logits it scores (``q . k`` times its scale) and the weights ``need_weights=True`` returns.
    """

    part_role = "attention"  # part_matrices names both query forms; only those the layer has are found
    part_matrices = {
        "q": "q_proj.weight",
        "q_down": "q_down.weight",
        "q_up": "q_up.weight",
        "kv_down": "kv_down.weight",
        "kv_up": "kv_up.weight",
        "out": "out_proj.weight",
    }

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        kv_latent: int,
        q_latent: int | None = None,
        rope_dim: int | None = None,
        nope_dim: int | None = None,
        v_dim: int | None = None,
        rotary_base: float = 10000.0,
        eps: float = 1e-6,
        dropout: float = 0.0,
        bias: bool = False,
    ):
        super().__init__()
        sizes = dict(
            d_model=d_model,
            n_heads=n_heads,
            kv_latent=kv_latent,
            q_latent=q_latent,
            rope_dim=rope_dim,
            nope_dim=nope_dim,
            v_dim=v_dim,
        )
        for i, (name, value) in enumerate(sizes.items()):
            if i < 3 or value is not None:  # the first three are required
                check_int(value, name)
        d_k = d_model // n_heads if d_model % n_heads == 0 else None
        if d_k is None and None in (rope_dim, nope_dim, v_dim):
            raise ValueError(
                f"d_model ({d_model}) is not divisible by n_heads ({n_heads}), so rope_dim, nope_dim and "
                "v_dim have no default (d_k): give all three"
            )
        given = rope_dim
        nope_dim, v_dim, rope_dim = nope_dim or d_k, v_dim or d_k, rope_dim or 2 * (d_k // 4)
        if rope_dim < 2 or rope_dim % 2:
            why = (
                "" if given else f" (by default the even part of half a head, whose width d_model / n_heads is {d_k}: "
            )
            raise ValueError(
                f"rope_dim must be even and >= 2 (rotated in pairs), got {rope_dim}"
                + (why and why + "give wider heads or a rope_dim)")
            )
        check_base(rotary_base, "rotary_base")
        check_probability(dropout, "dropout")
        check_bool(bias, "bias")
        self.d_model, self.n_heads, self.kv_latent, self.q_latent = d_model, n_heads, kv_latent, q_latent
        self.rope_dim, self.nope_dim, self.v_dim, self.dropout = rope_dim, nope_dim, v_dim, dropout
        self.scale = 1.0 / math.sqrt(nope_dim + rope_dim)
        self.folded = False
        q_width = n_heads * (nope_dim + rope_dim)
        if q_latent is None:
            self.q_proj = nn.Linear(d_model, q_width, bias=False)
        else:
            self.q_down = nn.Linear(d_model, q_latent, bias=bias)
            self.q_norm = RMSNorm(q_latent, eps=eps)
            self.q_up = nn.Linear(q_latent, q_width, bias=False)
        self.kv_down = nn.Linear(d_model, kv_latent + rope_dim, bias=bias)
        self.kv_norm = RMSNorm(kv_latent, eps=eps)
        self.kv_up = nn.Linear(kv_latent, n_heads * (nope_dim + v_dim), bias=False)
        self.out_proj = nn.Linear(n_heads * v_dim, d_model, bias=bias)
        self.rotary = RotaryEmbedding(rope_dim, base=rotary_base)

    def cache_elements_per_token(self) -> int:
        """Numbers cached per token: ``kv_latent + rope_dim`` (multi-head attention with ``d_k``-wide
        heads caches ``2 h d_k``: a key and a value per head)."""
        return self.kv_latent + self.rope_dim

    def new_cache(self, window: int | None = None) -> LatentCache:
        """An empty :class:`LatentCache` for this layer (``window``: a sliding window's)."""
        return LatentCache(window=window)

    def up_matrices(self) -> tuple[Tensor, Tensor]:
        """``W_uk (h, nope_dim, kv_latent)`` and ``W_uv (h, v_dim, kv_latent)``: views of ``kv_up.weight``."""
        w = self.kv_up.weight.view(self.n_heads, self.nope_dim + self.v_dim, self.kv_latent)
        return w[:, : self.nope_dim], w[:, self.nope_dim :]

    def _queries(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``x (B, T, d_model)`` -> ``q_nope (B, h, T, nope_dim)``, ``q_rope (B, h, T, rope_dim)`` (rotated)."""
        q = self.q_proj(x) if self.q_latent is None else self.q_up(self.q_norm(self.q_down(x)))
        q = q.view(*x.shape[:2], self.n_heads, self.nope_dim + self.rope_dim).transpose(1, 2)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        return q_nope, self.rotary(q_rope, positions)

    def _latents(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``x (B, T, d_model)`` -> ``c (B, T, kv_latent)`` (normalised), ``k_rope (B, T, rope_dim)`` (rotated)."""
        c, k_rope = self.kv_down(x).split([self.kv_latent, self.rope_dim], dim=-1)
        return self.kv_norm(c), self.rotary(k_rope, positions)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask, causal: bool, need_weights: bool, p: float):
        """``q (B, h, T_q, d)``, ``k (B, h or 1, T_k, d)``, ``v (B, h or 1, T_k, d_v)`` -> ``(B, h, T_q, d_v)``
        and the weights ``(B, h, T_q, T_k)`` (None without ``need_weights``), scaled by ``self.scale``."""
        if need_weights or k.shape[1] != q.shape[1]:  # the weights, or the folded path's one latent head (a
            # matmul broadcasts it to the heads; PyTorch's fused kernel copies it per head, slower on a CPU)
            if causal:
                mask = causal_mask(q.shape[2], k.shape[2], device=q.device)
            if q.shape[-1] != self.nope_dim + self.rope_dim:  # it divides by sqrt(q's width): rescale q
                q = q * (self.scale * math.sqrt(q.shape[-1]))
            out, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=p)
            return out, weights if need_weights else None
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, None, p, causal, scale=self.scale), None
        any_key = mask.any(dim=-1, keepdim=True)  # a query with no key gets zeros, as by hand
        out = F.scaled_dot_product_attention(q, k, v, mask | ~any_key, p, scale=self.scale)
        return torch.where(any_key, out, 0.0), None

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
        cache: LatentCache | None = None,
        folded: bool | None = None,
        _checked: bool = False,
        _trusted: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """``query (B, T_q, d_model)``, the same tensor as ``key`` and ``value`` (self-attention) ->
        ``(output (B, T_q, d_model), weights (B, h, T_q, T_k) or None)``.

        ``mask`` (boolean, True = may attend, broadcastable to ``(B, h, T_q, T_k)``), ``is_causal``
        and ``window`` are those of :meth:`MultiHeadAttention.forward`. ``cache`` (a
        :class:`LatentCache`): the new tokens sit at positions ``cache.position ..``; their latents
        and rotary keys are appended and the earlier ones read back, so ``T_k = T_cached + T_q``.
        ``folded``: the folded path (default ``self.folded``); both give the same function.
        """
        if not _trusted:
            self._check_inputs(query, key, value, is_causal, window, cache, _checked)
        B, T_q, _ = query.shape
        T_k = T_q + (0 if cache is None else cache.length)
        if not _trusted:
            check_mask(mask, torch.Size((B, self.n_heads, T_q, T_k)))
        folded, p = self.folded if folded is None else folded, self.dropout if self.training else 0.0
        check_bool(folded, "folded")
        record = self._recording(cache)
        if T_q == 0:  # no token: an empty output, as multi-head attention gives, and the cache as it was
            if record:
                self._report_scores(lambda: (query.new_zeros(B, self.n_heads, 0, T_k),) * 2)
            weights = query.new_zeros(B, self.n_heads, 0, T_k) if need_weights else None
            return query.new_zeros(B, 0, self.d_model), weights
        return self._run(query, mask, is_causal, window, cache, folded, need_weights, p, record)

    def _run(self, x, mask, is_causal, window, cache, folded, need_weights, p, record=False) -> tuple:
        start = 0 if cache is None else cache.position
        positions = torch.arange(start, start + x.shape[1], device=x.device)
        q_nope, q_rope = self._queries(x, positions)  # (B, h, T_q, nope_dim), (B, h, T_q, rope_dim)
        c, k_rope = self._latents(x, positions)  # (B, T_new, kv_latent), (B, T_new, rope_dim)
        if cache is not None:
            c, k_rope = cache.append(c, k_rope)  # (B, T_k, kv_latent), (B, T_k, rope_dim)
        T_q, T_k = x.shape[1], c.shape[1]
        causal = False
        if is_causal:
            mask = MultiHeadAttention._causal(mask, T_q, T_k, window, need_weights, x.device)
            causal = mask is None and T_q == T_k  # the fused kernel's own causal path
        W_uk, W_uv = self.up_matrices()
        if folded:  # scores q_nope_i W_uk_i . c + q_rope_i . k_rope; values: the latents, W_uv_i after
            q = torch.cat([torch.einsum("bhtn,hnl->bhtl", q_nope, W_uk), q_rope], dim=-1)  # (B, h, T_q, L + r)
            k = torch.cat([c, k_rope], dim=-1).unsqueeze(1)  # (B, 1, T_k, L + r): one head shared by all
            lat, weights = self._attend(q, k, c.unsqueeze(1), mask, causal, need_weights, p)  # (B, h, T_q, L)
            heads = torch.einsum("bhtl,hvl->bhtv", lat, W_uv)  # (B, h, T_q, v_dim)
        else:
            kv = self.kv_up(c).view(x.shape[0], T_k, self.n_heads, -1).transpose(1, 2)  # (B, h, T_k, nope + v)
            k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
            k = torch.cat([k_nope, k_rope.unsqueeze(1).expand(-1, self.n_heads, -1, -1)], dim=-1)  # (B, h, T_k, n + r)
            q = torch.cat([q_nope, q_rope], -1)  # (B, h, T_q, n + r)
            heads, weights = self._attend(q, k, v, mask, causal, need_weights, p)
        if record:  # record_scores: every pair's logit q . k * scale; the weights as need_weights gives them
            self._report_scores(lambda: (q @ k.mT * self.scale, self._attend(q, k, k, mask, causal, True, 0.0)[1]))
        return self.out_proj(merge_heads(heads)), weights  # (B, T_q, d_model)

    def attention_weights(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        window: int | None = None,
        **_,
    ) -> Tensor:
        """The weights ``(B, h, T_q, T_k)`` of ``forward(query, key, value, need_weights=True, ...)``
        before dropout, without a cache (for the inspection tools of chapter "What attention learns")."""
        self._check_inputs(query, key, value, is_causal, window, None, False)
        B, T, _ = query.shape
        check_mask(mask, torch.Size((B, self.n_heads, T, T)))
        if T == 0:  # no token: no weights, as forward gives
            return query.new_zeros(B, self.n_heads, 0, 0)
        return self._run(query, mask, is_causal, window, None, self.folded, True, 0.0)[1]

    def _check_inputs(self, query, key, value, is_causal, window, cache, window_checked) -> None:
        """The checks of :meth:`forward`: self-attention, shape and dtype, the window, the cache."""
        if key is not query or value is not query:
            raise ValueError("LatentAttention is self-attention only: pass one tensor as query, key and value")
        check_float_tensors({"query": query}, layer_dtype=self.kv_down.weight.dtype)
        if query.dim() != 3 or query.shape[-1] != self.d_model:
            raise ValueError(f"query must have shape (B, T, d_model={self.d_model}), got {tuple(query.shape)}")
        if window is not None and not window_checked:
            check_int(window, "window")
            if not is_causal:
                raise ValueError(f"window={window} is sliding-window *causal* attention: pass is_causal=True too")
        if cache is not None and not isinstance(cache, LatentCache):
            raise TypeError(f"cache must be a LatentCache (layer.new_cache()) or None, got {type(cache).__name__}")
        if cache is not None and cache.window is not None and (window is None or cache.window < window):
            raise ValueError(
                f"this LatentCache keeps only what a window of {cache.window} needs, but the attention's window is "
                f"{window}: give the cache the attention's window (or none)"
            )


@dataclass(frozen=True)
class LatentSpec(Spec):
    """Multi-head latent attention as a recipe's choice (chapter "Latent, sparse and sink attention"):
    its widths (None: a ``4 d_k`` latent, no query latent, half of each head rotated)."""

    kind = "latent"
    kv_latent: int | None = option(None, "latent attention: the latent each token caches (default: 4 d_k)")
    q_latent: int | None = option(None, "latent attention: the query's latent (default: none, a full query projection)")
    rope_dim: int | None = option(None, "latent attention: the rotated width of each head (default: d_k / 2)")

    def __post_init__(self):
        super().__post_init__()
        for name in ("kv_latent", "q_latent", "rope_dim"):
            if getattr(self, name) is not None:
                check_int(getattr(self, name), name)

    def check(self, recipe) -> None:
        """Latent attention rotates a small shared key: it needs rotary positions, as trained."""
        if recipe.positions.kind != "rotary":
            raise ValueError(
                "attention='latent' rotates a small shared key (decoupled rotary positions): "
                f"it needs positions='rotary', got {recipe.positions.kind!r}"
            )
        if recipe.positions.scaling is not None:
            raise ValueError("rope_scaling rescales multi-head attention's rotary positions: attention is 'latent'")

    def layer(self, recipe, d_model: int, n_heads: int, *, n_kv_heads, dropout, self_attention) -> LatentAttention:
        """One layer; one ``kv_latent``-wide latent per token is cached."""
        if not self_attention:
            raise ValueError(
                "attention='latent' is a causal self-attention: an encoder-decoder's cross-attention is not"
            )
        if n_kv_heads is not None:
            raise ValueError(f"n_kv_heads={n_kv_heads} is grouped-query attention's: latent attention shares a latent")
        return LatentAttention(
            d_model,
            n_heads,
            kv_latent=self.kv_latent or 4 * (d_model // n_heads),
            q_latent=self.q_latent,
            rope_dim=self.rope_dim,
            rotary_base=recipe.positions.base,
            eps=recipe.norm_eps,
            dropout=dropout,
            bias=recipe.bias,
        )
