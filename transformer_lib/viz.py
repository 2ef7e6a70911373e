"""Figures and small measurements the chapters share: attention heatmaps and softmax entropy."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import Tensor

__all__ = ["plot_attention", "plot_attention_grid", "softmax_entropy"]


def _to_numpy(w: Tensor | np.ndarray) -> np.ndarray:
    if isinstance(w, Tensor):
        return w.detach().float().cpu().numpy()
    return np.asarray(w, dtype=float)


def softmax_entropy(weights: Tensor, dim: int = -1) -> Tensor:
    """Entropy (in nats) of each row of attention weights; 0 for one-hot, log(T_k) for uniform.

    Zero weights contribute 0 (the limit of p log p), so masked keys are handled.
    """
    p = weights.clamp_min(0)
    return -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(dim)


def plot_attention(
    weights: Tensor | np.ndarray,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    ax: plt.Axes | None = None,
    title: str | None = None,
    annotate: bool | None = None,
    cmap: str = "viridis",
    colorbar: bool = True,
) -> plt.Axes:
    """Heatmap of one ``(T_q, T_k)`` weight matrix: rows are queries, columns are keys.

    ``annotate`` writes each weight in its cell (default: when the matrix is at most 12 x 12).
    """
    w = _to_numpy(weights)
    if w.ndim != 2:
        raise ValueError(f"plot_attention expects a 2-D (T_q, T_k) matrix, got shape {w.shape}")
    T_q, T_k = w.shape
    for name, labels, n in (("x_labels", x_labels, T_k), ("y_labels", y_labels, T_q)):
        if labels is not None and len(labels) != n:
            raise ValueError(f"{name} has {len(labels)} entries but the matrix has {n} along that axis")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.45 * T_k + 2, 0.45 * T_q + 1.2))
    im = ax.imshow(w, cmap=cmap, vmin=0.0, vmax=max(1e-9, float(w.max())), aspect="auto")
    ax.set_xticks(range(T_k), labels=list(x_labels) if x_labels is not None else range(T_k),
                  rotation=90 if x_labels is not None else 0)
    ax.set_yticks(range(T_q), labels=list(y_labels) if y_labels is not None else range(T_q))
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    if annotate is None:
        annotate = T_q <= 12 and T_k <= 12
    if annotate:
        for i in range(T_q):
            for j in range(T_k):
                ax.text(j, i, f"{w[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if w[i, j] < 0.6 * w.max() else "black")
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return ax


def plot_attention_grid(
    weights: Tensor | np.ndarray,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    row_title: str = "layer",
    col_title: str = "head",
    size: float = 2.6,
) -> plt.Figure:
    """A grid of heatmaps from weights of shape ``(rows, cols, T_q, T_k)`` (for example layers x heads)."""
    w = _to_numpy(weights)
    if w.ndim == 3:
        w = w[None]
    if w.ndim != 4:
        raise ValueError(f"plot_attention_grid expects (rows, cols, T_q, T_k), got shape {w.shape}")
    rows, cols = w.shape[:2]
    fig, axes = plt.subplots(rows, cols, figsize=(size * cols, size * rows), squeeze=False)
    for r in range(rows):
        for c in range(cols):
            plot_attention(w[r, c], x_labels, y_labels, ax=axes[r, c], annotate=False, colorbar=False,
                           title=f"{row_title} {r}, {col_title} {c}")
            if c:
                axes[r, c].set_ylabel("")
                axes[r, c].set_yticklabels([])
            if r < rows - 1:
                axes[r, c].set_xlabel("")
    fig.tight_layout()
    return fig
