"""Which of a GPT's settings each Hugging Face format can write (chapters 10, 14, 18 and "Experts").

A converter from the book's :class:`~transformer_lib.models.GPT` to a ``transformers`` model names
every setting of the config in a table: :data:`ANY` where the format writes whatever value the GPT
has (a width, an epsilon, a tied head), or the one value the format computes (``norm="rmsnorm"``,
``sinks=False``). :func:`check_settings` refuses the first setting whose value the format cannot
write, by name, so a model is never converted into one that computes something else. The settings
are the recipe's fields (:class:`~transformer_lib.recipe.BlockRecipe`) and the config's
``n_kv_heads`` and ``window``; a table that leaves one out is an error, so a new choice of the
recipe is refused by every format until its converter says what to do with it.
"""

from __future__ import annotations

from dataclasses import fields

from .recipe import BlockRecipe

__all__ = ["ANY", "SETTINGS", "check_settings", "missing_settings"]


class _Any:
    """The marker of a setting a format writes whatever its value."""

    def __repr__(self) -> str:
        return "ANY"


ANY = _Any()
# Every setting a table names: the config's two attention sizes, then the recipe's fields.
SETTINGS = ("n_kv_heads", "window", *(f.name for f in fields(BlockRecipe)))


def missing_settings(table: dict) -> list[str]:
    """The settings of :data:`SETTINGS` that ``table`` does not name (none, for a complete table)."""
    return [name for name in SETTINGS if name not in table]


def check_settings(config, table: dict, who: str, why: dict[str, str] | None = None) -> None:
    """Refuse, with a ``ValueError`` naming it, the first setting of ``config`` (a ``GPTConfig``)
    that ``table`` fixes to another value; ``who`` starts the message ("GPT-2's format needs ..."),
    and ``why`` may give a setting's reason. ``n_kv_heads`` equal to ``n_heads`` reads as None (one
    key/value head per query head)."""
    unnamed = missing_settings(table)
    if unnamed:
        raise RuntimeError(f"{who}: the table of settings does not say whether it can write {unnamed}")
    for name in SETTINGS:
        wanted, value = table[name], getattr(config, name)
        if name == "n_kv_heads" and value == config.n_heads:
            value = None
        if wanted is not ANY and value != wanted:
            reason = f": {why[name]}" if why and name in why else ""
            raise ValueError(f"{who} needs {name}={wanted!r}, the GPT has {name}={value!r}{reason}")
