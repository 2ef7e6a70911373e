"""A block's recipe (chapter 14, "Today's block"): every choice that makes a GPT-2 block or a
Llama one, in one frozen object, and the parts it makes.

:class:`BlockRecipe` holds the norm, the feed-forward network, the positions, the attention, the
query-key transform, the biases and the tied embeddings, each with its options.
:data:`GPT2_BLOCK` is the default (chapter 9's model, bitwise); :data:`LLAMA_BLOCK` is chapter 14's
Llama-style block. A layer of :mod:`transformer_lib.blocks` is handed the recipe as its ``parts``
and asks it for each part (:meth:`BlockRecipe.norm`, :meth:`~BlockRecipe.feed_forward`,
:meth:`~BlockRecipe.attention`): nothing is registered anywhere, and every part the recipe makes
is an import of this module.

A new kind of attention (latent attention, say) is one new module with its layer and its cache,
and one new value of ``attention`` here, in :data:`ATTENTIONS`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from torch import nn

from ._checks import check_base, check_bool, check_int
from .blocks import FeedForward
from .modern_block import QKTransform, RMSNorm, SwiGLU
from .multihead import MultiHeadAttention

__all__ = ["ATTENTIONS", "GPT2_BLOCK", "LLAMA_BLOCK", "RECIPES", "RECIPE_CHOICES", "BlockRecipe", "as_recipe"]


def _multi_head(recipe: BlockRecipe, d_model: int, n_heads: int, *, n_kv_heads, dropout, self_attention):
    """Chapter 5's attention (10's grouped-query), with chapter 14's query-key transform in self-attention."""
    mha = MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv_heads, dropout=dropout, bias=recipe.bias, _checked=True)
    rotary = recipe.positions == "rotary"
    if self_attention and (rotary or recipe.qk_norm):  # applied to q and k, before the scores and the cache
        mha.qk_transform = QKTransform(
            mha.d_k, rotary_base=recipe.rotary_base if rotary else None, qk_norm=recipe.qk_norm, eps=recipe.norm_eps
        )
    return mha


# The attention a recipe names, and the function that makes one layer's: (recipe, d_model, n_heads,
# *, n_kv_heads, dropout, self_attention) -> the layer. A new attention adds one entry.
ATTENTIONS = {"multi_head": _multi_head}

# The names each choice accepts, GPT-2's first.
RECIPE_CHOICES = {
    "norm": ("layernorm", "rmsnorm"),
    "ffn": ("mlp", "swiglu"),
    "positions": ("learned", "rotary"),
    "activation": ("gelu", "gelu_tanh"),
    "attention": tuple(ATTENTIONS),
}


@dataclass(frozen=True)
class BlockRecipe:
    """The choices of a GPT's block (chapter 14); the defaults are GPT-2's.

    ``BlockRecipe(norm="rmsnorm", ffn="swiglu", positions="rotary", bias=False)`` is Llama's
    (:data:`LLAMA_BLOCK`); ``replace(recipe, qk_norm=True)`` changes one choice. Every value is
    checked here, by name.
    """

    norm: str = "layernorm"  # or "rmsnorm" (no mean, no bias)
    norm_eps: float = 1e-5  # the eps of every norm (LayerNorm's default; Llama's rms_norm_eps)
    ffn: str = "mlp"  # Linear, `activation`, Linear; or "swiglu", the gated network
    activation: str = "gelu"  # the "mlp" network's: or "gelu_tanh", GPT-2's tanh approximation (chapter 10)
    d_ff: int | None = None  # the feed-forward width; None: 4 d_model, or for "swiglu" 2/3 of it (swiglu_hidden)
    positions: str = "learned"  # learned vectors added to the embeddings; or "rotary", applied to q and k
    rotary_base: float = 10000.0  # the base of the rotary frequencies (Llama's rope_theta)
    attention: str = "multi_head"  # the attention layer, by name in ATTENTIONS
    qk_norm: bool = False  # an RMSNorm on each head's queries and keys before the scores
    bias: bool = True  # biases in the linear maps and LayerNorms
    tie_embeddings: bool = True  # the output head shares the token embedding's matrix (GPT-2); Llama's does not

    def __post_init__(self):
        for name, allowed in RECIPE_CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        for name in ("qk_norm", "bias", "tie_embeddings"):
            check_bool(getattr(self, name), name)
        check_base(self.norm_eps, "norm_eps")
        check_base(self.rotary_base, "rotary_base")
        if self.d_ff is not None:
            check_int(self.d_ff, "d_ff")
        if self.ffn == "swiglu" and self.activation != "gelu":
            raise ValueError(f"activation={self.activation!r} is the 'mlp' network's: the 'swiglu' one uses SiLU")

    def to_dict(self) -> dict:
        """The choices as a plain dict (what a checkpoint stores)."""
        return asdict(self)

    def changes(self) -> dict:
        """The choices that differ from GPT-2's block, as keyword arguments."""
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(GPT2_BLOCK, f.name)
        }

    def norm_layer(self, d_model: int) -> nn.Module:
        """One norm of width ``d_model``: LayerNorm (with a bias unless ``bias=False``) or RMSNorm (none)."""
        if self.norm == "rmsnorm":
            return RMSNorm(d_model, eps=self.norm_eps)
        return nn.LayerNorm(d_model, eps=self.norm_eps, bias=self.bias)

    def feed_forward(self, d_model: int, d_ff: int | None = None) -> nn.Module:
        """One feed-forward network; ``d_ff`` (a layer's own) wins over the recipe's."""
        d_ff = self.d_ff if d_ff is None else d_ff
        if self.ffn == "swiglu":
            return SwiGLU(d_model, d_ff, bias=self.bias)
        return FeedForward(d_model, 4 * d_model if d_ff is None else d_ff, activation=self.activation, bias=self.bias)

    def attention_layer(
        self,
        d_model: int,
        n_heads: int,
        *,
        n_kv_heads: int | None = None,
        dropout: float = 0.0,
        self_attention: bool = True,
    ) -> nn.Module:
        """One attention layer of the kind :attr:`attention` names."""
        return ATTENTIONS[self.attention](
            self, d_model, n_heads, n_kv_heads=n_kv_heads, dropout=dropout, self_attention=self_attention
        )


GPT2_BLOCK = BlockRecipe()
LLAMA_BLOCK = BlockRecipe(norm="rmsnorm", ffn="swiglu", positions="rotary", bias=False)
RECIPES = {"gpt2": GPT2_BLOCK, "llama": LLAMA_BLOCK}


def as_recipe(recipe=None, **changes) -> BlockRecipe:
    """A :class:`BlockRecipe` from a recipe, a name in :data:`RECIPES`, a dict (a checkpoint's) or
    None (GPT-2's), with ``changes`` applied; an unknown choice is refused by name (chapter 14)."""
    if recipe is None:
        recipe = GPT2_BLOCK
    elif isinstance(recipe, str):
        if recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {sorted(RECIPES)} or a BlockRecipe, got {recipe!r}")
        recipe = RECIPES[recipe]
    elif isinstance(recipe, dict):
        changes = {**recipe, **changes}
        recipe = GPT2_BLOCK
    elif not isinstance(recipe, BlockRecipe):
        raise TypeError(f"recipe must be a BlockRecipe, a name in {sorted(RECIPES)} or a dict, got {recipe!r}")
    known = {f.name for f in fields(BlockRecipe)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise TypeError(f"{unknown[0]!r} is not a choice of the block; the choices are {sorted(known)}")
    return replace(recipe, **changes) if changes else recipe
