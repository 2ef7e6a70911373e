"""Tests for transformer_lib/viz: the heatmap helpers, the kernel-free widgets and the diagrams."""

import base64
import html
import io
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

import transformer_lib as tl
import transformer_lib.viz as viz


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


# --------------------------------------------------------------------------------------------
# plot_attention and plot_attention_grid
# --------------------------------------------------------------------------------------------


def test_plot_attention_draws_labels_and_annotations():
    w = torch.softmax(torch.randn(3, 4, generator=torch.Generator().manual_seed(0)), dim=-1)
    ax = tl.viz.plot_attention(w, x_labels=list("abcd"), y_labels=list("xyz"), title="weights")
    assert isinstance(ax, plt.Axes)
    assert ax.get_title() == "weights"
    assert [t.get_text() for t in ax.get_xticklabels()] == list("abcd")
    assert [t.get_text() for t in ax.get_yticklabels()] == list("xyz")
    assert ax.get_xlabel() == "key" and ax.get_ylabel() == "query"
    assert len(ax.texts) == 12  # one number per cell for a small matrix
    assert len(ax.figure.axes) == 2  # the heatmap and its colour bar
    np.testing.assert_allclose(ax.images[0].get_array(), w.numpy(), rtol=1e-6)


def test_plot_attention_accepts_numpy_and_an_existing_axes():
    fig, ax = plt.subplots()
    out = viz.plot_attention(np.full((20, 20), 0.05), ax=ax, colorbar=False)
    assert out is ax
    assert len(ax.texts) == 0  # large matrices are not annotated by default
    assert len(fig.axes) == 1


@pytest.mark.parametrize("shape", [(4,), (2, 3, 4)])
def test_plot_attention_rejects_non_matrices(shape):
    with pytest.raises(ValueError, match=r"expects a 2-D \(T_q, T_k\) matrix"):
        viz.plot_attention(torch.zeros(shape))


def test_plot_attention_rejects_labels_of_the_wrong_length():
    with pytest.raises(ValueError, match="x_labels has 3 entries but the matrix has 4"):
        viz.plot_attention(torch.zeros(2, 4), x_labels=list("abc"))
    with pytest.raises(ValueError, match="y_labels has 1 entries but the matrix has 2"):
        viz.plot_attention(torch.zeros(2, 4), y_labels=["a"])


def test_plot_attention_grid_layout():
    w = torch.softmax(torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(0)), dim=-1)
    fig = viz.plot_attention_grid(w, row_title="layer", col_title="head")
    assert isinstance(fig, plt.Figure)
    assert len(fig.axes) == 6
    assert fig.axes[0].get_title() == "layer 0, head 0"
    assert fig.axes[5].get_title() == "layer 1, head 2"


def test_plot_attention_grid_treats_3d_input_as_one_row():
    fig = viz.plot_attention_grid(np.full((3, 2, 2), 0.5))
    assert len(fig.axes) == 3


@pytest.mark.parametrize("shape", [(4, 5), (1, 2, 3, 4, 5)])
def test_plot_attention_grid_rejects_bad_shapes(shape):
    with pytest.raises(ValueError, match=r"expects \(rows, cols, T_q, T_k\)"):
        viz.plot_attention_grid(torch.zeros(shape))


# --------------------------------------------------------------------------------------------
# figure_png and frame_widget
# --------------------------------------------------------------------------------------------


@pytest.fixture
def widgets():
    return pytest.importorskip("ipywidgets")


def bars(n, label="x"):
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.bar(range(n), np.arange(n))
    ax.set_title(f"{label} {n}")
    return fig, f"{label}: {n} bars"


def test_figure_png_is_a_deterministic_png_and_closes_the_figure():
    first, second = (tl.viz.figure_png(bars(3)[0]) for _ in range(2))
    assert first[:8] == b"\x89PNG\r\n\x1a\n"
    assert first == second
    assert first != tl.viz.figure_png(bars(4)[0])
    assert plt.get_fignums() == []
    with pytest.raises(TypeError, match="fig must be a matplotlib Figure, got int"):
        tl.viz.figure_png(3)


def _picture(frame):
    """The alt text, the title and the PNG bytes of a frame's <img>."""
    alt, src, title = (re.search(rf'{key}="([^"]*)"', frame.value).group(1) for key in ("alt", "src", "title"))
    return html.unescape(alt), html.unescape(title), base64.b64decode(src.removeprefix("data:image/png;base64,"))


def _links(widgets):
    from ipywidgets.widgets.widget import _instances
    from ipywidgets.widgets.widget_link import Link

    return [w for w in _instances.values() if isinstance(w, Link)]


def _follow_links(widgets):
    """Do what the browser does with every jslink: copy the source trait into the target."""
    for link in _links(widgets):
        (source, source_name), (target, target_name) = link.source, link.target
        setattr(target, target_name, getattr(source, source_name))


def _visible_frame(box, widgets):
    node = box.children[1]
    while isinstance(node, widgets.Stack):
        node = node.children[node.selected_index]
    return node


@pytest.mark.parametrize("n_index, label_index", [(0, 0), (1, 2), (2, 1), (2, 2)])
def test_frame_widget_shows_the_frame_of_the_chosen_options(widgets, n_index, label_index):
    n = widgets.SelectionSlider(options=[2, 4, 7], value=4, description="n")
    label = widgets.ToggleButtons(options=[("red", "r"), ("green", "g"), ("blue", "b")], value="b")
    box = tl.viz.frame_widget(bars, n=n, label=label)
    controls, stack = box.children
    assert list(controls.children) == [n, label]
    assert len(stack.children) == 3 and all(len(page.children) == 3 for page in stack.children)
    assert (n.index, label.index) == (1, 2)  # building the frames leaves the chosen values alone
    assert len(_links(widgets)) >= 1 + 3  # one link for the outer stack, one per inner stack
    assert _picture(_visible_frame(box, widgets).children[0])[0] == "n = 4, label = blue"
    n.index, label.index = n_index, label_index
    _follow_links(widgets)
    frame = _visible_frame(box, widgets)
    image, caption = frame.children
    alt, title, png = _picture(image)
    assert alt == title == f"n = {n.label}, label = {label.label}"
    assert caption.value == f"{label.value}: {n.value} bars"
    assert png == tl.viz.figure_png(bars(n.value, label.value)[0], dpi=viz.FRAME_DENSITY * 96)
    assert plt.get_fignums() == []


def test_frame_widget_turns_lists_into_sliders_and_bare_figures_into_images(widgets):
    box = tl.viz.frame_widget(lambda n: bars(n)[0], n=[1, 3, 5])
    (slider,) = box.children[0].children
    assert isinstance(slider, widgets.SelectionSlider) and slider.description == "n"
    frames = box.children[1].children
    assert all(isinstance(f, widgets.HTML) for f in frames)
    pictures = [_picture(f) for f in frames]
    assert [alt for alt, _, _ in pictures] == ["n = 1", "n = 3", "n = 5"]
    assert len({png for _, _, png in pictures}) == 3  # every setting draws its own picture


def test_frame_widget_calls_draw_once_per_combination(widgets):
    calls = []

    def draw(a, b):
        calls.append((a, b))
        return bars(a)[0]

    tl.viz.frame_widget(draw, a=[1, 2], b=widgets.Dropdown(options=["u", "v", "w"]))
    assert sorted(calls) == [(a, b) for a in (1, 2) for b in "uvw"]


def test_frame_widget_errors(widgets):
    with pytest.raises(TypeError, match="draw must be a function"):
        viz.frame_widget("not a function", n=[1, 2])
    with pytest.raises(ValueError, match="at least one control"):
        viz.frame_widget(bars)
    with pytest.raises(TypeError, match="control 'n' must be an ipywidgets selection widget .* got IntSlider"):
        viz.frame_widget(bars, n=widgets.IntSlider())
    with pytest.raises(ValueError, match="control 'n' has no options"):
        viz.frame_widget(bars, n=[])
    with pytest.raises(TypeError, match="draw must return a matplotlib Figure or .* got int"):
        viz.frame_widget(lambda n: n, n=[1])


def test_frame_widget_escapes_option_labels_in_the_alt_text(widgets):
    box = tl.viz.frame_widget(lambda label: bars(2)[0], label=['say "hi" <b>'])
    alt, title, _ = _picture(box.children[1].children[0])
    assert alt == title == 'label = say "hi" <b>'


def test_frame_widget_draws_at_frame_density_times_the_size_it_shows(widgets):
    """A frame is drawn at FRAME_DENSITY x dpi (1.5 x) and shown at dpi, with the height its smallest text then has;
    text below MIN_TEXT_PT (a 6-point title here) is raised to it."""
    from PIL import Image

    def draw(n):
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.plot(range(n))
        ax.set_title("small", fontsize=6)
        return fig

    assert viz.MIN_TEXT_PT == 10 and viz.FRAME_DENSITY == 1.5
    for dpi, text_px in ((96, 13.3), (72, 10.0)):
        frame = tl.viz.frame_widget(draw, dpi=dpi, n=[2, 3]).children[1].children[0]
        png = Image.open(io.BytesIO(_picture(frame)[2]))
        shown = int(re.search(r'width="(\d+)"', frame.value).group(1))
        assert shown == round(png.size[0] / 1.5) and 2.8 * dpi < shown < 3.1 * dpi  # a 3-inch figure
        assert float(re.search(r'data-text-px="([\d.]+)"', frame.value).group(1)) == text_px
        assert "max-width: 100%" in frame.value


def test_frame_widget_frames_share_one_layout_and_style(widgets):
    """Every frame, caption and stack of a widget uses one Layout (and one style per kind), so the
    notebook saves those models once rather than once per frame."""
    box = tl.viz.frame_widget(bars, n=[1, 2], label=widgets.Dropdown(options=["a", "b", "c"]))
    stacks = [box.children[1], *box.children[1].children]
    frames = [frame for stack in stacks[1:] for frame in stack.children]
    parts = [part for frame in frames for part in frame.children]
    assert len(frames) == 6 and all(isinstance(f, widgets.VBox) for f in frames)
    assert len({id(w.layout) for w in stacks + frames + parts}) == 1
    assert len({id(p.style) for p in parts if isinstance(p, widgets.HTML)}) == 1
    assert len({id(p.style) for p in parts if isinstance(p, widgets.Label)}) == 1
    assert box.children[0].layout is not stacks[0].layout  # the controls keep their own


def test_palette_png_and_inline_figures():
    """An opaque PNG becomes a palette PNG of at most 256 colours with no metadata; a transparent
    one is left alone; IPython's PNG formatter shows matplotlib figures through palette_png until
    compact_inline_figures(False) gives it its own lookup back."""
    from PIL import Image

    from transformer_lib.viz import _inline

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.imshow(np.linspace(0, 1, 600).reshape(20, 30))
    raw = io.BytesIO()
    fig.savefig(raw, format="png", dpi=100)
    small = _inline.palette_png(raw.getvalue())
    picture = Image.open(io.BytesIO(small))
    assert picture.mode == "P" and len(picture.getcolors()) <= 256 and "Software" not in picture.info
    assert len(small) < len(raw.getvalue())
    clear = io.BytesIO()
    fig.savefig(clear, format="png", dpi=50, transparent=True)
    assert _inline.palette_png(clear.getvalue()) == clear.getvalue()

    class Formatter:  # the part of IPython's PNG formatter that compact_inline_figures uses
        def lookup(self, obj):
            return lambda figure: base64.b64encode(raw.getvalue()).decode("ascii")

    class Shell:
        display_formatter = type("Display", (), {"formatters": {"image/png": Formatter()}})()

    class IPython:
        get_ipython = staticmethod(lambda: Shell)

    import sys

    saved = sys.modules.get("IPython")
    sys.modules["IPython"] = IPython
    try:
        assert _inline.compact_inline_figures() and _inline.compact_inline_figures()  # once only
    finally:
        if saved is not None:
            sys.modules["IPython"] = saved
        else:
            del sys.modules["IPython"]
    formatter = Shell.display_formatter.formatters["image/png"]
    assert base64.b64decode(formatter.lookup(fig)(fig)) == small
    assert formatter.lookup(3)(3) == base64.b64encode(raw.getvalue()).decode("ascii")  # not a figure
    sys.modules["IPython"] = IPython
    try:  # and off again: the formatter's own lookup is back
        assert _inline.compact_inline_figures(False) is False and "lookup" not in vars(formatter)
        assert _inline.compact_inline_figures(False) is False  # twice is harmless
    finally:
        if saved is not None:
            sys.modules["IPython"] = saved
        else:
            del sys.modules["IPython"]
    assert formatter.lookup(fig)(fig) == base64.b64encode(raw.getvalue()).decode("ascii")


def test_frame_widget_draws_a_wide_figure_at_the_column_width(widgets):
    """A 12-inch figure would be 1152 px at 96 px per inch: it is drawn COLUMN_PX wide instead,
    with its text still at MIN_TEXT_PT, so the page never scales the frame (and its text) down."""

    def draw(n):
        fig, axes = plt.subplots(1, 3, figsize=(12, 3))
        for ax in axes:
            ax.plot(range(n))
            ax.set_title("panel")
        fig.tight_layout()
        return fig

    frame = tl.viz.frame_widget(draw, n=[2, 3]).children[1].children[0]
    shown = int(re.search(r'width="(\d+)"', frame.value).group(1))
    assert 0.9 * viz.COLUMN_PX <= shown <= viz.COLUMN_PX + 8  # the tight bounding box may add a little
    assert float(re.search(r'data-text-px="([\d.]+)"', frame.value).group(1)) == 13.3


@pytest.mark.parametrize("description", ["n", "temperature", "a long description"])
def test_frame_widget_gives_every_slider_a_track_and_its_whole_label(widgets, description):
    """The row of controls wraps; a slider is wide enough for its description, a track of
    SLIDER_TRACK_PX and its readout; descriptions and toggle buttons fit their text."""
    slider = widgets.SelectionSlider(options=[0.25, 0.5, 1.0], description=description)
    toggles = widgets.ToggleButtons(options=["left", "right"], description="side")
    box = tl.viz.frame_widget(lambda n, side: bars(2)[0], n=slider, side=toggles)
    row = box.children[0]
    assert row.layout.flex_flow == "row wrap"
    label_px = int(slider.style.description_width.removesuffix("px"))
    assert label_px >= 8 * len(description)
    width = int(slider.layout.width.removesuffix("px"))
    assert width - label_px - 72 - 30 >= viz.SLIDER_TRACK_PX >= 100
    assert slider.layout.flex == "0 0 auto"  # the row cannot squeeze it
    assert int(toggles.style.button_width.removesuffix("px")) >= 8 * len("right")


def test_frame_widget_names_falsy_values_too(widgets):
    """A control created with value 0 shows "0", and so must the frame's alt text."""
    box = tl.viz.frame_widget(lambda n: bars(n + 1)[0], n=widgets.SelectionSlider(options=[0, 1, 2], value=0))
    assert [_picture(f)[0] for f in box.children[1].children] == ["n = 0", "n = 1", "n = 2"]


# --------------------------------------------------------------------------------------------
# plot_head_split and plot_architecture (the diagrams)
# --------------------------------------------------------------------------------------------


def _traced(T, d_model):
    # entry 100 t + c: feature c of position t, every entry distinct
    return (100 * torch.arange(T)[:, None] + torch.arange(d_model))[None]


def _cells(fig):
    # (text, face colour) of every numbered cell, panel by panel from left to right
    ax = fig.axes[0]
    rects = [p for p in ax.patches if isinstance(p, matplotlib.patches.Rectangle)]
    by_xy = {(round(r.get_x() + 0.5, 3), round(r.get_y() + 0.5, 3)): r.get_facecolor() for r in rects}
    return [(int(t.get_text()), by_xy[round(t.get_position()[0], 3), round(t.get_position()[1], 3)])
            for t in ax.texts if t.get_text().isdigit()]  # fmt: skip


@pytest.mark.parametrize("T, d_model, h", [(3, 6, 2), (4, 8, 4), (2, 6, 3), (5, 4, 1)])
def test_plot_head_split_gives_each_head_one_hue_and_keeps_every_entry_its_colour(T, d_model, h):
    x = _traced(T, d_model)
    heads = tl.split_heads(x, h)
    fig = viz.plot_head_split(x[0], heads[0], tl.merge_heads(heads)[0])
    cells = _cells(fig)
    # x, the h heads and the merged copy: every entry drawn three times (once in x, once in its
    # head, once merged), always in the same colour
    assert len(cells) == 3 * T * d_model
    colour_of = {}
    for value, colour in cells:
        assert colour_of.setdefault(value, colour) == colour
    # one hue per head: entries of the same feature block but different positions differ only
    # in shade, and those of different heads differ
    d_k = d_model // h
    for value, colour in colour_of.items():
        same_head = [colour_of[t * 100 + c] for t in range(T) for c in range(d_model) if c // d_k == value % 100 // d_k]
        assert colour in same_head
    if h > 1:
        assert colour_of[0] != colour_of[d_k]
    assert fig.axes[0].get_title() == ""


def test_plot_head_split_shows_a_wrong_reshape_as_mixed_colours():
    x = _traced(3, 6)
    right = _cells(viz.plot_head_split(x[0], tl.split_heads(x, 2)[0]))
    wrong = _cells(viz.plot_head_split(x[0], x.view(1, 2, 3, 3)[0]))
    # head 0 of the right split holds features 0-2 only; the wrong one holds features 3-5 too
    right_head0 = [v for v, _ in right[18:27]]
    wrong_head0 = [v for v, _ in wrong[18:27]]
    assert sorted(v % 100 for v in right_head0) == sorted([0, 1, 2] * 3)
    assert {v % 100 for v in wrong_head0} == set(range(6))


@pytest.mark.parametrize(
    "args, message",
    [
        ((torch.arange(6), torch.arange(6).view(2, 1, 3)), "x must be one sequence"),
        ((torch.arange(6).view(1, 6), torch.arange(6).view(2, 3)), "heads must have shape"),
        ((torch.arange(6).view(1, 6), torch.arange(4).view(2, 1, 2)), "heads has 4 entries but x has 6"),
        ((torch.zeros(1, 6), torch.zeros(2, 1, 3)), "distinct integers"),
        ((torch.arange(6).view(1, 6), (torch.arange(6) + 1).view(2, 1, 3)), "not in x: \\[6\\]"),
        ((torch.arange(6).view(1, 6), torch.arange(6).view(2, 1, 3), torch.arange(6)), "merged must have"),
    ],
)
def test_plot_head_split_rejects_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        viz.plot_head_split(*args)


def _labels(fig):
    return [t.get_text() for t in fig.axes[0].texts]


@pytest.mark.parametrize("kind", tl.viz.diagrams.ARCHITECTURES)
def test_plot_architecture_draws_each_model_with_its_parts(kind):
    labels = _labels(viz.plot_architecture(kind))
    attention = [t for t in labels if "attention" in t]
    # one LayerNorm per residual sub-layer, and pre-LN adds the final one
    encoder_decoder, pre_ln = kind.startswith("encoder_decoder"), kind.endswith("pre_ln")
    sublayers = 5 if encoder_decoder else 2
    assert labels.count("+") == sublayers
    # one final LayerNorm per pre-LN stack: two for the encoder-decoder, one for a GPT
    finals = labels.count("final LayerNorm")
    assert finals == (1 + encoder_decoder) * pre_ln
    assert sum("LayerNorm" in t for t in labels) == sublayers + finals
    assert len(attention) == (3 if encoder_decoder else 1)
    assert ("cross-attention" in labels) == encoder_decoder
    assert "next-token logits" in labels


def test_plot_architecture_puts_the_norm_before_or_after_the_sublayer():
    # read each stack from the bottom: pre-LN goes LayerNorm, attention; post-LN the reverse
    def order(kind, attention="causal self-attention"):
        ax = viz.plot_architecture(kind).axes[0]
        # the one column that holds this attention box
        x = next(t.get_position()[0] for t in ax.texts if t.get_text() == attention)
        texts = sorted((t for t in ax.texts if t.get_position()[0] == x), key=lambda t: t.get_position()[1])
        return [t.get_text() for t in texts if t.get_text() in ("LayerNorm", attention)][:2]

    for kind in ("gpt_pre_ln", "encoder_decoder_pre_ln"):
        assert order(kind) == ["LayerNorm", "causal self-attention"]
    for kind in ("gpt_post_ln", "encoder_decoder"):
        assert order(kind) == ["causal self-attention", "LayerNorm"]
    assert order("encoder_decoder", "self-attention") == ["self-attention", "LayerNorm"]
    assert order("encoder_decoder_pre_ln", "self-attention") == ["LayerNorm", "self-attention"]


def test_plot_architecture_draws_all_three_side_by_side_by_default():
    labels = _labels(viz.plot_architecture())
    assert {"encoder-decoder (post-LN)", "GPT, post-LN", "GPT, pre-LN"} <= set(labels)
    assert "encoder-decoder (pre-LN)" in _labels(viz.plot_architecture("encoder_decoder_pre_ln"))
    png = viz.figure_png(viz.plot_architecture("gpt_pre_ln"), dpi=60)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_architecture_rejects_an_unknown_kind():
    with pytest.raises(ValueError, match="kind must be one of .* got 'bert'"):
        viz.plot_architecture("bert")


# --------------------------------------------------------------------------------------------
# plot_against_uniform (chapter "Encoder-decoder and cross-attention"'s table of per-head statistics)
# --------------------------------------------------------------------------------------------


def _framed(ax):
    # the (row, col) of every cell framed as below uniform
    rects = [p for p in ax.patches if isinstance(p, matplotlib.patches.Rectangle) and not p.get_fill()]
    return sorted((round(r.get_y() + r.get_height() / 2), round(r.get_x() + r.get_width() / 2)) for r in rects)


def test_plot_against_uniform_colours_by_the_ratio_and_frames_the_cells_below():
    scores = torch.tensor([[0.5, 0.1, 0.25], [0.9, 0.4, 0.05]])
    ax = viz.plot_against_uniform(scores, ["year", "day"], ["a", "b", "c"], [0.25, 0.3], title="t")
    assert ax.get_title() == "t"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["year (0.25)", "day (0.30)"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]
    assert [t.get_text() for t in ax.texts] == ["0.50", "0.10", "0.25", "0.90", "0.40", "0.05"]
    # the colour is log2(score / uniform): 0 (white) at the reference, +1 at twice it
    expected = np.log2(scores.double().numpy() / np.array([[0.25], [0.3]]))
    np.testing.assert_allclose(ax.images[0].get_array(), expected, rtol=1e-12)
    assert ax.images[0].norm.vmin == -2 and ax.images[0].norm.vmax == 2
    # strictly below the row's reference: framed; equal to it (0.25 on the year) is not
    assert _framed(ax) == [(0, 1), (1, 2)]
    bar = ax.figure.axes[1]
    assert [t.get_text() for t in bar.get_yticklabels()] == ["1/4×", "1/2×", "1×", "2×", "4×"]


def test_plot_against_uniform_takes_one_reference_for_all_rows_and_an_existing_axes():
    fig, ax = plt.subplots()
    out = viz.plot_against_uniform(np.full((3, 2), 0.5), list("xyz"), ["h0", "h1"], 0.25, ax=ax, colorbar=False)
    assert out is ax and len(fig.axes) == 1
    assert [t.get_text() for t in ax.get_yticklabels()] == ["x (0.25)", "y (0.25)", "z (0.25)"]
    assert _framed(ax) == []
    assert tl.plot_against_uniform is viz.plot_against_uniform


@pytest.mark.parametrize(
    "args, message",
    [
        ((np.zeros(3), ["a"], ["b"], 0.1), r"scores must be a \(rows, cols\) table"),
        ((np.zeros((2, 2)), ["a", "b"], ["c", "d"], [0.1, 0.2, 0.3]), r"one number or one per row \(2\), got 3"),
        ((np.zeros((2, 2)), ["a"], ["c", "d"], 0.1), "2 x 2, but there are 1 row labels and 2 column labels"),
        ((np.zeros((1, 2)), ["a"], ["c", "d"], 0.0), "uniform reference > 0"),
        ((-np.ones((1, 2)), ["a"], ["c", "d"], 0.1), "scores must be >= 0"),
    ],
)
def test_plot_against_uniform_rejects_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        viz.plot_against_uniform(*args)
