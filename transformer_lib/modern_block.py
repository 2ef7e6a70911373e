"""Today's block (chapter "Today's block"): the parts that turn GPT-2's block into a
Llama-style one. Every departure from GPT-2's block, one line each (each is one choice of
:class:`~transformer_lib.recipe.BlockRecipe`, switchable, and measured in chapter "Today's block"):

- ``norm="rmsnorm"``: :class:`RMSNorm` rescales by the root mean square only (no mean, no bias);
- ``ffn="swiglu"``: :class:`SwiGLU`, ``down(silu(gate(x)) * up(x))``, as wide in parameters as a
  ``4 d_model`` GELU network by the 2/3 rule (:func:`swiglu_hidden`);
- ``positions="rotary"``: no position vectors; queries and keys are rotated by their positions
  (:func:`rotate_heads`, chapter "Positional encoding"'s :class:`~transformer_lib.positional.RotaryEmbedding`), keys
  before the cache, so a key-value cache holds them rotated;
- ``bias=False``: no biases in the linear maps or norms;
- ``qk_norm=True``: an RMSNorm on each head's queries and keys before the scores;
- ``tie_embeddings=False``: the output head has its own matrix (Llama's; GPT-2 ties it);
- ``n_kv_heads < n_heads`` (the model's shape, chapter "Generation"): grouped-query attention.

:class:`QKTransform` is what an attention applies to its queries and keys after splitting the
heads and before the scores: query-key normalisation, then rotary positions. This module makes
no model: :mod:`transformer_lib.recipe` hands these parts to the layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_base, check_bool, check_int, is_real
from ._specs import Spec, option
from .inspect_heads import recording_scores
from .multihead import MultiHeadAttention
from .parts import find_parts
from .positional import RotaryEmbedding

__all__ = [
    "QKTransform",
    "RMSNorm",
    "RotarySpec",
    "SwiGLU",
    "SwiGLUSpec",
    "attention_logit_max",
    "qk_transformed",
    "rotate_heads",
    "swiglu_hidden",
]


def _check_eps(eps: object) -> None:
    if not is_real(eps) or not (eps > 0 and math.isfinite(eps)):  # inf divides every x to 0
        raise ValueError(f"eps must be a number > 0 (it keeps the division finite) and not inf, got {eps!r}")


class RMSNorm(nn.Module):
    """Root-mean-square normalisation (chapter "Today's block"): ``x / sqrt(mean(x^2) + eps) * weight``.

    ``x (..., d)`` in, the same shape out. Unlike LayerNorm it subtracts no mean and adds no bias:
    one learned gain ``weight (d,)``, initialised to ones. Equal to ``torch.nn.RMSNorm(d, eps=eps)``.
    """

    part_role = "norm"  # its role, for the tools that ask for parts by role (transformer_lib.parts)

    def __init__(self, d: int, *, eps: float = 1e-5):
        super().__init__()
        check_int(d, "d")
        _check_eps(eps)
        self.d, self.eps = d, float(eps)
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:
        """``x (..., d)`` -> ``(..., d)``: each vector divided by its root mean square, times ``weight``."""
        if x.shape[-1] != self.d:
            raise ValueError(f"expected last dimension d={self.d}, got shape {tuple(x.shape)}")
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def extra_repr(self) -> str:
        return f"{self.d}, eps={self.eps}"


def swiglu_hidden(d_model: int, *, multiple_of: int = 8) -> int:
    """The hidden width of a :class:`SwiGLU` as wide in parameters as a ``4 d_model`` GELU network (chapter "Today's
    block").

    A gated network has three matrices, ``3 d_model d_ff`` weights, against ``2 d_model (4 d_model)``:
    ``d_ff = 2/3 * 4 d_model`` makes them equal. Llama then rounds up to a ``multiple_of``, which
    adds at most ``3 d_model (multiple_of - 1)`` weights: for ``d_model = 128``, ``d_ff = 344``.
    """
    check_int(d_model, "d_model")
    check_int(multiple_of, "multiple_of")
    hidden = int(2 * 4 * d_model / 3)
    return multiple_of * -(-hidden // multiple_of)  # rounded up


class SwiGLU(nn.Module):
    """The gated feed-forward network of Llama (chapter "Today's block"): ``down_proj(silu(gate_proj(x)) *
    up_proj(x))``.

    ``x (B, T, d_model)`` in and out; ``d_ff`` (default :func:`swiglu_hidden`) is the width of the
    gate and of the values it gates. ``bias`` (default False, as in Llama) adds biases to the three
    linear maps. The names of the maps are those of ``transformers``' ``LlamaMLP``.
    """

    part_role = "feed_forward"
    part_matrices = {"gate": "gate_proj.weight", "in": "up_proj.weight", "out": "down_proj.weight"}

    def __init__(self, d_model: int, d_ff: int | None = None, *, bias: bool = False):
        super().__init__()
        check_int(d_model, "d_model")
        d_ff = swiglu_hidden(d_model) if d_ff is None else d_ff
        check_int(d_ff, "d_ff")
        check_bool(bias, "bias")
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """``x (B, T, d_model)`` -> ``(B, T, d_model)``: the SiLU of the gate times the up projection, down."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@dataclass(frozen=True)
class SwiGLUSpec(Spec):
    """Llama's gated feed-forward network as a recipe's choice (chapter "Today's block"), ``d_ff`` wide
    (None: :func:`swiglu_hidden`, as many weights as GPT-2's network)."""

    kind = "swiglu"
    d_ff: int | None = option(None, "the feed-forward width (default: 4 d_model, or 2/3 of it for swiglu)")

    def __post_init__(self):
        super().__post_init__()
        if self.d_ff is not None:
            check_int(self.d_ff, "d_ff")

    def layer(self, recipe, d_model: int, d_ff: int | None = None) -> SwiGLU:
        """One network of width ``d_model``; ``d_ff`` (a layer's own) wins over the spec's."""
        return SwiGLU(d_model, self.d_ff if d_ff is None else d_ff, bias=recipe.bias)


@dataclass(frozen=True)
class RotarySpec(Spec):
    """Rotary positions as a recipe's choice (chapter "Today's block"): queries and keys rotated with
    frequencies of base ``base`` (Llama's ``rope_theta``), rescaled by ``scaling`` (chapter "Longer
    than trained": a :class:`~transformer_lib.rope_scaling.RopeScaling`; None: as trained)."""

    kind = "rotary"
    base: float = option(10000.0, "the base of the rotary frequencies", flat="rotary_base")
    scaling: object = None  # a RopeScaling (its own flags: transformer_lib.rope_scaling)

    def __post_init__(self):
        super().__post_init__()
        check_base(self.base, "rotary_base")


def rotate_heads(x: Tensor, rotary: RotaryEmbedding, start: int = 0) -> Tensor:
    """Rotary positions for queries or keys ``x (B, h, T, d_k)`` at positions ``start .. start + T - 1`` (chapter
    "Today's block").

    ``start`` is the number of tokens a key-value cache already holds, so that a token gets the
    same rotation whether it is computed with the cache or without. Returns ``(B, h, T, d_k)``.
    """
    if x.dim() != 4:
        raise ValueError(f"rotate_heads expects x of shape (B, h, T, d_k), got {tuple(x.shape)}")
    check_int(start, "start", minimum=0)
    return rotary(x, torch.arange(start, start + x.shape[2], device=x.device))


class QKTransform(nn.Module):
    """What an attention does to its queries and keys before the scores (chapter "Today's block").

    ``QKTransform(d_k, *, rotary_base=None, qk_norm=False, eps=1e-5, rope_scaling=None)``: with
    ``qk_norm`` each head's queries and keys pass an :class:`RMSNorm` of width ``d_k`` (one for
    queries, one for keys, shared by the heads); with ``rotary_base`` they are then rotated by their
    positions (:func:`rotate_heads`), with rescaled frequencies if a ``rope_scaling`` (chapter
    "Longer than trained", :class:`~transformer_lib.rope_scaling.RopeScaling`) is given.
    ``forward(q (B, h, T, d_k), k (B, h_kv, T, d_k), start)`` returns both, same shapes;
    :class:`~transformer_lib.multihead.MultiHeadAttention` calls it on the new positions before it
    appends the keys to its cache, so the cache holds rotated keys.
    """

    def __init__(
        self, d_k: int, *, rotary_base: float | None = None, qk_norm: bool = False, eps: float = 1e-5, rope_scaling=None
    ):
        super().__init__()
        check_bool(qk_norm, "qk_norm")
        rotary = None if rotary_base is None else RotaryEmbedding(d_k, base=rotary_base, scaling=rope_scaling)
        self.rotary = rotary
        self.q_norm = RMSNorm(d_k, eps=eps) if qk_norm else None
        self.k_norm = RMSNorm(d_k, eps=eps) if qk_norm else None

    def forward(self, q: Tensor, k: Tensor, start: int = 0) -> tuple[Tensor, Tensor]:
        """``q (B, h, T, d_k)``, ``k (B, h_kv, T, d_k)`` at positions ``start ..`` -> the same shapes."""
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None:
            q, k = rotate_heads(q, self.rotary, start), rotate_heads(k, self.rotary, start)
        return q, k


def qk_transformed(mha: MultiHeadAttention, recipe, *, qk_norm: bool = False) -> MultiHeadAttention:
    """``mha`` (a self-attention) with the query-key transform the recipe's positions and ``qk_norm``
    ask for (chapter "Today's block"): rotary positions, rescaled or not, and query-key norms."""
    positions = recipe.positions
    rotary = isinstance(positions, RotarySpec)
    if rotary or qk_norm:  # applied to q and k, before the scores and the cache
        mha.qk_transform = QKTransform(
            mha.d_k,
            rotary_base=positions.base if rotary else None,
            qk_norm=qk_norm,
            eps=recipe.norm_eps,
            rope_scaling=positions.scaling if rotary else None,
        )
    return mha


@torch.no_grad()
def attention_logit_max(model: nn.Module, *inputs) -> Tensor:
    """The largest attention logit ``|q . k| / sqrt(d_k)`` of each attention layer of ``model`` on
    ``model(*inputs)`` (chapter "Today's block"): ``(n_layers,)``, in the order the layers run.

    Each layer gives its logits through its one recording hook,
    :meth:`~transformer_lib.multihead.RecordsScores.record_scores`: the queries and keys are the
    ones the layer scores, after query-key normalisation and rotary positions; every pair is
    counted, masked ones too (a mask hides a logit, it does not shrink it).
    Chapter "Latent, sparse and sink attention"'s latent attention counts the logits it scores (its scale is
    ``1/sqrt(nope + rope)``). Chapter "Attention as a recurrence"'s recurrent layers score no logits: a hybrid's value
    is its multi-head layers', and a model with no layer that scores is refused by name.
    """
    found: list[Tensor] = []
    layers = find_parts(model, "attention")

    def keep(_name: str, logits: Tensor | None, _weights: Tensor) -> None:
        if logits is not None:  # a recurrence scores none
            found.append(logits.abs().amax())

    with recording_scores(layers, keep):
        model(*inputs)
    if layers and not found:
        first = next(iter(layers.values()))
        raise ValueError(
            f"{type(model).__name__}'s attention layers ({type(first).__name__}) score no logits: "
            "a recurrence has no softmax to saturate"
        )
    return torch.stack(found) if found else torch.zeros(0)
