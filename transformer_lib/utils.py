"""Small helpers every chapter uses: seeding and device choice."""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["pick_device", "set_seed"]


def set_seed(seed: int = 0) -> None:
    """Seed Python's, NumPy's and PyTorch's random generators (CPU and every GPU)."""
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 (seeds the legacy global generator that user code may use)
    torch.manual_seed(seed)


def pick_device(device: str | None = None) -> torch.device:
    """``device`` if given, else CUDA if available, then Apple's MPS, then the CPU."""
    if device not in (None, "auto"):
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")
