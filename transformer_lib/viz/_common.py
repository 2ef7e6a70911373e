"""The two helpers every figure module of :mod:`transformer_lib.viz` uses."""

from __future__ import annotations

import numpy as np
from torch import Tensor


def pyplot():
    """matplotlib's pyplot, imported at the first figure: ``import transformer_lib`` needs no matplotlib."""
    import matplotlib.pyplot

    return matplotlib.pyplot


def to_numpy(x, *, floats: bool = True) -> np.ndarray:
    """A tensor (detached, moved to the CPU) or an array-like as a NumPy array: float64 values
    when ``floats`` (exact for a float64, float32, float16 or bfloat16 tensor), else its own dtype."""
    if isinstance(x, Tensor):
        x = x.detach().cpu()
        return (x.double() if floats else x).numpy()
    return np.asarray(x, dtype=float) if floats else np.asarray(x)
