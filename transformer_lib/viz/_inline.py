"""Smaller PNGs for the notebooks' saved figures: the widget frames and the plots a cell shows.

A matplotlib plot is a few flat colours and their anti-aliased edges, so a palette of 256 colours
looks the same as the full-colour picture at about a third of its size. ``palette_png`` makes such
a PNG; ``compact_inline_figures`` has IPython show every matplotlib figure through it.
"""

from __future__ import annotations

import base64
import io
import sys


def palette_png(png: bytes) -> bytes:
    """An opaque PNG reduced to a palette of at most 256 colours, with no metadata (chapter "Why attention?").

    A picture with transparent pixels is returned as it is (its palette would need an alpha
    channel that the median cut does not keep). The result is the same on every run.
    """
    from PIL import Image  # matplotlib's own dependency

    picture = Image.open(io.BytesIO(png))
    if picture.mode in ("RGBA", "LA") and picture.getchannel("A").getextrema()[0] < 255:
        return png
    return palette_picture_png(picture.convert("RGB"))


def palette_picture_png(picture) -> bytes:
    """An RGB ``PIL.Image`` as a PNG with a palette of at most 256 colours (median cut, no
    dithering), compressed as tightly as zlib can, with no metadata."""
    from PIL import Image

    small = io.BytesIO()
    picture.quantize(256, dither=Image.Dither.NONE).save(small, format="png", optimize=True)
    return small.getvalue()


def _palette_output(data):
    """``palette_png`` on a PNG formatter's output: bytes, or base64 text as the inline backend gives."""
    if isinstance(data, bytes):
        return palette_png(data)
    if isinstance(data, str):
        return base64.b64encode(palette_png(base64.b64decode(data))).decode("ascii")
    return data


def compact_inline_figures(on: bool = True) -> bool:
    """Have IPython show matplotlib figures as palette PNGs (``palette_png``); True if it now does
    (chapter "Why attention?").

    The chapters call it once, in their first cell: the plots a cell shows are then saved at about
    a third of their size. Importing the library does not call it, since it changes how every
    figure of the session is shown, the reader's own too; ``compact_inline_figures(False)`` gives
    IPython's own PNG formatter back. Outside IPython it does nothing and returns False. It wraps
    the PNG formatter's lookup, so it holds whether matplotlib's inline backend registers its
    printer before or after.
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    formatters = getattr(getattr(shell, "display_formatter", None), "formatters", None)
    if not formatters or "image/png" not in formatters:
        return False
    formatter = formatters["image/png"]
    lookup = formatter.lookup
    compact = getattr(lookup, "_palette", None)
    if not on:
        if compact is not None:  # put back the lookup it wrapped
            if getattr(compact, "__self__", None) is formatter:
                del formatter.lookup  # the formatter's own method again
            else:
                formatter.lookup = compact
        return False
    if compact is not None:
        return True

    def palette_lookup(obj):
        printer = lookup(obj)
        if type(obj).__module__.split(".")[0] != "matplotlib":
            return printer
        return lambda figure: _palette_output(printer(figure))

    palette_lookup._palette = lookup  # the lookup it wraps
    formatter.lookup = palette_lookup
    return True
