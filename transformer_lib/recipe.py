"""A block's recipe (chapter "Today's block"): every choice that makes a GPT-2 block or a Llama one,
in one frozen object, and the parts it makes.

:class:`BlockRecipe` holds the block-wide choices (the norm and its eps, the biases, the tied
embeddings) and one small spec for each kind of part: the positions, the attention and the
feed-forward network, each a frozen object defined beside the layer it builds, with its own
options (:class:`~transformer_lib.sinks.MultiHeadSpec`, :class:`~transformer_lib.modern_block.SwiGLUSpec`,
...). ``layers`` is a per-layer pattern: rules that give some layers another attention or
feed-forward network (a hybrid's full-attention layers, experts from layer k on).
:data:`GPT2_BLOCK` is the default (the model of chapter "GPT", bitwise); :data:`LLAMA_BLOCK` is chapter
"Today's block"'s Llama-style block. A layer of :mod:`transformer_lib.blocks` is handed the recipe
as its ``parts`` and asks it for each part (:meth:`BlockRecipe.norm_layer`,
:meth:`~BlockRecipe.feed_forward`, :meth:`~BlockRecipe.attention_layer`).

A new kind of attention or feed-forward network is one spec in its own module and one row of
:data:`ATTENTIONS` or :data:`FEED_FORWARDS`: the command line's flags and a checkpoint's format
follow from the spec's fields. The command line and checkpoints written before the specs name
every option flat (``attention="latent", kv_latent=32``); :func:`recipe_from_flat` and
:meth:`BlockRecipe.flat` are the one conversion between the two.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from torch import nn

from ._checks import check_base, check_bool, check_int, plain_number
from ._specs import Spec, flat_name, spec_from_value
from .blocks import MLPSpec
from .delta_net import RecurrenceSpec
from .experts import FLAT_SPEC as _EXPERTS_FLAT
from .experts import ExpertsSpec
from .latent_attention import LatentSpec
from .modern_block import RMSNorm, RotarySpec, SwiGLUSpec
from .positional import LearnedSpec
from .rope_scaling import FLAT_SPEC as _ROPE_FLAT
from .sinks import MultiHeadSpec
from .sparse_attention import SparseSpec

__all__ = [
    "ATTENTIONS",
    "FEED_FORWARDS",
    "GPT2_BLOCK",
    "LLAMA_BLOCK",
    "POSITIONS",
    "RECIPES",
    "RECURRENT",
    "BlockRecipe",
    "LayerRule",
    "Spec",
    "as_recipe",
    "recipe_from_flat",
]

# The kinds of each part, by name: a new kind is one row (its spec builds the layer and checks its options).
ATTENTIONS: dict[str, type] = {
    "multi_head": MultiHeadSpec,
    "latent": LatentSpec,
    "sparse": SparseSpec,
    "linear": RecurrenceSpec,
    "delta": RecurrenceSpec,
    "gated_delta": RecurrenceSpec,
}
FEED_FORWARDS: dict[str, type] = {"mlp": MLPSpec, "swiglu": SwiGLUSpec, "experts": ExpertsSpec}
POSITIONS: dict[str, type] = {"learned": LearnedSpec, "rotary": RotarySpec}
NORMS = ("layernorm", "rmsnorm")
RECURRENT = tuple(k for k, spec in ATTENTIONS.items() if spec is RecurrenceSpec)
_NESTED = {"scaling": _ROPE_FLAT.from_value}  # a rotary spec's rescaling, from a checkpoint's dict


def _slice(where: str) -> slice:
    """The layers ``where`` names, as Python's slice of the stack (``"3::4"``, ``":3"``, ``"5:"``)."""
    if not isinstance(where, str) or not 1 <= where.count(":") <= 2:
        raise ValueError(f"layers must be a slice of the stack such as '3::4' or ':3', got {where!r}")
    parts = [p.strip() for p in where.split(":")]
    try:
        start, stop, step = ([int(p) if p else None for p in parts] + [None])[:3]
    except ValueError:
        raise ValueError(f"layers must be a slice of the stack such as '3::4' or ':3', got {where!r}") from None
    if any(v is not None and v < 0 for v in (start, stop)) or (step is not None and step < 1):
        raise ValueError(f"layers counts from layer 0 with a step of at least 1, got {where!r}")
    return slice(start, stop, step)


@dataclass(frozen=True)
class LayerRule:
    """One rule of a recipe's per-layer pattern (chapter "Attention as a recurrence"): the layers
    ``layers`` names, a slice of the stack (``"3::4"``: layers 3, 7, 11, ...; ``":3"``: the first
    three), take ``attention`` and ``ffn`` (specs, or None: the recipe's) instead of the recipe's."""

    layers: str
    attention: Spec | None = None
    ffn: Spec | None = None

    def __post_init__(self):
        _slice(self.layers)
        for role, table in (("attention", ATTENTIONS), ("ffn", FEED_FORWARDS)):
            value = getattr(self, role)
            if value is not None:
                object.__setattr__(self, role, spec_from_value(value, table, role))
        if self.attention is None and self.ffn is None:
            raise ValueError(f"the rule for layers {self.layers!r} changes nothing: give attention or ffn")

    def covers(self, index: int) -> bool:
        """Whether layer ``index`` (0 first) is one of the rule's."""
        s = _slice(self.layers)
        start, step = s.start or 0, s.step or 1
        return index >= start and (s.stop is None or index < s.stop) and (index - start) % step == 0

    def to_dict(self) -> dict:
        """The rule as a plain dict (what a checkpoint stores)."""
        return {
            "layers": self.layers,
            "attention": None if self.attention is None else self.attention.to_dict(),
            "ffn": None if self.ffn is None else self.ffn.to_dict(),
        }


@dataclass(frozen=True)
class BlockRecipe:
    """The choices of a GPT's block (chapter "Today's block"); the defaults are GPT-2's.

    ``BlockRecipe(norm="rmsnorm", ffn="swiglu", positions="rotary", bias=False)`` is Llama's
    (:data:`LLAMA_BLOCK`): a part given by its kind's name takes that kind's default options, and
    ``attention=LatentSpec(kv_latent=32)`` gives them. ``replace(recipe, bias=True)`` changes one
    choice. Every value is checked here or by its spec, by name.
    """

    norm: str = "layernorm"  # or "rmsnorm" (no mean, no bias)
    norm_eps: float = 1e-5  # the eps of every norm (LayerNorm's default; Llama's rms_norm_eps)
    ffn: Spec = MLPSpec()  # a spec of FEED_FORWARDS
    positions: Spec = LearnedSpec()  # a spec of POSITIONS
    attention: Spec = MultiHeadSpec()  # a spec of ATTENTIONS
    bias: bool = True  # biases in the linear maps and LayerNorms
    tie_embeddings: bool = True  # the output head shares the token embedding's matrix (GPT-2); Llama's does not
    layers: tuple[LayerRule, ...] = ()  # the per-layer pattern: later rules win

    def __post_init__(self):
        for name in ("norm_eps", "bias", "tie_embeddings"):  # NumPy's numbers kept as Python's
            object.__setattr__(self, name, plain_number(getattr(self, name)))
        for role, table in (("ffn", FEED_FORWARDS), ("positions", POSITIONS), ("attention", ATTENTIONS)):
            nested = _NESTED if role == "positions" else None
            object.__setattr__(self, role, spec_from_value(getattr(self, role), table, role, nested))
        if isinstance(self.layers, (list, tuple)):
            rules = tuple(r if isinstance(r, LayerRule) else LayerRule(**r) for r in self.layers)
            object.__setattr__(self, "layers", rules)
        else:
            raise TypeError(f"layers must be a tuple of LayerRule, got {self.layers!r}")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {list(NORMS)}, got {self.norm!r}")
        check_base(self.norm_eps, "norm_eps")
        check_bool(self.bias, "bias")
        check_bool(self.tie_embeddings, "tie_embeddings")
        for attention in self.attentions():
            attention.check(self)
        self._check_rope_scaling()

    def attentions(self) -> list[Spec]:
        """The attention of every kind of layer the recipe makes: its own, then its rules'."""
        return [self.attention, *(r.attention for r in self.layers if r.attention is not None)]

    def _check_rope_scaling(self) -> None:
        """A rescaling needs a multi-head attention to read it, and fixed frequencies."""
        scaling = getattr(self.positions, "scaling", None)
        if scaling is None:
            return
        if not any(a.kind == "multi_head" for a in self.attentions()):
            raise ValueError(
                f"rope_scaling rescales multi-head attention's rotary positions: attention is {self.attention.kind!r}"
            )
        if scaling.kind == "dynamic":
            raise ValueError(
                "rope_scaling kind 'dynamic' changes the frequencies as the sequence grows, so keys "
                "cached at a shorter length would no longer match: use 'ntk' with the factor of the "
                "longest length"
            )

    def to_dict(self) -> dict:
        """The choices as a plain dict, each spec with its kind (what a checkpoint stores)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for role in ("ffn", "positions", "attention"):
            out[role] = out[role].to_dict()
        out["layers"] = [r.to_dict() for r in self.layers]
        return out

    def flat(self, strict: bool = True) -> dict:
        """The choices by their flat names, as the command line and the checkpoints written before
        the specs name them (``attention="latent"``, ``kv_latent=32``, ``full_every=4``, ...): the
        kinds by name, every option of every kind (a kind not chosen at its defaults), the experts
        and the rotary rescaling as their specs (or None). A pattern other than a hybrid's
        ``full_every`` has no flat form and is refused by name; with ``strict=False`` it is left out
        (``full_every`` 0): the choices of the recipe's own parts."""
        return _to_flat(self, strict)

    def changes(self) -> dict:
        """The flat choices that differ from GPT-2's block, as keyword arguments of :func:`as_recipe`."""
        base = GPT2_BLOCK.flat()
        return {k: v for k, v in self.flat().items() if v != base[k]}

    def norm_layer(self, d_model: int) -> nn.Module:
        """One norm of width ``d_model``: LayerNorm (with a bias unless ``bias=False``) or RMSNorm (none)."""
        if self.norm == "rmsnorm":
            return RMSNorm(d_model, eps=self.norm_eps)
        return nn.LayerNorm(d_model, eps=self.norm_eps, bias=self.bias)

    def feed_forward(self, d_model: int, d_ff: int | None = None) -> nn.Module:
        """One feed-forward network of the recipe's kind; ``d_ff`` (a layer's own) wins over the spec's."""
        return self.ffn.layer(self, d_model, d_ff)

    def for_layer(self, index: int) -> BlockRecipe:
        """The recipe of layer ``index`` (0 first) of a stack (chapter "Attention as a recurrence"):
        this one with the parts of every rule of ``layers`` that covers the layer, and the
        feed-forward network's own choice for the layer (experts keep their first ``dense_layers``
        layers dense, as DeepSeek-V3 its first three)."""
        check_int(index, "index", minimum=0)
        attention, ffn = self.attention, self.ffn
        for rule in self.layers:
            if rule.covers(index):
                attention, ffn = rule.attention or attention, rule.ffn or ffn
        if hasattr(ffn, "for_layer"):
            ffn = ffn.for_layer(index)
        layer = object.__new__(BlockRecipe)  # the stack's recipe was checked: one layer's parts need no check
        for f in fields(self):
            object.__setattr__(layer, f.name, getattr(self, f.name))
        for name, value in (("attention", attention), ("ffn", ffn), ("layers", ())):
            object.__setattr__(layer, name, value)
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
        """One attention layer of the recipe's kind."""
        return self.attention.layer(
            self, d_model, n_heads, n_kv_heads=n_kv_heads, dropout=dropout, self_attention=self_attention
        )


# ---- The flat names: the command line's flags and the checkpoints written before the specs ----

# The choices the recipe itself names, with their flags' help; each kind's options follow from its spec.
_SELECTORS = {
    "norm": ("layernorm", "the norm of every block: layernorm or rmsnorm"),
    "norm_eps": (1e-5, "the eps of every norm"),
    "ffn": ("mlp", "the feed-forward network: mlp (GELU) or swiglu (gated, 2/3 as wide: equal parameters)"),
    "positions": ("learned", "learned (added to the embeddings) or rotary (applied to queries and keys)"),
    "attention": (
        "multi_head",
        "the attention: multi_head, latent (DeepSeek-V3's) or sparse (DeepSeek-V3.2's); or a "
        "recurrence: linear, delta or gated_delta (Qwen3-Next's gated DeltaNet)",
    ),
    "full_every": (
        0,
        "with a recurrent --attention, every this many-th layer is multi-head attention (a hybrid; 0: none)",
    ),
    "bias": (True, "biases in the linear maps and norms"),
    "tie_embeddings": (True, "the output head shares the token embedding's matrix"),
}
_SELECTOR_TYPES = {"norm": "str", "norm_eps": "float", "ffn": "str", "positions": "str", "attention": "str"}
_SELECTOR_TYPES.update(full_every="int", bias="bool", tie_embeddings="bool")
_SPECIAL = (_EXPERTS_FLAT, _ROPE_FLAT)  # specs spelled by a switch flag and options of their own prefix


def _options(table: dict) -> dict:
    """Every flat option of the kinds of ``table``: name -> (the spec field, the kinds that have it)."""
    found: dict = {}
    for kind, spec_type in table.items():
        if spec_type is ExpertsSpec:  # its flags are its own: --experts and --experts-<option>
            continue
        for f in fields(spec_type):
            name = flat_name(f)
            if name in _SELECTORS or f.name == "scaling":  # a kind's own name; the rescaling's flags are its own
                continue
            field_, kinds = found.get(name, (f, []))
            found[name] = (field_, [*kinds, kind])
    return found


_OPTIONS = {role: _options(table) for role, table in (("ffn", FEED_FORWARDS), ("positions", POSITIONS))}
_OPTIONS["attention"] = _options(ATTENTIONS)
#: every flat name of a recipe, with its flag's help, its type as written and its choices
FLAT_HELP: dict[str, str] = {}
FLAT_TYPES: dict[str, str] = {}
FLAT_DEFAULTS: dict = {}
for _name, (_default, _help) in _SELECTORS.items():
    FLAT_HELP[_name], FLAT_TYPES[_name], FLAT_DEFAULTS[_name] = _help, _SELECTOR_TYPES[_name], _default
    for _role in ("ffn", "positions", "attention"):
        if _name == _role:
            for _option_name, (_field, _) in _OPTIONS[_role].items():
                if _option_name not in FLAT_HELP:
                    FLAT_HELP[_option_name] = _field.metadata["help"]
                    FLAT_TYPES[_option_name], FLAT_DEFAULTS[_option_name] = _field.type, _field.default
# the names each kind flag accepts: the tables' own keys, so a kind added to a table is a choice at once
FLAT_CHOICES = {"norm": NORMS, "ffn": ("mlp", "swiglu"), "positions": POSITIONS.keys(), "attention": ATTENTIONS.keys()}
for _role in ("ffn", "positions", "attention"):  # an option's own choices, where its field names them
    for _option_name, (_field, _) in _OPTIONS[_role].items():
        if _field.metadata.get("choices"):
            FLAT_CHOICES[_option_name] = _field.metadata["choices"]
_KINDS_FLAT = tuple(FLAT_HELP)  # the kinds' names and options, the experts' and the rescaling's aside
for _spec in _SPECIAL:
    for _name in _spec.names:
        if _name not in FLAT_HELP:
            FLAT_HELP[_name], FLAT_TYPES[_name] = _spec.help[_name], _spec.types[_name]
            FLAT_DEFAULTS[_name] = _spec.defaults.get(_spec.names[_name]) if _name != _spec.key else _spec.off
#: the flat names a recipe's dict may hold: the flags', and the experts' and rescaling's specs themselves
_FLAT_NAMES = set(FLAT_HELP)


def _kind_from_flat(role: str, table: dict, kind: str, flat: dict, **extra) -> Spec:
    """The spec of ``kind`` from the flat options in ``flat``; an option of another kind, changed from
    its default, is refused by name."""
    if kind not in table:
        raise ValueError(f"{role} must be one of {list(FLAT_CHOICES[role])}, got {kind!r}")
    spec_type = table[kind]
    own = {flat_name(f): f.name for f in fields(spec_type)}
    options = dict(extra)
    for name, (_, kinds) in _options(table).items():
        if name not in flat:
            continue
        value = flat[name]
        if name in own:
            options[own[name]] = value
        elif value != FLAT_DEFAULTS[name]:
            owners = " or ".join(kinds)
            raise ValueError(f"{name}={value!r} is {owners} {role}'s: {role} is {kind!r}")
    if "kind" in own.values():
        options["kind"] = kind
    return spec_type(**options)


def _special_from_flat(spec, flat: dict):
    """The experts' or the rescaling's spec from ``flat``: the spec itself (or its dict), or its flags."""
    value = flat.get(spec.key)
    if value is None or isinstance(value, (spec.spec_type, dict)):
        given = {k: v for k, v in flat.items() if k in spec.names and k != spec.key and k != "d_ff"}
        if value is not None and given:
            raise ValueError(f"give {spec.key} as a spec or as flags, not both: {sorted(given)[0]} is a flag")
        return spec.from_value(value) if value is not None else spec.spec(given)
    return spec.spec({k: v for k, v in flat.items() if k in spec.names and k != "d_ff"})


def recipe_from_flat(flat: dict) -> BlockRecipe:
    """A :class:`BlockRecipe` from its flat choices (the command line's, or a checkpoint's written
    before the specs): the one conversion from the flat names (chapter "Today's block"). A name
    that is no choice, or an option given to a kind that has no such option, is refused by name."""
    unknown = sorted(set(flat) - _FLAT_NAMES)
    if unknown:
        raise TypeError(f"{unknown[0]!r} is not a choice of the block; the choices are {sorted(_FLAT_NAMES)}")
    get = lambda name: flat.get(name, FLAT_DEFAULTS[name])  # noqa: E731
    experts = _special_from_flat(_EXPERTS_FLAT, flat)
    if experts is not None:
        if get("ffn") != "swiglu":
            raise ValueError(
                f"experts are SwiGLU networks (as in Mixtral, Qwen3-MoE and DeepSeek-V3): "
                f"give ffn='swiglu' with experts, got ffn={get('ffn')!r}"
            )
        if get("activation") != FLAT_DEFAULTS["activation"]:
            raise ValueError(f"activation={get('activation')!r} is the 'mlp' network's: the experts use SiLU")
        ffn = replace(experts, d_ff=get("d_ff")) if get("d_ff") is not None else experts
    else:
        ffn = _kind_from_flat("ffn", FEED_FORWARDS, get("ffn"), flat)
    scaling = _special_from_flat(_ROPE_FLAT, flat)
    if scaling is not None and get("positions") != "rotary":
        raise ValueError(f"rope_scaling rescales rotary positions: positions is {get('positions')!r}")
    extra = {"scaling": scaling} if scaling is not None else {}
    positions = _kind_from_flat("positions", POSITIONS, get("positions"), flat, **extra)
    kind, full_every = get("attention"), get("full_every")
    check_int(full_every, "full_every", minimum=0)
    layers = ()
    attention_flat = dict(flat)
    if full_every:
        if kind not in RECURRENT:
            raise ValueError(
                f"full_every={full_every!r} is {' or '.join(RECURRENT)} attention's: attention is {kind!r}"
            )
        full = MultiHeadSpec(qk_norm=attention_flat.pop("qk_norm", False))  # the query-key norm is the full layers'
        layers = (LayerRule(f"{full_every - 1}::{full_every}", attention=full),)
    attention = _kind_from_flat("attention", ATTENTIONS, kind, attention_flat)
    block = {name: get(name) for name in ("norm", "norm_eps", "bias", "tie_embeddings")}
    return BlockRecipe(**block, ffn=ffn, positions=positions, attention=attention, layers=layers)


def _is_hybrid(recipe: BlockRecipe) -> bool:
    """Whether the recipe's pattern is a hybrid's ``full_every``: a recurrence, and plain multi-head
    attention in the last layer of every group of ``full_every``."""
    if len(recipe.layers) != 1:
        return False
    rule = recipe.layers[0]
    s = _slice(rule.layers)
    return (
        rule.ffn is None
        and isinstance(rule.attention, MultiHeadSpec)
        and not (rule.attention.sinks or rule.attention.keep_first)
        and s.stop is None
        and s.step is not None
        and s.start == s.step - 1
        and recipe.attention.kind in RECURRENT
    )


def _to_flat(recipe: BlockRecipe, strict: bool = True) -> dict:
    """:meth:`BlockRecipe.flat`."""
    flat = {name: FLAT_DEFAULTS[name] for name in _KINDS_FLAT}
    flat.update({name: getattr(recipe, name) for name in ("norm", "norm_eps", "bias", "tie_embeddings")})
    flat["experts"], flat["rope_scaling"] = None, None
    full_every = 0
    if recipe.layers and (strict or _is_hybrid(recipe)):
        rule = recipe.layers[0]
        s = _slice(rule.layers)
        is_hybrid = _is_hybrid(recipe)
        if not is_hybrid:
            raise ValueError(
                f"the layer pattern {[r.layers for r in recipe.layers]} has no flat form (only a hybrid's "
                "full_every has): give the recipe itself"
            )
        full_every = s.step
        flat["qk_norm"] = rule.attention.qk_norm
    flat["full_every"] = full_every
    for role in ("ffn", "positions", "attention"):
        spec = getattr(recipe, role)
        flat[role] = spec.kind
        for f in fields(spec):
            if flat_name(f) in flat and flat_name(f) not in _SELECTORS:
                flat[flat_name(f)] = getattr(spec, f.name)
    if isinstance(recipe.ffn, ExpertsSpec):
        flat["ffn"], flat["experts"] = "swiglu", replace(recipe.ffn, d_ff=None)
    if isinstance(recipe.positions, RotarySpec):
        flat["rope_scaling"] = recipe.positions.scaling
    return flat


GPT2_BLOCK = BlockRecipe()
LLAMA_BLOCK = BlockRecipe(norm="rmsnorm", ffn="swiglu", positions="rotary", bias=False)
# chapter "Latent, sparse and sink attention": Llama's block with the attention of DeepSeek-V3 (latent),
# DeepSeek-V3.2 (sparse) or gpt-oss (sinks)
RECIPES = {
    "gpt2": GPT2_BLOCK,
    "llama": LLAMA_BLOCK,
    "latent": replace(LLAMA_BLOCK, attention=LatentSpec()),
    "sparse": replace(LLAMA_BLOCK, attention=SparseSpec(sparse_k=16)),
    "sinks": replace(LLAMA_BLOCK, attention=MultiHeadSpec(sinks=True)),
    # chapter "Attention as a recurrence": Qwen3-Next's gated DeltaNet in every layer, or in three of
    # every four (a hybrid)
    "gated_delta": replace(LLAMA_BLOCK, attention=RecurrenceSpec("gated_delta")),
    "hybrid": replace(
        LLAMA_BLOCK, attention=RecurrenceSpec("gated_delta"), layers=(LayerRule("3::4", attention=MultiHeadSpec()),)
    ),
    # chapter "Experts": Llama's block with eight SwiGLU experts, two per token (Mixtral's routing)
    "experts": replace(LLAMA_BLOCK, ffn=ExpertsSpec()),
}


def _is_new_dict(value: dict) -> bool:
    """A checkpoint's recipe written with its specs (each a dict with its kind), not flat."""
    return any(isinstance(value.get(role), dict) for role in ("ffn", "positions", "attention")) or "layers" in value


def as_recipe(recipe=None, **changes) -> BlockRecipe:
    """A :class:`BlockRecipe` from a recipe, a name in :data:`RECIPES`, a dict (a checkpoint's, with
    its specs or flat) or None (GPT-2's), with ``changes`` applied: the recipe's fields
    (``attention=LatentSpec(...)``) or flat choices (``attention="latent", kv_latent=32``); an
    unknown choice is refused by name (chapter "Today's block")."""
    if recipe is None:
        recipe = GPT2_BLOCK
    elif isinstance(recipe, str):
        if recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {sorted(RECIPES)} or a BlockRecipe, got {recipe!r}")
        recipe = RECIPES[recipe]
    elif isinstance(recipe, dict):
        recipe = _from_dict(recipe)
    elif not isinstance(recipe, BlockRecipe):
        raise TypeError(f"recipe must be a BlockRecipe, a name in {sorted(RECIPES)} or a dict, got {recipe!r}")
    if not changes:
        return recipe
    own = {f.name for f in fields(BlockRecipe)}
    if set(changes) <= own and not any(isinstance(v, str) and k != "norm" for k, v in changes.items()):
        return replace(recipe, **changes)  # the recipe's own fields, as specs
    return recipe_from_flat({**recipe.flat(), **changes})


def _from_dict(value: dict) -> BlockRecipe:
    """A recipe from a checkpoint's dict: with its specs, or flat (written before the specs)."""
    if not _is_new_dict(value):
        return recipe_from_flat(value)
    known = {f.name for f in fields(BlockRecipe)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise TypeError(f"{unknown[0]!r} is not a choice of the block; the choices are {sorted(known)}")
    return BlockRecipe(**value)
