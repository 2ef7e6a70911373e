"""Figures the chapters share: attention heatmaps and interactive figures.

(The softmax's entropy, Jacobian and temperature are chapter 3's math and live in
:mod:`transformer_lib.attention`.)
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence

import matplotlib.pyplot as plt
import numpy as np
from torch import Tensor

__all__ = [
    "live_figure",
    "plot_attention",
    "plot_attention_grid",
]


def _to_numpy(w: Tensor | np.ndarray) -> np.ndarray:
    if isinstance(w, Tensor):
        return w.detach().float().cpu().numpy()
    return np.asarray(w, dtype=float)


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
    """Heatmap of one ``(T_q, T_k)`` weight matrix: rows are queries, columns are keys (chapter 2).

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
    ax.set_xticks(
        range(T_k),
        labels=list(x_labels) if x_labels is not None else range(T_k),
        rotation=90 if x_labels is not None else 0,
    )
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
                ax.text(
                    j,
                    i,
                    f"{w[i, j]:.2f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if w[i, j] < 0.6 * w.max() else "black",
                )
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
    """A grid of heatmaps from weights of shape ``(rows, cols, T_q, T_k)`` (for example layers x heads; chapter 5)."""
    w = _to_numpy(weights)
    if w.ndim == 3:
        w = w[None]
    if w.ndim != 4:
        raise ValueError(f"plot_attention_grid expects (rows, cols, T_q, T_k), got shape {w.shape}")
    rows, cols = w.shape[:2]
    fig, axes = plt.subplots(rows, cols, figsize=(size * cols, size * rows), squeeze=False)
    for r in range(rows):
        for c in range(cols):
            plot_attention(
                w[r, c],
                x_labels,
                y_labels,
                ax=axes[r, c],
                annotate=False,
                colorbar=False,
                title=f"{row_title} {r}, {col_title} {c}",
            )
            if c:
                axes[r, c].set_ylabel("")
                axes[r, c].set_yticklabels([])
            if r < rows - 1:
                axes[r, c].set_xlabel("")
    fig.tight_layout()
    return fig


def live_figure(draw: Callable, dpi: int = 80, **controls):
    """Widgets above a figure that ``draw`` redraws whenever one of them changes (chapter 3).

    ``draw(**values)`` receives each control's current value under the control's keyword name and
    returns a matplotlib figure, or ``(figure, caption)``. The figure is rendered to PNG bytes
    inside an ``ipywidgets.Image`` and closed, so a notebook cell that displays the returned box has
    one output, the widget, identical on every run (which nbval needs), while the picture itself is
    kept in the widget state that the static book shows.

    Returns an ``ipywidgets.VBox`` (controls, image, caption); show it with
    ``IPython.display.display``. Example: ``display(live_figure(draw, d_k=IntSlider(64, 1, 1024)))``.
    """
    import ipywidgets as widgets  # only the notebooks need ipywidgets, so import it here

    if not callable(draw):
        raise TypeError(f"draw must be a function returning a figure, got {type(draw).__name__}")
    if not controls:
        raise ValueError("live_figure needs at least one control, for example d_k=ipywidgets.IntSlider(...)")
    for name, control in controls.items():
        if not isinstance(control, widgets.ValueWidget):
            raise TypeError(
                f"control {name!r} must be an ipywidgets widget with a value (a slider, checkbox, ...), "
                f"got {type(control).__name__}"
            )
    image, caption = widgets.Image(format="png"), widgets.Label()

    def update(_change=None) -> None:
        result = draw(**{name: control.value for name, control in controls.items()})
        fig, text = result if isinstance(result, tuple) else (result, "")
        if not isinstance(fig, plt.Figure):
            raise TypeError(f"draw must return a matplotlib Figure or (Figure, caption), got {type(fig).__name__}")
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
        plt.close(fig)
        image.value, caption.value = buffer.getvalue(), str(text)

    for control in controls.values():
        control.observe(update, names="value")
    update()
    return widgets.VBox([widgets.HBox(list(controls.values())), image, caption])
