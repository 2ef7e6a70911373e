"""Sphinx extension: interactive figures on paper.

A widget cannot move in a PDF, and its saved output holds only a view reference and a text repr
("VBox(children=...)"). For the LaTeX builder this extension rewrites each notebook as it is read
(the file on disk is untouched): every widget output becomes the figure the widget shows before
anyone touches it, the frame its controls select by default, taken from the notebook's saved
widget state (``tl.viz.frame_widget`` stores every frame as a PNG), with a line naming the
controls' default values and the other values the web edition offers. The HTML build is not
affected.
"""

from __future__ import annotations

import json
import re

from sphinx.util import logging

logger = logging.getLogger(__name__)

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
IMG = re.compile(r'<img[^>]*src="data:image/png;base64,([^"]+)"')


def _ref(value: str) -> str:
    return value.replace("IPY_MODEL_", "", 1)


def _default_frame(state: dict, model_id: str) -> tuple[str | None, list[str], list[str]]:
    """(PNG as base64, captions, control settings) of the frame a widget shows by default."""
    png, captions, controls = None, [], []

    def visit(mid: str) -> None:
        nonlocal png
        model = state.get(mid)
        if model is None:
            return
        name, s = model.get("model_name", ""), model.get("state", {})
        children = [_ref(c) for c in s.get("children", [])]
        if name == "StackModel" or name == "TabModel":
            index = s.get("selected_index")
            if children:
                visit(children[index if isinstance(index, int) and 0 <= index < len(children) else 0])
            return
        if "_options_labels" in s:
            labels = s["_options_labels"]
            index = s.get("index")
            if isinstance(index, int) and 0 <= index < len(labels):
                others = [lab for i, lab in enumerate(labels) if i != index]
                setting = f"{s.get('description') or 'setting'} = {labels[index]}"
                controls.append(setting + (f" (also {', '.join(others)} on the web)" if others else ""))
        elif name in ("IntSliderModel", "FloatSliderModel", "CheckboxModel", "ToggleButtonModel"):
            controls.append(f"{s.get('description') or 'setting'} = {s.get('value')}")
        elif name == "HTMLModel" and png is None:
            m = IMG.search(s.get("value", ""))
            if m:
                png = m.group(1)
        elif name == "ImageModel" and png is None and s.get("format") == "png":
            for buf in model.get("buffers", []):
                if buf.get("path") == ["value"] and buf.get("encoding") == "base64":
                    png = buf["data"]
        elif name == "LabelModel" and s.get("value"):
            captions.append(s["value"])
        for child in children:
            visit(child)

    visit(model_id)
    return png, captions, controls


def _print_widgets(nb: dict, docname: str) -> int:
    state = nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    replaced = 0
    for cell in nb.get("cells", []):
        outputs = cell.get("outputs") if cell.get("cell_type") == "code" else None
        for i, out in enumerate(outputs or []):
            view = out.get("data", {}).get(WIDGET_VIEW)
            if not view:
                continue
            png, captions, controls = _default_frame(state, view.get("model_id", ""))
            if png is None:
                logger.warning("%s: a widget output has no saved frame to print", docname)
                continue
            note = "Interactive figure, printed at its default setting"
            note += ": " + "; ".join(controls) + "." if controls else "."
            text = "\n".join([note, *captions])
            outputs[i] = {
                "output_type": "display_data",
                "metadata": {},
                "data": {"image/png": png.replace("\n", ""), "text/plain": text},
            }
            outputs.insert(i + 1, {"output_type": "stream", "name": "stdout", "text": text + "\n"})
            replaced += 1
    return replaced


def _source_read(app, docname, source):
    if app.builder.format != "latex" or not source or not source[0].lstrip().startswith("{"):
        return
    try:
        nb = json.loads(source[0])
    except ValueError:
        return
    if isinstance(nb, dict) and "cells" in nb and _print_widgets(nb, docname):
        source[0] = json.dumps(nb)


def setup(app):
    app.connect("source-read", _source_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
