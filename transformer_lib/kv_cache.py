"""The key-value cache of incremental decoding (chapter "Generation").

Generating token by token, a causal model would recompute the keys and values of every earlier
token at every step. A :class:`KVCache` keeps one attention layer's; a :class:`LayerCache` holds a
decoder layer's two (self- and cross-attention); a :class:`DecoderCache` holds a whole stack's and
counts the positions it has seen. The attention layers read them
(:meth:`~transformer_lib.multihead.MultiHeadAttention.forward`), the blocks and models pass them on.

Every cache of the book answers the same questions, whatever it holds (keys and values, a latent,
index keys, a recurrent state): ``position`` (tokens appended in all), ``length`` (positions held),
``filled``, ``nbytes()`` (memory held), ``reset()`` (empty it), ``crop(n)`` (back to what it held
after the first ``n`` tokens, so decoding can go on from there: speculative decoding, "regenerate
from here") and ``select(rows)`` (keep these batch rows, in this order: beam search). A cache that
cannot go back, because what it would need is gone (a window that dropped it, a state that mixed
it in), refuses by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from ._checks import check_bool, check_int, check_window

__all__ = ["DecoderCache", "KVCache", "LayerCache"]  # crop_positions, is_prefix, select_rows: for the other caches


def window_positions(total: int, window: int | None) -> list[int]:
    """The positions a cache holds after ``total`` tokens (chapter "Generation"): all of them without a
    window, the last ``window - 1`` with one."""
    if window is None or total <= window - 1:
        return list(range(total))
    return list(range(total - (window - 1), total))


def crop_positions(
    position: int,
    length: int,
    n: int,
    *,
    window: int | None,
    what: str,
    held: Callable[[int], list[int]] | None = None,
) -> Tensor:
    """The indices, among the ``length`` positions a cache holds after ``position`` tokens, of those
    it would hold after the first ``n`` tokens only (chapter "Generation"). ``held(total)`` lists the
    positions the cache holds after ``total`` tokens, by default :func:`window_positions` with
    ``window``. Refuses an ``n`` outside ``[0, position]``, and one whose positions a window has
    already dropped (``what`` names the cache)."""
    check_int(n, "n", minimum=0)
    if n > position:
        raise ValueError(f"cannot crop {what} to n={n}: it holds {position} tokens (crop only goes back)")
    kept = held if held is not None else (lambda total: window_positions(total, window))
    now = kept(position)
    assert len(now) == length, (now, length)  # what the cache's own append keeps
    where = {p: i for i, p in enumerate(now)}
    need = kept(n)
    lost = [p for p in need if p not in where]
    if lost:
        raise ValueError(
            f"cannot crop {what} to n={n}: its window of {window} already dropped position {lost[0]}, which the "
            f"first {n} tokens' cache holds (decode again from the prompt)"
        )
    return torch.tensor([where[p] for p in need], dtype=torch.long)


def is_prefix(index: Tensor) -> bool:
    """Whether ``index`` is ``0, 1, ..., len - 1``: a crop that keeps a prefix of what is held."""
    return bool(torch.equal(index, torch.arange(index.numel())))


def select_rows(rows, batch: int, what: str) -> Tensor:
    """``rows`` (a list or 1-D tensor of batch indices, repeats allowed) as a long tensor, each checked to
    be in ``[0, batch)`` (chapter "Generation")."""
    index = torch.as_tensor(rows)
    if index.dim() != 1 or index.dtype in (torch.bool, torch.float16, torch.float32, torch.float64, torch.bfloat16):
        raise ValueError(f"select needs a 1-D list of batch rows (integers), got {rows!r}")
    if index.numel() and (index.min() < 0 or index.max() >= batch):
        raise ValueError(f"select: {what} holds a batch of {batch} rows, got rows {index.tolist()}")
    return index.long()


class KVCache:
    """The keys and values one attention layer has already computed, for generation (chapter "Generation").

    Generating token by token, a causal model recomputes the same keys and values at every step;
    a cache keeps them. ``k`` and ``v`` are ``(B, n_kv_heads, T_cached, d_k)`` (None while empty).
    Pass the cache to :meth:`~transformer_lib.multihead.MultiHeadAttention.forward` as
    ``cache=``; the layer then projects only the new tokens. Two kinds:

    * ``KVCache()`` (self-attention): :meth:`append` adds the new tokens' keys and values and
      returns all of them. With ``window`` (sliding-window attention) only the last
      ``window - 1`` are kept, which is all the next token can see besides itself, so the memory
      stays bounded; without it, everything is kept. A window's cache that also keeps the first
      positions ever appended (StreamingLLM's attention sinks) is chapter "Latent, sparse and sink
      attention"'s :class:`~transformer_lib.sinks.KeepFirstKVCache`.
    * ``KVCache(static=True)`` (cross-attention): filled once, by :meth:`set` or by the first
      forward call, with the projected keys and values of the encoder's output; every later call
      reuses them and does not project the memory again.

    ``length`` is the number of cached positions held, ``position`` the number of tokens appended
    in all (the position of the next one; it differs from ``length`` only once a window has
    dropped old keys), ``nbytes()`` the memory the held keys and values take.

    Appending by concatenation would copy the whole cache at every step, a cost that grows with
    the context. So, outside autograd, an unbounded cache writes into a buffer with room to
    spare (its ``capacity`` doubles when full: at most twice ``length`` positions are allocated)
    and ``k``, ``v`` are views of its first ``length`` positions. When gradients are recorded,
    and for a window's short cache, it concatenates.
    """

    #: The first positions a window's cache keeps besides its last ``window - 1``: none here
    #: (:class:`~transformer_lib.sinks.KeepFirstKVCache` keeps some); attentions check it (:func:`check_cache`).
    keep_first = 0

    def __init__(self, *, window: int | None = None, static: bool = False, _checked: bool = False):
        if not _checked:  # a layer making its cache checked its window where it entered
            check_window(window)
        check_bool(static, "static")
        if static and window is not None:
            raise ValueError("a static (cross-attention) KVCache keeps every key: give it no window")
        self.window, self.static = window, static
        self.k: Tensor | None = None  # (B, n_kv_heads, T_cached, d_k)
        self.v: Tensor | None = None
        self.position = 0
        self._buffers: tuple[Tensor, Tensor] | None = None  # (B, n_kv_heads, capacity, d_k) each

    @property
    def capacity(self) -> int:
        """Positions allocated: ``length`` plus the spare room of the buffer, if any."""
        return self.length if self._buffers is None else self._buffers[0].shape[2]

    @property
    def length(self) -> int:
        """The number of positions held, ``T_cached``."""
        return 0 if self.k is None else self.k.shape[2]

    @property
    def filled(self) -> bool:
        """True once anything is cached."""
        return self.k is not None

    def keys_after(self, T_new: int) -> int:
        """How many keys an attention reads once ``T_new`` new positions pass through the cache:
        a filled static cache's own, else what is held plus the new ones (a static cache's first
        fill holds only the new ones)."""
        if self.static:
            return self.length if self.filled else T_new
        return self.length + T_new

    def nbytes(self) -> int:
        """Bytes taken by the cached keys and values."""
        if self.k is None:
            return 0
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def _check(self, k: Tensor, v: Tensor) -> None:
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, Tensor) or t.dim() != 4:
                got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"KVCache: {name} must have shape (B, n_kv_heads, T, d_k), got {got}")
        if k.shape != v.shape:
            raise ValueError(f"KVCache: k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
        if self.k is not None:
            old, new = self.k.shape, k.shape
            if (old[0], old[1], old[3]) != (new[0], new[1], new[3]) or self.k.dtype != k.dtype:
                raise ValueError(
                    f"KVCache holds (B, n_kv_heads, T, d_k) = {tuple(old)} {self.k.dtype}; cannot add "
                    f"{tuple(new)} {k.dtype} (a different batch, layer or dtype: start a new cache)"
                )

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new ``k, v (B, n_kv_heads, T_new, d_k)``; returns every key and value,
        ``(B, n_kv_heads, T_cached + T_new, d_k)`` each, the new ones last."""
        if self.static:
            raise ValueError("this KVCache is static (cross-attention): it is filled once, by set()")
        self._check(k, v)
        self.position += k.shape[2]
        if self.window is None and not (torch.is_grad_enabled() and (k.requires_grad or v.requires_grad)):
            return self._write(k, v)
        self._buffers = None
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)  # (B, n_kv, T_cached + T_new, d_k)
        self.k, self.v = self._kept(k), self._kept(v)
        return k, v

    def _kept(self, x: Tensor) -> Tensor:
        """What a window keeps of ``x (B, n_kv_heads, T, d_k)``, every position held plus the new ones:
        the last ``window - 1`` positions."""
        T = x.shape[2]
        if self.window is None or T <= self.window - 1:
            return x
        return x[:, :, T - (self.window - 1) :]

    def _held(self, total: int) -> list[int]:
        """The positions :meth:`_kept` holds after ``total`` tokens (what :meth:`crop` goes back to)."""
        return window_positions(total, self.window)

    def _write(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append into the buffers (amortised: a copy of the cache only when the capacity doubles)."""
        n, need = self.length, self.length + k.shape[2]
        if self._buffers is None or need > self._buffers[0].shape[2]:
            B, h, _, d_k = k.shape
            capacity = max(need, 2 * self.capacity)
            buffers = k.new_empty(B, h, capacity, d_k), v.new_empty(B, h, capacity, d_k)
            if n:
                buffers[0][:, :, :n] = self.k
                buffers[1][:, :, :n] = self.v
            self._buffers = buffers
        kb, vb = self._buffers
        kb[:, :, n:need] = k
        vb[:, :, n:need] = v
        self.k, self.v = kb[:, :, :need], vb[:, :, :need]  # views: (B, n_kv, T_cached + T_new, d_k)
        return self.k, self.v

    def set(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Fill a static cache with ``k, v (B, n_kv_heads, T_src, d_k)`` (once); returns them."""
        if not self.static:
            raise ValueError(
                "set() fills a static cache (KVCache(static=True)); a self-attention cache grows by append()"
            )
        if self.k is not None:
            raise ValueError("this static KVCache is already filled; start a new one for a new source")
        self._check(k, v)
        self.k, self.v, self.position = k, v, k.shape[2]
        return k, v

    def reset(self) -> None:
        """Empty the cache."""
        self.k = self.v = None
        self._buffers = None
        self.position = 0

    def crop(self, n: int) -> None:
        """Go back to what the cache held after its first ``n`` tokens (see the module): the keys and
        values of later positions are dropped and ``position`` becomes ``n``. A static
        (cross-attention) cache holds the source, not decoded tokens, and is left as it is."""
        if self.static:
            return
        index = crop_positions(self.position, self.length, n, window=self.window, held=self._held, what="this KVCache")
        if is_prefix(index):
            self._keep_prefix(index.numel())
        else:
            self._buffers = None
            self.k, self.v = self.k[:, :, index], self.v[:, :, index]
        self.position = n

    def _keep_prefix(self, n_held: int) -> None:
        """Keep the first ``n_held`` positions held (views of the same buffers: no copy)."""
        if n_held == 0:
            self.k = self.v = None
            self._buffers = None
        else:
            self.k, self.v = self.k[:, :, :n_held], self.v[:, :, :n_held]

    def select(self, rows) -> None:
        """Keep the batch rows ``rows`` (indices, in that order, repeats allowed: beam search's
        surviving beams), for every position held."""
        if not self.filled:
            return
        index = select_rows(rows, self.k.shape[0], "this KVCache")
        self._buffers = None
        self.k, self.v = self.k[index], self.v[index]

    def __repr__(self) -> str:
        shape = None if self.k is None else tuple(self.k.shape)
        extra = ", static=True" if self.static else (f", window={self.window}" if self.window else "")
        return f"KVCache(shape={shape}, position={self.position}{extra}{self._repr_extra()})"

    def _repr_extra(self) -> str:
        """What a subclass adds to the settings :meth:`__repr__` shows: nothing here."""
        return ""


def check_cache(cache: object, window: int | None, batch: int, keep_first: int = 0) -> None:
    """That ``cache`` is a :class:`KVCache` an attention layer with this ``window`` and a query batch of
    ``batch`` may use (chapter "Generation"); a clear error otherwise. ``keep_first`` is the first keys
    the attention keeps in view of its window, which the cache must keep too (chapter "Latent, sparse
    and sink attention"'s :class:`~transformer_lib.sinks.SinkAttention`; 0 for every other attention)."""
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache or None, got {type(cache).__name__}")
    if cache.window is not None and (window is None or cache.window < window):
        raise ValueError(
            f"this KVCache keeps only what a window of {cache.window} needs, but the attention's window is "
            f"{window}: give the cache the attention's window (or none)"
        )
    if cache.keep_first != keep_first and cache.window is not None:
        raise ValueError(
            f"this KVCache keeps the first {cache.keep_first} keys besides its window, the attention keeps "
            f"keep_first={keep_first}: give the cache the attention's keep_first"
        )
    if cache.static and cache.filled and cache.k.shape[0] != batch:
        raise ValueError(f"the static KVCache holds a batch of {cache.k.shape[0]}, the query has B={batch}")


class LayerCache(NamedTuple):
    """The caches of one :class:`~transformer_lib.blocks.DecoderLayer` for incremental decoding (chapter "Generation").

    ``self_attn`` grows by one entry per generated token; ``cross_attn`` (None in a layer without
    cross-attention) is a static :class:`KVCache` filled once with the
    encoder output's keys and values. Each holds ``(B, n_kv_heads, T, d_k)`` keys and values.
    """

    self_attn: KVCache
    cross_attn: KVCache | None = None


class DecoderCache:
    """The caches of a whole :class:`~transformer_lib.blocks.Decoder` stack for incremental decoding (chapter
    "Generation").

    ``layers`` holds one :class:`LayerCache` per layer (``decoder.new_cache()`` makes them);
    ``position`` is the number of target positions the decoder has processed, which is where the
    next new token sits (the offset its position encoding needs). It is not counted twice: every
    layer sees the same tokens, so it is the first layer's ``self_attn.position``, which its
    attention advances (a stack of no layers, with no attention, counts its own).
    ``nbytes()`` is the memory all cached keys and values take, cross-attention included.
    """

    def __init__(self, layers: list[LayerCache]):
        if not all(isinstance(c, LayerCache) for c in layers):
            raise TypeError("DecoderCache takes a list of LayerCache, one per layer")
        self.layers = list(layers)
        self._no_layer_position = 0  # the count of a stack with no layers (and so no KVCache)

    @property
    def position(self) -> int:
        """The target positions processed: the first layer's self-attention cache counts them."""
        return self.layers[0].self_attn.position if self.layers else self._no_layer_position

    def _advance(self, T_new: int) -> None:
        """Count ``T_new`` new positions in a cache of no layers; with layers, the attention
        counts them as it appends (:meth:`KVCache.append`), so this does nothing."""
        if not self.layers:
            self._no_layer_position += T_new

    def crop(self, n: int) -> None:
        """Every layer's caches back to what they held after the first ``n`` target tokens (the
        module's protocol); cross-attention's source stays."""
        for c in self.layers:
            c.self_attn.crop(n)
            if c.cross_attn is not None:
                c.cross_attn.crop(n)
        if not self.layers:
            check_int(n, "n", minimum=0)
            if n > self._no_layer_position:
                raise ValueError(f"cannot crop this DecoderCache to n={n}: it holds {self._no_layer_position} tokens")
            self._no_layer_position = n

    def select(self, rows) -> None:
        """Keep the batch rows ``rows`` in every layer's caches (the module's protocol)."""
        for c in self.layers:
            c.self_attn.select(rows)
            if c.cross_attn is not None:
                c.cross_attn.select(rows)

    def nbytes(self, *, cross: bool = True) -> int:
        """Bytes of every cached key and value; ``cross=False`` counts the self-attention only."""
        total = 0
        for c in self.layers:
            total += c.self_attn.nbytes() + (c.cross_attn.nbytes() if cross and c.cross_attn is not None else 0)
        return total

    def __len__(self) -> int:
        return len(self.layers)

    def __repr__(self) -> str:
        return f"DecoderCache({len(self.layers)} layers, position={self.position}, nbytes={self.nbytes()})"
