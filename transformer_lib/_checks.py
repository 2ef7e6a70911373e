"""Argument guards the concept modules share: each raises ``TypeError`` for a value of the wrong
type and ``ValueError`` for one out of range, and names the argument and the value.

Only Python values and tensor attributes (type, dtype, shape) are read, never a tensor's data,
so a guard costs nothing on the hot path and never waits for a GPU.

A setting is checked once, where it enters: a config's ``__post_init__`` or the public call a
reader makes. A layer built by another layer or by a model from values already checked is passed
the private keyword ``_checked=True`` and does not check ``window`` or ``n_kv_heads`` again.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor


def is_int(value) -> bool:
    """Is ``value`` a whole number of Python's or NumPy's, not a bool (True and False are ints to
    Python, never a size here)? The one test of the library's checks and the exercise checks."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
    """Is ``value`` a real number (an int, a float, NumPy's), not a bool?"""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def plain_number(value):
    """``value`` as Python's own ``int`` or ``float`` when it is a NumPy number (``np.int64(2)``,
    ``np.float32(0.1)``), else unchanged (a bool, a string, None: left for a check to refuse).

    A setting that a checkpoint or a JSON file stores must hold Python's numbers: PyTorch's
    ``weights_only`` loading and ``json.dumps`` refuse NumPy's."""
    if is_int(value) and type(value) is not int:
        return int(value)
    if is_real(value) and type(value) is not float and not is_int(value):
        return float(value)
    return value


def check_int(value, name: str, minimum: int = 1) -> None:
    """``value`` must be an int (not a bool) and at least ``minimum``."""
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        rule = "must be positive (an int >= 1)" if minimum == 1 else f"must be an int >= {minimum}"
        raise ValueError(f"{name} {rule}, got {value}")


def check_index(value, name: str, size: int, of: str) -> None:
    """``value`` must be an int (not a bool, a float or a tensor) in ``[0, size)``; ``of`` says
    what it indexes, for the message ("layer 'layers.0', which has n_heads=4")."""
    if not is_int(value):
        hint = ": use int(...)" if isinstance(value, Tensor) and value.dim() == 0 else ""
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__}){hint}")
    if not 0 <= value < size:
        raise ValueError(f"{name} {value} is out of range for {of} (valid: 0 .. {size - 1})")


def check_window(window) -> None:
    """``window`` (sliding-window attention, chapter "Long context and precision") must be None or a positive int."""
    if window is not None:
        check_int(window, "window")


def check_kv_heads(n_kv_heads, n_heads) -> None:
    """``n_kv_heads`` (grouped-query attention, chapter "Generation") must be None or a positive int
    dividing ``n_heads``, itself already checked."""
    if n_kv_heads is not None:
        check_int(n_kv_heads, "n_kv_heads")
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads ({n_kv_heads}) must divide n_heads ({n_heads})")


def check_bool(value, name: str) -> None:
    """``value`` must be ``True`` or ``False`` (a string such as ``"False"`` is truthy)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")


def _check_real(value, name: str) -> float:
    if not is_real(value):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    return float(value)


def check_probability(value, name: str) -> None:
    """``value`` must be a number in ``[0, 1)`` (a dropout probability)."""
    p = _check_real(value, name)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1), got {value!r}")


def check_temperature(value, name: str = "temperature") -> None:
    """``value`` must be a finite number > 0."""
    t = _check_real(value, name)
    if not (t > 0.0 and math.isfinite(t)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def check_float_tensors(named: dict[str, object], layer_dtype=None) -> None:
    """Every value must be a floating-point tensor, all of one dtype (as ``q``, ``k``, ``v``), and
    that of a layer's weights when ``layer_dtype`` is given (outside autocast, which casts)."""
    for name, t in named.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}; convert with .float()")
    dtypes = {t.dtype for t in named.values()}
    if len(dtypes) > 1:
        got = ", ".join(f"{name} {t.dtype}" for name, t in named.items())
        raise TypeError(f"{', '.join(named)} must share one dtype, got {got}")
    if layer_dtype is not None:
        name, first = next(iter(named.items()))
        _check_layer_dtype(first, layer_dtype, name)


def check_float_tensor(t, name: str) -> None:
    """``t`` must be a floating-point tensor (scores, logits, vectors to rotate or to encode): an
    integer tensor would fail deep inside a kernel or be silently truncated."""
    check_float_tensors({name: t})


def check_layer_dtype(x: Tensor, layer, name: str) -> None:
    """``x`` must be a floating-point tensor of the dtype of ``layer``'s weights (a float64 input to
    a float32 layer fails inside the matrix product with a message that names neither)."""
    check_float_tensor(x, name)
    weight = next(layer.parameters(), None)
    if weight is not None:
        _check_layer_dtype(x, weight.dtype, name)


def _check_layer_dtype(x: Tensor, layer_dtype, name: str) -> None:
    """Raise unless ``x`` has the layer's dtype or autocast (which casts per operation) is on."""
    if x.dtype != layer_dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(
            f"{name} is {x.dtype} but the layer's weights are {layer_dtype}: convert one to the other "
            f"(x.to({layer_dtype}) or layer.to({x.dtype}))"
        )


def check_base(base, name: str = "base") -> None:
    """A positional encoding's ``base`` must be a finite number > 0 (0 or a negative base gives
    NaN frequencies)."""
    value = _check_real(base, name)
    if not (value > 0.0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {base!r}")


def check_divisible(d_model, n_heads) -> None:
    """``d_model`` and ``n_heads`` positive ints, ``d_model`` divisible by ``n_heads``."""
    check_int(d_model, "d_model")
    check_int(n_heads, "n_heads")
    if d_model % n_heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
