"""Diagrams drawn with matplotlib alone, so they work offline and in the PDF: heads split and merged
(chapter "Multi-head attention") and whole models (chapters "The transformer block", "Encoder-decoder and
cross-attention" and "A GPT from scratch"). Reached as ``tl.viz.plot_head_split`` and ``tl.viz.plot_architecture``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

from ._common import pyplot as _pyplot
from ._common import to_numpy

if TYPE_CHECKING:
    import matplotlib.pyplot as plt

__all__ = ["ARCHITECTURES", "plot_architecture", "plot_head_split"]


# --------------------------------------------------------------------------------------------
# Splitting and merging heads (chapter "Multi-head attention")
# --------------------------------------------------------------------------------------------


def _draw_grid(ax, values, origin, colours, title):
    """Draw a matrix of integers as coloured cells with its lower-left corner at ``origin``."""
    rows, cols = values.shape
    x0, y0 = origin
    for r in range(rows):
        for c in range(cols):
            y = y0 + rows - 1 - r
            ax.add_patch(_pyplot().Rectangle((x0 + c, y), 1, 1, facecolor=colours[r, c], edgecolor="white", lw=1.5))
            ax.text(x0 + c + 0.5, y + 0.5, str(values[r, c]), ha="center", va="center", fontsize=8)
    ax.text(x0 + cols / 2, y0 + rows + 0.3, title, ha="center", va="bottom", fontsize=9)


def plot_head_split(
    x: Tensor | np.ndarray,
    heads: Tensor | np.ndarray,
    merged: Tensor | np.ndarray | None = None,
    *,
    heads_title: str = "head",
) -> plt.Figure:
    """Where every entry goes when heads are split and merged (chapter "Multi-head attention"), as coloured blocks.

    ``x`` is one sequence, ``(T, d_model)``, whose entries are distinct integers; ``heads`` is the
    same numbers regrouped as ``(h, T, d_k)`` (for example ``tl.split_heads(x[None], h)[0]``),
    and ``merged`` optionally the ``(T, d_model)`` result of merging them back. Every cell keeps
    the colour of the place it came from in ``x``: its hue names the head that owns its feature
    (feature ``c`` belongs to head ``c // d_k``), its shade the position. A correct split gives
    each head cells of one hue, one row per position; a wrong one mixes them.
    """
    plt = _pyplot()
    xs = to_numpy(x, floats=False).astype(np.int64)
    hs = to_numpy(heads, floats=False).astype(np.int64)
    if xs.ndim != 2:
        raise ValueError(f"x must be one sequence of shape (T, d_model), got shape {xs.shape}")
    if hs.ndim != 3:
        raise ValueError(f"heads must have shape (h, T, d_k), got shape {hs.shape}")
    if hs.size != xs.size:
        raise ValueError(f"heads has {hs.size} entries but x has {xs.size}: they must be the same numbers")
    if len(np.unique(xs)) != xs.size:
        raise ValueError("x must hold distinct integers, so that every entry can be traced")
    where = {int(v): divmod(i, xs.shape[1]) for i, v in enumerate(xs.ravel())}
    missing = sorted(set(hs.ravel().tolist()) - set(where))
    if missing:
        raise ValueError(f"heads holds values that are not in x: {missing[:5]}")
    T, d_model = xs.shape
    h, _, d_k = hs.shape
    if d_model % h:
        raise ValueError(f"d_model = {d_model} is not divisible by h = {h}")
    d_k_true = d_model // h
    cmap = plt.get_cmap("tab10")

    def colours(values):
        out = np.empty(values.shape + (4,))
        for idx, v in np.ndenumerate(values):
            t, c = where[int(v)]
            base = np.array(cmap(c // d_k_true % 10))
            # the head's hue, paler for later positions
            out[idx] = base
            out[idx][:3] = 1 - (1 - base[:3]) * (0.85 - 0.5 * t / max(T - 1, 1))
        return out

    panels = [(xs, "x: (T, d_model)")]
    panels += [(hs[i], f"{heads_title} {i}: (T, d_k)") for i in range(h)]
    if merged is not None:
        ms = to_numpy(merged, floats=False).astype(np.int64)
        if ms.shape != xs.shape:
            raise ValueError(f"merged must have the shape of x, {xs.shape}, got {ms.shape}")
        panels.append((ms, "merged: (T, d_model)"))
    gap = 1.6
    width = sum(p.shape[1] for p, _ in panels) + gap * (len(panels) - 1)
    rows = max(p.shape[0] for p, _ in panels)
    fig, ax = plt.subplots(figsize=(0.42 * width, 0.42 * rows + 0.8))
    left = 0.0
    for k, (values, title) in enumerate(panels):
        _draw_grid(ax, values, (left, rows - values.shape[0]), colours(values), title)
        left += values.shape[1]
        if k < len(panels) - 1:
            arrow = "split" if k == 0 else ("merge" if merged is not None and k == len(panels) - 2 else "")
            if arrow:
                ax.annotate(
                    "",
                    (left + gap - 0.2, rows / 2),
                    (left + 0.2, rows / 2),
                    arrowprops=dict(arrowstyle="->", color="0.3"),
                )
                ax.text(left + gap / 2, rows / 2 + 0.25, arrow, ha="center", va="bottom", fontsize=8, color="0.3")
        left += gap
    ax.set_xlim(-0.2, width + 0.2)
    ax.set_ylim(-0.2, rows + 1.0)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig


# --------------------------------------------------------------------------------------------
# Whole-model diagrams (chapters "The transformer block", "Encoder-decoder and cross-attention" and "A GPT from
# scratch") --------------------------------------------------------------------------------------------

_COLOURS = {
    "attn": "#f6c89f",
    "ffn": "#a8d5ba",
    "norm": "#f3e79b",
    "embed": "#c6dbef",
    "head": "#dadaeb",
}
_BOX_W, _BOX_H, _STEP = 3.0, 0.55, 0.3
ARCHITECTURES = ("encoder_decoder", "encoder_decoder_pre_ln", "gpt_post_ln", "gpt_pre_ln")


class _Column:
    """Draws one stack of boxes from the bottom up, with residual connections on its right."""

    def __init__(self, ax, x):
        self.ax, self.x, self.y = ax, x, 0.0
        self.boxes = {}

    def _arrow(self, y_from, y_to):
        self.ax.annotate("", (self.x, y_to), (self.x, y_from), arrowprops=dict(arrowstyle="->", color="0.25", lw=1))

    def text(self, label):
        self.ax.text(self.x, self.y, label, ha="center", va="bottom", fontsize=8, style="italic")
        self.y += 0.3

    def box(self, label, kind, name=None):
        self._arrow(self.y, self.y + _STEP)
        self.y += _STEP
        plt = _pyplot()
        self.ax.add_patch(
            plt.Rectangle(
                (self.x - _BOX_W / 2, self.y), _BOX_W, _BOX_H, facecolor=_COLOURS[kind], edgecolor="0.3", lw=0.8
            )
        )
        self.ax.text(self.x, self.y + _BOX_H / 2, label, ha="center", va="center", fontsize=7.5)
        if name:
            self.boxes[name] = (self.x, self.y)
        self.y += _BOX_H

    def add(self, y_branch):
        """The residual sum: a circled + fed from below and by a line from ``y_branch``."""
        plt = _pyplot()
        self._arrow(self.y, self.y + _STEP)
        self.y += _STEP + 0.14
        self.ax.add_patch(plt.Circle((self.x, self.y), 0.14, facecolor="white", edgecolor="0.25", lw=1))
        self.ax.text(self.x, self.y, "+", ha="center", va="center", fontsize=9)
        side = self.x + _BOX_W / 2 + 0.25
        self.ax.plot([self.x, side, side], [y_branch, y_branch, self.y], color="0.25", lw=1)
        self.ax.annotate("", (self.x + 0.14, self.y), (side, self.y), arrowprops=dict(arrowstyle="->", color="0.25"))
        self.y += 0.14

    def sublayer(self, label, kind, pre_ln, name=None):
        y_branch = self.y + _STEP / 2
        if pre_ln:
            self.box("LayerNorm", "norm")
            self.box(label, kind, name)
            self.add(y_branch)
        else:
            self.box(label, kind, name)
            self.add(y_branch)
            self.box("LayerNorm", "norm")

    def frame(self, y_start, label):
        plt = _pyplot()
        pad = 0.15
        self.ax.add_patch(
            plt.Rectangle(
                (self.x - _BOX_W / 2 - 0.35, y_start),
                _BOX_W + 1.0,
                self.y - y_start + pad,
                facecolor="none",
                edgecolor="0.5",
                lw=1,
                ls="--",
            )
        )
        self.ax.text(self.x - _BOX_W / 2 - 0.45, (y_start + self.y) / 2, label, ha="right", va="center", fontsize=9)
        self.y += pad


def _draw_gpt(ax, x, pre_ln):
    col = _Column(ax, x)
    col.text("tokens")
    col.box("token + position embedding", "embed")
    start = col.y + 0.05
    col.sublayer("causal self-attention", "attn", pre_ln)
    col.sublayer("feed-forward", "ffn", pre_ln)
    col.frame(start, "N ×")
    if pre_ln:
        col.box("final LayerNorm", "norm")
    col.box("linear (to vocabulary)", "head")
    col._arrow(col.y, col.y + _STEP)
    col.y += _STEP + 0.05
    col.text("next-token logits")
    return col.y, ("GPT, pre-LN" if pre_ln else "GPT, post-LN")


def _draw_encoder_decoder(ax, x, pre_ln):
    enc, dec = _Column(ax, x), _Column(ax, x + _BOX_W + 3.0)
    enc.text("source tokens")
    enc.box("embedding + positions", "embed")
    start = enc.y + 0.05
    enc.sublayer("self-attention", "attn", pre_ln)
    enc.sublayer("feed-forward", "ffn", pre_ln)
    enc.frame(start, "N ×")
    if pre_ln:  # each pre-LN stack ends with its own LayerNorm
        enc.box("final LayerNorm", "norm")
    dec.text("target tokens, shifted right")
    dec.box("embedding + positions", "embed")
    start = dec.y + 0.05
    dec.sublayer("causal self-attention", "attn", pre_ln)
    dec.sublayer("cross-attention", "attn", pre_ln, name="cross")
    dec.sublayer("feed-forward", "ffn", pre_ln)
    dec.frame(start, "N ×")
    if pre_ln:
        dec.box("final LayerNorm", "norm")
    dec.box("linear (to vocabulary)", "head")
    dec._arrow(dec.y, dec.y + _STEP)
    dec.y += _STEP + 0.05
    dec.text("next-token logits")
    # the encoder's output becomes the keys and values of every cross-attention
    cx, cy = dec.boxes["cross"]
    mid = (enc.x + cx) / 2 + 0.15
    ax.plot([enc.x, enc.x, mid, mid], [enc.y, enc.y + 0.25, enc.y + 0.25, cy + _BOX_H / 2], color="C0", lw=1.2)
    ax.annotate(
        "",
        (cx - _BOX_W / 2, cy + _BOX_H / 2),
        (mid, cy + _BOX_H / 2),
        arrowprops=dict(arrowstyle="->", color="C0", lw=1.2),
    )
    ax.text(mid - 0.1, enc.y + 0.35, "keys, values", ha="right", va="bottom", fontsize=7, color="C0")
    return max(enc.y, dec.y), f"encoder-decoder ({'pre' if pre_ln else 'post'}-LN)"


def plot_architecture(*kinds: str) -> plt.Figure:
    """Whole-model diagrams, side by side: ``"encoder_decoder"`` (post-LN, as in the paper),
    ``"encoder_decoder_pre_ln"``, ``"gpt_post_ln"``, ``"gpt_pre_ln"``.

    Drawn with matplotlib only (chapters "The transformer block", "Encoder-decoder and cross-attention" and "A GPT from
    scratch" show the same pictures). With no argument, the paper's encoder-decoder and both GPT blocks. Residual
    connections run on the right of each stack; dashed frames repeat ``N`` times.
    """
    kinds = kinds or ("encoder_decoder", "gpt_post_ln", "gpt_pre_ln")
    for kind in kinds:
        if kind not in ARCHITECTURES:
            raise ValueError(f"kind must be one of {ARCHITECTURES}, got {kind!r}")
    plt = _pyplot()
    widths = [2 * _BOX_W + 4.8 if k.startswith("encoder_decoder") else _BOX_W + 2.6 for k in kinds]
    fig, ax = plt.subplots(figsize=(0.62 * sum(widths), 6.0))
    left, top = 0.0, 0.0
    for kind, width in zip(kinds, widths, strict=True):
        x = left + 1.5 + _BOX_W / 2
        if kind.startswith("encoder_decoder"):
            height, title = _draw_encoder_decoder(ax, x, pre_ln=kind.endswith("pre_ln"))
            centre = x + (_BOX_W + 3.0) / 2
        else:
            height, title = _draw_gpt(ax, x, pre_ln=kind == "gpt_pre_ln")
            centre = x
        ax.text(centre, -0.45, title, ha="center", va="top", fontsize=10, weight="bold")
        top = max(top, height)
        left += width
    ax.set_xlim(0, left)
    ax.set_ylim(-0.9, top + 0.2)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig
