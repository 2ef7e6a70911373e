"""What the recipe's small specs share (chapters "Experts" and "Longer than trained"): a frozen
choice object that a recipe holds as one field, read back from a checkpoint's dict, and spelled as
the command line's flat settings.

A spec such as :class:`~transformer_lib.experts.ExpertsSpec` is one field of
:class:`~transformer_lib.recipe.BlockRecipe`; on the command line it is one switch flag (the number
of experts, the kind of scaling) and one flag per other field, named ``<prefix><field>``, with the
help its field's metadata gives. :class:`FlatSpec` makes both directions from the dataclass, so no
list of flags is written twice. This module imports only the book's checks.
"""

from __future__ import annotations

from dataclasses import MISSING, field, fields, replace
from typing import ClassVar

from ._checks import plain_number

__all__ = ["FlatSpec", "Spec", "option", "spec_from_value"]


def option(default, help_: str, *, flat: str | None = None, choices: tuple | None = None):
    """A spec's field with the help its command-line flag shows; ``flat`` is the flag's name when it
    is not the field's own (a recurrence's ``kind`` is ``--attention``), ``choices`` the values it takes."""
    return field(default=default, metadata={"help": help_, "flat": flat, "choices": choices})


def flat_name(f) -> str:
    """The command line's name of the spec field ``f``."""
    return f.metadata.get("flat") or f.name


class Spec:
    """A small frozen choice (chapter "Today's block"): one kind of attention, feed-forward network or
    positions, with its own options, defined beside the layer it builds.

    A subclass is a frozen dataclass with a class attribute ``kind`` (its name in the recipe's table;
    a spec whose kinds share one class, as the recurrences, makes ``kind`` a field instead). It checks
    its options in ``__post_init__``, may check what it needs of the rest of the recipe in
    :meth:`check`, and builds its layer. :meth:`to_dict` is what a checkpoint stores.
    """

    kind: ClassVar[str]

    def __post_init__(self):
        """NumPy's numbers kept as Python's, as a checkpoint loads them; a subclass that checks its
        options calls this first."""
        for f in fields(self):
            object.__setattr__(self, f.name, plain_number(getattr(self, f.name)))

    def to_dict(self) -> dict:
        """The kind and the options as a plain dict; a nested spec as its own dict."""
        out = {"kind": self.kind}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if hasattr(value, "to_dict") else value
        return out

    def options(self) -> dict:
        """The options by field name (the kind aside)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "kind"}

    def with_options(self, **changes):
        """This spec with some options changed, each checked again."""
        return replace(self, **changes)

    def check(self, recipe) -> None:
        """Refuse, by name, a recipe this kind cannot be part of (none by default)."""


def spec_from_value(value, table: dict, role: str, nested: dict | None = None):
    """A spec of ``table`` (kind name -> spec class) from a spec, its kind's name (default options) or a
    checkpoint's dict with a ``"kind"``; ``nested`` converts a dict-valued option (``{"scaling": f}``).
    Anything else, an unknown kind or an unknown option is refused by name (``role``: the recipe's field)."""
    if isinstance(value, tuple(set(table.values()))):
        return value
    if isinstance(value, str):
        value = {"kind": value}
    if isinstance(value, dict) and "kind" not in value:  # dataclasses.asdict drops the kind: its fields say it
        matches = [k for k, t in table.items() if {f.name for f in fields(t)} == set(value)]
        if len(set(table[k] for k in matches)) == 1:
            value = {"kind": matches[0], **value}
    if not isinstance(value, dict) or "kind" not in value:
        raise TypeError(f"{role} must be a spec, one of {sorted(table)} or a dict with its 'kind', got {value!r}")
    options = dict(value)
    kind = options.pop("kind")
    if kind not in table:
        raise ValueError(f"{role} must be one of {sorted(table)}, got {kind!r}")
    spec_type = table[kind]
    known = {f.name for f in fields(spec_type)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not an option of {role} {kind!r}; its options are {sorted(known)}")
    if "kind" in known:  # kinds that share one class name themselves
        options["kind"] = kind
    for name, convert in (nested or {}).items():
        if name in options:
            options[name] = convert(options[name])
    return spec_type(**options)


class FlatSpec:
    """The flat settings of the frozen dataclass ``spec_type`` (chapter "Experts").

    ``key`` is the switch setting and ``switch`` the field it holds (``off``: no spec); every other
    field is the setting ``prefix + name``. :attr:`names` maps a flat name to its field,
    :attr:`help` and :attr:`types` give each flat name's help and type as written.
    """

    def __init__(self, spec_type: type, key: str, switch: str, off, prefix: str):
        self.spec_type, self.key, self.switch, self.off = spec_type, key, switch, off
        own = {f.name: f for f in fields(spec_type)}
        self.names = {
            key: switch,
            **{f.metadata.get("flat") or f"{prefix}{n}": n for n, f in own.items() if n != switch},
        }
        self.help = {flat: own[name].metadata["help"] for flat, name in self.names.items()}
        self.types = {flat: own[name].type for flat, name in self.names.items()}
        self.defaults = {n: f.default for n, f in own.items() if f.default is not MISSING}

    def settings(self, spec) -> dict:
        """``spec`` (or None) as the flat settings; without a spec, the switch is ``off`` and the
        other settings their defaults."""
        flat = {k: (getattr(spec, n) if spec is not None else self.defaults.get(n)) for k, n in self.names.items()}
        if spec is None:
            flat[self.key] = self.off
        return flat

    def spec(self, flat: dict):
        """The spec the flat settings say; None where the switch is ``off`` or missing, and an
        option changed from its default without the switch is refused by name."""
        on = flat.get(self.key, self.off)
        options = {self.names[k]: v for k, v in flat.items() if k != self.key}
        if on == self.off or on is None:
            changed = [k for k, v in flat.items() if k != self.key and v != self.defaults.get(self.names[k])]
            if changed:
                raise ValueError(f"{changed[0]}={flat[changed[0]]!r} is a choice of {self.key}: give {self.key} too")
            return None
        return self.spec_type(**{self.switch: on, **options})

    def from_value(self, value):
        """A spec from a spec, a dict (a checkpoint's) or None, its keys checked by name."""
        if value is None or isinstance(value, self.spec_type):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"{self.key} must be a {self.spec_type.__name__}, a dict or None, got {value!r}")
        known = {f.name for f in fields(self.spec_type)}
        if "kind" not in known:  # a spec's own dict names its kind
            value = {k: v for k, v in value.items() if k != "kind"}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown {self.key} choice {unknown[0]!r}: the choices are {sorted(known)}")
        return self.spec_type(**value)
