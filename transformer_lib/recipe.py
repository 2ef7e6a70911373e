"""A block's recipe (chapter 14, "Today's block"): every choice that makes a GPT-2 block or a
Llama one, in one frozen object, and the parts it makes.

:class:`BlockRecipe` holds the norm, the feed-forward network, the positions, the attention, the
query-key transform, the biases and the tied embeddings, each with its options.
:data:`GPT2_BLOCK` is the default (chapter 9's model, bitwise); :data:`LLAMA_BLOCK` is chapter 14's
Llama-style block. A layer of :mod:`transformer_lib.blocks` is handed the recipe as its ``parts``
and asks it for each part (:meth:`BlockRecipe.norm`, :meth:`~BlockRecipe.feed_forward`,
:meth:`~BlockRecipe.attention`): nothing is registered anywhere, and every part the recipe makes
is an import of this module.

A new kind of attention is one new module with its layer and its cache, and one new value of
``attention`` here, in :data:`ATTENTIONS`: chapter 18's latent attention
(:mod:`~transformer_lib.latent_attention`) and sparse attention
(:mod:`~transformer_lib.sparse_attention`) are two; its sink logits and kept first tokens
(:mod:`~transformer_lib.sinks`) are options of the multi-head attention. Chapter 19's
recurrences are three more values, ``"linear"``, ``"delta"`` and ``"gated_delta"`` (the modes of
:class:`~transformer_lib.delta_net.GatedDeltaNet`), and ``full_every`` makes a hybrid: every
``full_every``-th layer keeps multi-head attention, as Qwen3-Next keeps one layer in four.
:meth:`BlockRecipe.for_layer` gives each layer its own recipe.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from torch import nn

from ._checks import check_base, check_bool, check_int, plain_number
from .blocks import FeedForward
from .delta_net import GatedDeltaNet
from .experts import FLAT_SPEC as _EXPERTS_FLAT
from .experts import ExpertsSpec
from .latent_attention import LatentAttention
from .modern_block import QKTransform, RMSNorm, SwiGLU
from .multihead import MultiHeadAttention
from .rope_scaling import FLAT_SPEC as _ROPE_FLAT
from .rope_scaling import RopeScaling
from .sinks import SinkAttention
from .sparse_attention import SparseAttention

__all__ = [
    "ATTENTIONS",
    "GPT2_BLOCK",
    "LLAMA_BLOCK",
    "RECIPES",
    "RECIPE_CHOICES",
    "RECURRENT",
    "BlockRecipe",
    "as_recipe",
]


# The specs a recipe holds as one field each, and their flat command-line settings (chapters "Experts" and
# "Longer than trained").
_SPECS = (_EXPERTS_FLAT, _ROPE_FLAT)


def _multi_head(recipe: BlockRecipe, d_model: int, n_heads: int, *, n_kv_heads, dropout, self_attention):
    """Chapter 5's attention (10's grouped-query), with chapter 14's query-key transform in self-attention
    and chapter 18's sink logits and kept first tokens."""
    options = dict(n_kv_heads=n_kv_heads, dropout=dropout, bias=recipe.bias, _checked=True)
    if self_attention and (recipe.sinks or recipe.keep_first):
        mha = SinkAttention(d_model, n_heads, sinks=recipe.sinks, keep_first=recipe.keep_first, **options)
    else:
        mha = MultiHeadAttention(d_model, n_heads, **options)
    return _with_qk_transform(recipe, mha, self_attention)


def _sparse(recipe: BlockRecipe, d_model: int, n_heads: int, *, n_kv_heads, dropout, self_attention):
    """Chapter 18's sparse attention: each query reads the ``sparse_k`` keys an indexer picks."""
    if not self_attention:
        raise ValueError("attention='sparse' is a causal self-attention: an encoder-decoder's cross-attention is not")
    d_k = d_model // n_heads
    rope = d_k // 2 if recipe.positions == "rotary" else 0  # the indexer rotates half of its width, as DeepSeek's
    sparse = SparseAttention(
        d_model,
        n_heads,
        top_k=recipe.sparse_k,
        rope_dim=rope,
        rotary_base=recipe.rotary_base,
        n_kv_heads=n_kv_heads,
        dropout=dropout,
        bias=recipe.bias,
        _checked=True,
    )
    return _with_qk_transform(recipe, sparse, self_attention)


def _with_qk_transform(recipe: BlockRecipe, mha: MultiHeadAttention, self_attention: bool) -> MultiHeadAttention:
    """``mha`` with chapter 14's query-key transform (rotary, query-key norm) in self-attention."""
    rotary = recipe.positions == "rotary"
    if self_attention and (rotary or recipe.qk_norm):  # applied to q and k, before the scores and the cache
        mha.qk_transform = QKTransform(
            mha.d_k,
            rotary_base=recipe.rotary_base if rotary else None,
            qk_norm=recipe.qk_norm,
            eps=recipe.norm_eps,
            rope_scaling=recipe.rope_scaling,
        )
    return mha


def _latent(recipe: BlockRecipe, d_model: int, n_heads: int, *, n_kv_heads, dropout, self_attention):
    """Chapter 18's multi-head latent attention: one ``kv_latent``-wide latent per token is cached."""
    if not self_attention:
        raise ValueError("attention='latent' is a causal self-attention: an encoder-decoder's cross-attention is not")
    if n_kv_heads is not None:
        raise ValueError(f"n_kv_heads={n_kv_heads} is grouped-query attention's: latent attention shares a latent")
    d_k = d_model // n_heads
    return LatentAttention(
        d_model,
        n_heads,
        kv_latent=recipe.kv_latent or 4 * d_k,
        q_latent=recipe.q_latent,
        rope_dim=recipe.rope_dim,
        rotary_base=recipe.rotary_base,
        eps=recipe.norm_eps,
        dropout=dropout,
        bias=recipe.bias,
    )


def _recurrent(recipe: BlockRecipe, d_model: int, n_heads: int, *, n_kv_heads, dropout, self_attention):
    """Chapter 19's recurrences: Qwen3-Next's gated DeltaNet layer in the mode the recipe names (linear
    attention, the delta rule, the gated delta rule), its state the cache. It has no attention weights
    to drop: ``dropout`` is the residual's alone."""
    if not self_attention:
        raise ValueError(
            f"attention={recipe.attention!r} is a causal recurrence: an encoder-decoder's cross-attention is not"
        )
    if n_kv_heads is not None:
        raise ValueError(
            f"n_kv_heads={n_kv_heads} is grouped-query attention's: attention={recipe.attention!r} "
            "is a recurrence whose heads each keep a state"
        )
    return GatedDeltaNet(d_model, n_heads, mode=_MODES[recipe.attention], eps=recipe.norm_eps)


# The attention a recipe names, and the function that makes one layer's: (recipe, d_model, n_heads,
# *, n_kv_heads, dropout, self_attention) -> the layer. A new attention adds one entry.
ATTENTIONS = {
    "multi_head": _multi_head,
    "latent": _latent,
    "sparse": _sparse,
    "linear": _recurrent,
    "delta": _recurrent,
    "gated_delta": _recurrent,
}
_MODES = {"linear": "linear", "delta": "delta", "gated_delta": "gated"}  # chapter 19: GatedDeltaNet's modes
RECURRENT = tuple(_MODES)
# The choices only some kinds of attention read (chapters 18 and 19), refused with another.
_ATTENTION_OPTIONS = {
    "kv_latent": ("latent",),
    "q_latent": ("latent",),
    "rope_dim": ("latent",),
    "sparse_k": ("sparse",),
    "sinks": ("multi_head",),
    "keep_first": ("multi_head",),
    "full_every": RECURRENT,
}

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
    # chapter 18: latent attention's widths (None: 4 d_k, no query latent, d_k / 2) ...
    kv_latent: int | None = None  # the latent each token caches (DeepSeek's kv_lora_rank)
    q_latent: int | None = None  # the query's latent (q_lora_rank); None: a full query projection
    rope_dim: int | None = None  # each head's rotated width, and the shared rotary key's
    sparse_k: int | None = None  # ... sparse attention's keys per query (DeepSeek-V3.2's index_topk) ...
    sinks: bool = False  # ... and a learned sink logit per head (gpt-oss's)
    keep_first: int = 0  # with a sliding window, every query also sees the first tokens (StreamingLLM)
    # chapter 19: with a recurrent attention, every full_every-th layer is multi-head attention (0: none is;
    # Qwen3-Next's full_attention_interval, 4)
    full_every: int = 0
    # chapter "Experts": a mixture of experts in place of each feed-forward network (its own spec, with its
    # options and which first layers stay dense); None: dense
    experts: ExpertsSpec | None = None
    # chapter "Longer than trained": multi-head attention's rotary frequencies rescaled (None: as trained)
    rope_scaling: RopeScaling | None = None

    def __post_init__(self):
        for f in fields(self):  # NumPy's numbers kept as Python's, as a checkpoint loads them
            object.__setattr__(self, f.name, plain_number(getattr(self, f.name)))
        for spec in _SPECS:  # a checkpoint's dict, or a spec
            object.__setattr__(self, spec.key, spec.from_value(getattr(self, spec.key)))
        if self.rope_scaling is not None:
            self._check_rope_scaling()
        if self.experts is not None and self.ffn != "swiglu":
            raise ValueError(
                f"experts are SwiGLU networks (as in Mixtral, Qwen3-MoE and DeepSeek-V3): "
                f"give ffn='swiglu' with experts, got ffn={self.ffn!r}"
            )
        for name, allowed in RECIPE_CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        for name in ("qk_norm", "bias", "tie_embeddings", "sinks"):
            check_bool(getattr(self, name), name)
        for name in ("kv_latent", "q_latent", "rope_dim", "sparse_k"):
            if getattr(self, name) is not None:
                check_int(getattr(self, name), name)
        check_int(self.keep_first, "keep_first", minimum=0)
        check_int(self.full_every, "full_every", minimum=0)
        for name, kinds in _ATTENTION_OPTIONS.items():
            if getattr(self, name) not in (None, False, 0) and self.attention not in kinds:
                value, kind = getattr(self, name), " or ".join(kinds)
                raise ValueError(f"{name}={value!r} is {kind} attention's: attention is {self.attention!r}")
        if self.attention == "latent" and self.positions != "rotary":
            raise ValueError(
                "attention='latent' rotates a small shared key (decoupled rotary positions): "
                f"it needs positions='rotary', got {self.positions!r}"
            )
        if self.attention == "latent" and self.qk_norm:
            raise ValueError("qk_norm normalises each head's keys: latent attention's keys are rebuilt from a latent")
        if self.attention in RECURRENT and self.qk_norm and not self.full_every:
            raise ValueError(
                f"qk_norm normalises multi-head attention's queries and keys: attention="
                f"{self.attention!r} L2-normalises its own, and without full_every no layer "
                "reads it"
            )
        if self.attention == "sparse" and self.sparse_k is None:
            raise ValueError("attention='sparse' needs sparse_k, the number of keys each query reads")
        check_base(self.norm_eps, "norm_eps")
        check_base(self.rotary_base, "rotary_base")
        if self.d_ff is not None:
            check_int(self.d_ff, "d_ff")
        if self.ffn == "swiglu" and self.activation != "gelu":
            raise ValueError(f"activation={self.activation!r} is the 'mlp' network's: the 'swiglu' one uses SiLU")

    def _check_rope_scaling(self) -> None:
        """A rescaling needs rotary positions read by multi-head attention, and fixed frequencies."""
        kind = self.rope_scaling.kind
        if self.positions != "rotary":
            raise ValueError(f"rope_scaling rescales rotary positions: positions is {self.positions!r}")
        if self.attention in ("latent", "sparse") or (self.attention in RECURRENT and not self.full_every):
            raise ValueError(
                f"rope_scaling rescales multi-head attention's rotary positions: attention is {self.attention!r}"
            )
        if kind == "dynamic":
            raise ValueError(
                "rope_scaling kind 'dynamic' changes the frequencies as the sequence grows, so keys "
                "cached at a shorter length would no longer match: use 'ntk' with the factor of the "
                "longest length"
            )

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
        if self.experts is not None:
            return self.experts.layer(d_model, d_ff, bias=self.bias)
        if self.ffn == "swiglu":
            return SwiGLU(d_model, d_ff, bias=self.bias)
        return FeedForward(d_model, 4 * d_model if d_ff is None else d_ff, activation=self.activation, bias=self.bias)

    def for_layer(self, index: int) -> BlockRecipe:
        """The recipe of layer ``index`` (0 first) of a stack (chapter 19): this one, except that with
        ``full_every`` the last layer of every group of ``full_every`` is multi-head attention
        (``full_every=4``: layers 3, 7, ... as in Qwen3-Next), and with experts the first
        ``experts.dense_layers`` layers keep a dense feed-forward network (DeepSeek-V3's first three)."""
        check_int(index, "index", minimum=0)
        layer = self
        if self.full_every and (index + 1) % self.full_every == 0:
            layer = replace(layer, attention="multi_head", full_every=0)
        if self.experts is not None and index < self.experts.dense_layers:
            layer = replace(layer, experts=None)
        return layer

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
# chapter 18: Llama's block with the attention of DeepSeek-V3 (latent), DeepSeek-V3.2 (sparse) or gpt-oss (sinks)
RECIPES = {
    "gpt2": GPT2_BLOCK,
    "llama": LLAMA_BLOCK,
    "latent": replace(LLAMA_BLOCK, attention="latent"),
    "sparse": replace(LLAMA_BLOCK, attention="sparse", sparse_k=16),
    "sinks": replace(LLAMA_BLOCK, sinks=True),
    # chapter 19: Qwen3-Next's gated DeltaNet in every layer, or in three of every four (a hybrid)
    "gated_delta": replace(LLAMA_BLOCK, attention="gated_delta"),
    "hybrid": replace(LLAMA_BLOCK, attention="gated_delta", full_every=4),
    # chapter "Experts": Llama's block with eight SwiGLU experts, two per token (Mixtral's routing)
    "experts": replace(LLAMA_BLOCK, experts=ExpertsSpec()),
}


def _is_flat(spec, key: str, value) -> bool:
    """A flat setting of ``spec`` (``experts_top_k=2``, ``experts=8``), not the spec itself (or its dict, or None)."""
    return key != spec.key or not (value is None or isinstance(value, (spec.spec_type, dict)))


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
    for spec in _SPECS:  # the command line's flat settings of a spec: experts=8, experts_top_k=2, ...
        flat = {k: changes.pop(k) for k in list(changes) if k in spec.names and _is_flat(spec, k, changes[k])}
        if flat:
            changes[spec.key] = spec.spec(flat)
    known = {f.name for f in fields(BlockRecipe)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise TypeError(f"{unknown[0]!r} is not a choice of the block; the choices are {sorted(known)}")
    return replace(recipe, **changes) if changes else recipe
