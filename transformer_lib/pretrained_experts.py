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
when a converter is called. There is no way back.
"""

from __future__ import annotations

from itertools import chain

import torch
from torch import Tensor, nn

from .experts import Experts, ExpertsSpec

__all__ = ["experts_from_deepseek_v3", "experts_from_mixtral", "experts_from_qwen3_moe"]

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


def _check_type(block, module: str, class_name: str, caller: str) -> None:
    """``block`` must be ``transformers.models.<module>``'s ``class_name``; a TypeError names what it is."""
    from importlib import import_module

    expected = getattr(import_module(f"transformers.models.{module}.modeling_{module}"), class_name)
    if not isinstance(block, expected):
        hint = " (a decoder layer's .mlp)" if isinstance(block, nn.Module) else ""
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
        raise TypeError(f"unknown option {unknown[0]!r}: the routing comes from the block; "
                        f"the options are {sorted(_TRAINING)}")  # fmt: skip
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
        raise ValueError(f"the Mixtral block has router_jitter_noise={block.jitter_noise!r}: the book's router "
                         "multiplies no noise into its input in training (build it with 0.0)")  # fmt: skip
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
        raise ValueError(f"the DeepSeek-V3 shared experts are {width} wide, not a multiple of the experts' "
                         f"moe_intermediate_size={h}: the book's shared experts are n_shared experts wide")  # fmt: skip
    router = block.gate
    routing = {
        "n_experts": E, "top_k": router.top_k, "d_expert": h, "n_shared": width // h, "score": "sigmoid",
        "norm_topk": bool(router.norm_topk_prob), "n_groups": router.num_group, "topk_groups": router.topk_group,
        "scaling": float(router.routed_scaling_factor),
    }  # fmt: skip
    layer = _layer(block, _spec(routing, training))
    with torch.no_grad():
        layer.score_bias.copy_(router.e_score_correction_bias)  # (E,)
        if layer.shared is not None:
            for name in _SHARED:
                shared: Tensor = getattr(block.shared_experts, name).weight
                getattr(layer.shared, name).weight.copy_(shared)
    return layer
