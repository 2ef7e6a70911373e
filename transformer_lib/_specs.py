"""What the recipe's small specs share (chapters "Experts" and "Longer than trained"): a frozen
choice object that a recipe holds as one field, read back from a checkpoint's dict, and spelled as
the command line's flat settings.

A spec such as :class:`~transformer_lib.experts.ExpertsSpec` is one field of
:class:`~transformer_lib.recipe.BlockRecipe`; on the command line it is one switch flag (the number
of experts, the kind of scaling) and one flag per other field, named ``<prefix><field>``, with the
help its field's metadata gives. :class:`FlatSpec` makes both directions from the dataclass, so no
list of flags is written twice. This module imports nothing of the book.
"""

from __future__ import annotations

from dataclasses import MISSING, fields

__all__ = ["FlatSpec"]


class FlatSpec:
    """The flat settings of the frozen dataclass ``spec_type`` (chapter "Experts").

    ``key`` is the switch setting and ``switch`` the field it holds (``off``: no spec); every other
    field is the setting ``prefix + name``. :attr:`names` maps a flat name to its field,
    :attr:`help` and :attr:`types` give each flat name's help and type as written.
    """

    def __init__(self, spec_type: type, key: str, switch: str, off, prefix: str):
        self.spec_type, self.key, self.switch, self.off = spec_type, key, switch, off
        own = {f.name: f for f in fields(spec_type)}
        self.names = {key: switch, **{f"{prefix}{n}": n for n in own if n != switch}}
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
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown {self.key} choice {unknown[0]!r}: the choices are {sorted(known)}")
        return self.spec_type(**value)
