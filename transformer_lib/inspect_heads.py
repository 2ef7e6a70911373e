"""Looking inside a trained model (chapter "What attention learns"): capture the attention
weights of every layer and head in one forward pass, intervene on chosen heads, and score
attention patterns.

Everything here asks the attention layers a model already has through what every attention
offers: its weights through one recording hook,
:meth:`~transformer_lib.multihead.RecordsScores.record_scores`, and its heads through the input of
its ``out_proj``, which a PyTorch hook reads or changes. No model class changes and the model's own
forward still takes its usual (fused) path; every hook is removed when the call or the ``with``
block ends, also when the forward raises. A layer is named as ``model.named_modules()`` names it, for example
``"decoder.layers.0.self_attn"`` in a :class:`~transformer_lib.models.GPT`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager

import torch
from torch import Tensor, nn

from ._checks import check_index, is_int
from .multihead import split_heads
from .parts import find_parts

__all__ = [
    "attention_layers",
    "capture_attention",
    "copying_score",
    "eval_attention",
    "head_activations",
    "induction_score",
    "intervene_heads",
    "previous_token_score",
    "recording_scores",
    "run_with_attention",
]

MODES = ("zero", "mean", "patch")


def attention_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Every attention layer in ``model`` (the parts whose role is ``"attention"``,
    :mod:`transformer_lib.parts`: a :class:`~transformer_lib.multihead.MultiHeadAttention` or a
    later chapter's kind), by its name in ``model.named_modules()`` (chapter "What attention learns"), in the order the
    modules were registered. ``model`` itself, if it is one, is named ``""``."""
    return find_parts(model, "attention")


def _choose(model: nn.Module, layers: Iterable[str] | None) -> dict[str, nn.Module]:
    """The attention layers named in ``layers`` (all of them for None), checked to exist."""
    found = attention_layers(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no attention layer to inspect")
    if layers is None:
        return found
    if isinstance(layers, str):
        layers = [layers]
    chosen = {}
    for name in layers:
        if name not in found:
            raise ValueError(f"no attention layer named {name!r}; the model's attention layers are {list(found)}")
        chosen[name] = found[name]
    return chosen


@contextmanager
def recording_scores(layers: Mapping[str, nn.Module], callback) -> Iterator[None]:
    """Record the scores of every layer of ``layers`` (``{name: attention layer}``, as
    :func:`attention_layers` gives) during the forward passes inside the ``with`` block (chapter
    "What attention learns"): each forward pass of a layer calls ``callback(name, logits,
    weights)``, with the ``logits`` (None for a layer with no softmax) and ``weights`` of
    :meth:`~transformer_lib.multihead.RecordsScores.record_scores`, the one hook the inspection
    tools use. Every layer stops recording when the block ends, also on an error."""
    for name, layer in layers.items():
        if not callable(getattr(layer, "record_scores", None)):
            raise TypeError(
                f"the attention layer {name!r} ({type(layer).__name__}) offers no record_scores(callback), the hook "
                "through which the tools read its scores (transformer_lib.multihead.RecordsScores gives it)"
            )
    with ExitStack() as stack:
        for name, layer in layers.items():
            stack.enter_context(layer.record_scores(lambda logits, weights, name=name: callback(name, logits, weights)))
        yield


@contextmanager
def capture_attention(model: nn.Module, layers: Iterable[str] | None = None) -> Iterator[dict[str, Tensor]]:
    """Record the attention weights of the chosen layers during the forward passes inside the
    ``with`` block (chapter "What attention learns").

    Yields a dict that each forward fills with ``{layer name: weights (B, h, T_q, T_k)}``
    (detached; a layer called twice keeps its last call). ``layers``: names from
    :func:`attention_layers` (default: every attention layer). The model's outputs do not change:
    each layer records its weights through its
    :meth:`~transformer_lib.multihead.RecordsScores.record_scores` hook, computed beside its
    usual (fused) path with the hand-written attention on the same projected queries and keys.
    The weights recorded are always the attention probabilities before dropout (each row sums to
    1, or is zeros where every key is masked): in eval mode, or with no dropout, they are bitwise
    those the layer returns with ``need_weights=True``; a layer in train mode with dropout
    returns the weights after dropout (some zeroed, the rest scaled by ``1 / (1 - p)``), and the
    probabilities are recorded instead. A layer run with a ``KVCache`` raises ``ValueError``.
    The recording stops when the block ends, also on an error.

    >>> with capture_attention(model) as weights:
    ...     logits, _ = model(idx)
    """
    chosen = _choose(model, layers)
    weights: dict[str, Tensor] = {}

    def keep(name: str, _logits: Tensor | None, layer_weights: Tensor) -> None:
        weights[name] = layer_weights

    with recording_scores(chosen, keep):
        yield weights


def run_with_attention(model: nn.Module, *args, layers: Iterable[str] | None = None, **kwargs):
    """``(model(*args, **kwargs), {layer name: weights (B, h, T_q, T_k)})`` in one forward pass
    (chapter "What attention learns"): :func:`capture_attention` around one call. The output is the model's usual
    output, bitwise."""
    with capture_attention(model, layers) as weights:
        out = model(*args, **kwargs)
    return out, dict(weights)


def eval_attention(model: nn.Module, *args, **kwargs) -> dict[str, Tensor]:
    """``{layer name: weights (B, h, T_q, T_k)}`` of ``model(*args, **kwargs)`` run in eval mode (no
    dropout), the model's mode restored after (chapters "What attention learns" and "Latent, sparse and sink
    attention")."""
    was_training = model.training
    model.eval()
    try:
        return run_with_attention(model, *args, **kwargs)[1]
    finally:
        model.train(was_training)


def head_activations(model: nn.Module, *args, layers: Iterable[str] | None = None, **kwargs):
    """``(model(*args, **kwargs), {layer name: heads (B, h, T_q, d_k)})`` (chapter "What attention learns").

    ``heads[:, i]`` is head ``i``'s output before the output projection: a forward pre-hook on
    each layer's ``out_proj`` reads its input, the merged heads ``(B, T_q, h * d_k)``, whose
    columns ``i * d_k .. (i + 1) * d_k - 1`` belong to head ``i``; inside :func:`intervene_heads`
    it reads what ``out_proj`` receives, the intervention included. Detached; hooks removed after.
    """
    chosen = _choose(model, layers)
    found: dict[str, Tensor] = {}
    handles = []
    try:
        for name, module in chosen.items():

            def hook(_out_proj, inputs, name=name, h=module.n_heads):
                found[name] = split_heads(inputs[0].detach(), h)  # (B, h, T_q, d_k)

            handles.append(module.out_proj.register_forward_pre_hook(hook))
        out = model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return out, found


def _check_heads(chosen: dict[str, nn.Module], heads: Mapping) -> dict[str, list[int]]:
    """``{layer name: [head indices]}``, each index an int in ``[0, n_heads)``: an int, a list or
    tuple of ints, or a 1-d integer tensor; a float, a bool or a 0-d tensor is a ``TypeError``
    naming the layer and the value."""
    result = {}
    for name, picked in heads.items():
        label = f"heads[{name!r}]"
        if isinstance(picked, Tensor) and picked.dim() == 1 and not (picked.is_floating_point() or picked.is_complex()):
            picked = picked.tolist() if picked.dtype != torch.bool else [picked]  # a bool mask: refused below
        if is_int(picked):
            picked = [picked]
        elif isinstance(picked, (str, bytes, Tensor)) or not isinstance(picked, Iterable):
            hint = ": use int(...)" if isinstance(picked, Tensor) and picked.dim() == 0 else ""
            raise TypeError(
                f"{label} must be a head index (an int) or a list of them, got {picked!r} ({type(picked).__name__})"
                f"{hint}"
            )
        n = chosen[name].n_heads
        for i in picked:
            check_index(i, f"{label}: head", n, f"layer {name!r}, which has n_heads={n}")
        result[name] = sorted({int(i) for i in picked})
    return result


@contextmanager
def intervene_heads(
    model: nn.Module, heads: Mapping[str, int | Iterable[int]], mode: str = "zero", reference=None
) -> Iterator[None]:
    """Replace the output of chosen heads inside the ``with`` block, then undo it (chapter "What attention learns").

    ``heads``: ``{layer name: head index or indices}``. ``mode``:

    * ``"zero"``: the head's output ``(B, T_q, d_k)`` becomes zeros (zero ablation);
    * ``"mean"``: it becomes the head's mean output over the batch and positions of
      ``reference``, a vector ``(d_k,)`` (mean ablation);
    * ``"patch"``: it becomes the head's output on ``reference`` (activation patching); the
      inputs must then have the reference's batch size and length.

    ``reference`` (for ``"mean"`` and ``"patch"``): the model's input, a tensor or a tuple of
    positional arguments, run once on entry without gradients. The intervention is a forward
    pre-hook on each layer's ``out_proj``, whose input is the merged heads ``(B, T_q, h * d_k)``,
    head ``i`` being columns ``i * d_k .. (i + 1) * d_k - 1``; so zeroing every head of a layer
    leaves exactly ``out_proj.bias`` as that attention's output at every position. The hooks are
    removed when the block ends, also on an error.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not isinstance(heads, Mapping):
        raise TypeError(f"heads must be a dict {{layer name: head indices}}, got {type(heads).__name__}")
    chosen = _choose(model, list(heads))
    picked = _check_heads(chosen, heads)
    if (reference is None) != (mode == "zero"):
        need = "needs" if mode != "zero" else "takes no"
        raise ValueError(f"mode {mode!r} {need} reference input, got reference={reference!r}")
    source: dict[str, Tensor] = {}
    if mode != "zero":
        ref_args = reference if isinstance(reference, tuple) else (reference,)
        with torch.no_grad():
            _, acts = head_activations(model, *ref_args, layers=[n for n in picked if picked[n]])
        # mean: (h, d_k), as (h, 1, d_k) to broadcast over (B, h, T_q, d_k); patch: (B, h, T_q, d_k)
        source = {n: a.mean(dim=(0, 2))[:, None, :] if mode == "mean" else a for n, a in acts.items()}
    handles = []
    try:
        for name, indices in picked.items():
            if indices:
                hook = _replacer(name, chosen[name].n_heads, indices, mode, source.get(name))
                handles.append(chosen[name].out_proj.register_forward_pre_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _replacer(name: str, n_heads: int, indices: list[int], mode: str, source: Tensor | None):
    """The forward pre-hook of :func:`intervene_heads` for one layer's ``out_proj``."""

    def hook(_out_proj, inputs):
        merged = inputs[0]  # (B, T_q, h * d_k)
        if mode == "patch" and (source.shape[0], source.shape[2]) != tuple(merged.shape[:2]):
            raise ValueError(
                f"patching layer {name!r}: the reference has (B, T)={(source.shape[0], source.shape[2])}, "
                f"this input has {tuple(merged.shape[:2])}"
            )
        heads = split_heads(merged, n_heads).clone()  # (B, h, T_q, d_k)
        for i in indices:
            heads[:, i] = 0.0 if mode == "zero" else source[:, i] if mode == "patch" else source[i]
        return (heads.transpose(1, 2).reshape(merged.shape),)  # (B, T_q, h * d_k)

    return hook


def _check_pattern(pattern: Tensor, name: str) -> None:
    if not isinstance(pattern, Tensor) or pattern.dim() < 2 or pattern.shape[-1] != pattern.shape[-2]:
        raise ValueError(f"{name} expects a pattern of shape (..., T, T), got {getattr(pattern, 'shape', pattern)!r}")


def previous_token_score(pattern: Tensor) -> Tensor:
    """How much each query attends to the token just before it (chapter "What attention learns").

    ``pattern (..., T, T)`` (rows: queries, columns: keys, as returned by
    :func:`capture_attention`) with ``T >= 2``; returns ``(...)``, the mean over ``t = 1 .. T - 1``
    of ``pattern[..., t, t - 1]``. A perfect previous-token head scores 1, uniform causal
    attention about ``(1/2 + ... + 1/T) / (T - 1)``.
    """
    _check_pattern(pattern, "previous_token_score")
    if pattern.shape[-1] < 2:
        raise ValueError(f"previous_token_score needs T >= 2, got T={pattern.shape[-1]}")
    return pattern.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)  # (...)


def induction_score(pattern: Tensor, distance=None, queries: Tensor | None = None) -> Tensor:
    """The prefix-matching (induction) score of attention patterns (chapter "What attention learns").

    On a sequence in which the token at position ``t`` repeats the one at ``t - distance``, an
    induction head at query ``t`` attends to key ``t - distance + 1``, the token that followed the
    earlier occurrence. Returns ``(...)``: the mean of ``pattern[..., t, t - distance + 1]`` over
    the query positions ``t`` that ``queries`` marks.

    Args:
        pattern: ``(..., T, T)`` attention weights, rows queries, columns keys.
        distance: an int ``>= 1`` or an integer tensor broadcastable to ``pattern.shape[:-2]``
            (one distance per sequence: for ``(B, h, T, T)`` pass ``(B, 1)``). Default ``T // 2``
            for even ``T``: the second half repeats the first.
        queries: boolean, broadcastable to ``pattern.shape[:-1]``, the positions that count
            (each needs ``t >= distance``). Default: every ``t >= distance``.
    """
    _check_pattern(pattern, "induction_score")
    T = pattern.shape[-1]
    if distance is None:
        if T % 2:
            raise ValueError(f"induction_score: give distance= for an odd length T={T} (default: T // 2, for even T)")
        distance = T // 2
    d = torch.as_tensor(distance, device=pattern.device)
    if d.dtype.is_floating_point or d.dtype == torch.bool or (d < 1).any():
        raise ValueError(f"induction_score: distance must be integers >= 1, got {distance!r}")
    try:
        d = torch.broadcast_to(d, pattern.shape[:-2])[..., None]  # (..., 1)
    except RuntimeError:
        shape = tuple(pattern.shape[:-2])
        raise ValueError(f"distance of shape {tuple(d.shape)} does not broadcast to {shape}") from None
    t = torch.arange(T, device=pattern.device)
    valid = t >= d  # (..., T): an earlier occurrence exists
    if queries is None:
        queries = valid
    else:
        given = torch.as_tensor(queries, device=pattern.device)
        if given.dtype != torch.bool:
            raise TypeError(f"induction_score: queries must be boolean (True: the query counts), got {given.dtype}")
        try:
            queries = torch.broadcast_to(given, valid.shape)
        except RuntimeError:
            raise ValueError(
                f"induction_score: queries of shape {tuple(given.shape)} does not broadcast to the pattern's queries "
                f"{tuple(valid.shape)} (its last axis must have T={T} entries, one per query)"
            ) from None
        if (queries & ~valid).any():
            raise ValueError("induction_score: queries marks a position t < distance, which has no earlier occurrence")
    keys = (t - d + 1).clamp(0, T - 1)  # (..., T)
    picked = pattern.gather(-1, keys.expand(pattern.shape[:-1]).unsqueeze(-1)).squeeze(-1)  # (..., T)
    picked = torch.where(queries, picked, torch.zeros((), dtype=pattern.dtype, device=pattern.device))
    return picked.sum(-1) / queries.sum(-1)  # (...); NaN where no query counts


def copying_score(ov: Tensor) -> Tensor:
    """How much a head raises the logit of the token it attends to (chapter "What attention learns").

    ``ov (..., V, V)`` is a head's OV circuit read from tokens to logits, ``ov[..., a, b]`` the
    change of the logit of token ``a`` when the head attends fully to a position holding token
    ``b`` (see :func:`~transformer_lib.induction.ov_circuit`). Returns ``(...)``: the mean over
    source tokens ``b`` of ``ov[..., b, b] - mean_a ov[..., a, b]``, how far the attended token's
    own logit rises above the average token's. Positive: the head copies; negative: it
    suppresses what it reads; in the units of logits (it grows with the weights' scale).
    """
    if not isinstance(ov, Tensor) or ov.dim() < 2 or ov.shape[-1] != ov.shape[-2]:
        raise ValueError(f"copying_score expects an OV circuit of shape (..., V, V), got {getattr(ov, 'shape', ov)!r}")
    return (ov.diagonal(dim1=-2, dim2=-1) - ov.mean(-2)).mean(-1)  # (...)
