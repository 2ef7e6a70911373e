"""Low-rank adapters, LoRA (chapter "Fine-tuning"; Hu et al., 2021).

A weight matrix ``W (out, in)`` that stays frozen is used as ``W + (alpha / r) B A`` with two
small trainable matrices ``A (r, in)`` and ``B (out, r)``. ``A`` starts random and ``B`` at zero,
so an adapted model starts exactly where the pretrained one stands; only ``r (in + out)``
numbers per matrix are trained and saved instead of ``in * out``.

The adapter is a :mod:`torch.nn.utils.parametrize` parametrization of the weight, so it applies
to any 2-D parameter of any model, named as :meth:`~torch.nn.Module.named_parameters` names it
(a linear layer's ``weight``, or the fused ``in_proj_weight`` of the book's attention). Every
forward uses ``W + (alpha / r) B A`` computed from the frozen ``W``; :func:`merge_lora` writes
that sum into the weight once, so inference costs nothing extra, and :func:`unmerge_lora`
restores the frozen ``W`` bit for bit (it keeps a copy).

::

    targets = ["*.self_attn.in_proj_weight", "*.ff.net.*.weight"]
    names = add_lora(model, targets, rank=4, alpha=8)
    ...  # train: only the adapters' A and B require gradients
    save_adapter(model, "adapter.pt")  # kilobytes, not the model
    load_adapter(fresh_model, "adapter.pt")  # refuses another shape
"""

from __future__ import annotations

import fnmatch
import math
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from ._checks import check_int, is_real
from .checkpoint import read_checkpoint, save_checkpoint, tensor_checksum
from .token_rows import add_token_rows, token_rows

__all__ = [
    "ADAPTER_FORMAT",
    "LoRA",
    "add_lora",
    "adapter_state",
    "count_parameters",
    "load_adapter",
    "lora_weights",
    "merge_lora",
    "remove_lora",
    "save_adapter",
    "unmerge_lora",
]

#: The version written into every adapter file by :func:`save_adapter`.
ADAPTER_FORMAT = "transformer_lib.lora/1"


class LoRA(nn.Module):
    """The parametrization ``W -> W + (alpha / rank) B A`` of one weight ``W (out, in)`` (chapter "Fine-tuning").

    ``A (rank, in)`` is initialised as PyTorch initialises a linear layer's weight (Kaiming
    uniform with ``a = sqrt(5)``, as ``peft`` does) and ``B (out, rank)`` at zero, so the adapted
    weight starts equal to ``W``. ``forward(W)`` returns the adapted weight, of ``W``'s shape.
    """

    def __init__(self, weight: Tensor, rank: int, alpha: float, generator: torch.Generator | None = None):
        super().__init__()
        check_int(rank, "rank")  # NumPy's numbers too, stored as Python's: an adapter file holds no NumPy
        if not is_real(alpha):
            raise TypeError(f"alpha must be a positive number, got {alpha!r} ({type(alpha).__name__})")
        if not (alpha > 0 and math.isfinite(alpha)):
            raise ValueError(f"alpha must be a positive number (finite, > 0), got {alpha!r}")
        if weight.dim() != 2:
            raise ValueError(f"LoRA adapts a matrix, got a weight of shape {tuple(weight.shape)}")
        n_out, n_in = weight.shape
        if rank > min(n_out, n_in):
            raise ValueError(f"rank {rank} is above the smaller side of a ({n_out}, {n_in}) weight")
        options = dict(dtype=weight.dtype, device=weight.device)
        self.A = nn.Parameter(torch.empty(rank, n_in, **options))
        self.B = nn.Parameter(torch.zeros(n_out, rank, **options))
        bound = 1 / math.sqrt(n_in)  # kaiming_uniform_(a=sqrt(5)) on (rank, n_in): U(-1/sqrt(n_in), 1/sqrt(n_in))
        with torch.no_grad():
            self.A.uniform_(-bound, bound, generator=generator)
        self.rank, self.alpha = int(rank), float(alpha)
        self.scale = self.alpha / self.rank
        self.frozen: Tensor | None = None  # the frozen W, kept while the adapter is merged into it

    def delta(self) -> Tensor:
        """The update ``(alpha / rank) B A``, shape ``(out, in)``."""
        return self.scale * (self.B @ self.A)

    def forward(self, weight: Tensor) -> Tensor:
        """``weight (out, in)`` -> ``weight + (alpha / rank) B A (out, in)``, which the layer then
        applies to its input ``x (..., in)``, giving ``(..., out)``. While merged
        (:func:`merge_lora`), ``weight`` already holds that sum and is returned as it is; a
        backward through it is refused while ``A`` or ``B`` requires a gradient."""
        if self.frozen is None:
            return weight + self.delta()
        if torch.is_grad_enabled() and (self.A.requires_grad or self.B.requires_grad):
            return _Merged.apply(weight, self.A, self.B)
        return weight

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha:g}, in={self.A.shape[1]}, out={self.B.shape[0]}"


class _Merged(torch.autograd.Function):
    """A merged adapter's weight, as it is; its backward raises: the merged weight holds the sum,
    so ``A`` and ``B`` would get no gradient and training would leave them silently as they are."""

    @staticmethod
    def forward(weight: Tensor, A: Tensor, B: Tensor) -> Tensor:
        return weight.view_as(weight)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass

    @staticmethod
    def backward(ctx, grad: Tensor):
        raise ValueError(
            "a merged LoRA adapter cannot be trained (its weight holds W + (alpha / r) B A, so A and B get no "
            "gradient): unmerge_lora(model) first, or remove_lora(model) to train the merged weights as plain ones"
        )


def _split(name: str) -> tuple[str, str]:
    """``"decoder.layers.0.ff.net.0.weight"`` -> ``("decoder.layers.0.ff.net.0", "weight")``."""
    owner, _, leaf = name.rpartition(".")
    return owner, leaf


def _base_name(name: str) -> str:
    """A parameter's name as the model had it before parametrization (without
    ``parametrizations.`` and ``.original``)."""
    return name.replace(".parametrizations.", ".").replace(".original", "").removeprefix("parametrizations.")


def _targets(model: nn.Module, patterns: Sequence[str]) -> list[str]:
    """The weight names matching ``patterns`` (shell-style, as in :mod:`fnmatch`), each checked."""
    if isinstance(patterns, str) or not patterns:
        raise TypeError(f"targets must be a list of parameter-name patterns, got {patterns!r}")
    adapted = lora_weights(model)
    params = {
        _base_name(n): p
        for n, p in model.named_parameters(remove_duplicate=False)
        if ".parametrizations." not in n or n.endswith(".original")
    }
    names: list[str] = []
    for pattern in patterns:
        found = [n for n in params if fnmatch.fnmatchcase(n, pattern)]
        if not found:
            matrices = [n for n, p in params.items() if p.dim() == 2]
            raise ValueError(f"no parameter of the model matches {pattern!r}; its matrices are {matrices}")
        names += [n for n in found if n not in names]
    names = [n for n in params if n in names]  # the model's order
    for name in names:
        if name in adapted:
            raise ValueError(f"{name} already has an adapter")
        if params[name].dim() != 2:
            raise ValueError(f"{name} has shape {tuple(params[name].shape)}: LoRA adapts matrices only")
        if sum(p is params[name] for p in params.values()) > 1:
            raise ValueError(f"{name} is shared with another parameter (tied weights): adapting it would untie them")
    return names


def add_lora(
    model: nn.Module, targets: Sequence[str], rank: int = 8, alpha: float = 16.0, *, seed: int = 0, freeze: bool = True
) -> list[str]:
    """Adapt each weight of ``model`` whose name matches one of ``targets`` (patterns such as
    ``"*.self_attn.in_proj_weight"``) with a :class:`LoRA` of ``rank`` and ``alpha``; returns the
    names adapted, in the model's order (chapter "Fine-tuning"). ``freeze`` (the default) sets ``requires_grad=False``
    on every parameter but the adapters' ``A`` and ``B``. ``seed`` draws the ``A`` matrices.
    The model computes exactly what it computed before (``B`` is zero)."""
    names = _targets(model, targets)
    generator = torch.Generator().manual_seed(seed)
    if freeze:
        model.requires_grad_(False)
    for name in names:
        owner, leaf = _split(name)
        module = model.get_submodule(owner)
        weight = getattr(module, leaf)
        lora = LoRA(weight.detach().cpu(), rank, alpha, generator).to(weight.device)
        parametrize.register_parametrization(module, leaf, lora)
    return names


def lora_weights(model: nn.Module) -> dict[str, LoRA]:
    """``{weight name: its LoRA}`` for every adapter of ``model``, in the model's order (chapter "Fine-tuning")."""
    out = {}
    for owner, module in model.named_modules():
        for leaf, plist in getattr(module, "parametrizations", {}).items():
            for p in plist:
                if isinstance(p, LoRA):
                    out[f"{owner}.{leaf}" if owner else leaf] = p
    return out


def _adapters(model: nn.Module) -> dict[str, LoRA]:
    found = lora_weights(model)
    if not found:
        raise ValueError("the model has no LoRA adapters (add them with add_lora)")
    return found


def merge_lora(model: nn.Module) -> None:
    """Write ``W + (alpha / r) B A`` into each adapted weight, which then costs nothing per
    forward; the model computes what it computed unmerged (chapter "Fine-tuning"). :func:`unmerge_lora` undoes it.

    A merged model is for inference: a backward through a merged adapter whose ``A`` or ``B``
    requires a gradient raises a ``ValueError`` (they would get no gradient). Unmerge it to train
    the adapters, :func:`remove_lora` to train the merged weights, or freeze the adapters
    (``requires_grad_(False)``) to train the model's other weights around them."""
    for name, lora in _adapters(model).items():
        if lora.frozen is not None:
            raise ValueError(f"the adapter of {name} is already merged")
        owner, leaf = _split(name)
        module = model.get_submodule(owner)
        lora.frozen = module.parametrizations[leaf].original.detach().clone()
        with torch.no_grad():  # the adapted weight, computed as every forward computes it, becomes the weight
            module.parametrizations[leaf].original.copy_(lora.frozen + lora.delta())
        module.parametrizations[leaf].original.requires_grad_(False)


def unmerge_lora(model: nn.Module) -> None:
    """Restore each merged weight to its frozen ``W``, bit for bit, and use the adapter again (chapter
    "Fine-tuning")."""
    for name, lora in _adapters(model).items():
        if lora.frozen is None:
            raise ValueError(f"the adapter of {name} is not merged")
        owner, leaf = _split(name)
        module = model.get_submodule(owner)
        with torch.no_grad():
            module.parametrizations[leaf].original.copy_(lora.frozen)
        lora.frozen = None


def remove_lora(model: nn.Module, merge: bool = True) -> list[str]:
    """Remove every adapter, leaving plain weights: merged into them (``merge=True``) or the
    frozen ``W`` alone (chapter "Fine-tuning"). Returns the names."""
    names = []
    for name, lora in _adapters(model).items():
        if lora.frozen is not None and not merge:
            unmerge_lora(model)
        owner, leaf = _split(name)
        module = model.get_submodule(owner)
        parametrize.remove_parametrizations(module, leaf, leave_parametrized=merge)
        names.append(name)
    return names


def count_parameters(model: nn.Module, trainable: bool = True) -> int:
    """The number of parameters that require gradients (``trainable``) or of all, each shared
    parameter once (chapter "Fine-tuning")."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable)


def _shape_of(model: nn.Module, name: str) -> tuple[int, ...] | None:
    params = {_base_name(n): p for n, p in model.named_parameters(remove_duplicate=False)}
    return tuple(params[name].shape) if name in params else None


def adapter_state(model: nn.Module) -> dict:
    """The adapters alone, as plain data and tensors: ``{"rank", "alpha", "weights": {name: shape},
    "tensors": {name + ".A": A, name + ".B": B}}`` (``rank`` and ``alpha`` shared by all) (chapter "Fine-tuning")."""
    adapters = _adapters(model)
    settings = {(lora.rank, lora.alpha) for lora in adapters.values()}
    if len(settings) != 1:
        raise ValueError(f"the adapters differ in rank or alpha ({sorted(settings)}): save them one setting at a time")
    ((rank, alpha),) = settings
    weights = {name: list(_shape_of(model, name)) for name in adapters}
    tensors = {}
    for name, lora in adapters.items():
        tensors[f"{name}.A"] = lora.A.detach().cpu().clone()
        tensors[f"{name}.B"] = lora.B.detach().cpu().clone()
    rows = token_rows(model)  # trained token rows beside the adapters (token_rows.py), if any
    if rows is not None:
        tensors["token_rows.delta"] = rows.delta.detach().cpu().clone()
    extra = {} if rows is None else {"token_rows": rows.rows.tolist()}
    return {"rank": rank, "alpha": alpha, "weights": weights, "tensors": tensors, **extra}


def save_adapter(model: nn.Module, path: str | os.PathLike, *, meta: dict | None = None, force: bool = False) -> Path:
    """Write only the adapters of ``model`` to ``path``, atomically and checksummed like a
    checkpoint; an existing file that holds anything else is kept unless ``force`` (chapter "Fine-tuning")."""
    path = Path(path)
    state = {"format": ADAPTER_FORMAT, **adapter_state(model), "meta": dict(meta or {})}
    if path.exists() and not force:
        try:
            same = tensor_checksum(read_checkpoint(path).get("tensors", {})) == tensor_checksum(state["tensors"])
        except (ValueError, OSError):
            same = False
        if not same:
            raise FileExistsError(f"{path} exists and holds something else: choose another path, or force=True")
    return save_checkpoint(state, path)


def load_adapter(model: nn.Module, path: str | os.PathLike, *, freeze: bool = True) -> list[str]:
    """Add the adapters saved in ``path`` to ``model`` (with their ``A`` and ``B``), returning the
    names (chapter "Fine-tuning"). A file that is not an adapter, or damaged, and a model that lacks one of its weights
    or holds it in another shape, is a ``ValueError`` naming the file and the weight."""
    state = read_checkpoint(path)
    if state.get("format") != ADAPTER_FORMAT:
        raise ValueError(f"{path} is not a LoRA adapter of this library (format {state.get('format')!r})")
    for name, shape in state["weights"].items():
        have = _shape_of(model, name)
        if have is None:
            raise ValueError(f"{path} adapts {name}, which this model does not have")
        if have != tuple(shape):
            raise ValueError(f"{path} adapts {name} of shape {tuple(shape)}, but this model's is {have}")
    names = add_lora(model, list(state["weights"]), state["rank"], state["alpha"], freeze=freeze)
    adapters = lora_weights(model)
    if state.get("token_rows"):  # the token rows trained beside the adapters
        add_token_rows(model, state["token_rows"])
    with torch.no_grad():
        for name in names:
            adapters[name].A.copy_(state["tensors"][f"{name}.A"])
            adapters[name].B.copy_(state["tensors"][f"{name}.B"])
        if state.get("token_rows"):
            token_rows(model).delta.copy_(state["tensors"]["token_rows.delta"])
    return names
