"""Keys and values held in 8 or 4 bits (chapter "Longer than trained"): chapter "Generation"'s key-value cache,
quantised the way KIVI does it.

Past the trained length it is the cache that fills the memory: ``2 n_layers n_kv_heads d_k`` numbers
per token. A :class:`QuantizedKVCache` stores them as small integers and a few float32 scales, and
hands attention their dequantised values, so that the layer reads it as it reads a
:class:`~transformer_lib.kv_cache.KVCache`. Two observations of KIVI (Liu et al., 2024) set its layout:

- **keys per channel**: a few channels of the keys are large for every token (and rotary positions
  move size between the two channels of a pair), so each channel of a group of ``group`` tokens gets
  its own scale;
- **values per token**: the values have no such channels, and what attention makes of them is a
  weighted sum over tokens, so each token gets its own scale, over its ``d_k`` channels;
- **a residual in full precision**: a key's scale needs a whole group of tokens, so the newest tokens
  wait unquantised. Once ``residual_length`` tokens wait, the oldest whole groups are quantised; the
  residual then holds the newest ``residual_length - group`` to ``residual_length - 1`` tokens
  (``residual_length = group``, the default: the tokens of the group being filled).

Every scale is symmetric, as chapter "Measuring a model"'s int8 weights: ``s = max|x| / ((2^bits - 1) / 2)`` (127.5
for 8 bits, 7.5 for 4), at least float32's eps, and the code ``round(x * (1 / s))``, half to even,
clipped to ``[-2^(bits-1), 2^(bits-1) - 1]``; so ``|x - code * s| <= s / 2``, half a step. At 8 bits
the codes and dequantised values are PyTorch's ``torch.quantize_per_channel`` (and chapter "Measuring a model"'s
:func:`~transformer_lib.quantize.quantize_int8`), at 4 bits its ``torch.fake_quantize_per_channel_affine``
with ``quant_min=-8, quant_max=7``. Everything is computed in float32; the reads have the keys' dtype.

Storage: 4-bit codes are held one to an int8 here; :meth:`QuantizedKVCache.nbytes` counts them
packed, two to a byte, as a kernel stores them (:func:`quantized_kv_bytes` is the same count as a
formula). Decoding with one (``new_quantized_cache`` builds a model's)::

    cache = tl.new_quantized_cache(model, bits=4, group=32)
    logits, _ = model(prompt, cache=cache)  # prefill: (B, T, vocab_size)
    for _ in range(n):
        nxt = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        logits, _ = model(nxt, cache=cache)  # (B, 1, vocab_size)

The chapter's mistake is ``fixed_scale=True``: each key channel's scale is computed once, from the
prompt, and reused for every later key; a later key larger than any in the prompt is clipped.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_bool, check_int, is_int
from .blocks import Decoder
from .encoder_decoder import Transformer
from .kv_cache import DecoderCache, KVCache, LayerCache, select_rows
from .models import GPT

__all__ = ["QuantizedKVCache", "new_quantized_cache", "quantized_kv_bytes"]

BITS = (8, 4)  # the widths a code may have
_EPS = torch.finfo(torch.float32).eps  # the smallest scale (a channel or token of zeros gets it), as chapter "Measuring
# a model"'s


def _check_settings(bits, group, residual_length, fixed_scale) -> int:
    """The settings checked; returns ``residual_length`` (``group`` when None)."""
    if not is_int(bits) or bits not in BITS:
        raise ValueError(f"bits must be 8 or 4 (the width of a code), got {bits!r}")
    check_int(group, "group")
    residual_length = group if residual_length is None else residual_length
    check_int(residual_length, "residual_length")
    if residual_length < group:
        raise ValueError(
            f"residual_length={residual_length} is shorter than group={group}: a key's scale is computed over a "
            "whole group, so the residual must be able to hold one (residual_length >= group)"
        )
    check_bool(fixed_scale, "fixed_scale")
    return residual_length


def _scales(x32: Tensor, dim: int, bits: int) -> Tensor:
    """Symmetric scales of float32 ``x32`` over ``dim`` (kept, of size 1): ``max|x| / ((2^bits - 1) / 2)``,
    at least float32's eps."""
    return torch.clamp(x32.abs().amax(dim=dim, keepdim=True) / ((2**bits - 1) / 2), min=_EPS)


def _codes(x32: Tensor, scales: Tensor, bits: int) -> Tensor:
    """``round(x * (1 / s))``, half to even, clipped to the ``bits``-wide range: int8, ``x32``'s shape."""
    top = 2 ** (bits - 1)
    return torch.round(x32 * (1.0 / scales)).clamp(-top, top - 1).to(torch.int8)


class QuantizedKVCache(KVCache):
    """A :class:`~transformer_lib.kv_cache.KVCache` (chapter "Generation"'s) that stores keys and values in
    ``bits`` = 8 or 4 bits (chapter "Longer than trained"; KIVI's layout, see the module).

    ``QuantizedKVCache(bits=8, group=32, residual_length=None, fixed_scale=False)``. :meth:`append`
    takes the new ``k, v (B, n_kv_heads, T_new, d_k)`` and returns every key and value it holds,
    ``(B, n_kv_heads, T_cached + T_new, d_k)`` each, in the keys' dtype: the quantised ones
    dequantised, then the residual's as they came. What :meth:`append` returns is what the cache
    holds (``k`` and ``v`` read it again), so the tokens of a group are read at full precision
    until it is quantised, and dequantised from then on.

    Held: key codes ``(B, n_kv_heads, T_q, d_k)`` with a float32 scale per channel of each group of
    ``group`` tokens, ``(B, n_kv_heads, T_q / group, d_k)``; value codes of the same shape with a
    scale per token, ``(B, n_kv_heads, T_q)``; the residual, ``(B, n_kv_heads, T_r, d_k)`` twice, at
    the keys' dtype, ``T_r < residual_length`` (``group`` by default). ``T_q`` is a multiple of
    ``group``. :meth:`nbytes` counts all of it, 4-bit codes packed two to a byte.

    ``fixed_scale=True`` is the chapter's mistake: each key channel's scale is computed once from
    the first :meth:`append` (the prompt), ``(B, n_kv_heads, 1, d_k)``, and every key is quantised
    with it; a later key above the prompt's largest is clipped to the last code. The values keep
    their scale per token. The cache keeps every token (no window): a sliding-window attention
    still masks what it does not see.
    """

    def __init__(
        self,
        *,
        bits: int = 8,
        group: int = 32,
        residual_length: int | None = None,
        fixed_scale: bool = False,
        _checked: bool = False,
    ):
        if not _checked:  # new_quantized_cache checked the settings once for every layer
            residual_length = _check_settings(bits, group, residual_length, fixed_scale)
        super().__init__()
        self.bits, self.group, self.residual_length, self.fixed_scale = bits, group, residual_length, fixed_scale
        self._clear()

    def _clear(self) -> None:
        self._k_codes: Tensor | None = None  # (B, h, T_q, d_k) int8
        self._k_scales: Tensor | None = None  # (B, h, T_q / group, d_k) float32; fixed: (B, h, 1, d_k)
        self._v_codes: Tensor | None = None  # (B, h, T_q, d_k) int8
        self._v_scales: Tensor | None = None  # (B, h, T_q) float32
        self._k_res: Tensor | None = None  # (B, h, T_r, d_k), the keys' dtype
        self._v_res: Tensor | None = None

    # The base class keeps its keys in ``k`` and ``v`` and empties them by writing None; here they are
    # read from the codes, scales and residual, so the only value they may be given is None.
    @property
    def k(self) -> Tensor | None:
        """Every held key, ``(B, n_kv_heads, T_cached, d_k)``, dequantised (None while empty)."""
        return self._read()[0] if self.filled else None

    @k.setter
    def k(self, value) -> None:
        if value is not None:
            raise AttributeError("a QuantizedKVCache's keys are written by append(), not assigned")

    @property
    def v(self) -> Tensor | None:
        """Every held value, ``(B, n_kv_heads, T_cached, d_k)``, dequantised (None while empty)."""
        return self._read()[1] if self.filled else None

    @v.setter
    def v(self, value) -> None:
        if value is not None:
            raise AttributeError("a QuantizedKVCache's values are written by append(), not assigned")

    @property
    def quantised_length(self) -> int:
        """``T_q``: the positions held as codes (a multiple of ``group``)."""
        return 0 if self._k_codes is None else self._k_codes.shape[2]

    @property
    def residual(self) -> int:
        """``T_r``: the newest positions held in full precision, waiting for their group."""
        return 0 if self._k_res is None else self._k_res.shape[2]

    @property
    def length(self) -> int:
        """The number of positions held, ``T_cached = T_q + T_r``."""
        return self.quantised_length + self.residual

    @property
    def filled(self) -> bool:
        """True once anything is cached."""
        return self._k_res is not None

    def _check(self, k: Tensor, v: Tensor) -> None:
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, Tensor) or t.dim() != 4 or not t.is_floating_point():
                got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(
                    f"QuantizedKVCache: {name} must be floating point of shape (B, n_kv_heads, T, d_k), got {got}"
                )
        if k.shape != v.shape or k.dtype != v.dtype:
            raise ValueError(
                f"QuantizedKVCache: k and v must have one shape and dtype, got {tuple(k.shape)} "
                f"{k.dtype} and {tuple(v.shape)} {v.dtype}"
            )
        if self.filled:
            old = self._k_res
            sizes = (k.shape[0], k.shape[1], k.shape[3])  # (B, n_kv_heads, d_k)
            if sizes != (old.shape[0], old.shape[1], old.shape[3]) or k.dtype != old.dtype:
                raise ValueError(
                    f"QuantizedKVCache holds (B, n_kv_heads, T, d_k) = {(*old.shape[:2], self.length, old.shape[3])} "
                    f"{old.dtype}; cannot add {tuple(k.shape)} {k.dtype} (a different batch, layer or dtype: start a "
                    "new cache)"
                )

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new ``k, v (B, n_kv_heads, T_new, d_k)``; returns every key and value held,
        ``(B, n_kv_heads, T_cached + T_new, d_k)`` each, the new ones last, the quantised ones dequantised."""
        self._check(k, v)
        if self.fixed_scale and not self.filled:  # the mistake: one scale per channel, from the prompt alone
            self._k_scales = _scales(k.detach().float(), 2, self.bits)  # (B, h, 1, d_k)
        self.position += k.shape[2]
        k_res = k if self._k_res is None else torch.cat([self._k_res, k], dim=2)  # (B, h, T_r + T_new, d_k)
        v_res = v if self._v_res is None else torch.cat([self._v_res, v], dim=2)
        n, G = k_res.shape[2], self.group
        take = 0 if n < self.residual_length else G * ((n - self.residual_length) // G + 1)  # whole groups
        if take:
            self._store(k_res[:, :, :take].detach().float(), v_res[:, :, :take].detach().float())
        self._k_res, self._v_res = k_res[:, :, take:].clone(), v_res[:, :, take:].clone()  # (B, h, T_r, d_k)
        return self._read()

    def _store(self, k32: Tensor, v32: Tensor) -> None:
        """Quantise ``k32, v32 (B, h, m * group, d_k)`` (float32, whole groups) and add them to the codes."""
        B, h, n, d_k = k32.shape
        groups = k32.view(B, h, n // self.group, self.group, d_k)  # (B, h, m, group, d_k)
        if self.fixed_scale:
            k_codes = _codes(k32, self._k_scales, self.bits)  # clipped where a key outgrows the prompt's
            k_scales = None
        else:
            k_scales = _scales(groups, 3, self.bits)  # (B, h, m, 1, d_k): per channel, over a group's tokens
            k_codes = _codes(groups, k_scales, self.bits).view(B, h, n, d_k)
            k_scales = k_scales.squeeze(3)  # (B, h, m, d_k)
        v_scales = _scales(v32, 3, self.bits)  # (B, h, n, 1): per token, over its d_k channels
        v_codes = _codes(v32, v_scales, self.bits)
        held = self._k_codes is not None
        self._k_codes = torch.cat([self._k_codes, k_codes], dim=2) if held else k_codes
        self._v_codes = torch.cat([self._v_codes, v_codes], dim=2) if held else v_codes
        v_scales = v_scales.squeeze(3)
        self._v_scales = torch.cat([self._v_scales, v_scales], dim=2) if held else v_scales
        if k_scales is not None:
            self._k_scales = torch.cat([self._k_scales, k_scales], dim=2) if held else k_scales

    def _dequantised(self) -> tuple[Tensor, Tensor]:
        """The held codes times their scales, float32 ``(B, h, T_q, d_k)`` each."""
        B, h, n, d_k = self._k_codes.shape
        if self.fixed_scale:
            k = self._k_codes.float() * self._k_scales  # (B, h, T_q, d_k) times (B, h, 1, d_k)
        else:
            groups = self._k_codes.view(B, h, n // self.group, self.group, d_k).float()
            k = (groups * self._k_scales.unsqueeze(3)).view(B, h, n, d_k)  # each group by its channels' scales
        return k, self._v_codes.float() * self._v_scales.unsqueeze(3)  # values: each token by its scale

    def _read(self) -> tuple[Tensor, Tensor]:
        """Every held key and value, ``(B, h, T_cached, d_k)``: the dequantised ones, then the residual."""
        if self._k_codes is None:
            return self._k_res, self._v_res
        k, v = self._dequantised()
        dtype = self._k_res.dtype
        return torch.cat([k.to(dtype), self._k_res], dim=2), torch.cat([v.to(dtype), self._v_res], dim=2)

    def nbytes(self) -> int:
        """Bytes held: the codes (4-bit ones packed two to a byte), the float32 scales and the residual."""
        total = 0
        for codes in (self._k_codes, self._v_codes):
            total += 0 if codes is None else -(-codes.numel() * self.bits // 8)
        for t in (self._k_scales, self._v_scales, self._k_res, self._v_res):
            total += 0 if t is None else t.numel() * t.element_size()
        return total

    def set(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Refused: a quantised cache grows by :meth:`append` (a cross-attention cache is a static ``KVCache``)."""
        raise ValueError("a QuantizedKVCache is a self-attention cache: it grows by append(), it is not set()")

    def reset(self) -> None:
        """Empty the cache (the settings stay)."""
        super().reset()
        self._clear()

    def quantised_after(self, m: int) -> int:
        """``T_q`` once ``m`` tokens are appended, in any chunks: none before ``residual_length`` wait, then
        every whole group but the residual's ``residual_length - group`` to ``residual_length - 1``."""
        R, G = self.residual_length, self.group
        return 0 if m < R else m - (R - G + (m - R) % G)

    def crop(self, n: int) -> None:
        """Back to what the cache held after its first ``n`` tokens (the protocol of chapter "Generation"). Only the
        residual can be cut: a position already quantised has lost its full-precision key, which the
        first ``n`` tokens' cache may still hold, and with ``fixed_scale`` the scale came from the prompt."""
        check_int(n, "n", minimum=0)
        if n > self.position:
            raise ValueError(f"cannot crop this QuantizedKVCache to n={n}: it holds {self.position} tokens")
        if n == self.position:
            return
        if n == 0:
            self.reset()
            return
        if self.fixed_scale or self.quantised_after(n) != self.quantised_length:
            why = "its keys' scale came from the prompt" if self.fixed_scale else "they are already quantised"
            raise ValueError(
                f"cannot crop this QuantizedKVCache to n={n}: it would need positions {self.quantised_after(n)} to "
                f"{n - 1} in full precision, and {why} (decode again from the prompt)"
            )
        keep = n - self.quantised_length
        self._k_res, self._v_res = self._k_res[:, :, :keep], self._v_res[:, :, :keep]
        self.position = n

    def select(self, rows) -> None:
        """Keep the batch rows ``rows`` of the codes, scales and residual."""
        if not self.filled:
            return
        index = select_rows(rows, self._k_res.shape[0], "this QuantizedKVCache")
        for name in ("_k_codes", "_k_scales", "_v_codes", "_v_scales", "_k_res", "_v_res"):
            held = getattr(self, name)
            if held is not None:
                setattr(self, name, held[index])

    def __repr__(self) -> str:
        settings = f"bits={self.bits}, group={self.group}, residual_length={self.residual_length}"
        settings += ", fixed_scale=True" if self.fixed_scale else ""
        held = f"quantised={self.quantised_length}, residual={self.residual}, position={self.position}"
        return f"QuantizedKVCache({settings}, {held})"


def new_quantized_cache(
    model, *, bits: int = 8, group: int = 32, residual_length: int | None = None, fixed_scale: bool = False
) -> DecoderCache:
    """An empty :class:`~transformer_lib.kv_cache.DecoderCache` for ``model`` whose self-attention caches
    are :class:`QuantizedKVCache` (chapter "Longer than trained"; the cache of chapter "Generation", quantised).

    ``model`` is a :class:`~transformer_lib.models.GPT`, a chapter "Encoder-decoder and cross-attention"
    :class:`~transformer_lib.encoder_decoder.Transformer` (its cross-attention caches stay full
    precision) or a :class:`~transformer_lib.blocks.Decoder`. Pass the cache as ``model(idx,
    cache=...)`` does ``model.new_cache()``'s. The settings are :class:`QuantizedKVCache`'s, checked
    here once. A layer whose attention keeps a cache of its own kind (latent, sparse, recurrent:
    chapters "Latent, sparse and sink attention" and "Attention as a recurrence") is refused: only multi-head
    attention's key-value cache is quantised here.
    """
    residual_length = _check_settings(bits, group, residual_length, fixed_scale)
    if isinstance(model, (GPT, Transformer)):
        decoder = model.decoder
    elif isinstance(model, Decoder):
        decoder = model
    else:
        raise TypeError(f"model must be a GPT, a Transformer or a Decoder, got {type(model).__name__}")
    layers = []
    for i, layer in enumerate(decoder.layers):
        plain = layer.new_cache()
        if type(plain.self_attn) is not KVCache:
            raise ValueError(
                f"layer {i}'s attention ({type(layer.self_attn).__name__}) keeps a {type(plain.self_attn).__name__}, "
                "not a KVCache of keys and values: new_quantized_cache quantises multi-head attention's cache only"
            )
        own = QuantizedKVCache(
            bits=bits, group=group, residual_length=residual_length, fixed_scale=fixed_scale, _checked=True
        )
        layers.append(LayerCache(own, plain.cross_attn))
    return DecoderCache(layers)


def quantized_kv_bytes(
    n_layers: int,
    n_kv_heads: int,
    d_k: int,
    T: int,
    *,
    bits: int = 8,
    group: int = 32,
    residual_length: int | None = None,
    fixed_scale: bool = False,
    batch: int = 1,
    dtype: torch.dtype = torch.float32,
) -> int:
    """The bytes :meth:`QuantizedKVCache.nbytes` counts, summed over ``n_layers``, once ``T`` tokens have
    been appended (chapter "Longer than trained"; chapter "Generation"'s ``kv_cache_bytes`` for the full cache).

    Of the ``T`` tokens, ``T_q`` are codes: 0 while ``T < residual_length``, else the multiple of
    ``group`` that leaves ``T_r = T - T_q`` in ``[residual_length - group, residual_length)``. Per
    layer, batch row and key-value head: ``2 T_q d_k bits / 8`` bytes of codes, ``4 (T_q / group) d_k``
    of key scales (``4 d_k`` once with ``fixed_scale``), ``4 T_q`` of value scales and ``2 T_r d_k``
    numbers of ``dtype`` in the residual. Per token, once the groups dominate: ``n_layers n_kv_heads
    (2 d_k bits / 8 + 4 d_k / group + 4)`` bytes, against ``n_layers n_kv_heads 2 d_k`` times the
    dtype's size.
    """
    for name, value in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("d_k", d_k), ("batch", batch)):
        check_int(value, name)
    check_int(T, "T", minimum=0)
    residual_length = _check_settings(bits, group, residual_length, fixed_scale)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    T_q = 0 if T < residual_length else group * ((T - residual_length) // group + 1)
    rows = batch * n_kv_heads  # the (B, h) pairs of one layer
    codes = 2 * -(-rows * T_q * d_k * bits // 8)  # keys' and values', packed
    key_scales = 4 * rows * d_k * ((1 if T else 0) if fixed_scale else T_q // group)
    residual = 2 * rows * (T - T_q) * d_k * torch.empty((), dtype=dtype).element_size()
    return n_layers * (codes + key_scales + 4 * rows * T_q + residual)
