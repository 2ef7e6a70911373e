"""Figures the chapters share: attention heatmaps, and interactive figures whose frames are drawn
in advance, so they work on the static web page with no kernel.

(The softmax's entropy, Jacobian and temperature are chapter "Why divide by sqrt(d_k)"'s math and live in
:mod:`transformer_lib.attention`.)
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Sequence
from itertools import product
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

from ._common import pyplot as _pyplot
from ._common import to_numpy
from ._inline import compact_inline_figures, palette_picture_png

if TYPE_CHECKING:
    import matplotlib.pyplot as plt

__all__ = [
    "compact_inline_figures",
    "figure_png",
    "frame_widget",
    "plot_against_uniform",
    "plot_architecture",
    "plot_attention",
    "plot_attention_grid",
    "plot_head_split",
    "plot_tokens",
]


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
    """Heatmap of one ``(T_q, T_k)`` weight matrix: rows are queries, columns are keys (chapter "Queries, keys and
    values").

    ``annotate`` writes each weight in its cell (default: when the matrix is at most 12 x 12).
    """
    w = to_numpy(weights)
    if w.ndim != 2:
        raise ValueError(f"plot_attention expects a 2-D (T_q, T_k) matrix, got shape {w.shape}")
    T_q, T_k = w.shape
    for name, labels, n in (("x_labels", x_labels, T_k), ("y_labels", y_labels, T_q)):
        if labels is not None and len(labels) != n:
            raise ValueError(f"{name} has {len(labels)} entries but the matrix has {n} along that axis")
    if ax is None:
        _, ax = _pyplot().subplots(figsize=(0.45 * T_k + 2, 0.45 * T_q + 1.2))
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
    """A grid of heatmaps from weights of shape ``(rows, cols, T_q, T_k)`` (for example layers x heads; chapter
    "Multi-head attention")."""
    w = to_numpy(weights)
    if w.ndim == 3:
        w = w[None]
    if w.ndim != 4:
        raise ValueError(f"plot_attention_grid expects (rows, cols, T_q, T_k), got shape {w.shape}")
    rows, cols = w.shape[:2]
    fig, axes = _pyplot().subplots(rows, cols, figsize=(size * cols, size * rows), squeeze=False)
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


def figure_png(fig: plt.Figure, dpi: int = 72) -> bytes:
    """A matplotlib figure as PNG bytes, identical on every run, and closed (chapter "Why attention?").

    The picture is cropped to its contents and reduced to a palette of at most 256 colours, which
    keeps plots at about a third of their size; no metadata (software version, date) is written.
    """
    from PIL import Image  # matplotlib's own dependency

    if not isinstance(fig, _pyplot().Figure):
        raise TypeError(f"fig must be a matplotlib Figure, got {type(fig).__name__}")
    raw = io.BytesIO()  # compressed once, by palette_picture_png, rather than twice
    fig.savefig(raw, format="png", dpi=dpi, bbox_inches="tight", pil_kwargs={"compress_level": 0})
    _pyplot().close(fig)
    return palette_picture_png(Image.open(raw).convert("RGB"))


def _choices(name: str, control) -> tuple[str, list[tuple[str, object]]]:
    """The caption of a selection control and its (label, value) options, in order."""
    import ipywidgets as widgets  # only the notebooks need ipywidgets, so import it here

    if not isinstance(control, widgets.widget_selection._Selection):
        raise TypeError(
            f"control {name!r} must be an ipywidgets selection widget (SelectionSlider, Dropdown, "
            f"ToggleButtons, ...) whose options are the values to draw, got {type(control).__name__}"
        )
    if not control.options:
        raise ValueError(f"control {name!r} has no options; give it the values to draw")
    # the labels the control shows: its own ``label`` trait is empty when it is created with a
    # falsy value such as 0, so read the option labels it renders
    pairs = list(zip(control._options_labels, control._options_values, strict=True))
    return control.description or name, pairs


def frame_widget(draw: Callable, dpi: int = 96, **controls):
    """Controls above a figure, with every frame drawn in advance, so it works with no kernel (chapter "Why
    attention?").

    ``draw(**values)`` returns a matplotlib figure, or ``(figure, caption)``, for one value of each
    control. Each control is an ipywidgets selection widget (``SelectionSlider``, ``Dropdown``,
    ``ToggleButtons``, ...) whose ``options`` are the values to draw, or a plain list of values,
    which becomes a ``SelectionSlider`` described by its keyword name. ``draw`` is called once for
    every combination of options, so keep a handful per control.

    The frames are PNG images (see ``figure_png``) in nested ``ipywidgets.Stack`` s, one level per
    control; ``ipywidgets.jslink`` ties each control's ``index`` to its stacks' ``selected_index``.
    The browser carries out those links, so the widget works on the book's static page, where the
    saved widget state holds every frame, and in a running notebook alike. Each frame is an
    ``<img>`` (in an ``ipywidgets.HTML``) whose alt text and title name its settings, for example
    ``"d_k = 64, T = 2"``, with the caption, if any, in an ``ipywidgets.Label`` below it.

    ``dpi`` is the size a frame is shown at, in CSS pixels per inch of the figure: 96, the CSS
    inch, shows a figure at its size in inches and a 10-point label at 13.3 pixels, the size of a
    page's small print. Each frame is drawn at ``FRAME_DENSITY`` (1.5) times that, sharp on a
    high-density screen, and shown at ``dpi``; a figure wider than ``COLUMN_PX`` (the page's
    output column) is drawn at that width, and text smaller than ``MIN_TEXT_PT`` (10 points) is
    drawn at that size. A slider keeps its whole description and a track of at least
    ``SLIDER_TRACK_PX`` pixels, and the row of controls wraps rather than squeeze one.

    Returns an ``ipywidgets.VBox`` (a row of controls, then the frames); a notebook cell shows it
    as its last expression or with ``IPython.display.display``.
    """
    import ipywidgets as widgets

    if not callable(draw):
        raise TypeError(f"draw must be a function returning a figure, got {type(draw).__name__}")
    if not controls:
        raise ValueError("frame_widget needs at least one control, for example d_k=[16, 64, 256]")
    for name, control in controls.items():
        if isinstance(control, (list, tuple)):
            if not control:
                raise ValueError(f"control {name!r} has no options; give it the values to draw")
            controls[name] = widgets.SelectionSlider(options=list(control), description=name)
    described = [_choices(name, control) for name, control in controls.items()]
    for control, (label, pairs) in zip(controls.values(), described, strict=True):
        _give_room(control, label, [option for option, _ in pairs])
    shared = _Shared()
    frames = {}
    for combination in product(*(range(len(pairs)) for _, pairs in described)):
        chosen = [pairs[i] for (_, pairs), i in zip(described, combination, strict=True)]
        values = {name: value for name, (_, value) in zip(controls, chosen, strict=True)}
        title = ", ".join(f"{label} = {option}" for (label, _), (option, _) in zip(described, chosen, strict=True))
        frames[combination] = _frame(draw(**values), dpi, title, shared)
    stack = _nest(list(controls.values()), frames, (), shared)
    row = widgets.HBox(list(controls.values()), layout=widgets.Layout(flex_flow="row wrap"))
    return widgets.VBox([row, stack])


# the least width of a slider's track, in CSS pixels, and the width the page's widget stylesheet
# gives a character of a description or readout (13 px text: at most about 8 px a character)
SLIDER_TRACK_PX = 120
# the smallest text a frame shows, in points: 13.3 px at the default 96 px per inch, the size of
# a page's small print (a <small> in 16 px text)
MIN_TEXT_PT = 10
# the width of the book's output column at a 1280-pixel window, in CSS pixels: a wider frame is
# drawn narrower rather than scaled down by the page
COLUMN_PX = 680
# the pixels a frame is drawn with per pixel it is shown at: 10-point text gets 20 device pixels,
# sharp on a high-density screen, and a frame takes about 70 % of the bytes it would at 2x
FRAME_DENSITY = 1.5
_CHAR_PX = 8


class _Shared:
    """The one layout and the styles that every frame, caption and stack of a widget shares: the
    notebook saves each widget model once, so a frame adds its picture and little else."""

    def __init__(self):
        import ipywidgets as widgets
        from ipywidgets.widgets.widget_string import HTMLStyle, LabelStyle

        self.layout = widgets.Layout()
        self.html_style = HTMLStyle()
        self.label_style = LabelStyle()


def _give_room(control, label: str, options: list[str]) -> None:
    """Keep a control's description whole and, for a slider, give its track ``SLIDER_TRACK_PX``:
    the description gets the width of its text, toggle buttons the width of their longest label,
    and a slider a fixed width that holds the description, the track and the longest option in
    the readout."""
    text = _CHAR_PX * len(control.description) + 12 if control.description else 0
    if control.description:
        control.style.description_width = f"{text}px"
    if hasattr(control.style, "button_width"):  # toggle buttons: as wide as their labels
        control.style.button_width = f"{_CHAR_PX * max(len(option) for option in options) + 28}px"
    if "Slider" not in type(control).__name__:
        return
    readout = max(72, _CHAR_PX * max(len(option) for option in options) + 24) if control.readout else 0
    control.layout.width = f"{text + SLIDER_TRACK_PX + 30 + readout}px"
    control.layout.flex = "0 0 auto"


def _frame(result, dpi: int, title: str, shared: _Shared):
    """One precomputed frame: the figure ``draw`` returned, as an image whose alt text and title
    are ``title``, with its caption below it."""
    import ipywidgets as widgets
    from PIL import Image  # matplotlib's own dependency

    fig, caption = result if isinstance(result, tuple) else (result, None)
    if not isinstance(fig, _pyplot().Figure):
        raise TypeError(f"draw must return a matplotlib Figure or (Figure, caption), got {type(fig).__name__}")
    _fit_column(fig, dpi)
    fig.canvas.draw()  # the tick labels get their text and size
    _at_least(fig, MIN_TEXT_PT)
    raw = figure_png(fig, FRAME_DENSITY * dpi)  # drawn at FRAME_DENSITY times the size it is shown at
    smallest = _smallest_text_pt(fig)
    width = round(Image.open(io.BytesIO(raw)).size[0] / FRAME_DENSITY)
    png = base64.b64encode(raw).decode("ascii")
    text = html.escape(title, quote=True)
    # an <img> in an HTML widget rather than an Image widget: the page's widget manager cannot
    # give an Image a tooltip, and the alt text names the frame for readers and tests alike.
    # data-text-px: the smallest text's height when the frame is shown at its width
    image = widgets.HTML(
        f'<img src="data:image/png;base64,{png}" alt="{text}" title="{text}" width="{width}" '
        f'style="max-width: 100%; height: auto" data-text-px="{smallest * dpi / 72:.1f}">',
        layout=shared.layout,
        style=shared.html_style,
    )
    if caption is None:
        return image
    label = widgets.Label(str(caption), layout=shared.layout, style=shared.label_style)
    return widgets.VBox([image, label], layout=shared.layout)


def _fit_column(fig, dpi: int) -> None:
    """Shrink a figure wider than ``COLUMN_PX`` at ``dpi`` to that width (its text keeps its size
    in points, so the page does not scale it down below the small print), and lay it out again."""
    import warnings

    for _ in range(3):  # the text keeps its size, so the picture shrinks less than the figure
        fig.canvas.draw()
        shown = (fig.get_tightbbox(fig.canvas.get_renderer()).width + 0.2) * dpi  # savefig pads 0.1 in
        if shown <= COLUMN_PX:
            return
        width, height = fig.get_size_inches()
        scale = COLUMN_PX / shown
        fig.set_size_inches(width * scale, height * scale)
        if fig.get_layout_engine() is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fig.tight_layout()


def _texts(fig) -> list:
    """The visible, non-empty text artists of a figure (titles, labels, ticks, annotations)."""
    from matplotlib.text import Text

    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def _at_least(fig, points: float) -> None:
    """Raise every text of ``fig`` smaller than ``points`` to that size."""
    for text in _texts(fig):
        if text.get_fontsize() < points:
            text.set_fontsize(points)
    for ax in fig.axes:  # tick labels are remade at draw time: set their size on the axis
        for axis in (ax.xaxis, ax.yaxis):
            labels = axis.get_ticklabels()
            if labels and labels[0].get_fontsize() < points:
                axis.set_tick_params(labelsize=points)


def _smallest_text_pt(fig) -> float:
    """The size in points of the smallest visible, non-empty text of a figure (10 if none)."""
    return min((t.get_fontsize() for t in _texts(fig)), default=10.0)


def _nest(controls: list, frames: dict, prefix: tuple, shared: _Shared):
    """The stack for the controls after ``prefix``: its pages are the next control's options."""
    import ipywidgets as widgets

    if len(prefix) == len(controls):
        return frames[prefix]
    control = controls[len(prefix)]
    pages = [_nest(controls, frames, (*prefix, i), shared) for i in range(len(control.options))]
    stack = widgets.Stack(pages, selected_index=control.index, layout=shared.layout)
    widgets.jslink((control, "index"), (stack, "selected_index"))
    return stack


# the diagrams (heads split and merged, whole models) and the tables of per-head statistics
# live in their own files
from .diagrams import plot_architecture, plot_head_split  # noqa: E402
from .head_tables import plot_against_uniform  # noqa: E402
from .tokens import plot_tokens  # noqa: E402
