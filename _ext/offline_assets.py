"""Sphinx extension: serve MathJax and the Jupyter widget manager from the site itself.

When ``scripts/web_assets.sh`` has installed them into ``.cache/web-assets/static``, the built
pages load MathJax, RequireJS and the widget manager from ``_static/`` instead of from CDNs,
so the book renders its equations and widgets with no network. Otherwise nothing changes.
"""

from pathlib import Path

from sphinx.util import logging

ASSETS = Path(__file__).resolve().parent.parent / ".cache" / "web-assets" / "static"
logger = logging.getLogger(__name__)


def _use_local_assets(app, config):
    if not (ASSETS / "mathjax" / "tex-chtml.js").is_file():
        logger.info("offline_assets: no local web assets; MathJax and widgets load from CDNs")
        return
    config.html_static_path = [*config.html_static_path, str(ASSETS)]
    config.mathjax_path = "mathjax/tex-chtml.js"
    config.nb_ipywidgets_js = {
        "require.js": {},
        "html-manager/embed-amd.js": {},
    }
    logger.info("offline_assets: serving MathJax and the widget manager from _static/")


def _dedupe_scripts(app, pagename, templatename, context, doctree):
    """Drop repeated script tags (an inline script declared twice throws in the browser) and
    give the theme a valid default colour mode."""
    seen, unique = set(), []
    for js in context.get("script_files", []):
        key = (getattr(js, "filename", str(js)) or None, tuple(sorted(getattr(js, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(js)
    context["script_files"] = unique
    # the theme's first script reads the colour mode from this variable; empty is an error
    if not context.get("default_mode"):
        context["default_mode"] = "auto"


def setup(app):
    app.connect("config-inited", _use_local_assets)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
