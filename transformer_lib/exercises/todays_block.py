"""Checks for chapter "Today's block": RMSNorm and the gated (SwiGLU) feed-forward network.

Each check prints one verdict line and returns a :class:`~transformer_lib.exercises.CheckResult`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ._core import ExerciseFailure, call_student, check, close, fmt, require_tensor

__all__ = ["check_rms_norm", "check_swiglu"]


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _first_mistake(wrong: dict[str, Tensor], actual: Tensor, right: Tensor) -> str | None:
    found = [m for m, w in wrong.items() if close(actual, w, atol=1e-6) and not close(w, right, atol=1e-6)]
    return found[0] if found else None


@check("check_rms_norm")
def check_rms_norm(fn: Callable) -> None:
    """Chapter "Today's block", exercise 1: check ``fn(x (..., d), weight (d,), eps) -> (..., d)``, RMSNorm.

    ``fn`` is given ``x``, the gain ``weight`` and ``eps``, and returns the normalised ``x``.
    Compared with ``torch.nn.functional.rms_norm`` on inputs with a large mean (where RMSNorm and
    LayerNorm differ), small values (where ``eps`` matters), a batch of sequences and float64.
    """
    g = torch.Generator().manual_seed(14)
    cases = [
        ("x of shape (2, 6) with mean 3 along the last axis", torch.randn(2, 6, generator=g) + 3, 1e-5),
        ("x of shape (3, 4) with tiny values (1e-3), eps = 1e-2", torch.randn(3, 4, generator=g) * 1e-3, 1e-2),
        ("x of shape (B, T, d) = (2, 5, 8)", torch.randn(2, 5, 8, generator=g), 1e-6),
        ("float64 x of shape (4, 7)", torch.randn(4, 7, generator=g, dtype=torch.float64) * 2 + 1, 1e-5),
    ]
    for desc, x, eps in cases:
        weight = torch.rand(x.shape[-1], generator=g, dtype=x.dtype) + 0.5
        where = f"for {desc}"
        out = call_student(fn, (x, weight, eps), where, inputs="x or weight", crash_hint=None)
        expected = F.rms_norm(x, (x.shape[-1],), weight, eps)
        require_tensor(out, where, tuple(x.shape), what="the result", layout="(..., d), the shape of x")
        if out.dtype != x.dtype:
            raise ExerciseFailure(f"{where}, the result has dtype {out.dtype}; keep x's dtype {x.dtype}.")
        if not close(out, expected, atol=1e-6, rtol=1e-5):
            ms = x.pow(2).mean(-1, keepdim=True)
            wrong = {
                "you subtracted the mean, which is LayerNorm; RMSNorm divides by the root mean square of x "
                "itself": F.layer_norm(x, (x.shape[-1],), weight, None, eps),
                "you left out the square root: divide by sqrt(mean(x^2) + eps)": x / (ms + eps) * weight,
                "you added eps after the square root; it goes inside, sqrt(mean(x^2) + eps)": x
                / (ms.sqrt() + eps)
                * weight,
                "you forgot the weight (the learned gain)": _rms(x, torch.ones_like(weight), eps),
                "you took the mean over the first axis; normalise each vector over its last axis, d": x
                / torch.sqrt(x.pow(2).mean(0, keepdim=True) + eps)
                * weight,
                "you divided by the standard deviation (x.std), which subtracts the mean: use the root of mean(x^2)": x
                / torch.sqrt(x.std(-1, keepdim=True) ** 2 + eps)
                * weight,
            }
            mistake = _first_mistake(wrong, out, expected)
            detail = f"expected {fmt(expected)}, got {fmt(out)}"
            raise ExerciseFailure(f"{where}, {mistake}; {detail}." if mistake else f"{where}, {detail}.")


@check("check_swiglu")
def check_swiglu(fn: Callable) -> None:
    """Chapter "Today's block", exercise 2: check ``fn(x, w_gate, w_up, w_down)``, the SwiGLU network.

    ``x (..., d_model)``, ``w_gate`` and ``w_up (d_ff, d_model)``, ``w_down (d_model, d_ff)`` (the
    layout of ``torch.nn.Linear``'s weights); returns ``(..., d_model)``, compared with
    :class:`transformer_lib.SwiGLU` given the same weights.
    """
    g = torch.Generator().manual_seed(41)
    for shape, d_ff, dtype in [((3, 4), 6, torch.float32), ((2, 5, 8), 16, torch.float32), ((4, 6), 8, torch.float64)]:
        d = shape[-1]
        x = torch.randn(*shape, generator=g, dtype=dtype)
        w_gate, w_up = (torch.randn(d_ff, d, generator=g, dtype=dtype) for _ in range(2))
        w_down = torch.randn(d, d_ff, generator=g, dtype=dtype)
        where = f"for x of shape {shape} and d_ff = {d_ff}" + (" in float64" if dtype == torch.float64 else "")
        out = call_student(fn, (x, w_gate, w_up, w_down), where, inputs="x or a weight", crash_hint=None)
        gate, up = x @ w_gate.T, x @ w_up.T
        expected = (F.silu(gate) * up) @ w_down.T
        require_tensor(out, where, tuple(x.shape), what="the result", layout="(..., d_model), the shape of x")
        if not close(out, expected, atol=1e-5, rtol=1e-4):
            wrong = {
                "you put the SiLU on the up projection; it goes on the gate, silu(x W_gate^T) * (x W_up^T)": (
                    gate * F.silu(up)
                )
                @ w_down.T,
                "you used the sigmoid; SwiGLU's gate is the SiLU, z * sigmoid(z)": (torch.sigmoid(gate) * up)
                @ w_down.T,
                "you left out the up projection: the gate multiplies x W_up^T": F.silu(gate) @ w_down.T,
                "you used ReLU; SwiGLU's gate is the SiLU, z * sigmoid(z)": (torch.relu(gate) * up) @ w_down.T,
                "you added the two branches; the gate multiplies the values": (F.silu(gate) + up) @ w_down.T,
            }
            mistake = _first_mistake(wrong, out, expected)
            detail = f"expected {fmt(expected)}, got {fmt(out)}"
            raise ExerciseFailure(f"{where}, {mistake}; {detail}." if mistake else f"{where}, {detail}.")
