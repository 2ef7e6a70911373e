"""Tables of per-head statistics, each compared with what uniform attention would score (chapter "Encoder-decoder and
cross-attention"). Reached as ``tl.viz.plot_against_uniform``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

from ._common import pyplot as _pyplot
from ._common import to_numpy

if TYPE_CHECKING:
    import matplotlib.pyplot as plt

__all__ = ["plot_against_uniform"]

# the colours saturate at 4 times the reference and at a quarter of it
_OCTAVES = 2.0


def plot_against_uniform(
    scores: Tensor | np.ndarray,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    uniform: float | Sequence[float] | Tensor | np.ndarray,
    ax: plt.Axes | None = None,
    title: str | None = None,
    colorbar: bool = True,
) -> plt.Axes:
    """Per-head statistics as a table of numbered cells, each coloured by how it compares with
    uniform attention (chapter "Encoder-decoder and cross-attention": how much weight each head puts on the date field
    it writes).

    ``scores`` is ``(rows, cols)``: one statistic per row (the share of weight on the year, say)
    and per column (a head). ``uniform`` is what attention spread evenly would score: one number
    for the whole table, or one per row; each row's label shows its reference in brackets. A cell is
    coloured by ``log2(score / uniform)``: white where it equals the reference, blue above it, red
    below it, saturating at four times and a quarter of it. Cells below their row's reference are
    also framed in black, so that a head that reads a place *less* than uniform attention would
    cannot be missed.
    """
    plt = _pyplot()
    s = to_numpy(scores)
    if s.ndim != 2:
        raise ValueError(f"scores must be a (rows, cols) table, got shape {s.shape}")
    rows, cols = s.shape
    ref = to_numpy(uniform).reshape(-1)
    if ref.size not in (1, rows):
        raise ValueError(f"uniform must be one number or one per row ({rows}), got {ref.size}")
    ref = np.broadcast_to(ref, (rows,))
    if len(row_labels) != rows or len(col_labels) != cols:
        raise ValueError(
            f"scores is {rows} x {cols}, but there are {len(row_labels)} row labels and {len(col_labels)} column labels"
        )
    if not (ref > 0).all() or not (s >= 0).all():
        raise ValueError("scores must be >= 0 and the uniform reference > 0")
    ratio = np.log2(np.maximum(s, 1e-12) / ref[:, None])
    if ax is None:
        _, ax = plt.subplots(figsize=(0.8 * cols + 2.6, 0.45 * rows + 1.0))
    image = ax.imshow(ratio, cmap="RdBu", vmin=-_OCTAVES, vmax=_OCTAVES, aspect="auto")
    for i in range(rows):
        for j in range(cols):
            dark = abs(ratio[i, j]) > 0.65 * _OCTAVES
            ax.text(j, i, f"{s[i, j]:.2f}", ha="center", va="center", fontsize=8, color="white" if dark else "black")
            if s[i, j] < ref[i]:  # below uniform attention: framed
                ax.add_patch(plt.Rectangle((j - 0.45, i - 0.45), 0.9, 0.9, fill=False, edgecolor="black", lw=2))
    ax.set_xticks(range(cols), labels=list(col_labels))
    ax.set_yticks(range(rows), labels=[f"{label} ({r:.2f})" for label, r in zip(row_labels, ref, strict=True)])
    ax.tick_params(length=0)
    if title:
        ax.set_title(title)
    if colorbar:
        ticks = np.arange(-_OCTAVES, _OCTAVES + 1)
        bar = ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.03, ticks=ticks)
        bar.ax.set_yticklabels([f"{2.0**t:g}×" if t >= 0 else f"1/{2.0**-t:g}×" for t in ticks])
        bar.set_label("score / uniform", fontsize=8)
    return ax
