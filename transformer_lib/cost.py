"""What a model costs, every formula in one place: receptive fields of convolution stacks
(chapter "Why attention?"), the parameters and FLOPs of multi-head attention (chapter "Multi-head attention"), training
FLOPs and the model-FLOPs utilisation against a GPU's peak (chapter "A GPT from scratch"), a peak-memory probe (chapter
"A GPT from scratch"), and the key-value cache's bytes (chapter "Generation") and the peak memory of three ways to
compute attention (chapter "Long context and precision").

This is a tool module, not a concept module: it reads the concepts and no concept module reads it.
Models are passed in (only their ``config`` and :meth:`num_params` are read); the attention
functions whose memory :func:`attention_peak_memory` compares are its only concept imports. The
CPU memory probe reads the profiler's allocation records, which PyTorch does not document
(``prof.profiler.kineto_results``); where they are missing it falls back to the public
per-operator totals.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_divisible, check_int
from .attention import scaled_dot_product_attention
from .long_context import tiled_attention
from .masks import causal_mask

__all__ = [
    "PEAK_FLOPS",
    "attention_peak_memory",
    "estimate_mfu",
    "flops_per_token",
    "gpu_peak_flops",
    "kv_cache_bytes",
    "layers_to_connect",
    "multihead_cost",
    "peak_memory_bytes",
    "receptive_field",
]


def receptive_field(layers: int, k: int, dilated: bool = False) -> int:
    """How many input positions one output sees after ``layers`` causal convolutions (chapter "Why attention?").

    Contiguous kernels of width ``k`` add ``k - 1`` positions per layer: ``1 + layers * (k - 1)``.
    Dilated kernels with dilation ``k**l`` at layer ``l = 0, 1, ...`` multiply the field by ``k``
    per layer: ``k**layers``. Integers in, an integer out (no tensors).
    """
    if layers < 0:
        raise ValueError(f"layers must be >= 0, got {layers}")
    if k < 1:
        raise ValueError(f"kernel width k must be >= 1, got {k}")
    return k**layers if dilated else 1 + layers * (k - 1)


def layers_to_connect(n: int, k: int, dilated: bool = False) -> int:
    """Fewest causal convolution layers (width ``k``) after which position ``n - 1`` sees position 0 (chapter "Why
    attention?").

    Contiguous kernels need ``ceil((n - 1) / (k - 1))`` layers, linear in ``n``; dilated kernels
    (dilation ``k**l`` at layer ``l``) need ``ceil(log_k n)``, computed here with integers only.
    ``n = 1`` needs 0 layers. Requires ``n >= 1`` and ``k >= 2``. Integers in, an integer out.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if k < 2:
        raise ValueError(f"kernel width k must be >= 2 to ever connect two positions, got {k}")
    if not dilated:
        return -(-(n - 1) // (k - 1))  # ceil((n - 1) / (k - 1)) in integers
    layers, field = 0, 1
    while field < n:  # the dilated field is k**layers
        layers, field = layers + 1, field * k
    return layers


def multihead_cost(
    d_model: int, n_heads: int, T_q: int, T_k: int | None = None, batch: int = 1, bias: bool = True
) -> dict[str, int]:
    """Parameters and forward FLOPs of one :class:`~transformer_lib.multihead.MultiHeadAttention` call (chapter
    "Multi-head attention").

    FLOPs count the matrix products only, two per multiply-add (the convention of
    :class:`torch.utils.flop_counter.FlopCounterMode`); bias additions and the softmax are left
    out. Returns a dict with ``params``; ``projection_flops`` (Q, K, V and output projections);
    ``attention_flops`` (the scores ``Q K^T`` and the weighted sum of values, over all heads);
    ``total_flops``; and ``score_entries``, the number of attention weights, ``B * h * T_q * T_k``,
    the only term that grows with ``h``. ``T_k`` defaults to ``T_q`` (self-attention).
    """
    check_divisible(d_model, n_heads)
    T_k = T_q if T_k is None else T_k
    for name, n in (("T_q", T_q), ("T_k", T_k), ("batch", batch)):
        check_int(n, name, minimum=0)
    params = 4 * d_model * d_model + (4 * d_model if bias else 0)
    projection = 2 * batch * d_model * d_model * (2 * T_q + 2 * T_k)  # Q and output on T_q rows, K and V on T_k
    d_k = d_model // n_heads
    attention = 2 * (2 * batch * n_heads * T_q * T_k * d_k)  # Q K^T, then weights @ V
    return {
        "params": params,
        "projection_flops": projection,
        "attention_flops": attention,
        "total_flops": projection + attention,
        "score_entries": batch * n_heads * T_q * T_k,
    }


# Dense (no sparsity) 16-bit tensor-core peaks, FLOP/s; bfloat16 where the GPU has it. The first
# name contained in torch.cuda.get_device_name() wins, so the more specific names come first.
PEAK_FLOPS: dict[str, float] = {
    "H100 PCIe": 756e12,
    "H100": 989.4e12,
    "H200": 989.4e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10": 125e12,
    "V100": 125e12,  # float16
    "T4": 65e12,  # float16
}


def gpu_peak_flops(name: str | None = None) -> float | None:
    """The dense 16-bit peak FLOP/s of the GPU called ``name`` (default: the current one), or
    None if unknown (chapter "A GPT from scratch")."""
    if name is None:
        if not torch.cuda.is_available():
            return None
        name = torch.cuda.get_device_name()
    return next((flops for key, flops in PEAK_FLOPS.items() if key in name), None)


def flops_per_token(model: nn.Module, context_len: int) -> float:
    """Training FLOPs per token of a GPT with context ``context_len``: ``6 N + 12 L h d_k T`` (chapter "A GPT from
    scratch").

    ``6 N`` counts the forward (2) and backward (4) multiply-adds of the ``N`` parameters (without
    the position embeddings, :meth:`GPT.num_params`); ``12 L h d_k T`` those of the attention
    scores and weighted sums, which have no parameters. ``model`` is a
    :class:`~transformer_lib.models.GPT` (its ``config`` gives ``L`` and ``h d_k = d_model``).
    """
    c = model.config
    return 6 * model.num_params() + 12 * c.n_layers * c.d_model * context_len  # h * d_k = d_model


def estimate_mfu(model: nn.Module, tokens_per_second: float, context_len: int, peak_flops: float) -> float:
    """Model FLOPs utilisation (chapter "A GPT from scratch"): the FLOP/s training achieves over the hardware's peak."""
    return flops_per_token(model, context_len) * tokens_per_second / peak_flops


def peak_memory_bytes(call: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """Peak bytes allocated during ``call()`` above what was allocated before it (chapter "A GPT from scratch").

    On a GPU: ``torch.cuda.max_memory_allocated``. On the CPU: ``torch.profiler`` with
    ``profile_memory=True`` records every allocation and free of the CPU allocator with its time;
    their running sum in time order is the memory in use, operators' own temporaries included.
    (Should those records be unavailable, the per-operator totals are summed instead, in the
    operators' start order, a lower bound that misses temporaries freed inside an operator.)
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        call()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    records = _memory_records(prof)
    if records is None:  # per operator: allocations minus frees inside it
        records = [(e.time_range.start, e.self_cpu_memory_usage) for e in prof.events()]
    in_use = peak = 0
    for _, nbytes in sorted(records, key=lambda r: r[0]):
        in_use += nbytes  # > 0: allocated, < 0: freed
        peak = max(peak, in_use)
    return peak


def _memory_records(prof) -> list[tuple[int, int]] | None:
    """``(time, bytes)`` of each allocation (> 0) and free (< 0) the profiler saw, or None."""
    try:
        events = prof.profiler.kineto_results.events()
        return [(e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"]
    except AttributeError:
        return None


def kv_cache_bytes(
    n_layers: int, n_kv_heads: int, d_k: int, T: int, *, batch: int = 1, dtype: torch.dtype = torch.float32
) -> int:
    """Bytes of the key-value cache of ``n_layers`` attention layers holding ``T`` positions (chapter "Generation").

    ``2 (K and V) * n_layers * batch * n_kv_heads * T * d_k * bytes per element``: linear in the
    context and in the number of K/V heads, which grouped-query attention divides by
    ``n_heads / n_kv_heads``. Compare with ``sum(c.nbytes() ...)`` of a filled cache.
    """
    for name, n in (("n_layers", n_layers), ("T", T), ("batch", batch)):
        check_int(n, name, minimum=0)
    check_int(n_kv_heads, "n_kv_heads")
    check_int(d_k, "d_k")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
    return 2 * n_layers * batch * n_kv_heads * T * d_k * torch.empty((), dtype=dtype).element_size()


_ATTENTION_METHODS = ("naive", "fused", "tiled")


def attention_peak_memory(
    T: int,
    *,
    method: str = "tiled",
    d: int = 64,
    n_heads: int = 1,
    batch: int = 1,
    is_causal: bool = False,
    backward: bool = False,
    block_size: int = 64,
    dtype: torch.dtype = torch.float32,
) -> int:
    """Peak extra bytes on the CPU of one attention call over ``T`` positions (chapter "Long context and precision").

    ``q``, ``k``, ``v`` of shape ``(batch, n_heads, T, d)`` (random, in ``dtype``) are made
    first and do not count; the probe (:func:`peak_memory_bytes`) then measures what one call
    allocates: the output and every temporary. ``method`` is ``"naive"`` (the library's
    :func:`~transformer_lib.attention.scaled_dot_product_attention`, which builds the
    ``(T, T)`` scores and weights; causal through a boolean ``(T, T)`` mask), ``"fused"``
    (``torch.nn.functional.scaled_dot_product_attention``, PyTorch's own kernel) or
    ``"tiled"`` (:func:`~transformer_lib.long_context.tiled_attention` with ``block_size``).
    With ``backward=True`` the call also runs the backward pass for a given output gradient,
    so the gradients of ``q``, ``k``, ``v`` count too. Returns an int (bytes).
    """
    if method not in _ATTENTION_METHODS:
        raise ValueError(f"method must be one of {_ATTENTION_METHODS}, got {method!r}")
    for name, value in (("T", T), ("d", d), ("n_heads", n_heads), ("batch", batch), ("block_size", block_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, n_heads, T, d, generator=gen).to(dtype).requires_grad_(backward) for _ in range(3))
    grad = torch.randn(batch, n_heads, T, d, generator=gen).to(dtype)  # (B, h, T, d)

    def attend() -> torch.Tensor:
        if method == "naive":
            mask = causal_mask(T) if is_causal else None  # (T, T)
            return scaled_dot_product_attention(q, k, v, mask)[0]
        if method == "fused":
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        return tiled_attention(q, k, v, is_causal=is_causal, block_size=block_size)

    def call() -> None:
        out = attend()  # (B, h, T, d)
        if backward:
            out.backward(grad)

    return peak_memory_bytes(call, "cpu")
