"""Transformer layers and stacks (chapter "The transformer block").

Every layer offers post-LN, ``LayerNorm(x + Sublayer(x))`` as in the original paper, and pre-LN,
``x + Sublayer(LayerNorm(x))`` as in most modern models, chosen by ``norm_first``.
Inputs and outputs are ``(B, T, d_model)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ._checks import check_bool, check_divisible, check_int, check_kv_heads, check_layer_dtype, check_window
from ._specs import Spec, option
from .kv_cache import DecoderCache, KVCache, LayerCache
from .multihead import MultiHeadAttention

__all__ = [
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "MLPSpec",
    "layer_grad_norms",
    "scaled_embedding",
]

# Every layer and stack takes d_model first; after its sizes (d_model, n_heads, then n_layers for a
# stack, then d_ff) every argument is keyword-only.


def scaled_embedding(embedding: nn.Embedding, ids: Tensor) -> Tensor:
    """Token embeddings multiplied by sqrt(d_model), as in the original paper (chapter "The transformer block").

    ``ids (B, T)`` integer ids in, ``(B, T, d_model)`` out.
    """
    return embedding(ids) * math.sqrt(embedding.embedding_dim)


class FeedForward(nn.Module):
    """Position-wise feed-forward network: Linear(d_model, d_ff), activation, Linear(d_ff, d_model) (chapter "The
    transformer block").

    Every position is transformed alike (see :meth:`forward`). ``activation`` is ``"relu"``,
    ``"gelu"`` (exact, with the normal CDF) or ``"gelu_tanh"`` (GPT-2's approximation
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, chapter "Generation").
    """

    part_role = "feed_forward"  # its role and matrices, for the tools that ask by role (transformer_lib.parts)
    part_matrices = {"in": "net.0.weight", "out": "net.2.weight"}

    def __init__(self, d_model: int, d_ff: int, *, dropout: float = 0.0, activation: str = "relu", bias: bool = True):
        super().__init__()
        check_int(d_model, "d_model")
        check_int(d_ff, "d_ff")
        acts = {"relu": nn.ReLU, "gelu": nn.GELU, "gelu_tanh": lambda: nn.GELU(approximate="tanh")}
        if activation not in acts:
            raise ValueError(f"activation must be one of {sorted(acts)}, got {activation!r}")
        self.net = nn.Sequential(
            nn.Linear(d_model, d_ff, bias=bias),
            acts[activation](),
            nn.Linear(d_ff, d_model, bias=bias),
            nn.Dropout(dropout),
        )

    def forward(self, x: Tensor) -> Tensor:
        """``x (B, T, d_model)`` -> ``(B, T, d_model)``: each position's vector through the network."""
        up, act, down, dropout = self.net
        try:
            out = down(act(up(x)))  # (B, T, d_model)
        except RuntimeError:  # name the usual cause (a tensor of another dtype) instead of the kernel's words
            check_layer_dtype(x, self, "x")
            raise
        return dropout(out) if dropout.p and self.training else out  # p = 0: no call at all


@dataclass(frozen=True)
class MLPSpec(Spec):
    """GPT-2's feed-forward network as a recipe's choice (chapter "Today's block"): Linear,
    ``activation``, Linear, ``d_ff`` wide (None: ``4 d_model``)."""

    kind = "mlp"
    activation: str = option(
        "gelu",
        "the mlp network's activation: gelu, or gelu_tanh (GPT-2's approximation)",
        choices=("gelu", "gelu_tanh"),
    )
    d_ff: int | None = option(None, "the feed-forward width (default: 4 d_model, or 2/3 of it for swiglu)")

    def __post_init__(self):
        super().__post_init__()
        if self.activation not in ("gelu", "gelu_tanh"):
            raise ValueError(f"activation must be one of ['gelu', 'gelu_tanh'], got {self.activation!r}")
        if self.d_ff is not None:
            check_int(self.d_ff, "d_ff")

    def layer(self, recipe, d_model: int, d_ff: int | None = None) -> FeedForward:
        """One network of width ``d_model``; ``d_ff`` (a layer's own) wins over the spec's."""
        d_ff = self.d_ff if d_ff is None else d_ff
        return FeedForward(d_model, 4 * d_model if d_ff is None else d_ff, activation=self.activation, bias=recipe.bias)


class _Residual(nn.Module):
    """One sublayer with its residual connection and its norm (LayerNorm or, chapter "Today's block", RMSNorm), post or
    pre."""

    def __init__(self, norm: nn.Module, dropout: float, norm_first: bool):
        super().__init__()
        self.norm = norm
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer) -> Tensor:
        if self.norm_first:
            try:
                normed = self.norm(x)
            except RuntimeError:  # name the usual cause (a tensor of another dtype) instead of the kernel's words
                check_layer_dtype(x, self, "x")
                raise
            return x + self._dropout(sublayer(normed))  # pre-LN
        return self.norm(x + self._dropout(sublayer(x)))  # post-LN

    def _dropout(self, x: Tensor) -> Tensor:
        """Dropout, not even called when it can change nothing (``p = 0`` or evaluation)."""
        return self.dropout(x) if self.dropout.p and self.training else x


def _check_kv_heads(d_model, n_heads, n_kv_heads) -> None:
    """``n_kv_heads``, with the sizes it depends on checked first (as the attention does)."""
    if n_kv_heads is not None:
        check_divisible(d_model, n_heads)
        check_kv_heads(n_kv_heads, n_heads)


class _LayerParts:
    """The settings every layer shares, and the sublayers made from them (in the order a layer calls):
    this chapter's LayerNorm, :class:`FeedForward` and :class:`~transformer_lib.multihead.MultiHeadAttention`,
    or those of ``parts`` (chapter "Today's block"'s :class:`~transformer_lib.recipe.BlockRecipe`: any object with
    ``norm_layer``, ``feed_forward`` and ``attention_layer``, which then decides biases and activation)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        *,
        dropout: float = 0.0,
        norm_first: bool = False,
        activation: str = "relu",
        bias: bool = True,
        n_kv_heads: int | None = None,
        parts=None,
        _checked: bool = False,
    ):
        if not _checked:  # n_kv_heads once per layer, not once per attention (the stack: once)
            _check_kv_heads(d_model, n_heads, n_kv_heads)
        if d_ff is not None:
            check_int(d_ff, "d_ff")
        check_bool(norm_first, "norm_first")
        check_bool(bias, "bias")
        if parts is not None and (activation != "relu" or not bias):
            raise ValueError("give activation and bias in the parts (a BlockRecipe), not beside them")
        if parts is not None and not all(callable(getattr(parts, m, None)) for m in self._MADE_BY_PARTS):
            raise TypeError(f"parts must make a block's parts ({', '.join(self._MADE_BY_PARTS)}), got {parts!r}")
        self.d_model, self.n_heads, self.d_ff, self.dropout = d_model, n_heads, d_ff, dropout
        self.norm_first, self.activation, self.bias, self.n_kv_heads, self.parts = (
            norm_first,
            activation,
            bias,
            n_kv_heads,
            parts,
        )

    _MADE_BY_PARTS = ("norm_layer", "feed_forward", "attention_layer")

    def attention(self, self_attention: bool = False) -> nn.Module:
        heads = dict(n_kv_heads=self.n_kv_heads, dropout=self.dropout)
        if self.parts is not None:
            return self.parts.attention_layer(self.d_model, self.n_heads, self_attention=self_attention, **heads)
        return MultiHeadAttention(self.d_model, self.n_heads, bias=self.bias, _checked=True, **heads)

    def norm(self) -> nn.Module:
        return self.parts.norm_layer(self.d_model) if self.parts else nn.LayerNorm(self.d_model, bias=self.bias)

    def residual(self) -> _Residual:
        return _Residual(self.norm(), self.dropout, self.norm_first)

    def feed_forward(self) -> nn.Module:
        if self.parts is not None:
            return self.parts.feed_forward(self.d_model, self.d_ff)
        d_ff = 4 * self.d_model if self.d_ff is None else self.d_ff
        return FeedForward(self.d_model, d_ff, activation=self.activation, bias=self.bias)


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in a residual connection and LayerNorm (chapter "The transformer
    block").

    ``EncoderLayer(d_model, n_heads, d_ff=None, *, dropout=0.0, norm_first=False, activation="relu",
    bias=True, n_kv_heads=None)`` (:meth:`forward`); ``n_kv_heads``: grouped-query attention (chapter "Generation").
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, **options):
        super().__init__()
        parts = _LayerParts(d_model, n_heads, d_ff, **options)
        self.self_attn = parts.attention(self_attention=True)
        self.ff = parts.feed_forward()
        self.res_attn, self.res_ff = parts.residual(), parts.residual()
        self.attn_weights = None

    def forward(self, x: Tensor, mask: Tensor | None = None, need_weights: bool = False) -> Tensor:
        """``x (B, T, d_model)`` -> ``(B, T, d_model)``. ``mask`` (True = may attend) broadcasts to
        ``(B, h, T, T)``, normally a padding mask (a NaN in a padded position's value still spreads:
        see :meth:`MultiHeadAttention.forward`). With ``need_weights`` the attention weights
        ``(B, h, T, T)`` are kept in ``self.attn_weights``."""

        def attend(h: Tensor) -> Tensor:
            out, self.attn_weights = self.self_attn(h, h, h, mask=mask, need_weights=need_weights)
            return out

        x = self.res_attn(x, attend)
        return self.res_ff(x, self.ff)  # (B, T, d_model)


class DecoderLayer(nn.Module):
    """Causal self-attention, then cross-attention to the encoder's output, then feed-forward (chapter "The transformer
    block").

    ``DecoderLayer(d_model, n_heads, d_ff=None, *, cross_attention=True, dropout=0.0,
    norm_first=False, activation="relu", bias=True, n_kv_heads=None, window=None)``;
    See :meth:`forward`. With ``cross_attention=False`` the layer has no cross-attention: the
    block of a decoder-only model such as GPT. Chapter "Generation" adds ``n_kv_heads`` (grouped-query
    attention in every attention of the layer), ``window`` (sliding-window self-attention: each
    position sees itself and the ``window - 1`` before it) and the ``cache`` of :meth:`forward`.
    Chapter "Today's block" adds ``parts``: an object that makes the layer's norms, feed-forward network and
    attention (a :class:`~transformer_lib.recipe.BlockRecipe`, which then decides the biases and
    the activation too); by default they are this chapter's.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        *,
        cross_attention: bool = True,
        window: int | None = None,
        _checked: bool = False,
        **options,
    ):
        super().__init__()
        if not _checked:  # a stack or a model building the layer checked window where it entered
            check_window(window)
        parts = _LayerParts(d_model, n_heads, d_ff, _checked=_checked, **options)
        self.window = window
        self.self_attn, self.res_self = parts.attention(self_attention=True), parts.residual()
        self.cross_attn = parts.attention() if cross_attention else None
        self.res_cross = parts.residual() if cross_attention else None
        self.ff, self.res_ff = parts.feed_forward(), parts.residual()
        self.self_attn_weights = self.cross_attn_weights = None

    def new_cache(self) -> LayerCache:
        """An empty :class:`LayerCache` for this layer (chapter "Generation"); a later chapter's attention that keeps
        another kind of cache makes its own (``self_attn.new_cache(window)``)."""
        own = getattr(self.self_attn, "new_cache", None)
        cross = KVCache(static=True) if self.cross_attn is not None else None
        return LayerCache(own(self.window) if own else KVCache(window=self.window, _checked=True), cross)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        self_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: LayerCache | None = None,
        _trusted: bool = False,
    ) -> Tensor:
        """``x (B, T, d_model)`` and ``memory (B, T_src, d_model)`` (the encoder's output) ->
        ``(B, T, d_model)``. The self-attention is always causal; ``self_mask`` can add a padding
        mask, ``memory_mask`` masks the source. With ``need_weights`` the weights are kept in
        ``self.self_attn_weights (B, h, T, T)`` and ``self.cross_attn_weights (B, h, T, T_src)``.
        With ``cache``, a :class:`LayerCache` (chapter "Generation"), ``x`` holds only the new positions,
        after the ``cache.self_attn.position`` already seen, and ``self_mask`` covers ``T_cached +
        T`` keys. ``_trusted``: a model built the inputs and checked them once per call."""
        if not _trusted and cache is not None and not isinstance(cache, LayerCache):
            raise TypeError(f"cache must be a LayerCache (layer.new_cache()) or None, got {type(cache).__name__}")
        self_cache = None if cache is None else cache.self_attn
        cross_cache = None if cache is None else cache.cross_attn

        def self_attend(h: Tensor) -> Tensor:
            out, self.self_attn_weights = self.self_attn(
                h,
                h,
                h,
                mask=self_mask,
                need_weights=need_weights,
                is_causal=True,
                window=self.window,
                cache=self_cache,
                _checked=True,
                _trusted=_trusted,
            )
            return out

        def cross_attend(h: Tensor) -> Tensor:
            out, self.cross_attn_weights = self.cross_attn(
                h, memory, memory, mask=memory_mask, need_weights=need_weights, cache=cross_cache, _trusted=_trusted
            )
            return out

        x = self.res_self(x, self_attend)
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("this DecoderLayer has cross-attention and needs the encoder output `memory`")
            x = self.res_cross(x, cross_attend)
        return self.res_ff(x, self.ff)  # (B, T, d_model)


class _Stack(nn.Module):
    """``n_layers`` layers of ``layer_class``; pre-LN stacks end with a final LayerNorm (their
    residual stream is never normalised otherwise)."""

    layer_class: type[nn.Module]

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_layers: int,
        d_ff: int | None = None,
        *,
        norm_first: bool = False,
        bias: bool = True,
        _checked: bool = False,
        **options,
    ):
        super().__init__()
        check_int(n_layers, "n_layers", minimum=0)
        if not _checked:  # once for the stack; its layers trust it (a model's config checked them)
            _check_kv_heads(d_model, n_heads, options.get("n_kv_heads"))
            if self.layer_class is DecoderLayer:
                check_window(options.get("window"))
        per_layer = getattr(options.get("parts"), "for_layer", None)  # chapter "Attention as a recurrence": a hybrid's
        # layers differ
        layer_options = [{**options, "parts": per_layer(i)} if per_layer else options for i in range(n_layers)]
        self.layers = nn.ModuleList(
            self.layer_class(d_model, n_heads, d_ff, norm_first=norm_first, bias=bias, _checked=True, **o)
            for o in layer_options
        )
        own = {k: options[k] for k in ("activation", "parts") if k in options}  # chapter "Today's block": the parts'
        # norm
        self.norm = (
            _LayerParts(d_model, n_heads, bias=bias, _checked=True, **own).norm() if norm_first else nn.Identity()
        )


class Encoder(_Stack):
    """A stack of ``n_layers`` :class:`EncoderLayer`; pre-LN stacks end with a final LayerNorm (chapter "The transformer
    block").

    ``Encoder(d_model, n_heads, n_layers, d_ff=None, *, norm_first=False, bias=True, **options)``,
    ``options`` being the other keyword arguments of :class:`EncoderLayer` (``dropout``,
    ``activation``, ``n_kv_heads``). ``x (B, T, d_model)`` in and out.
    """

    layer_class = EncoderLayer

    def forward(self, x: Tensor, mask: Tensor | None = None, need_weights: bool = False) -> Tensor:
        """``x (B, T, d_model)`` -> ``(B, T, d_model)``, each layer as :meth:`EncoderLayer.forward`."""
        for layer in self.layers:
            x = layer(x, mask=mask, need_weights=need_weights)
        return self.norm(x)  # (B, T, d_model)


class Decoder(_Stack):
    """A stack of ``n_layers`` :class:`DecoderLayer`; pre-LN stacks end with a final LayerNorm (chapter "The transformer
    block").

    ``Decoder(d_model, n_heads, n_layers, d_ff=None, *, norm_first=False, bias=True, **options)``,
    ``options`` being the other keyword arguments of :class:`DecoderLayer` (``dropout``,
    ``cross_attention``, ``activation``, from chapter "Generation" ``n_kv_heads``, and from chapter "Long context and
    precision" ``window``). See :meth:`forward`.
    """

    layer_class = DecoderLayer

    def new_cache(self) -> DecoderCache:
        """An empty :class:`DecoderCache` with one :class:`LayerCache` per layer (chapter "Generation")."""
        return DecoderCache([layer.new_cache() for layer in self.layers])

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        self_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: DecoderCache | None = None,
        _trusted: bool = False,
    ) -> Tensor:
        """``x (B, T, d_model)`` and ``memory (B, T_src, d_model)``, the encoder's output (None
        without cross-attention) -> ``(B, T, d_model)``, each layer as :meth:`DecoderLayer.forward`.
        ``cache`` (chapter "Generation"), a :class:`DecoderCache` from :meth:`new_cache`: ``x`` then holds
        only the new positions, and the cache's ``position`` moves on by ``T``. ``_trusted``: a
        model made ``x`` and the cache and checked them, so no layer checks them again."""
        if (
            not _trusted
            and cache is not None
            and (not isinstance(cache, DecoderCache) or len(cache) != len(self.layers))
        ):
            got = f"{len(cache)} layers" if isinstance(cache, DecoderCache) else type(cache).__name__
            raise ValueError(
                f"cache must be a DecoderCache with {len(self.layers)} layers (decoder.new_cache()), got {got}"
            )
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else cache.layers[i]
            x = layer(
                x,
                memory,
                self_mask=self_mask,
                memory_mask=memory_mask,
                need_weights=need_weights,
                cache=layer_cache,
                _trusted=_trusted,
            )
        if cache is not None:
            cache._advance(x.shape[1])  # a no-op with layers: their KVCaches counted the positions
        return self.norm(x)  # (B, T, d_model)


def layer_grad_norms(layers: nn.ModuleList | list[nn.Module]) -> Tensor:
    """The L2 norm of each layer's parameter gradients, a float32 tensor ``(n_layers,)`` (chapter "The transformer
    block").

    Call it after ``loss.backward()``, for example on ``encoder.layers``. All of a layer's
    parameters count together, as one long vector; a parameter without a gradient counts as
    zero. Chapter "The transformer block" uses it to compare how the gradient spreads over the layers of a deep
    post-LN stack and a deep pre-LN stack.
    """
    norms = []
    for layer in layers:
        squares = [p.grad.detach().float().pow(2).sum() for p in layer.parameters() if p.grad is not None]
        norms.append(torch.stack(squares).sum().sqrt().cpu() if squares else torch.zeros(()))
    return torch.stack(norms) if norms else torch.zeros(0)
