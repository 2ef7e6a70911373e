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
    _point_requirejs_at_static(pagename, context)
    _mathjax2_shim_for_widgets(context)
    # the theme's first script reads the colour mode from this variable; empty is an error
    if not context.get("default_mode"):
        context["default_mode"] = "auto"


def _point_requirejs_at_static(pagename, context):
    """The widget manager finds its fonts relative to the URL RequireJS gives its module; map
    that module to ``_static/html-manager`` (relative to this page) so they load locally."""
    scripts = context["script_files"]
    for i, js in enumerate(scripts):
        if (getattr(js, "filename", None) or "").endswith("require.js"):
            static = "../" * pagename.count("/") + "_static/html-manager"
            body = f'require.config({{paths: {{"@jupyter-widgets/html-manager/dist": "{static}"}}}});'
            scripts.insert(i + 1, type(js)(None, priority=js.priority, body=body))
            return


# The widget manager typesets widget labels with MathJax 2's MathJax.Hub.Queue; Sphinx loads
# MathJax 3, which has no Hub. This shim forwards those calls to MathJax 3's typesetPromise.
_MATHJAX_SHIM = """(function () {
  function queue(job) {
    var mj = window.MathJax, el = job && job[2];
    if (mj && mj.typesetPromise && el) { mj.typesetPromise([el]); }
  }
  var mj = (window.MathJax = window.MathJax || {});
  mj.Hub = {Queue: queue};
  mj.startup = mj.startup || {};
  mj.startup.ready = function () { window.MathJax.startup.defaultReady(); window.MathJax.Hub = {Queue: queue}; };
})();"""


def _mathjax2_shim_for_widgets(context):
    scripts = context["script_files"]
    for i, js in enumerate(scripts):
        filename = getattr(js, "filename", None) or ""
        if "mathjax" in filename.lower() or "tex-chtml" in filename:
            scripts.insert(i, type(js)(None, priority=js.priority, body=_MATHJAX_SHIM))
            return


def setup(app):
    # MathJax on every page, not only where Sphinx saw an equation: generated pages such as the
    # proof index repeat theorem titles that contain math
    app.set_html_assets_policy("always")
    app.connect("config-inited", _use_local_assets)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
