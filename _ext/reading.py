"""Sphinx extension: page styles that keep the chapters readable in the content column.

Adds ``_ext/static/reading.css``: text outputs wrap at the column's edge instead of scrolling
sideways, and the frames of interactive figures shrink to the column.
"""

from pathlib import Path

STATIC = Path(__file__).resolve().parent / "static"


def _add_static(app, config):
    config.html_static_path = [*config.html_static_path, str(STATIC)]


def setup(app):
    app.connect("config-inited", _add_static)
    app.add_css_file("reading.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
