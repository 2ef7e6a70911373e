"""A passage drawn as its tokens, one coloured box each (chapter "Tokens")."""

from __future__ import annotations

from collections.abc import Sequence

from ._common import pyplot

__all__ = ["plot_tokens"]

_COLOURS = ["#cfe2f3", "#fce5cd", "#d9ead3", "#f4cccc", "#d9d2e9", "#fff2cc"]


def plot_tokens(pieces: Sequence[str], ax=None, width: int = 60, fontsize: float = 10.0):
    """Draw the text pieces of a tokenized passage in boxes of alternating colours (chapter "Tokens").

    ``pieces`` are the tokens decoded one by one (``[tok.decode([i]) for i in ids]``); a space is
    drawn as ``·`` and a line break as ``↵`` followed by a new line. Lines wrap at ``width``
    characters, between tokens where possible. Returns the axes.
    """
    if isinstance(pieces, str) or not all(isinstance(p, str) for p in pieces):
        raise TypeError("pieces must be a sequence of strings, one per token")
    if ax is None:
        _, ax = pyplot().subplots(figsize=(width * 0.14, 3))
    row, col, rows = 0, 0, 1
    for k, piece in enumerate(pieces):
        shown = piece.replace(" ", "\u00b7").replace("\n", "\u21b5")
        if col and col + len(shown) > width:
            row, col = row + 1, 0
        ax.add_patch(pyplot().Rectangle((col, -row - 0.85), len(shown), 0.8, color=_COLOURS[k % len(_COLOURS)], lw=0))
        ax.text(
            col + len(shown) / 2, -row - 0.45, shown, ha="center", va="center", family="monospace", fontsize=fontsize
        )
        col += len(shown)
        if "\n" in piece:
            row, col = row + 1, 0
        rows = row + 1
    ax.set_xlim(0, width)
    ax.set_ylim(-max(rows, 1) - 0.1, 0.1)
    ax.axis("off")
    return ax
