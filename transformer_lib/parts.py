"""The parts of a model by role (chapter "Fine-tuning" and the tools): "the attention layers", "the
feed-forward matrices", instead of attribute paths that only one block has.

A part declares its role on its class, ``part_role``, and names its matrices, ``part_matrices``
(a kind such as ``"in"`` or ``"out"`` to the parameter's path inside the part); a model names the
roles of its direct children that are plain PyTorch layers, ``part_roles`` (``{"tok_embed":
"embedding", "lm_head": "head"}``). PyTorch's ``LayerNorm`` and ``RMSNorm`` are norms. The roles:

- ``"attention"``: query, key, value and output projections (the book's
  :class:`~transformer_lib.multihead.MultiHeadAttention` keeps Q, K and V in one fused matrix,
  ``"qkv"``). An attention part also has ``n_heads``, an ``out_proj`` that reads the merged heads,
  and the recording hook ``record_scores(callback)`` (:class:`~transformer_lib.multihead.RecordsScores`),
  so that chapter "What attention learns"'s tools can record and change its heads;
- ``"feed_forward"``: ``"in"`` and ``"out"``, and a gated network's ``"gate"``;
- ``"norm"``, ``"embedding"`` and ``"head"``: one ``"weight"`` each.

LoRA's targets (:func:`~transformer_lib.finetune.lora_targets`), the inspection tools
(:func:`~transformer_lib.inspect_heads.attention_layers`) and the converters ask for parts by role,
so a new kind of attention or feed-forward network is found by all of them once its class says
what it is. This module imports nothing of the book: every other module may use it.
"""

from __future__ import annotations

from torch import nn

__all__ = ["ROLES", "find_parts", "part_role", "part_weights"]

ROLES = ("attention", "feed_forward", "norm", "embedding", "head")
_NORMS = tuple(c for c in (nn.LayerNorm, getattr(nn, "RMSNorm", None)) if c is not None)


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")


def part_role(module: nn.Module) -> str | None:
    """The role a module declares (``part_role`` on its class; PyTorch's norms are ``"norm"``), or None
    (chapter "Fine-tuning")."""
    role = getattr(type(module), "part_role", None)
    if role is None and isinstance(module, _NORMS):
        return "norm"
    return role


def find_parts(model: nn.Module, role: str) -> dict[str, nn.Module]:
    """Every part of ``model`` with ``role``, by its name in ``model.named_modules()`` (``""`` for
    ``model`` itself), in the order the modules were registered (chapter "Fine-tuning").

    >>> list(find_parts(gpt, "feed_forward"))
    ['decoder.layers.0.ff', 'decoder.layers.1.ff']
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    _check_role(role)
    found = {}
    for name, module in model.named_modules():
        if part_role(module) == role:
            found[name] = module
        for child, child_role in getattr(module, "part_roles", {}).items():
            if child_role == role and getattr(module, child, None) is not None:
                found[f"{name}.{child}".lstrip(".")] = getattr(module, child)
    return found


def part_weights(model: nn.Module, roles: str | tuple[str, ...], kinds: tuple[str, ...] | None = None) -> list[str]:
    """The names of the matrices (and norms' weights) of the parts of ``model`` with ``roles``, as
    ``model.named_parameters()`` spells them, in the model's order (chapter "Fine-tuning"); ``kinds`` keeps only some of
    each part's matrices (``("qkv",)``, ``("in", "gate")``; a part without that kind gives none).
    A weight shared by two parts (tied embeddings) is named once, by its first name.

    >>> part_weights(gpt, ("attention", "feed_forward"))  # LoRA's targets
    """
    roles = (roles,) if isinstance(roles, str) else tuple(roles)
    for role in roles:
        _check_role(role)
    wanted = set()
    for role in roles:
        for name, part in find_parts(model, role).items():
            matrices = getattr(type(part), "part_matrices", {"weight": "weight"})
            for kind, path in matrices.items():
                if kinds is None or kind in kinds:
                    wanted.add(f"{name}.{path}".lstrip("."))
    names = [n.replace(".parametrizations.", ".").replace(".original", "") for n, _ in model.named_parameters()]
    return [n for n in names if n in wanted]
