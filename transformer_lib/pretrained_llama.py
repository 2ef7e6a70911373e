"""Llama's weights in the book's GPT and back (chapter "Today's block").

With ``norm="rmsnorm"``, ``ffn="swiglu"``, ``positions="rotary"`` and ``bias=False`` the book's
:class:`~transformer_lib.models.GPT` computes what ``transformers``' ``LlamaForCausalLM`` computes,
grouped-query attention included (``n_kv_heads``). Converting is a renaming of tensors, with two
details:

- the rotary convention. The book (chapter "Positional encoding") rotates the pairs of neighbouring dimensions
  ``(2i, 2i+1)`` of a head; Hugging Face's Llama rotates dimension ``i`` with ``i + d_k / 2``
  (``rotate_half``), with the same frequency ``base^(-2i/d_k)``. Reordering the rows of each head
  of ``W_q`` and ``W_k`` (Llama's row ``i`` becomes the book's ``2i``, row ``i + d_k/2`` its
  ``2i + 1``) turns one into the other: the scores ``q . k`` are unchanged by a reordering
  applied to both.
- the output head. GPT-2 ties it to the token embedding, Llama usually does not:
  ``tie_embeddings`` follows Llama's ``tie_word_embeddings``.

A rescaled rotary position (chapter "Longer than trained") is read into the recipe's
``rope_scaling`` (:class:`~transformer_lib.rope_scaling.RopeScaling`) and written back as
``rope_parameters``: transformers' ``"linear"``, ``"yarn"`` and ``"llama3"``, from ``rope_parameters`` or
the older ``rope_scaling`` (with ``rope_type`` or the older ``type``). ``"dynamic"`` and
``"longrope"`` are refused by name. A setting the GPT cannot follow (biases, an activation other
than SiLU, a head width other than ``d_model / n_heads``) raises a ``ValueError`` that names it,
rather than giving a model that is silently wrong. ``transformers`` is imported only by
:func:`llama_from_gpt`. Note that ``transformers`` computes the RMSNorm and the rotary angles (and
the rescaled frequencies) in float32 even for float64 weights.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from ._checks import is_int
from .models import GPT, RECIPE_FIELDS, GPTConfig
from .parts import find_parts, part_weights
from .positional import half_split_rows
from .recipe import LLAMA_BLOCK
from .rope_scaling import RopeScaling

__all__ = ["gpt_config_from_llama", "gpt_from_llama", "llama_from_gpt"]


# Which of a GPT's settings each Hugging Face format writes (chapters "Generation", "Today's block", "Latent, sparse and
# sink attention", "Attention as a recurrence" and "Experts"): a converter names every setting in a table, ANY where its
# format writes whatever value the GPT has, else the one value its format computes; check_settings refuses the first
# other value by name. A table that leaves a setting out is an error, so a new choice of the recipe is refused by every
# format until its converter says what to do with it.
class _Any:
    """The marker of a setting a format writes whatever its value."""

    def __repr__(self) -> str:
        return "ANY"


ANY = _Any()
# Every setting a table names: the config's two attention sizes, then the recipe's fields.
SETTINGS = ("n_kv_heads", "window", *RECIPE_FIELDS)  # the recipe by its flat names


def missing_settings(table: dict) -> list[str]:
    """The settings of :data:`SETTINGS` that ``table`` does not name (none, for a complete table)."""
    return [name for name in SETTINGS if name not in table]


def check_convertible(gpt, converter: str, counterpart: str) -> None:
    """That ``gpt`` is a plain :class:`~transformer_lib.models.GPT` a converter to ``counterpart`` can
    write (chapter "Today's block"): not a classifier around one, and no LoRA parametrization left unmerged."""
    if not isinstance(gpt, GPT):
        inner = ""
        if hasattr(gpt, "gpt"):
            inner = f" (convert its .gpt: a classifier's head has no {counterpart} counterpart)"
        raise TypeError(f"{converter} takes a GPT, got a {type(gpt).__name__}{inner}")
    if any(".parametrizations." in name for name, _ in gpt.named_parameters()):
        raise ValueError(
            f"{converter} takes a GPT without LoRA adapters (or other parametrizations): write them into its "
            "weights first with remove_lora(gpt), which merges them"
        )


def check_settings(config, table: dict, who: str, why: dict[str, str] | None = None) -> None:
    """Refuse, with a ``ValueError`` naming it, the first setting of ``config`` (a ``GPTConfig``)
    that ``table`` fixes to another value; ``who`` starts the message ("GPT-2's format needs ..."),
    and ``why`` may give a setting's reason. ``n_kv_heads`` equal to ``n_heads`` reads as None (one
    key/value head per query head)."""
    unnamed = missing_settings(table)
    if unnamed:
        raise RuntimeError(f"{who}: the table of settings does not say whether it can write {unnamed}")
    for name in SETTINGS:
        wanted, value = table[name], getattr(config, name)
        if name == "n_kv_heads" and value == config.n_heads:
            value = None
        if wanted is not ANY and value != wanted:
            reason = f": {why[name]}" if why and name in why else ""
            raise ValueError(f"{who} needs {name}={wanted!r}, the GPT has {name}={value!r}{reason}")


def _setting(cfg, name: str, default=None):
    return cfg.get(name, default) if isinstance(cfg, Mapping) else getattr(cfg, name, default)


# transformers' rope types the GPT does not follow, and why (chapter "Longer than trained").
_ROPE_REFUSED = {
    "dynamic": "its frequencies change as the sequence grows, so keys cached at a shorter length would no "
    "longer match (the recipe refuses it too); the rope type 'linear', 'yarn' or 'llama3', or the GPT's "
    "kind 'ntk' at the longest length, keeps them fixed",
    "longrope": "it divides each pair by a factor of its own (short_factor, long_factor) and switches between "
    "the two lists past the trained length, which RopeScaling cannot say",
}

# The settings each rope type the GPT reads must give (yarn's factor defaults to the ratio of the lengths).
_ROPE_NEEDS = {"linear": ("factor",), "yarn": (), "llama3": ("factor", "low_freq_factor", "high_freq_factor")}


def _rope_parameters(cfg) -> dict:
    """A Llama config's rotary settings as one dict: the older ``rope_scaling`` where it is given
    (transformers reads it first), else ``rope_parameters``; ``rope_type`` from the older ``type`` too."""
    params = dict(_setting(cfg, "rope_scaling") or _setting(cfg, "rope_parameters") or {})
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    return params


def _original_length(cfg, params: dict) -> int | None:
    """The length the model was trained at, as transformers reads it: the config's own
    ``original_max_position_embeddings`` (Phi-3's place) before the one in the rotary settings."""
    return _setting(cfg, "original_max_position_embeddings") or params.get("original_max_position_embeddings")


def _rope(cfg) -> tuple[float, RopeScaling | None]:
    """The rotary base of a Llama config and its rescaling (chapter "Longer than trained"), or None.

    - ``"linear"``: ``factor``; the trained length, which linear's frequencies do not use, is
      ``original_max_position_embeddings`` where the config gives it, else ``max_position_embeddings /
      factor`` rounded down (a linear-scaled config's ``max_position_embeddings`` is the new length);
    - ``"yarn"``: ``factor`` (none: ``max_position_embeddings`` over the trained length),
      ``original_max_position_embeddings`` (none: ``max_position_embeddings``), ``beta_fast``,
      ``beta_slow`` (none or 0: 32 and 1), ``truncate`` (none: True) and ``attention_factor``; with
      ``mscale`` and ``mscale_all_dim`` and no ``attention_factor``, the ratio of their two factors,
      as transformers computes it;
    - ``"llama3"``: ``factor``, ``low_freq_factor``, ``high_freq_factor`` and ``original_max_position_embeddings``.

    ``"dynamic"``, ``"longrope"``, any other type, a ``partial_rotary_factor`` other than 1 with a
    rescaling, and a bad value are refused by name.
    """
    params = _rope_parameters(cfg)
    kind = params["rope_type"]
    base = float(params.get("rope_theta", _setting(cfg, "rope_theta", 10000.0)))
    if kind == "default":
        return base, None
    if kind in _ROPE_REFUSED:
        raise ValueError(f"Llama rope_type {kind!r} is not supported: {_ROPE_REFUSED[kind]}")
    if kind not in ("linear", "yarn", "llama3"):
        raise ValueError(
            f"Llama rope_type {kind!r} is not supported: the GPT reads 'default', 'linear', 'yarn' and 'llama3'"
        )
    partial = params.get("partial_rotary_factor", _setting(cfg, "partial_rotary_factor"))
    if partial not in (None, 1, 1.0):
        raise ValueError(
            f"Llama setting partial_rotary_factor={partial!r} is not supported with rope_type "
            f"{kind!r}: the GPT rotates every dimension of a head"
        )
    for name in _ROPE_NEEDS[kind]:
        if params.get(name) is None:
            raise ValueError(f"Llama rope_type {kind!r} needs {name} in rope_parameters, got {params!r}")
    max_len = _setting(cfg, "max_position_embeddings")
    original = _original_length(cfg, params)
    if kind == "linear":
        options = {"factor": params["factor"], "original_context": original or max(1, int(max_len // params["factor"]))}
    elif kind == "llama3":
        options = {name: params[name] for name in ("factor", "low_freq_factor", "high_freq_factor")}
        options["original_context"] = original or max_len
    else:
        original = original or max_len
        factor = params.get("factor") or max_len / original
        attention = params.get("attention_factor")
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if attention is None and mscale and mscale_all_dim:  # DeepSeek's spelling of the attention factor

            def mscale_of(scale: float) -> float:
                return 1.0 if factor <= 1 else 0.1 * scale * math.log(factor) + 1.0

            attention = mscale_of(mscale) / mscale_of(mscale_all_dim)
        options = {
            "factor": factor,
            "original_context": original,
            "beta_fast": params.get("beta_fast") or 32.0,
            "beta_slow": params.get("beta_slow") or 1.0,
            "truncate": params.get("truncate", True),
            "attention_factor": attention,
        }
    try:
        return base, RopeScaling(kind, **options)
    except (TypeError, ValueError) as error:
        raise ValueError(f"Llama rope_parameters {params!r} cannot be read: {error}") from None


def _llama_rope_parameters(c: GPTConfig) -> dict:
    """The ``rope_parameters`` of a Llama computing the GPT's rotary positions (chapter "Longer than
    trained"): plain, or ``"linear"``, ``"yarn"``, ``"llama3"`` with the spec's values. The GPT's
    ``"ntk"`` is plain rotary positions of the larger base ``base * s^(d_k / (d_k - 2))`` (the same
    frequencies), and reads back as that base with no rescaling."""
    r, base = c.rope_scaling, float(c.rotary_base)
    if r is None:
        return {"rope_type": "default", "rope_theta": base}
    if r.kind == "ntk":
        d_k = c.d_model // c.n_heads
        return {"rope_type": "default", "rope_theta": base * float(r.factor) ** (d_k / (d_k - 2))}
    params = {"rope_type": r.kind, "rope_theta": base, "factor": float(r.factor)}
    if r.kind == "yarn":
        params |= {
            "original_max_position_embeddings": r.original_context,
            "beta_fast": float(r.beta_fast),
            "beta_slow": float(r.beta_slow),
            "truncate": r.truncate,
        }
        if r.attention_factor is not None:
            params["attention_factor"] = float(r.attention_factor)
    elif r.kind == "llama3":
        params |= {
            "original_max_position_embeddings": r.original_context,
            "low_freq_factor": float(r.low_freq_factor),
            "high_freq_factor": float(r.high_freq_factor),
        }
    elif r.kind != "linear":
        raise ValueError(f"llama_from_gpt cannot write rope_scaling kind {r.kind!r} as Llama's rope_parameters")
    return params


# The settings a Llama config must give (the others have defaults).
_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "max_position_embeddings",
    "intermediate_size",
    "rms_norm_eps",
)


def gpt_config_from_llama(cfg) -> GPTConfig:
    """The :class:`GPTConfig` of a ``LlamaConfig`` (or its dict) (chapter "Today's block"); unsupported settings raise.

    A rescaled rotary position (``"linear"``, ``"yarn"``, ``"llama3"``) becomes the recipe's
    ``rope_scaling`` (chapter "Longer than trained"; how each is read: :func:`_rope`)."""
    refused = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1}
    for name, ok in refused.items():
        value = _setting(cfg, name, ok)
        if value != ok:
            raise ValueError(f"Llama setting {name}={value!r} is not supported (the book's GPT needs {ok!r})")
    for name in _REQUIRED:
        if _setting(cfg, name) is None:
            raise ValueError(f"the Llama config has no {name}: the GPT cannot be built without guessing it")
    d_model, n_heads = _setting(cfg, "hidden_size"), _setting(cfg, "num_attention_heads")
    if not (is_int(d_model) and is_int(n_heads) and n_heads > 0):
        raise ValueError(f"Llama settings hidden_size={d_model!r} and num_attention_heads={n_heads!r} must be ints > 0")
    head_dim = _setting(cfg, "head_dim") or d_model // n_heads
    if head_dim * n_heads != d_model:
        raise ValueError(
            f"Llama setting head_dim={head_dim} is not supported: the GPT's heads are d_model / n_heads "
            f"(hidden_size={d_model} / num_attention_heads={n_heads})"
        )
    base, rope_scaling = _rope(cfg)
    return GPTConfig(
        vocab_size=_setting(cfg, "vocab_size"),
        context_len=_setting(cfg, "max_position_embeddings"),
        n_layers=_setting(cfg, "num_hidden_layers"),
        n_heads=n_heads,
        d_model=d_model,
        n_kv_heads=_setting(cfg, "num_key_value_heads") or n_heads,
        recipe=LLAMA_BLOCK,
        norm_eps=float(_setting(cfg, "rms_norm_eps")),
        d_ff=_setting(cfg, "intermediate_size"),
        rotary_base=base,
        rope_scaling=rope_scaling,
        tie_embeddings=bool(_setting(cfg, "tie_word_embeddings", False)),
    )


# What Llama's format writes of each setting (check_settings): ANY, or Llama's block's value. A SwiGLU
# network reads no activation; a rotary rescaling is written as rope_parameters.
_LLAMA_ANY = ("n_kv_heads", "norm_eps", "activation", "d_ff", "rotary_base", "tie_embeddings", "rope_scaling")
LLAMA_SETTINGS = {name: LLAMA_BLOCK.flat().get(name) for name in SETTINGS} | dict.fromkeys(_LLAMA_ANY, ANY)

# Llama's name (after "model.layers.i.") of each matrix of a layer, by the role and kind the book's part
# gives it (transformer_lib.parts); the fused "qkv" is Llama's three, and the norms come in layer order.
_LLAMA_MATRICES = {
    ("attention", "out"): "self_attn.o_proj.weight",
    ("feed_forward", "gate"): "mlp.gate_proj.weight",
    ("feed_forward", "in"): "mlp.up_proj.weight",
    ("feed_forward", "out"): "mlp.down_proj.weight",
}
_LLAMA_QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
_LLAMA_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")


def _layer_names(gpt: GPT, i: int) -> dict:
    """The book's name of each matrix of layer ``i``, found by role: ``{(role, kind): name}`` and ``"norms"``."""
    prefix, names = f"decoder.layers.{i}.", {}
    for role in ("attention", "feed_forward"):
        for part_name, part in find_parts(gpt.decoder.layers[i], role).items():
            for kind, path in type(part).part_matrices.items():
                names[role, kind] = prefix + f"{part_name}.{path}".lstrip(".")
    names["norms"] = [prefix + n for n in part_weights(gpt.decoder.layers[i], "norm")]
    return names


def _llama_shapes(c: GPTConfig, d_ff: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each tensor a Llama of the config ``c`` holds: its shape, and the settings that make it."""
    d, kv_rows = c.d_model, (c.n_kv_heads or c.n_heads) * (c.d_model // c.n_heads)
    shapes = {
        "model.embed_tokens.weight": ((c.vocab_size, d), "vocab_size, hidden_size"),
        "model.norm.weight": ((d,), "hidden_size"),
    }
    if not c.tie_embeddings:
        shapes["lm_head.weight"] = ((c.vocab_size, d), "vocab_size, hidden_size")
    kv = ((kv_rows, d), "hidden_size, num_attention_heads, num_key_value_heads")
    layer = dict(zip(_LLAMA_QKV, [((d, d), "hidden_size"), kv, kv], strict=True))
    layer["self_attn.o_proj.weight"] = ((d, d), "hidden_size")
    layer |= {n: ((d_ff, d), "intermediate_size") for n in ("mlp.gate_proj.weight", "mlp.up_proj.weight")}
    layer["mlp.down_proj.weight"] = ((d, d_ff), "intermediate_size")
    layer |= {n: ((d,), "hidden_size") for n in _LLAMA_NORMS}
    for i in range(c.n_layers):
        shapes |= {f"model.layers.{i}.{n}": shape for n, shape in layer.items()}
    return shapes


def _check_llama_state(gpt: GPT, s: Mapping[str, Tensor]) -> None:
    """Refuse, by name, a state dict that does not fit the config: a missing tensor (its layer and
    matrix), a tensor of another shape, another number of layers."""
    c = gpt.config
    layers = {int(m[1]) for k in s if (m := re.match(r"model\.layers\.(\d+)\.", k))}
    if layers != set(range(c.n_layers)):
        held = f"{len(layers)} layers" + (f" {sorted(layers)}" if 0 < len(layers) < 8 else "")
        raise ValueError(f"the Llama config has num_hidden_layers={c.n_layers}, but the weights hold {held}")
    d_ff = gpt.state_dict()[_layer_names(gpt, 0)["feed_forward", "in"]].shape[0] if c.n_layers else 0
    for name, (shape, settings) in _llama_shapes(c, d_ff).items():
        where = f"layer {name.split('.')[2]}'s {'.'.join(name.split('.')[3:5])}" if ".layers." in name else "the model"
        if name not in s:
            raise ValueError(f"the Llama state dict has no {name} ({where})")
        if not isinstance(s[name], Tensor) or tuple(s[name].shape) != shape:
            got = tuple(s[name].shape) if isinstance(s[name], Tensor) else type(s[name]).__name__
            raise ValueError(
                f"the Llama state dict's {name} ({where}) has shape {got}, but the config ({settings}) makes it {shape}"
            )


def _book_state(gpt: GPT, s: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Llama's tensors (``model.`` names) under the names of ``gpt``'s parts, ``W_q`` and ``W_k`` rows reordered."""
    c = gpt.config
    d_k = c.d_model // c.n_heads
    q_order, k_order = half_split_rows(c.n_heads, d_k), half_split_rows(c.n_kv_heads, d_k)
    out = {"tok_embed.weight": s["model.embed_tokens.weight"], "decoder.norm.weight": s["model.norm.weight"]}
    out["lm_head.weight"] = s["model.embed_tokens.weight"] if c.tie_embeddings else s["lm_head.weight"]
    for i in range(c.n_layers):
        hf, names = f"model.layers.{i}.", _layer_names(gpt, i)
        q, k, v = (s[hf + n] for n in _LLAMA_QKV)
        out[names["attention", "qkv"]] = torch.cat([q[q_order], k[k_order], v])
        out |= {names[key]: s[hf + theirs] for key, theirs in _LLAMA_MATRICES.items()}
        out |= {ours: s[hf + theirs] for ours, theirs in zip(names["norms"], _LLAMA_NORMS, strict=True)}
    return out


def gpt_from_llama(source: nn.Module | Mapping[str, Tensor], config=None) -> GPT:
    """The book's :class:`GPT` computing what a Llama computes (chapter "Today's block"), in the source's dtype, in eval
    mode.

    ``source`` is a ``transformers`` ``LlamaForCausalLM`` (its ``config`` is used) or its state
    dict, with ``config`` a ``LlamaConfig`` or its dict. Logits ``(B, T, vocab_size)`` of the two
    models agree to rounding (float64: about 1e-15 once ``transformers`` computes its norms and
    angles in float64 too). Settings the GPT cannot follow raise a ``ValueError`` naming them.
    """
    if isinstance(source, nn.Module):
        if type(source).__name__ != "LlamaForCausalLM":
            raise TypeError(
                f"gpt_from_llama takes a transformers LlamaForCausalLM (the whole model, with its head) or "
                f"its state dict, got {type(source).__name__}"
            )
        config = source.config if config is None else config
        source = source.state_dict()
    if config is None:
        raise ValueError("gpt_from_llama needs the LlamaConfig (or its dict) with a state dict")
    c = gpt_config_from_llama(config)
    if "model.embed_tokens.weight" not in source:
        raise ValueError("expected a Llama state dict (with 'model.embed_tokens.weight', 'model.layers.0....')")
    model = GPT(c)
    _check_llama_state(model, source)
    state = _book_state(model, source)
    model = model.to(state["tok_embed.weight"].dtype)
    model.load_state_dict(state)
    return model.eval()


def llama_from_gpt(gpt: GPT) -> nn.Module:
    """A ``transformers`` ``LlamaForCausalLM`` with the weights of a Llama-style :class:`GPT` (chapter "Today's block").

    The GPT needs ``norm="rmsnorm"``, ``ffn="swiglu"``, ``positions="rotary"``, ``bias=False``,
    multi-head attention without sinks, no ``qk_norm`` and no ``window``; anything else (a sparse,
    latent or recurrent attention included) raises a ``ValueError`` naming the setting. A
    ``rope_scaling`` (chapter "Longer than trained") is written as Llama's ``rope_parameters``
    (:func:`_llama_rope_parameters`). The model is in the GPT's dtype, in eval mode, with PyTorch's
    fused attention (``transformers``' eager attention computes the softmax in float32).
    """
    if not isinstance(gpt, GPT):
        inner = " (convert its .gpt: a classifier's head has no Llama counterpart)" if hasattr(gpt, "gpt") else ""
        raise TypeError(f"llama_from_gpt takes a GPT, got a {type(gpt).__name__}{inner}")
    if any(".parametrizations." in name for name, _ in gpt.named_parameters()):
        raise ValueError(
            "llama_from_gpt takes a GPT without LoRA adapters (or other parametrizations): write them "
            "into its weights first with remove_lora(gpt), which merges them"
        )
    from transformers import LlamaConfig, LlamaForCausalLM

    c = gpt.config
    if c.experts is not None:
        raise ValueError(
            "llama_from_gpt needs a dense feed-forward network: the GPT has experts (a mixture "
            "of experts), which Llama's format cannot hold"
        )
    check_settings(c, LLAMA_SETTINGS, "llama_from_gpt")
    d_k = c.d_model // c.n_heads
    layer0 = gpt.decoder.layers[0].ff if c.n_layers else None
    cfg = LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads or c.n_heads,
        head_dim=d_k,
        max_position_embeddings=c.context_len,
        intermediate_size=layer0.gate_proj.out_features if layer0 is not None else c.d_ff or 1,
        rms_norm_eps=c.norm_eps,
        rope_parameters=_llama_rope_parameters(c),
        tie_word_embeddings=c.tie_embeddings,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        attn_implementation="sdpa",
    )
    book = gpt.state_dict()
    q_back = torch.argsort(half_split_rows(c.n_heads, d_k))
    k_back = torch.argsort(half_split_rows(c.n_kv_heads or c.n_heads, d_k))
    state = {
        "model.embed_tokens.weight": book["tok_embed.weight"],
        "model.norm.weight": book["decoder.norm.weight"],
        "lm_head.weight": book["lm_head.weight"],
    }
    for i in range(c.n_layers):
        hf, names = f"model.layers.{i}.", _layer_names(gpt, i)
        q, k, v = book[names["attention", "qkv"]].split([c.d_model, len(k_back), len(k_back)])
        state |= dict(zip((hf + n for n in _LLAMA_QKV), (q[q_back], k[k_back], v), strict=True))
        state |= {hf + theirs: book[names[key]] for key, theirs in _LLAMA_MATRICES.items()}
        state |= {hf + theirs: book[ours] for ours, theirs in zip(names["norms"], _LLAMA_NORMS, strict=True)}
    llama = LlamaForCausalLM(cfg).to(book["tok_embed.weight"].dtype)
    llama.load_state_dict(state, strict=not c.tie_embeddings)
    return llama.eval()
