"""Numbers in the prose are glued from the cells that measured them (MyST-NB's ``glue``): every
``{glue:text}`key``` (and ``{glue}``, ``{glue:figure}``, ``{glue:math}``) a markdown cell
references is defined by a saved output of the same notebook, so a sentence can never quote a
number that no cell computed, and a re-run that changes the number changes the sentence."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb")) + [ROOT / "instructors.ipynb"]
# {glue:text}`key`, {glue:text}`key:.2f`, {glue}`key`, and the directive form ```{glue:figure} key
ROLE = re.compile(r"\{glue(?::(?:text|any|figure|math))?\}`([^`:]+)(?::[^`]*)?`")
DIRECTIVE = re.compile(r"^[`:]{3,}\{glue(?::(?:any|figure|math))?\}\s+(\S+)", re.MULTILINE)


def glued_keys(nb: dict) -> dict[str, str]:
    """Each key a code cell glued (its saved output) -> its plain-text value."""
    keys = {}
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:
                keys[name] = out.get("data", {}).get("application/papermill.record/text/plain", "")
    return keys


def referenced_keys(nb: dict) -> list[str]:
    text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    return ROLE.findall(text) + DIRECTIVE.findall(text)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_glue_reference_is_defined_by_a_saved_output(path):
    nb = json.loads(path.read_text())
    defined = glued_keys(nb)
    missing = sorted({key for key in referenced_keys(nb) if key not in defined})
    assert not missing, f"{path.name}: referenced but never glued: {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_glued_values_are_finite(path):
    """A glued NaN or inf would print "nan" in a sentence."""
    bad = {k: v for k, v in glued_keys(json.loads(path.read_text())).items() if re.search(r"\b(nan|inf)\b", v)}
    assert not bad, f"{path.name}: glued values that are not finite: {bad}"


def test_the_patterns_find_roles_and_directives():
    nb = {
        "cells": [
            {"cell_type": "markdown", "source": "a {glue:text}`x:.2f` b {glue}`y` c\n```{glue:figure} z\n```"},
            {"cell_type": "code", "source": "", "outputs": []},
        ]
    }
    assert sorted(referenced_keys(nb)) == ["x", "y", "z"]
