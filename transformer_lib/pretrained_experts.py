"""Mixture-of-experts layers of ``transformers`` in the book's :class:`~transformer_lib.experts.Experts`
(chapter "Experts"): one layer and three routers.

Each converter takes one block, the ``mlp`` of a decoder layer, and returns an ``Experts`` layer
whose :class:`~transformer_lib.experts.ExpertsSpec` says that family's routing:

- ``Qwen3MoeSparseMoeBlock``: a softmax over the experts, the top k, divided by their sum when
  the config's ``norm_topk_prob`` is set;
- ``MixtralSparseMoeBlock``: Mixtral's softmax over the top k logits, which is the softmax over
  all the experts divided by the sum of the chosen k (``norm_topk=True``);
- ``DeepseekV3MoE``: a sigmoid of each logit; the choice within the best ``topk_group`` of
  ``n_group`` groups, moved by ``e_score_correction_bias`` (the layer's ``score_bias``); the
  weights times ``routed_scaling_factor`` (``scaling``); ``n_shared_experts`` shared experts.

The settings are read from the block's own modules, which are what its forward uses (the block's
config may have been edited since it was built). ``transformers`` 5 stores the routed experts as
two 3-D tensors: ``gate_up_proj (E, 2 h, d)``, the gate's ``h`` rows then the up projection's,
and ``down_proj (E, d, h)``. Expert ``e`` of the book is a
:class:`~transformer_lib.modern_block.SwiGLU` with ``gate_proj.weight = gate_up_proj[e, :h]``,
``up_proj.weight = gate_up_proj[e, h:]`` and ``down_proj.weight = down_proj[e]``.

The converted layer is in the block's dtype and device, and computes what the block computes with
one difference: ``transformers``' routers compute their scores in float32 (DeepSeek-V3's its logits
too) whatever the block's dtype, and the book's router computes in the layer's dtype. In float64
the weights then differ by float32's rounding, about 1e-7 of each weight.

The converted spec adds no training terms (``aux_loss=0``): ``transformers`` adds its balancing
loss only with ``output_router_logits``, and over every layer's tokens at once (see
:func:`~transformer_lib.experts.load_balancing_loss`). The keyword options ``aux_loss``,
``z_loss``, ``bias_rate`` and ``capacity`` set them. What the book's layer cannot say is refused
by name with a ``ValueError``: a bias in an expert or the router, an activation other than SiLU,
Mixtral's router jitter, another layout of the stacked experts. ``transformers`` is imported only
when a converter is called.

A whole model goes both ways with Mixtral: :func:`mixtral_from_gpt` writes the book's GPT with
Llama's block and experts routed as Mixtral routes (the recipe ``"experts"``) as a
``MixtralForCausalLM``, and :func:`gpt_from_mixtral` reads one back. Outside its experts a Mixtral
is a Llama, so everything else is the conversion of chapter "Today's block" (``pretrained_llama``: the names, the
rotary row order, the tied head).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import chain

import torch
from torch import Tensor, nn

from .experts import Experts, ExpertsSpec, experts_layers
from .models import GPT
from .positional import half_split_rows
from .pretrained_llama import (
    _LLAMA_NORMS,
    _LLAMA_QKV,
    ANY,
    LLAMA_SETTINGS,
    _layer_names,
    _llama_rope_parameters,
    _setting,
    check_settings,
    gpt_config_from_llama,
)

__all__ = [
    "experts_from_deepseek_v3",
    "experts_from_mixtral",
    "experts_from_qwen3_moe",
    "gpt_from_mixtral",
    "mixtral_from_gpt",
]

# The spec's training terms a converter may be given; the block says everything else.
_TRAINING = {"aux_loss": 0.0, "z_loss": 0.0, "bias_rate": 0.0, "capacity": None}

# How transformers' stacked experts may be laid out; the book's SwiGLU reads the first form only.
_EXPERTS_LAYOUT = {
    "has_bias": False,
    "has_gate": True,
    "is_concatenated": True,
    "is_transposed": False,
    "has_post_expert_norm": False,
}


def _check_type(block, module: str, class_name: str, caller: str, hint: str = " (a decoder layer's .mlp)") -> None:
    """``block`` must be ``transformers.models.<module>``'s ``class_name``; a TypeError names what it is."""
    from importlib import import_module

    expected = getattr(import_module(f"transformers.models.{module}.modeling_{module}"), class_name)
    if not isinstance(block, expected):
        hint = hint if isinstance(block, nn.Module) else ""
        raise TypeError(f"{caller} takes a transformers {class_name}{hint}, got {type(block).__name__}")


def _check_silu(act_fn, where: str, config) -> None:
    from transformers.activations import SiLUActivation

    if not isinstance(act_fn, (nn.SiLU, SiLUActivation)):
        name = getattr(config, "hidden_act", None)
        said = f"hidden_act={name!r}" if name not in (None, "silu", "swish") else type(act_fn).__name__
        raise ValueError(f"{where} use the activation {said}: the book's experts are SwiGLU networks (SiLU only)")


def _check_tensors(block: nn.Module, family: str, expected: set[str]) -> None:
    """The block must hold exactly the ``expected`` parameters and buffers; any other is named."""
    held = {name for name, _ in chain(block.named_parameters(), block.named_buffers())}
    for name in sorted(held - expected):
        why = " (a bias)" if "bias" in name else ""
        raise ValueError(f"the {family} block holds {name!r}{why}, which the book's Experts layer has no place for")
    for name in sorted(expected - held):
        raise ValueError(f"the {family} block has no {name!r}: it is not the block this converter reads")


def _expert_sizes(block: nn.Module, family: str) -> tuple[int, int, int]:
    """``(E, d, h)`` from the router ``(E, d)`` and the stacked experts, their layout and shapes checked."""
    experts = block.experts
    for flag, ok in _EXPERTS_LAYOUT.items():
        value = getattr(experts, flag, ok)
        if value != ok:
            raise ValueError(f"the {family} experts have {flag}={value!r}: the book's experts need {flag}={ok!r}")
    E, d = block.gate.weight.shape
    h = experts.down_proj.shape[-1]
    shapes = {"gate_up_proj": (E, 2 * h, d), "down_proj": (E, d, h)}
    for name, shape in shapes.items():
        got = tuple(getattr(experts, name).shape)
        if got != shape:
            raise ValueError(
                f"the {family} experts' {name} has shape {got}, but a router of {E} experts over "
                f"d={d} and a down_proj of width h={h} make it {shape}"
            )
    return E, d, h


def _spec(routing: dict, training: dict) -> ExpertsSpec:
    unknown = sorted(set(training) - set(_TRAINING))
    if unknown:
        raise TypeError(
            f"unknown option {unknown[0]!r}: the routing comes from the block; the options are {sorted(_TRAINING)}"
        )
    return ExpertsSpec(**routing, **{**_TRAINING, **training})


def _layer(block: nn.Module, spec: ExpertsSpec) -> Experts:
    """The book's layer with the block's router and routed experts copied, in the block's dtype and device."""
    gate_up, down = block.experts.gate_up_proj, block.experts.down_proj  # (E, 2h, d), (E, d, h)
    h = down.shape[-1]
    layer = Experts(block.gate.weight.shape[1], spec).to(device=gate_up.device, dtype=gate_up.dtype)
    with torch.no_grad():
        layer.gate.weight.copy_(block.gate.weight)  # (E, d)
        for e, expert in enumerate(layer.experts):
            expert.gate_proj.weight.copy_(gate_up[e, :h])  # (h, d)
            expert.up_proj.weight.copy_(gate_up[e, h:])  # (h, d)
            expert.down_proj.weight.copy_(down[e])  # (d, h)
    return layer.train(block.training)


def experts_from_qwen3_moe(block: nn.Module, **training) -> Experts:
    """The book's :class:`~transformer_lib.experts.Experts` computing what a ``transformers``
    ``Qwen3MoeSparseMoeBlock`` computes (chapter "Experts"): ``x (B, T, d)`` -> ``(B, T, d)``.

    Softmax scores, the top ``num_experts_per_tok``, renormalised if ``norm_topk_prob``; no shared
    expert. ``training``: the spec's ``aux_loss``, ``z_loss``, ``bias_rate``, ``capacity`` (default none).
    """
    _check_type(block, "qwen3_moe", "Qwen3MoeSparseMoeBlock", "experts_from_qwen3_moe")
    _check_tensors(block, "Qwen3-MoE", {"gate.weight", "experts.gate_up_proj", "experts.down_proj"})
    E, _, h = _expert_sizes(block, "Qwen3-MoE")
    _check_silu(block.experts.act_fn, "the Qwen3-MoE experts", getattr(block.experts, "config", None))
    router = block.gate
    routing = {"n_experts": E, "top_k": router.top_k, "d_expert": h, "norm_topk": bool(router.norm_topk_prob)}
    return _layer(block, _spec(routing, training))


def experts_from_mixtral(block: nn.Module, **training) -> Experts:
    """The book's :class:`~transformer_lib.experts.Experts` computing what a ``transformers``
    ``MixtralSparseMoeBlock`` computes (chapter "Experts"): ``x (B, T, d)`` -> ``(B, T, d)``.

    Mixtral's softmax over the top k logits is the softmax over all experts renormalised over the
    chosen k. A block with ``router_jitter_noise`` (noise on the input in training) is refused.
    ``training``: the spec's ``aux_loss``, ``z_loss``, ``bias_rate``, ``capacity`` (default none).
    """
    _check_type(block, "mixtral", "MixtralSparseMoeBlock", "experts_from_mixtral")
    _check_tensors(block, "Mixtral", {"gate.weight", "experts.gate_up_proj", "experts.down_proj"})
    E, _, h = _expert_sizes(block, "Mixtral")
    _check_silu(block.experts.act_fn, "the Mixtral experts", getattr(block.experts, "config", None))
    if block.jitter_noise:
        raise ValueError(
            f"the Mixtral block has router_jitter_noise={block.jitter_noise!r}: the book's router "
            "multiplies no noise into its input in training (build it with 0.0)"
        )
    routing = {"n_experts": E, "top_k": block.gate.top_k, "d_expert": h, "norm_topk": True}
    return _layer(block, _spec(routing, training))


_SHARED = ("gate_proj", "up_proj", "down_proj")


def experts_from_deepseek_v3(block: nn.Module, **training) -> Experts:
    """The book's :class:`~transformer_lib.experts.Experts` computing what a ``transformers``
    ``DeepseekV3MoE`` computes (chapter "Experts"): ``x (B, T, d)`` -> ``(B, T, d)``.

    Sigmoid scores; the top k within the best ``topk_group`` of ``n_group`` groups of
    ``scores + e_score_correction_bias`` (copied into ``score_bias``); weights renormalised if
    ``norm_topk_prob``, times ``routed_scaling_factor``; ``n_shared_experts`` shared experts, one
    SwiGLU network ``n_shared_experts * moe_intermediate_size`` wide. ``training``: the spec's
    ``aux_loss``, ``z_loss``, ``bias_rate`` (DeepSeek-V3's bias update), ``capacity`` (default none).
    """
    _check_type(block, "deepseek_v3", "DeepseekV3MoE", "experts_from_deepseek_v3")
    shared_names = {f"shared_experts.{m}.weight" for m in _SHARED}
    expected = {"gate.weight", "gate.e_score_correction_bias", "experts.gate_up_proj", "experts.down_proj"}
    _check_tensors(block, "DeepSeek-V3", expected | shared_names)
    E, _, h = _expert_sizes(block, "DeepSeek-V3")
    config = getattr(block, "config", None)
    _check_silu(block.experts.act_fn, "the DeepSeek-V3 experts", config)
    _check_silu(block.shared_experts.act_fn, "the DeepSeek-V3 shared experts", config)
    width = block.shared_experts.gate_proj.weight.shape[0]
    if width % h:
        raise ValueError(
            f"the DeepSeek-V3 shared experts are {width} wide, not a multiple of the experts' "
            f"moe_intermediate_size={h}: the book's shared experts are n_shared experts wide"
        )
    router = block.gate
    routing = {
        "n_experts": E,
        "top_k": router.top_k,
        "d_expert": h,
        "n_shared": width // h,
        "score": "sigmoid",
        "norm_topk": bool(router.norm_topk_prob),
        "n_groups": router.num_group,
        "topk_groups": router.topk_group,
        "scaling": float(router.routed_scaling_factor),
    }
    layer = _layer(block, _spec(routing, training))
    with torch.no_grad():
        layer.score_bias.copy_(router.e_score_correction_bias)  # (E,)
        if layer.shared is not None:
            for name in _SHARED:
                shared: Tensor = getattr(block.shared_experts, name).weight
                getattr(layer.shared, name).weight.copy_(shared)
    return layer


# The whole model. Mixtral's routing in the spec's terms: experts that route otherwise are refused by the setting.
_MIXTRAL_ROUTING = {
    "score": "softmax",
    "norm_topk": True,
    "n_shared": 0,
    "n_groups": 1,
    "scaling": 1.0,
    "dense_layers": 0,
}
# Around the experts, what Llama's format writes of each setting (check_settings): a Mixtral layer's choices.
MIXTRAL_SETTINGS = LLAMA_SETTINGS | {"experts": ANY}
# A MixtralConfig's name for each size of the GPTConfig
_MIXTRAL_SIZES = {
    "vocab_size": "vocab_size",
    "hidden_size": "d_model",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "max_position_embeddings": "context_len",
    "rms_norm_eps": "norm_eps",
    "tie_word_embeddings": "tie_embeddings",
}


def _llama_tensors(gpt: GPT) -> list[tuple[str, list[tuple[str, Tensor | None]]]]:
    """Each tensor of ``gpt`` outside its experts, by the book's name, with the Llama tensors (Mixtral's
    names are Llama's) that its rows hold, in order, and each one's rows in the book's rotary order
    (``half_split_rows``; None: as is). The fused ``W_q, W_k, W_v`` holds three; every other tensor one."""
    c = gpt.config
    d_k, n_kv = c.d_model // c.n_heads, c.n_kv_heads or c.n_heads
    qkv_rows = (half_split_rows(c.n_heads, d_k), half_split_rows(n_kv, d_k), torch.arange(n_kv * d_k))
    table = [
        ("tok_embed.weight", [("model.embed_tokens.weight", None)]),
        ("decoder.norm.weight", [("model.norm.weight", None)]),
        ("lm_head.weight", [("lm_head.weight", None)]),
    ]
    for i in range(c.n_layers):
        hf, names = f"model.layers.{i}.", _layer_names(gpt, i)
        table.append((names["attention", "qkv"], [(hf + n, r) for n, r in zip(_LLAMA_QKV, qkv_rows, strict=True)]))
        table.append((names["attention", "out"], [(hf + "self_attn.o_proj.weight", None)]))
        table += [(ours, [(hf + theirs, None)]) for ours, theirs in zip(names["norms"], _LLAMA_NORMS, strict=True)]
    return table


def _require(settings, needed: dict, what: str) -> None:
    """Each setting of ``needed`` must have its value; the first that has not is named."""
    for name, value in needed.items():
        held = getattr(settings, name)
        if held != value:
            raise ValueError(f"Mixtral's format needs {what}{name}={value!r}, the GPT has {name}={held!r}")


def mixtral_from_gpt(gpt: GPT) -> nn.Module:
    """A ``transformers`` ``MixtralForCausalLM`` with the weights of an experts :class:`GPT` (chapter
    "Experts"), mapping ``input_ids (B, T)`` to the GPT's logits ``(B, T, vocab_size)``.

    The GPT needs Llama's block (RMSNorm, rotary positions, no biases, multi-head attention, grouped
    queries allowed, no ``qk_norm``, ``window`` or ``sinks``) and experts that route as Mixtral's:
    softmax scores, the top k renormalised (``norm_topk``), no shared experts, no groups,
    ``scaling`` 1, experts in every layer (``dense_layers`` 0) and no choice bias (``score_bias``
    zero). Anything else raises a ``ValueError`` naming the setting. The spec's training settings
    are dropped: ``aux_loss`` and ``z_loss`` (``transformers`` adds its own balancing loss, in
    another convention, with ``output_router_logits`` only), ``bias_rate``, and ``capacity``, which
    the book applies in training only (in eval mode every token reaches its experts, as in Mixtral).

    The model is in the GPT's dtype, in eval mode, its head tied where the GPT's is, with PyTorch's
    fused attention and ``transformers``' eager experts, the one that runs in float64 (a float64
    model loaded from a saved folder needs ``experts_implementation="eager"`` too). Its router
    computes its scores in float32: in float64 the logits differ by that rounding.
    """
    if not isinstance(gpt, GPT):
        inner = " (convert its .gpt: a classifier's head has no Mixtral counterpart)" if hasattr(gpt, "gpt") else ""
        raise TypeError(f"mixtral_from_gpt takes a GPT, got a {type(gpt).__name__}{inner}")
    if any(".parametrizations." in name for name, _ in gpt.named_parameters()):
        raise ValueError(
            "mixtral_from_gpt takes a GPT without LoRA adapters (or other parametrizations): "
            "write them into its weights first with remove_lora(gpt), which merges them"
        )
    c = gpt.config
    if c.experts is None:
        raise ValueError(
            "mixtral_from_gpt needs experts (recipe='experts'): the GPT has a dense feed-forward "
            "network, which llama_from_gpt converts"
        )
    check_settings(c, MIXTRAL_SETTINGS, "Mixtral's format")
    _require(c.experts, _MIXTRAL_ROUTING, "experts ")
    by_name = experts_layers(gpt)  # one a layer (dense_layers is 0)
    for name, layer in by_name.items():
        if layer.score_bias.any():
            raise ValueError(
                f"{name}.score_bias, the choice bias that bias_rate={c.experts.bias_rate} trained, "
                "is not zero: Mixtral's router has no bias"
            )
    layers = list(by_name.values())
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(
        **{theirs: getattr(c, ours) for theirs, ours in _MIXTRAL_SIZES.items()},
        num_key_value_heads=c.n_kv_heads or c.n_heads,
        head_dim=c.d_model // c.n_heads,
        intermediate_size=layers[0].d_expert if layers else c.experts.d_expert or c.d_ff or 1,
        num_local_experts=c.experts.n_experts,
        num_experts_per_tok=c.experts.top_k,
        rope_parameters=_llama_rope_parameters(c),
        hidden_act="silu",
        sliding_window=None,
        router_jitter_noise=0.0,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation="sdpa",
        experts_implementation="eager",
    )
    book, state = gpt.state_dict(), {}
    for ours, parts in _llama_tensors(gpt):
        sizes = [book[ours].shape[0] if rows is None else len(rows) for _, rows in parts]
        for (theirs, rows), piece in zip(parts, book[ours].split(sizes), strict=True):
            state[theirs] = piece if rows is None else piece[torch.argsort(rows)]
    for i, layer in enumerate(layers):  # the inverse of _layer: gate_up_proj (E, 2 h, d), down_proj (E, d, h)
        mlp = f"model.layers.{i}.mlp."
        state[mlp + "gate.weight"] = layer.gate.weight  # (E, d)
        state[mlp + "experts.gate_up_proj"] = torch.stack(
            [torch.cat([e.gate_proj.weight, e.up_proj.weight]) for e in layer.experts]
        )
        state[mlp + "experts.down_proj"] = torch.stack([e.down_proj.weight for e in layer.experts])
    mixtral = MixtralForCausalLM(cfg).to(book["tok_embed.weight"].dtype)
    mixtral.load_state_dict(state)
    return mixtral.eval()


def gpt_from_mixtral(model: nn.Module, **training) -> GPT:
    """The book's :class:`GPT` computing what a ``transformers`` ``MixtralForCausalLM`` computes (chapter
    "Experts"), ``idx (B, T)`` to logits ``(B, T, vocab_size)``, in the model's dtype, in eval mode.

    Its recipe is Llama's block with experts: :func:`experts_from_mixtral` reads each layer's block
    (and refuses what the book's layer cannot say), and the rest of the config is read as chapter
    "Today's block"'s :func:`~transformer_lib.pretrained_llama.gpt_config_from_llama` reads Llama's (a rope
    scaling, biases, another activation or head width are refused by name); a ``sliding_window`` is
    refused too. ``training``: the spec's ``aux_loss``, ``z_loss``, ``bias_rate``, ``capacity``
    (default none), for training the GPT further.
    """
    _check_type(model, "mixtral", "MixtralForCausalLM", "gpt_from_mixtral", hint=" (the whole model, with its head)")
    cfg = model.config
    if _setting(cfg, "sliding_window") is not None:
        raise ValueError(
            f"Mixtral setting sliding_window={cfg.sliding_window!r} is not supported: the book "
            "converts a Mixtral whose every query sees every earlier key"
        )
    try:
        dense = gpt_config_from_llama(cfg)
    except ValueError as error:  # chapter "Today's block"'s checks of a Llama config, said of a Mixtral one
        raise ValueError(str(error).replace("Llama", "Mixtral")) from None
    routing = {
        "n_experts": cfg.num_local_experts,
        "top_k": cfg.num_experts_per_tok,
        "d_expert": cfg.intermediate_size,
        "norm_topk": True,
    }
    spec = _spec(routing, training)
    layers = [experts_from_mixtral(layer.mlp, **training) for layer in model.model.layers]
    for i, layer in enumerate(layers):
        if layer.spec != spec:
            raise ValueError(f"layer {i}'s Mixtral block routes as {layer.spec}, not as its config says ({spec})")
    gpt = GPT(replace(dense, recipe=replace(dense.recipe, ffn=replace(spec, d_ff=dense.recipe.ffn.d_ff))))
    s = model.state_dict()
    state = {
        ours: torch.cat([s[n] if rows is None else s[n][rows] for n, rows in parts])
        for ours, parts in _llama_tensors(gpt)
    }
    for name, layer in zip(experts_layers(gpt), layers, strict=True):
        state |= {f"{name}.{key}": value for key, value in layer.state_dict().items()}
    gpt = gpt.to(s["model.embed_tokens.weight"].dtype)
    gpt.load_state_dict(state)
    return gpt.eval()
