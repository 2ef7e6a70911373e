"""Sphinx extension: links from the chapters to the library reference, by the names readers use.

The chapters name the library's objects as ``tl.name`` (the flat namespace) or
``tl.module.name``. A role such as ``{py:obj}`tl.causal_mask <transformer_lib.causal_mask>```
targets that public path; this extension finds the module that really defines the object and
links to its entry in the API pages, so the chapters' links survive when a name moves between
modules. A ``transformer_lib`` target that matches nothing documented is a build warning (an
error under ``-W``), never a silent plain-text name.
"""

from __future__ import annotations

import importlib
import inspect

from sphinx.util import logging

logger = logging.getLogger(__name__)


def _canonical(target: str) -> str | None:
    """The dotted path of the module that defines ``target``'s object, or None."""
    parts = target.split(".")
    try:
        obj = importlib.import_module(parts[0])
    except ImportError:
        return None
    for i, part in enumerate(parts[1:], start=1):
        last = i == len(parts) - 1
        found = getattr(obj, part, None)
        # ``tl.train`` is the function, as Python reads it; ``transformer_lib.train.x`` goes
        # through the module of that name, which the flat namespace's function shadows.
        if found is not None and (last or inspect.ismodule(found)):
            obj = found
            continue
        try:
            obj = importlib.import_module(".".join(parts[: i + 1]))
        except ImportError:
            if found is None:
                return None
            obj = found
    if inspect.ismodule(obj):
        return obj.__name__
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if module and qualname:
        return f"{module}.{qualname}"
    return None


def _resolve(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    if not target.startswith("transformer_lib"):
        return None
    domain = env.get_domain("py")
    canonical = _canonical(target)
    if canonical and canonical != target:
        new = node.deepcopy()
        new["reftarget"] = canonical
        found = domain.resolve_any_xref(env, node["refdoc"], app.builder, canonical, new, contnode)
        if found:
            return found[0][1]
    logger.warning(
        "the library reference has no entry for %s (is its module on an API page?)",
        target,
        location=node,
    )
    return None


def setup(app):
    app.connect("missing-reference", _resolve)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
