"""Tests for transformer_lib/viz.py: the heatmap helpers and live figures."""

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
# live_figure
# --------------------------------------------------------------------------------------------


@pytest.fixture
def widgets():
    return pytest.importorskip("ipywidgets")


def bars(n, label="x"):
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.bar(range(n), np.arange(n))
    return fig, f"{label}: {n} bars"


def test_live_figure_draws_and_redraws_when_a_control_changes(widgets):
    slider = widgets.IntSlider(value=2, min=1, max=5)
    box = viz.live_figure(bars, n=slider, label=widgets.Text(value="bars"))
    controls, image, caption = box.children
    assert list(controls.children)[0] is slider
    first = image.value
    assert first[:8] == b"\x89PNG\r\n\x1a\n"
    assert caption.value == "bars: 2 bars"
    slider.value = 4
    assert caption.value == "bars: 4 bars" and image.value != first
    assert plt.get_fignums() == []  # every drawn figure is closed


def test_live_figure_accepts_a_bare_figure(widgets):
    box = viz.live_figure(lambda n: bars(n)[0], n=widgets.IntSlider(value=3))
    assert box.children[2].value == ""
    assert box.children[1].value[:4] == b"\x89PNG"


def test_live_figure_errors(widgets):
    with pytest.raises(TypeError, match="draw must be a function"):
        viz.live_figure("not a function", n=widgets.IntSlider())
    with pytest.raises(ValueError, match="at least one control"):
        viz.live_figure(bars)
    with pytest.raises(TypeError, match="control 'n' must be an ipywidgets widget with a value"):
        viz.live_figure(bars, n=3)
    with pytest.raises(TypeError, match="draw must return a matplotlib Figure"):
        viz.live_figure(lambda n: n, n=widgets.IntSlider())
