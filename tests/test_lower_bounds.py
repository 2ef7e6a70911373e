"""The pins of scripts/lower_bounds.txt, which scripts/test_lower_bounds.sh installs and tests, are the
lower bounds the requirements files promise: each pin equals the ``>=`` bound of every range that names
the package, and every range the chapters or tests depend on has a pin."""

import re
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
FILES = ("requirements.txt", "binder/requirements.txt", "pyproject.toml")
# the book's tools, not imported by any chapter or test: the lower-bounds job does not install them
UNTESTED = {"jupyterlab", "sphinx-exercise", "sphinx-proof", "pytest-xdist", "ruff", "check-jsonschema"}
RANGE = re.compile(r"^([A-Za-z0-9_.-]+)\s*((?:[<>=!~]=?[^,\s\"]+,?)+)")


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def ranges(text: str) -> dict[str, str]:
    """The ``{package: specifier}`` of a requirements file's lines (or pyproject.toml's quoted ones)."""
    found = {}
    for line in text.splitlines():
        line = line.strip().strip('",')
        if line.startswith(("#", "-", "[")):
            continue
        m = RANGE.match(line)
        if m:
            found[_name(m.group(1))] = m.group(2)
    return found


def lower_bound(specifier: str) -> str | None:
    m = re.search(r">=([^,]+)", specifier)
    return m.group(1) if m else None


def pins() -> dict[str, str]:
    text = (ROOT / "scripts" / "lower_bounds.txt").read_text(encoding="utf-8")
    return {_name(n): v for n, v in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", text, re.M)}


def _dependencies() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    return re.search(r"^dependencies = \[(.*?)^\]", text, re.M | re.S).group(1)


def _file_ranges(name: str) -> dict[str, str]:
    if name == "pyproject.toml":
        return ranges(_dependencies().replace(",\n", "\n"))
    return ranges((ROOT / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", FILES)
def test_every_pin_is_the_lower_bound_of_each_range(name):
    pinned = pins()
    for package, spec in _file_ranges(name).items():
        if package in UNTESTED:
            continue
        assert package in pinned, f"{name}: {package}{spec} has no pin in scripts/lower_bounds.txt"
        bound = lower_bound(spec)
        assert bound is not None, f"{name}: {package}{spec} has no lower bound"
        pin = pinned[package]
        assert Version(pin) == Version(bound), f"{name}: {package}{spec}, but scripts/lower_bounds.txt pins {pin}"


def test_every_pin_has_a_range():
    named = set().union(*(_file_ranges(name) for name in FILES))
    assert set(pins()) <= named, set(pins()) - named


def test_the_parser_reads_ranges_and_bounds():
    assert ranges("# c\n-e .\nfoo>=1.2,<2\nbar_baz==3\n--extra-index-url x\n") == {"foo": ">=1.2,<2", "bar-baz": "==3"}
    assert lower_bound(">=1.2,<2") == "1.2" and lower_bound("<2") is None
    # a mismatch is seen: the check above can fail
    assert Version(lower_bound(ranges("transformers>=4.44")["transformers"])) != Version(pins()["transformers"])
